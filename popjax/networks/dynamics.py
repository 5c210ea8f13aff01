"""A one-step dynamics model: an ensemble of Gaussian MLPs (MEMR, ``popjax.learners.memr``).

Each of the ``size`` members maps ``(s, a)`` to a diagonal Gaussian over ``(s' - s, r)`` and a termination logit.
The model type is popjax's choice (Zhang 2022, Ch. 3 leaves it open): the probabilistic ensemble of PETS/MBPO,
because maximum likelihood needs a density (a Gaussian head gives the NLL), an ensemble is the cheapest guard
against a single network's bias where data is thin, and the members are a leading axis of every parameter, so
the whole ensemble is one batched matmul per layer (and vmaps over the population like any other leaf).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from popjax.networks.mlp import MLP

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
LOG_STD_MIN, LOG_STD_MAX = -10.0, 1.0


def soft_clamp(x: jax.Array, low: float, high: float) -> jax.Array:
    """A smooth clamp into ``(low, high)`` (gradients never vanish, unlike ``clip``)."""
    x = high - jax.nn.softplus(high - x)
    return low + jax.nn.softplus(x - low)


class GaussianEnsemble(nn.Module):
    """``size`` independent MLPs: inputs ``[..., d_in]`` -> ``(mean, log_std)`` of ``[size, ..., out_dim]`` and a
    termination logit ``[size, ...]``."""

    hidden: Sequence[int]
    out_dim: int
    size: int

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        ensemble = nn.vmap(MLP, variable_axes={"params": 0}, split_rngs={"params": True}, in_axes=None,
                           axis_size=self.size)
        out = ensemble(self.hidden, 2 * self.out_dim + 1)(x)
        mean, log_std, logit = out[..., :self.out_dim], out[..., self.out_dim:-1], out[..., -1]
        return mean, soft_clamp(log_std, LOG_STD_MIN, LOG_STD_MAX), logit


def gaussian_nll(mean: jax.Array, log_std: jax.Array, target: jax.Array) -> jax.Array:
    """``-log N(target; mean, exp(log_std)^2)`` summed over the last axis."""
    z = (target - mean) * jnp.exp(-log_std)
    return jnp.sum(0.5 * z**2 + log_std + _HALF_LOG_2PI, axis=-1)


def model_nll(net: GaussianEnsemble, params, obs: jax.Array, action: jax.Array, delta_reward: jax.Array,
              terminated: jax.Array, weights: jax.Array) -> jax.Array:
    """The ensemble's loss on real transitions ``[B]``: per member the weighted mean over the batch of the Gaussian
    NLL of ``(s' - s, r)`` plus the termination's binary cross-entropy, summed over members."""
    mean, log_std, logit = net.apply(params, jnp.concatenate([obs, action], axis=-1))
    nll = gaussian_nll(mean, log_std, delta_reward) + sigmoid_bce(logit, terminated)  # [size, B]
    return jnp.sum(jnp.sum(nll * weights, axis=-1) / jnp.sum(weights))


def sigmoid_bce(logit: jax.Array, label: jax.Array) -> jax.Array:
    """Binary cross-entropy of a logit (stable form)."""
    return jax.nn.softplus(logit) - label * logit


def predict(net: GaussianEnsemble, params, key: jax.Array, obs: jax.Array, action: jax.Array):
    """One-step rollouts ``[B]``: each row is predicted by one ensemble member drawn uniformly (MBPO), at its mean
    (the thesis's tasks are deterministic). Returns ``(next_obs, reward, terminated)``."""
    mean, _, logit = net.apply(params, jnp.concatenate([obs, action], axis=-1))
    pick = jax.random.randint(key, obs.shape[:1], 0, net.size)
    rows = jnp.arange(obs.shape[0])
    chosen = mean[pick, rows]
    return obs + chosen[:, :-1], chosen[:, -1], (logit[pick, rows] > 0).astype(jnp.float32)
