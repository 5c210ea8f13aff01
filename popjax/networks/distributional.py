"""Networks of the large-batch learners: twin categorical (C51) critics and a deterministic actor with a small
output layer (FastTD3's architecture: Seo et al. 2025)."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from popjax.networks.mlp import MLP


class TwinCategoricalCritic(nn.Module):
    """Two independent ``Z(s, a)`` networks, each giving the logits of a categorical distribution over
    ``num_atoms`` fixed atoms: ``[2, ..., num_atoms]``."""

    hidden: Sequence[int]
    num_atoms: int
    layer_norm: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        x = jnp.concatenate([obs, action], axis=-1)
        return jnp.stack([MLP(self.hidden, self.num_atoms, self.layer_norm, name=f"z{i}")(x) for i in (1, 2)])


class SmallInitActor(nn.Module):
    """Deterministic policy in ``[-1, 1]`` whose output layer starts near zero (weights ~ N(0, ``init_scale``^2),
    zero bias), so the first actions are near the middle of the action range."""

    hidden: Sequence[int]
    action_dim: int
    init_scale: float = 0.01
    layer_norm: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        out_init = nn.initializers.normal(self.init_scale)
        return jnp.tanh(MLP(self.hidden, self.action_dim, self.layer_norm, out_init)(obs))
