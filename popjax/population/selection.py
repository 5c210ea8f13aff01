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
import numpy as np

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


def multi_frequency(fitness: jax.Array, valid: jax.Array, round_index: jax.Array, sizes: tuple[int, ...],
                    frequencies: tuple[int, ...], quantile: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    """MF-PBT (Doulazmi et al. 2025; WaelDLZ/MF-PBT ``hpo/mfpbt.py``): ``(parent, hparams_from, explored)``.

    Members are split into sub-populations of ``sizes`` (in member order); sub-population i evolves in round r
    (counted from 0) when ``(r + 1) % frequencies[i] == 0``. Ranked within it, best first, with q =
    ``int(quantile * n)``: B1 the top q, B3 the q above the bottom q, B4 the bottom q.

    - Internal exploit: the k-th best of B4 takes the weights and hparams of the k-th best of B1 and is explored.
    - Migration: each B3 member, best first, meets the best member left among all other sub-populations (their
      fitness of this round); if that one is better, the B3 member takes its weights and the candidate leaves the
      list. Its hparams come with the weights from a steadier sub-population (larger frequency), and from the best
      member of its own sub-population when the migrant is from a more dynamic one. Migrants are not explored.

    Every copy reads the round's snapshot (a gather), so a member replaced this round still passes on its old
    weights (the reference code copies in place and can pass on a replaced row).

    Broken members (``valid`` False) are replaced in every round, also in a sub-population that rests and beyond
    the q of B4: a member that would keep (or take) broken weights takes the weights and hparams of its
    sub-population's best valid member (the population's, if it has none) and is explored, as a truncation loser.
    """
    pop = fitness.shape[0]
    idx = jnp.arange(pop, dtype=jnp.int32)
    score = jnp.where(valid, fitness, -jnp.inf)
    group = np.repeat(np.arange(len(sizes)), sizes)
    delta = jnp.asarray(np.repeat(frequencies, sizes), jnp.int32)
    parent, hparams_from, explored, best = idx, idx, jnp.zeros(pop, bool), idx
    start = 0
    for i, (n, f) in enumerate(zip(sizes, frequencies, strict=True)):
        q, members = int(quantile * n), idx[start:start + n]
        ranked = members[jnp.lexsort((members, -score[start:start + n], ~valid[start:start + n]))]
        best = best.at[members].set(ranked[0])
        b1, b3, b4 = ranked[:q], ranked[n - 2 * q:n - q], ranked[n - q:]
        new_parent, new_from = parent.at[b4].set(b1), hparams_from.at[b4].set(b1)
        new_explored = explored.at[b4].set(True)
        others = valid & jnp.asarray(group != i)
        candidates = jnp.lexsort((idx, -score, ~others)).astype(jnp.int32)  # other sub-populations, best first
        j = jnp.zeros((), jnp.int32)
        for b in b3:
            c = candidates[jnp.minimum(j, pop - 1)]
            take = (j < others.sum()) & (score[c] > score[b])
            new_parent = new_parent.at[b].set(jnp.where(take, c, b))
            new_from = new_from.at[b].set(jnp.where(take, jnp.where(delta[c] > f, c, ranked[0]), b))
            j = j + take
        evolve = (round_index + 1) % f == 0
        parent, hparams_from = jnp.where(evolve, new_parent, parent), jnp.where(evolve, new_from, hparams_from)
        explored = jnp.where(evolve, new_explored, explored)
        start += n
    fallback = jnp.where(valid[best], best, jnp.lexsort((idx, -score, ~valid))[0].astype(jnp.int32))
    broken = ~valid[parent] & valid[fallback]  # it would train on broken weights: replaced whatever the round
    parent, hparams_from = jnp.where(broken, fallback, parent), jnp.where(broken, fallback, hparams_from)
    return parent, hparams_from, explored | broken
