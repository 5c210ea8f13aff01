"""PBT's pure round: exploit and explore as jnp functions over the population, and the compiled ``after_eval``
that records the evaluation and runs a round when the population is ready (see ``popjax.drivers.pbt``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from popjax.drivers.base import Counters
from popjax.drivers.pbt_options import PBTConfig
from popjax.population import constraints, selection, tree
from popjax.population.hparams import Range
from popjax.types import Key, PyTree


def perturb_value(key: Key, value: jax.Array, r: Range, factors: tuple[float, ...]) -> jax.Array:
    """Scales by a random factor (reflected at the bounds, nudged for integers), clipped to ``r``; a categorical
    value moves to the next choice up (f > 1) or down (reflected at the ends, Ray's list step)."""
    f = jnp.asarray(factors, jnp.float32)[jax.random.randint(key, value.shape, 0, len(factors))]
    x = value.astype(jnp.float32)
    if r.choices:
        choices = jnp.asarray(r.choices, jnp.float32)
        i = jnp.argmin(jnp.abs(x[..., None] - choices), axis=-1)
        step = jnp.where(f > 1.0, 1, -1)
        j = jnp.where((i + step < 0) | (i + step >= len(r.choices)), i - step, i + step)
        return choices[jnp.clip(j, 0, len(r.choices) - 1)]
    # Log ranges scale the value (a step of log f in log space); linear ranges scale the
    # offset from the lower bound, so U[0.9, 1] (discount) moves inside its range too.
    origin = 0.0 if r.log else r.low
    new = origin + (x - origin) * f
    new = jnp.where((new > r.high) | (new < r.low), origin + (x - origin) / f, new)
    if r.integer:
        new = jnp.round(new)
        new = jnp.where(new == x, x + jnp.sign(f - 1.0), new)
        new = jnp.where((new > r.high) | (new < r.low), x - jnp.sign(f - 1.0), new)
    return r.clip(new)


def member_finite(states: PyTree) -> jax.Array:
    """``[pop]`` bool: every floating-point value of the member is finite."""
    leaves = jax.tree.leaves(states)
    ok = jnp.ones(leaves[0].shape[0], bool)
    for leaf in leaves:
        if jnp.issubdtype(leaf.dtype, jnp.inexact):
            ok = ok & jnp.isfinite(leaf.reshape(leaf.shape[0], -1)).all(axis=1)
    return ok


def explore_hparams(key: Key, hparams, config: PBTConfig):
    """New values for every member's explored hparams (the caller keeps them for losers only); ``pb2`` keeps the
    parent's here: the host proposes them after the round (``PBTHost.propose``)."""
    if config.explore == "pb2":
        return hparams
    pop = tree.size(hparams)
    new = {}
    for i, (name, r) in enumerate(config.search_space):
        key_name = jax.random.fold_in(key, i)
        key_sample, key_perturb, key_coin = jax.random.split(key_name, 3)
        old = getattr(hparams, name)
        value = r.sample(key_sample, (pop,))
        if config.explore == "perturb":
            perturbed = perturb_value(key_perturb, old, r, config.perturb_factors)
            coin = jax.random.uniform(key_coin, (pop,)) < config.resample_probability
            value = jnp.where(coin, value, perturbed)
        new[name] = value.astype(old.dtype)
    return hparams.replace(**new)


def exploit_and_explore(key: Key, states: PyTree, hparams, fitness: jax.Array, config: PBTConfig,
                        round_index: jax.Array | int = 0):
    """One PBT round over the whole population (pure, jit-able with ``config`` static).

    Args:
      key: PRNG key (parents and exploration).
      states: the pytree copied from parent to loser, member axis 0: ``{"learner": ..., ...}`` (the carried
        fields, plus the replay buffer when ``config.copy_buffer``); any pytree with ``copy: full`` and no
        ``reset_optimizer``.
      hparams: HParams with ``[pop]`` leaves.
      fitness: ``[pop]`` fitness, higher is better; NaN = broken member.
      config: static PBT settings.
      round_index: rounds done before this one (multi-frequency PBT's sub-populations evolve by it).

    Returns:
      ``(states, hparams, info)``; ``info`` holds ``loser`` (bool ``[pop]``: copied or explored), ``explored``
      (bool ``[pop]``: new hparams from ``explore``), ``parent`` (int32 ``[pop]``, whose weights; the member itself
      when it keeps its own), ``valid`` (bool ``[pop]``) and ``rank`` (int32 ``[pop]``, 0 = best).
    """
    pop = fitness.shape[0]
    idx = jnp.arange(pop, dtype=jnp.int32)
    fitness = fitness.astype(jnp.float32)
    valid = ~jnp.isnan(fitness) & member_finite(states)
    order, rank = selection.rank_members(fitness, valid)
    key_parent, key_explore = jax.random.split(key)
    if config.subpopulations:
        parent, hparams_from, explored = selection.multi_frequency(
            fitness, valid, round_index, config.subpopulations, config.frequencies, config.quantile)
    else:
        if config.selection == "sigma":
            explored, leaders = selection.sigma_threshold(fitness, valid, config.threshold_std, config.threshold_abs)
        else:
            k = config.num_losers(pop)
            if not 1 <= k <= pop // 2:
                raise ValueError(f"int(quantile {config.quantile} x pop {pop}) = {k}; need 1 <= losers <= pop/2")
            explored, leaders = selection.truncation(rank, valid, k)
        pool = leaders if config.parents == "top" else (valid & ~explored).sum()
        parent = hparams_from = selection.draw_parents(key_parent, order, explored, pool)
    loser = explored | (parent != idx)
    new_states = copy_members(states, parent, loser, config)
    parent_hparams = tree.take(hparams, hparams_from)
    new_hparams = tree.where(explored, explore_hparams(key_explore, parent_hparams, config), parent_hparams)
    new_hparams = constraints.enforce(jax.random.fold_in(key_explore, 1 << 20), new_hparams, parent_hparams,
                                      config.space, config.constraints, redraw=explored)
    return new_states, new_hparams, {"loser": loser, "explored": explored, "parent": parent, "valid": valid,
                                     "rank": rank}


def copy_members(states: PyTree, parent: jax.Array, loser: jax.Array, config: PBTConfig) -> PyTree:
    """``states`` after every member copied its parent's: all of it (``copy: full``) or only the learner state's
    policy fields (``copy: policy``); with ``reset_optimizer`` a loser's optimizer states of the params it
    copied start afresh (zeros: a fresh Adam state)."""
    if config.copy == "full":
        new, copied = tree.take(states, parent), {params for _, params in config.optimizer_state}
    else:  # non-losers are their own parents: gathering leaves them as they are
        learner = states["learner"]
        for path in config.policy_state:
            learner = tree.replace_path(learner, path, tree.take(tree.get_path(learner, path), parent))
        new, copied = {**states, "learner": learner}, set(config.policy_state)
    if config.reset_optimizer:
        learner = new["learner"]
        for opt, params in config.optimizer_state:
            if params in copied:
                old = tree.get_path(learner, opt)
                learner = tree.replace_path(learner, opt, tree.where(loser, jax.tree.map(jnp.zeros_like, old), old))
        new = {**new, "learner": learner}
    return new


def initial_hparams(key: Key, hparams, space: Mapping[str, Range], keep: set[str] | frozenset = frozenset(),
                    config: PBTConfig | None = None):
    """Samples every hparam of ``space`` not in ``keep`` from its prior, per member (with ``config``'s
    constraints kept: redrawn, else its feasible point)."""
    pop = tree.size(hparams)
    new = {}
    for i, (name, r) in enumerate(sorted(space.items())):
        if name not in keep:
            old = getattr(hparams, name)
            new[name] = r.sample(jax.random.fold_in(key, i), (pop,)).astype(old.dtype)
    hparams = hparams.replace(**new)
    if config is None or not config.constraints:
        return hparams
    fallback = hparams.replace(**{n: jnp.full_like(getattr(hparams, n), v) for n, v in config.feasible})
    return constraints.enforce(jax.random.fold_in(key, 1 << 20), hparams, fallback, space, config.constraints)


@struct.dataclass
class PBTRecord:
    """PBT's variables in the state (replicated; tiny)."""

    window: jax.Array  # [fitness_window, pop] float32: the last evaluations, newest last (NaN = none yet)
    count: jax.Array  # [pop] int32: evaluations in the window since the member's last exploit
    last_ready: jax.Array  # int32: env steps per member at the last round
    rounds: jax.Array  # int32: rounds done


@struct.dataclass
class PBTState:
    """``PopState``'s fields (the independent driver trains it) plus the ``PBTRecord``."""

    learner: Any
    buffer: Any
    hparams: Any
    counters: Counters
    pbt: PBTRecord


MEMBER_AXES = PBTState(learner=True, buffer=True, hparams=True, counters=False, pbt=False)


def initial_record(fitness_window: int, pop_size: int) -> PBTRecord:
    return PBTRecord(window=jnp.full((fitness_window, pop_size), jnp.nan, jnp.float32),
                     count=jnp.zeros(pop_size, jnp.int32), last_ready=jnp.zeros((), jnp.int32),
                     rounds=jnp.zeros((), jnp.int32))


def window_fitness(window: jax.Array, count: jax.Array) -> jax.Array:
    """``[pop]``: mean of each member's last ``clip(count, 1, W)`` evaluations (NaN if one is NaN)."""
    w = window.shape[0]
    c = jnp.clip(count, 1, w)
    recent = jnp.arange(w)[:, None] >= w - c[None, :]
    return jnp.where(recent, window, 0.0).sum(axis=0) / c


def pbt_after_eval(key: Key, state, returns: jax.Array, config: PBTConfig, total_env_steps: int,
                   carried: tuple[str, ...] = ("learner",), on_replace: Callable | None = None):
    """Records the evaluation; when the population is ready, one exploit/explore round.

    ``state`` has ``counters``, ``hparams``, ``pbt`` (a ``PBTRecord``) and the member-axis fields named in
    ``carried``, which a loser copies from its parent (plus ``buffer`` with ``copy_buffer``): the learner
    state here; the HTS driver adds its behaviour state and staged segment, so a copied member continues
    exactly as its parent would. ``on_replace(state, loser)``: the inner driver's update of what a loser derives
    from its new learner state (``Driver.on_replace``), run in the round. Ready = ``interval`` env steps per member
    since the last round and not the
    final evaluation. Returns ``(state, info)``; ``info`` holds ``ready``, ``loser`` and ``parent``
    ``[pop]``, the ``fitness`` used and the hparams before the round (for the lineage).
    """
    record = state.pbt
    window = jnp.concatenate([record.window[1:], jnp.asarray(returns, jnp.float32)[None]])
    fitness = window_fitness(window, record.count + 1)
    steps = state.counters.env_steps
    ready = (steps - record.last_ready >= config.interval) & (steps < total_env_steps)
    pop = fitness.shape[0]
    copied = {name: getattr(state, name) for name in carried + (("buffer",) if config.copy_buffer else ())}

    def exploit():
        new, hparams, info = exploit_and_explore(key, copied, state.hparams, fitness, config, record.rounds)
        return new, hparams, info["loser"], info["explored"], info["parent"]

    def keep():
        return copied, state.hparams, jnp.zeros(pop, bool), jnp.zeros(pop, bool), jnp.arange(pop, dtype=jnp.int32)

    copied, hparams, loser, explored, parent = jax.lax.cond(ready, exploit, keep)
    record = PBTRecord(window=window, count=jnp.where(loser, 0, record.count + 1),
                       last_ready=jnp.where(ready, steps, record.last_ready), rounds=record.rounds + ready)
    info = {"ready": ready, "loser": loser, "explored": explored, "parent": parent, "fitness": fitness,
            "old_hparams": state.hparams, "env_steps": steps}
    state = state.replace(**copied, hparams=hparams, pbt=record)
    if on_replace is not None:
        state = jax.lax.cond(ready, lambda s: on_replace(s, loser), lambda s: s, state)
    return state, info
