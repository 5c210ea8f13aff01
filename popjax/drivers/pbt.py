"""Population-based training (Jaderberg et al. 2017) as one jitted population function.

``exploit_and_explore`` is pure jnp: rank the members by fitness, replace the bottom
``quantile`` (a static count ``int(quantile * N) >= 1``) by full copies of parents drawn
uniformly from the top ``quantile``, then explore the copied hyperparameters (resample from
the prior, the fast-PBT paper's choice, or perturb). ``PBTDriver`` is the host hook the
training loop calls after every evaluation: it keeps the fitness window, decides when the
population is ready, calls the compiled exploit/explore and records the lineage.

Choices (reference/population-core.md §4.3):
  * The loser copies the parent's **whole learner state**: networks, targets, optimizer
    states and step counters (the release copies only the policy). The replay buffer is
    copied too with ``copy_buffer=True``; by default each member keeps its own data.
  * Ranking is a stable sort: members with equal fitness keep index order, so the lower
    index ranks higher. A member whose fitness is NaN or whose learner state holds a
    non-finite value ranks below every valid member and is always replaced (even beyond
    the static loser count).
  * Hyperparameters are traced arrays with fixed dtypes (``policy_delay`` is int32 in TD3),
    so neither the exploit nor the training step is retraced after an exploit.
  * Perturbation multiplies by a factor f drawn from ``perturb_factors`` (default 0.8 /
    1.2): for a log-uniform range the value itself (``log x + log f`` in log space), for a
    linear range the offset from its lower bound (``low + (x - low) f``; identical for
    ranges starting at 0, and it keeps U[0.9, 1] discounts moving inside the range). A step
    that would leave the range is reflected (divided by f instead) and then clipped; an
    integer that rounds back to its old value moves one unit in f's direction. With
    probability ``resample_probability`` a value is resampled from the prior instead.
  * No exploit runs at the final evaluation (it would replace members after their last
    evaluation, so the final returns would no longer describe the final state).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from popjax.config import ConfigError
from popjax.drivers.population import PopState
from popjax.population import tree
from popjax.population.hparams import Range, hparam_names, hparams_table
from popjax.population.search_spaces import get_search_space
from popjax.types import Key, PyTree

EXPLORE_MODES = ("resample", "perturb")


@dataclasses.dataclass(frozen=True)
class PBTConfig:
    """Static PBT settings (hashable: it is a static argument of the jitted exploit).

    Attributes:
      interval: env steps per member between two exploit/explore rounds (checked at evaluations).
      quantile: fraction replaced at the bottom and the parents' fraction at the top, in (0, 0.5].
      explore: ``resample`` (prior, the paper) or ``perturb``.
      perturb_factors: multiplicative factors for ``perturb``.
      resample_probability: per hparam, chance that ``perturb`` resamples from the prior instead.
      fitness_window: fitness = mean of the member's last this-many evaluations.
      copy_buffer: losers also copy the parent's replay buffer.
      search_space: ``((name, Range), ...)`` sorted by name: the explored hparams and their priors.
    """

    interval: int = 10_000
    quantile: float = 0.3
    explore: str = "resample"
    perturb_factors: tuple[float, ...] = (0.8, 1.2)
    resample_probability: float = 0.25
    fitness_window: int = 1
    copy_buffer: bool = False
    search_space: tuple[tuple[str, Range], ...] = ()

    def num_losers(self, pop_size: int) -> int:
        return int(self.quantile * pop_size)

    @property
    def space(self) -> dict[str, Range]:
        return dict(self.search_space)


PBT_KEYS = ("interval", "quantile", "explore", "perturb_factors", "resample_probability", "fitness_window",
            "copy_buffer", "search_space")


def default_interval(total_env_steps: int, eval_interval: int) -> int:
    """Ten PBT rounds per run by default, at least one evaluation apart."""
    return max(eval_interval, total_env_steps // 10)


def parse_pbt_config(raw: Mapping[str, Any], *, learner: str, hparams_names: tuple[str, ...], pop_size: int,
                     total_env_steps: int, eval_interval: int) -> PBTConfig:
    """Validates ``RunConfig.pbt`` and resolves its search space; raises a one-line ConfigError."""
    raw = dict(raw or {})
    unknown = sorted(set(raw) - set(PBT_KEYS))
    if unknown:
        raise ConfigError(f"pbt: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(PBT_KEYS)}")

    def number(name, kind, default):
        value = raw.get(name, default)
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if isinstance(value, str):
            try:
                value, ok = float(value), True
            except ValueError:
                ok = False
        if not ok or (kind is int and not float(value).is_integer()):
            raise ConfigError(f"pbt.{name}: expected {kind.__name__}, got {raw.get(name)!r}")
        return kind(value)

    interval = number("interval", int, default_interval(total_env_steps, eval_interval))
    if interval < 1:
        raise ConfigError(f"pbt.interval: must be >= 1 env step per member, got {interval}")
    quantile = number("quantile", float, 0.3)
    if not 0.0 < quantile <= 0.5:
        raise ConfigError(f"pbt.quantile: must lie in (0, 0.5], got {quantile}")
    if int(quantile * pop_size) < 1:
        raise ConfigError(f"pbt.quantile: int({quantile} x pop_size {pop_size}) = 0 members replaced; "
                          f"use quantile >= {1 / pop_size:.3g} or a larger population")
    explore = raw.get("explore", "resample")
    if explore not in EXPLORE_MODES:
        raise ConfigError(f"pbt.explore: {explore!r} unknown; allowed: {', '.join(EXPLORE_MODES)}")
    factors = raw.get("perturb_factors", (0.8, 1.2))
    if (not isinstance(factors, list | tuple) or not factors
            or not all(isinstance(f, int | float) and not isinstance(f, bool) and math.isfinite(f) and f > 0
                       and f != 1 for f in factors)):
        raise ConfigError(f"pbt.perturb_factors: expected a non-empty list of positive numbers != 1, "
                          f"got {factors!r}")
    resample_probability = number("resample_probability", float, 0.25)
    if not 0.0 <= resample_probability <= 1.0:
        raise ConfigError(f"pbt.resample_probability: must lie in [0, 1], got {resample_probability}")
    fitness_window = number("fitness_window", int, 1)
    if fitness_window < 1:
        raise ConfigError(f"pbt.fitness_window: must be >= 1 evaluation, got {fitness_window}")
    copy_buffer = raw.get("copy_buffer", False)
    if not isinstance(copy_buffer, bool):
        raise ConfigError(f"pbt.copy_buffer: expected true or false, got {copy_buffer!r}")
    try:
        space = get_search_space(raw.get("search_space", learner), hparams_names)
    except ValueError as err:
        raise ConfigError(f"pbt.search_space: {err}") from None
    return PBTConfig(interval=interval, quantile=quantile, explore=explore,
                     perturb_factors=tuple(float(f) for f in factors),
                     resample_probability=resample_probability,
                     fitness_window=fitness_window, copy_buffer=copy_buffer,
                     search_space=tuple(sorted(space.items())))


# --- pure population functions ------------------------------------------------------------------

def perturb_value(key: Key, value: jax.Array, r: Range, factors: tuple[float, ...]) -> jax.Array:
    """Scales by a random factor (reflected at the bounds, nudged for integers), clipped to ``r``."""
    f = jnp.asarray(factors, jnp.float32)[jax.random.randint(key, value.shape, 0, len(factors))]
    x = value.astype(jnp.float32)
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
    """New values for every member's explored hparams (the caller keeps them for losers only)."""
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


def exploit_and_explore(key: Key, states: PyTree, hparams, fitness: jax.Array, config: PBTConfig):
    """One PBT round over the whole population (pure, jit-able with ``config`` static).

    Args:
      key: PRNG key (parents and exploration).
      states: the pytree copied from parent to loser, member axis 0 (the learner state, plus
        the replay buffer when ``config.copy_buffer``).
      hparams: HParams with ``[pop]`` leaves.
      fitness: ``[pop]`` fitness, higher is better; NaN = broken member.
      config: static PBT settings.

    Returns:
      ``(states, hparams, info)``; ``info`` holds ``loser`` (bool ``[pop]``), ``parent`` (int32
      ``[pop]``, the member itself for non-losers), ``valid`` (bool ``[pop]``) and ``rank``
      (int32 ``[pop]``, 0 = best).
    """
    pop = fitness.shape[0]
    k = config.num_losers(pop)
    if not 1 <= k <= pop // 2:
        raise ValueError(f"int(quantile {config.quantile} x pop {pop}) = {k}; need 1 <= losers <= pop/2")
    idx = jnp.arange(pop, dtype=jnp.int32)
    fitness = fitness.astype(jnp.float32)
    valid = ~jnp.isnan(fitness) & member_finite(states)
    score = jnp.where(valid, fitness, -jnp.inf)
    # Best first: valid before invalid, then higher fitness, then lower member index.
    order = jnp.lexsort((idx, -score, ~valid)).astype(jnp.int32)
    rank = jnp.zeros(pop, jnp.int32).at[order].set(idx)
    loser = (rank >= pop - k) | ~valid
    key_parent, key_explore = jax.random.split(key)
    winners = order[:k]
    parent = jnp.where(loser, winners[jax.random.randint(key_parent, (pop,), 0, k)], idx)
    # Non-losers gather themselves: an exact copy, so no select is needed.
    new_states = tree.take(states, parent)
    parent_hparams = tree.take(hparams, parent)
    new_hparams = tree.where(loser, explore_hparams(key_explore, parent_hparams, config), parent_hparams)
    return new_states, new_hparams, {"loser": loser, "parent": parent, "valid": valid, "rank": rank}


def initial_hparams(key: Key, hparams, space: Mapping[str, Range], keep: set[str] | frozenset = frozenset()):
    """Samples every hparam of ``space`` not in ``keep`` from its prior, per member."""
    pop = tree.size(hparams)
    new = {}
    for i, (name, r) in enumerate(sorted(space.items())):
        if name not in keep:
            old = getattr(hparams, name)
            new[name] = r.sample(jax.random.fold_in(key, i), (pop,)).astype(old.dtype)
    return hparams.replace(**new)


# --- the host-side driver ----------------------------------------------------------------------

class PBTDriver:
    """Hook object for the training loop: evaluations in, exploit/explore when ready."""

    name = "pbt"

    def __init__(self, config: PBTConfig, pop_size: int, total_env_steps: int, sharding=None):
        self.config = config
        self.pop_size = pop_size
        self.total_env_steps = total_env_steps
        self.sharding = sharding
        self.trace_count = 0
        self.compile_s = 0.0  # the training loop books this as compile time, not run time
        self.window = np.full((config.fitness_window, pop_size), np.nan)
        self.count = np.zeros(pop_size, np.int64)  # evaluations in the window since the member's last exploit
        self.last_ready = 0
        self.rounds = 0
        self.lineage: list[dict[str, Any]] = []

        def traced(key, states, hparams, fitness):
            self.trace_count += 1  # runs only while tracing
            return exploit_and_explore(key, states, hparams, fitness, config)

        self._jit = jax.jit(traced, donate_argnums=(1, 2))
        self._compiled = None

    def _exploit(self, *args):
        if self._compiled is None:  # compiled once, ahead of time (timed separately)
            start = time.perf_counter()
            self._compiled = self._jit.lower(*args).compile()
            self.compile_s += time.perf_counter() - start
        return self._compiled(*args)

    def fitness(self) -> np.ndarray:
        """Mean of each member's last ``fitness_window`` evaluations (since its last exploit)."""
        out = np.empty(self.pop_size)
        for m in range(self.pop_size):
            c = max(1, min(self.count[m], self.config.fitness_window))
            out[m] = self.window[-c:, m].mean()
        return out

    def ready(self, env_steps: int) -> bool:
        return env_steps - self.last_ready >= self.config.interval and env_steps < self.total_env_steps

    def after_eval(self, key: Key, state: PopState, returns: jax.Array, env_steps: int) -> PopState:
        """Records the evaluation; runs one exploit/explore round when the population is ready."""
        self.window = np.roll(self.window, -1, axis=0)
        self.window[-1] = np.asarray(returns, np.float64)
        self.count += 1
        if not self.ready(env_steps):
            return state
        fitness = self.fitness()
        old = hparams_table(state.hparams)
        copy_buffer = self.config.copy_buffer
        states = (state.learner, state.buffer) if copy_buffer else state.learner
        states, hparams, info = self._exploit(key, states, state.hparams, jnp.asarray(fitness, jnp.float32))
        if self.sharding is not None:
            from popjax.population.sharding import shard_members

            states, hparams = shard_members((states, hparams), self.sharding)
        learner, buffer = states if copy_buffer else (states, state.buffer)
        state = state.replace(learner=learner, buffer=buffer, hparams=hparams)
        new = hparams_table(hparams)
        loser, parent = np.asarray(info["loser"]), np.asarray(info["parent"])
        for m in np.flatnonzero(loser).tolist():
            p = int(parent[m])
            self.lineage.append({
                "env_steps": int(env_steps), "member": m, "parent": p,
                "fitness": _json_float(fitness[m]), "parent_fitness": _json_float(fitness[p]),
                "old_hparams": {name: values[m] for name, values in old.items()},
                "new_hparams": {name: values[m] for name, values in new.items()},
            })
        self.count[loser] = 0
        self.last_ready = int(env_steps)
        self.rounds += 1
        return state

    def state_dict(self) -> dict[str, Any]:
        """Lineage (for summary.json) and the readiness state (for exact resume)."""
        return {
            "lineage": [dict(e) for e in self.lineage],
            "pbt": {
                "rounds": self.rounds, "last_ready_env_steps": self.last_ready,
                "fitness_window": [[_json_float(v) for v in row] for row in self.window.tolist()],
                "window_count": self.count.tolist(),
            },
        }

    def load_state_dict(self, data: dict[str, Any]) -> None:
        self.lineage = [dict(e) for e in data.get("lineage", [])]
        pbt = data.get("pbt", {})
        self.rounds = int(pbt.get("rounds", 0))
        self.last_ready = int(pbt.get("last_ready_env_steps", 0))
        if "fitness_window" in pbt:
            window = np.array([[np.nan if v is None else v for v in row] for row in pbt["fitness_window"]],
                              np.float64)
            if window.shape != self.window.shape:
                raise ValueError(f"pbt state: fitness window {window.shape} != {self.window.shape}")
            self.window = window
            self.count = np.asarray(pbt["window_count"], np.int64)


def _json_float(x: float) -> float | None:
    """NaN/inf -> None, so the lineage is strict JSON."""
    x = float(x)
    return x if math.isfinite(x) else None


def make_pbt_driver(run_config, learner_def, learner_config, sharding=None) -> PBTDriver:
    """Builds the driver from a RunConfig (validates ``run_config.pbt``)."""
    config = resolve_pbt_config(run_config, learner_def, learner_config)
    return PBTDriver(config, run_config.pop_size, run_config.total_env_steps, sharding)


def resolve_pbt_config(run_config, learner_def, learner_config) -> PBTConfig:
    names = hparam_names(learner_def.default_hparams(learner_config))
    return parse_pbt_config(run_config.pbt, learner=run_config.learner, hparams_names=names,
                            pop_size=run_config.pop_size, total_env_steps=run_config.total_env_steps,
                            eval_interval=run_config.eval_interval)


def pbt_initial_hparams(run_config, learner_def, learner_config, hparams):
    """The initial PBT population: hparams of the PBT space sampled from the prior, except those the
    user fixed (``hparams``) or sampled from ``search_space``."""
    config = resolve_pbt_config(run_config, learner_def, learner_config)
    keep = set(run_config.hparams) | set(run_config.search_space)
    key = jax.random.fold_in(jax.random.key(run_config.seed), 7)
    return initial_hparams(key, hparams, config.space, keep)


__all__ = ["PBTConfig", "PBTDriver", "exploit_and_explore", "explore_hparams", "initial_hparams",
           "make_pbt_driver", "parse_pbt_config", "perturb_value"]
