"""Who PBT replaces, and from whom: pure jnp over the population's fitness (jit-able, no Python loop over members).

A selection returns a ``loser`` mask and the size of the parent pool at the top of the ranking; ``draw_parents``
then gives every loser a parent drawn uniformly from that pool (the pool is always a prefix of the ranking, so one
dynamic ``randint`` into ``order`` draws it). Members that are broken (``valid`` False: NaN fitness or non-finite
state) rank last and are always losers.

- ``truncation`` (Jaderberg et al. 2017; the default): the bottom ``k`` by rank lose; parents are the top ``k``.
- ``sigma_threshold`` (Isaac Lab's PBT, after DexPBT): with μ and σ (population std, ddof 0) of the valid members'
  fitness, members below ``min(μ - k σ, μ - A)`` lose and members above ``max(μ + k σ, μ + A)`` lead; a loser
  with no leader keeps its own weights (its parent is itself) and is only explored.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from popjax.types import Key


def rank_members(fitness: jax.Array, valid: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(order, rank)``: members best first (valid before invalid, higher fitness, then lower index), and each
    member's position in that order (0 = best)."""
    pop = fitness.shape[0]
    idx = jnp.arange(pop, dtype=jnp.int32)
    score = jnp.where(valid, fitness, -jnp.inf)
    order = jnp.lexsort((idx, -score, ~valid)).astype(jnp.int32)
    return order, jnp.zeros(pop, jnp.int32).at[order].set(idx)


def truncation(rank: jax.Array, valid: jax.Array, k: int) -> tuple[jax.Array, int]:
    """``(loser, leaders)``: the bottom ``k`` by rank (and every invalid member) lose; the top ``k`` lead."""
    return (rank >= rank.shape[0] - k) | ~valid, k


def sigma_threshold(fitness: jax.Array, valid: jax.Array, k: float, margin: float) -> tuple[jax.Array, jax.Array]:
    """``(loser, leaders)``: Isaac Lab's rule over the valid members (see the module docstring)."""
    n = jnp.maximum(valid.sum(), 1)
    x = jnp.where(valid, fitness, 0.0)
    mean = x.sum() / n
    std = jnp.sqrt(jnp.where(valid, (x - mean) ** 2, 0.0).sum() / n)
    upper = jnp.maximum(mean + k * std, mean + margin)
    lower = jnp.minimum(mean - k * std, mean - margin)
    loser = (valid & (fitness < lower)) | ~valid
    return loser, (valid & (fitness > upper)).sum()


def draw_parents(key: Key, order: jax.Array, loser: jax.Array, pool: jax.Array | int) -> jax.Array:
    """``[pop]`` int32: a loser's parent uniform over the best ``pool`` members (itself when the pool is empty);
    every other member is its own parent."""
    idx = jnp.arange(order.shape[0], dtype=jnp.int32)
    drawn = order[jax.random.randint(key, idx.shape, 0, jnp.maximum(pool, 1))]
    return jnp.where(loser & (jnp.asarray(pool) > 0), drawn, idx)
