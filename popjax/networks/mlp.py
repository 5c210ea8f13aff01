"""flax.linen networks used by the learners.

Every module is used through pure ``init/apply``; parameters are plain pytrees that vmap
over the member axis without any special handling.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp


class MLP(nn.Module):
    """Fully connected ReLU network with a linear output layer; ``layer_norm``: LayerNorm before each ReLU;
    ``out_init``: the output layer's kernel initialiser (None: flax's default)."""

    hidden: Sequence[int]
    out_dim: int
    layer_norm: bool = False
    out_init: Any = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for width in self.hidden:
            x = nn.Dense(width)(x)
            x = nn.relu(nn.LayerNorm()(x) if self.layer_norm else x)
        if self.out_init is None:
            return nn.Dense(self.out_dim)(x)
        return nn.Dense(self.out_dim, kernel_init=self.out_init)(x)


class DeterministicActor(nn.Module):
    """TD3 policy: observation -> action in [-1, 1]."""

    hidden: Sequence[int]
    action_dim: int

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        return jnp.tanh(MLP(self.hidden, self.action_dim)(obs))


class GaussianActor(nn.Module):
    """SAC policy head: observation -> (mean, log_std) of the pre-tanh Gaussian."""

    hidden: Sequence[int]
    action_dim: int
    log_std_min: float = -5.0
    log_std_max: float = 2.0

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        out = MLP(self.hidden, 2 * self.action_dim)(obs)
        mean, log_std = jnp.split(out, 2, axis=-1)
        # Smooth squashing of log_std into its range (as in SAC reference implementations).
        log_std = self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (jnp.tanh(log_std) + 1)
        return mean, log_std


class TwinCritic(nn.Module):
    """Two independent Q(s, a) networks; returns an array of shape ``[2, ...]``."""

    hidden: Sequence[int]

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        x = jnp.concatenate([obs, action], axis=-1)
        q1 = MLP(self.hidden, 1, name="q1")(x)[..., 0]
        q2 = MLP(self.hidden, 1, name="q2")(x)[..., 0]
        return jnp.stack([q1, q2])


class NatureTorso(nn.Module):
    """The DQN Atari torso (Mnih et al. 2015): 84x84x4 frames -> flat features."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(jnp.float32)
        x = nn.relu(nn.Conv(32, (8, 8), strides=(4, 4), padding="VALID")(x))
        x = nn.relu(nn.Conv(64, (4, 4), strides=(2, 2), padding="VALID")(x))
        x = nn.relu(nn.Conv(64, (3, 3), strides=(1, 1), padding="VALID")(x))
        return x.reshape(x.shape[:-3] + (-1,))


NATURE_TORSO_MIN_SIZE = 36  # the smallest frame side the torso's three VALID convolutions leave a pixel of


def nature_torso_problem(obs_shape: tuple[int, ...]) -> str | None:
    """Why ``NatureTorso`` cannot read observations of ``obs_shape`` (one per env step), or None when it can:
    it convolves frames [height, width, channels] of at least 36 x 36."""
    if len(obs_shape) == 3 and min(obs_shape[:2]) >= NATURE_TORSO_MIN_SIZE:
        return None
    return (f"the convolutional (Nature CNN) torso needs image observations [height, width, channels] of at least "
            f"{NATURE_TORSO_MIN_SIZE} x {NATURE_TORSO_MIN_SIZE}, got observations of shape {tuple(obs_shape)}")


def check_cnn(config: Any, spec: Any) -> tuple[str, str] | None:
    """``RunFit.check_env`` of a learner whose ``cnn`` option puts ``NatureTorso`` before its Q-network."""
    if config.cnn and (why := nature_torso_problem(spec.obs_shape)) is not None:
        return "cnn", f"{why} (allowed: false)"
    return None


class QNetwork(nn.Module):
    """Discrete Q(s, .) network: optional Nature CNN torso, MLP head, optional dueling."""

    hidden: Sequence[int]
    num_actions: int
    dueling: bool = False
    cnn: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = NatureTorso()(obs) if self.cnn else obs
        if not self.dueling:
            return MLP(self.hidden, self.num_actions)(x)
        value = MLP(self.hidden, 1, name="value")(x)
        advantage = MLP(self.hidden, self.num_actions, name="advantage")(x)
        return value + advantage - advantage.mean(axis=-1, keepdims=True)
