"""A one-step dynamics model: an ensemble of Gaussian MLPs (MEMR, ``popjax.learners.memr``).

Each of the ``size`` members maps ``(s, a)`` to a diagonal Gaussian over ``(s' - s, r)`` and a termination logit.
The model type is popjax's choice (Zhang 2022, Ch. 3 leaves it open): the probabilistic ensemble of PETS/MBPO,
because maximum likelihood needs a density (a Gaussian head gives the NLL), an ensemble is the cheapest guard
against a single network's bias where data is thin, and the members are a leading axis of every parameter, so
the whole ensemble is one batched matmul per layer (and vmaps over the population like any other leaf).

Inputs ``(s, a)`` and targets ``(s' - s, r)`` are normalised by running statistics of the real data (``Stats``,
MBPO's practice): raw Pendulum velocities (±8) and rewards (down to -16) otherwise dominate the loss and the
initial predictions. The statistics are plain arrays, so they live in the learner state (checkpointed, vmapped).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct

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


def ensemble_nll(net: GaussianEnsemble, params, inputs: jax.Array, target: jax.Array, terminated: jax.Array,
                 weights: jax.Array) -> jax.Array:
    """Per member ``[size]``: the weighted mean over the batch ``[B]`` of the Gaussian NLL of ``target`` plus the
    termination's binary cross-entropy (0 where every weight is 0)."""
    mean, log_std, logit = net.apply(params, inputs)
    nll = gaussian_nll(mean, log_std, target) + sigmoid_bce(logit, terminated)  # [size, B]
    return jnp.sum(nll * weights, axis=-1) / jnp.maximum(jnp.sum(weights), 1e-12)


def model_nll(net: GaussianEnsemble, params, obs: jax.Array, action: jax.Array, delta_reward: jax.Array,
              terminated: jax.Array, weights: jax.Array) -> jax.Array:
    """The ensemble's loss on raw real transitions ``[B]``: ``ensemble_nll`` of ``(s' - s, r)`` summed over
    members."""
    return jnp.sum(ensemble_nll(net, params, jnp.concatenate([obs, action], axis=-1), delta_reward, terminated,
                                weights))


@struct.dataclass
class Stats:
    """Running mean and variance of vectors ``[dim]`` (Chan et al.'s parallel merge; exact in float64 terms up to
    float32 rounding). ``count`` is int32 (a float32 count stops at 2^24 rows)."""

    count: jax.Array
    mean: jax.Array
    m2: jax.Array  # sum of squared deviations from ``mean``

    def std(self) -> jax.Array:
        """The population standard deviation, 1 before any data and floored at 1e-6 (a constant feature)."""
        var = self.m2 / jnp.maximum(self.count, 1).astype(jnp.float32)
        return jnp.where(self.count > 0, jnp.sqrt(jnp.maximum(var, 1e-12)), 1.0)

    def normalize(self, x: jax.Array) -> jax.Array:
        return (x - self.mean) / self.std()

    def denormalize(self, z: jax.Array) -> jax.Array:
        return z * self.std() + self.mean


def stats_init(dim: int) -> Stats:
    return Stats(jnp.zeros((), jnp.int32), jnp.zeros(dim, jnp.float32), jnp.zeros(dim, jnp.float32))


def stats_update(stats: Stats, x: jax.Array) -> Stats:
    """Merges the rows of ``x [B, dim]`` into ``stats``."""
    n_a, n_b = stats.count.astype(jnp.float32), jnp.float32(x.shape[0])
    mean_b = jnp.mean(x, axis=0)
    m2_b = jnp.sum((x - mean_b) ** 2, axis=0)
    n = n_a + n_b
    delta = mean_b - stats.mean
    return Stats(stats.count + x.shape[0], stats.mean + delta * (n_b / n), stats.m2 + m2_b + delta**2 * (n_a * n_b / n))


@struct.dataclass
class ModelNorm:
    """The statistics of the model's inputs ``(s, a)`` and targets ``(s' - s, r)``."""

    inputs: Stats
    targets: Stats


def sigmoid_bce(logit: jax.Array, label: jax.Array) -> jax.Array:
    """Binary cross-entropy of a logit (stable form)."""
    return jax.nn.softplus(logit) - label * logit


def predict(net: GaussianEnsemble, params, norm: ModelNorm, key: jax.Array, obs: jax.Array, action: jax.Array,
            members: jax.Array):
    """One-step rollouts ``[B]``: each row is predicted by one of ``members`` (int ``[k]``, the elites) drawn
    uniformly (MBPO), at its mean (the thesis's tasks are deterministic). Returns ``(next_obs, reward,
    terminated)``."""
    mean, _, logit = net.apply(params, norm.inputs.normalize(jnp.concatenate([obs, action], axis=-1)))
    pick = members[jax.random.randint(key, obs.shape[:1], 0, members.shape[0])]
    rows = jnp.arange(obs.shape[0])
    chosen = norm.targets.denormalize(mean[pick, rows])
    return obs + chosen[:, :-1], chosen[:, -1], (logit[pick, rows] > 0).astype(jnp.float32)
