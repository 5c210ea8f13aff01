"""Population-based training (Jaderberg et al. 2017) as one jitted population function.

``exploit_and_explore`` is pure jnp: rank the members by fitness, replace the bottom
``quantile`` (a static count ``int(quantile * N) >= 1``) by full copies of parents drawn
uniformly from the top ``quantile``, then explore the copied hyperparameters (resample from
the prior, the fast-PBT paper's choice, or perturb). The driver trains like ``independent``;
its state adds a ``PBTRecord`` (fitness window, counts, last round), so the whole decision
after an evaluation (record the returns, check readiness, exploit and explore) is one
compiled ``after_eval``; only the lineage is written on the host.

Choices:
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
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Annotated, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from pydantic import Field, PrivateAttr, ValidationInfo, model_validator

from popjax import plots
from popjax.distributed import fetch
from popjax.drivers.base import BuildContext, Counters, Driver, DriverDef, DriverHost, DriverOptions, run_config
from popjax.drivers.independent import make_population
from popjax.learners.base import ReplayStep, RolloutStep
from popjax.population import tree
from popjax.population.hparams import Range, hparams_table, validate_space
from popjax.population.search_spaces import SEARCH_SPACES
from popjax.registry import LEARNERS
from popjax.schema import Bool, Float, Int, Invalid, Kind, Number, NumberList, OneOf, problem, show, validate
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


@dataclasses.dataclass(frozen=True)
class SpaceOrName(Kind):
    """A named prior of ``SEARCH_SPACES`` or ``{hparam: {low, high, log, integer}}`` (checked with the learner)."""

    def describe(self) -> str:
        return f"one of {', '.join(SEARCH_SPACES)} or {{hparam: {{low, high, log, integer}}}}"

    def convert(self, value, context=None):
        if isinstance(value, str):
            if value not in SEARCH_SPACES:
                raise Invalid(f"{show(value)} unknown (allowed: {', '.join(SEARCH_SPACES)} "
                              "or {hparam: {low, high, log, integer}})")
            return value
        if isinstance(value, Mapping) and value:
            return {name: dict(r) if isinstance(r, Mapping) else r for name, r in value.items()}
        raise self.expected(value)


class PBTOptions(DriverOptions):
    """``pbt`` options (see ``PBTConfig``)."""

    interval: Int(ge=1, le=2**30) | None = Field(
        None, description="env steps per member between two exploit/explore rounds (checked at evaluations)",
        json_schema_extra={"default": "total_env_steps / 10, at least eval_interval"})
    quantile: Float(gt=0, le=0.5) = Field(
        0.3, description="fraction replaced at the bottom, and the parents' fraction at the top")
    explore: OneOf(EXPLORE_MODES) = Field(
        "resample", description="new hparams of a replaced member: resample from the prior, or perturb")
    perturb_factors: Annotated[tuple[float, ...], NumberList(
        Number(gt=0), "a non-empty list of positive numbers other than 1", min_len=1)] = Field(
        (0.8, 1.2), description="factors a perturbed hparam is multiplied by")
    resample_probability: Float(ge=0, le=1) = Field(
        0.25, description="chance that perturb resamples an hparam from the prior instead")
    fitness_window: Int(ge=1, le=1_000) = Field(
        1, description="fitness = mean of the member's last this-many evaluations")
    copy_buffer: Bool = Field(False, description="replaced members also copy the parent's replay buffer")
    search_space: Annotated[Any, SpaceOrName()] = Field(
        None, description="the explored hparams and their priors",
        json_schema_extra={"default": "the learner's name (the fast-PBT priors)"})
    _space: dict[str, Range] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _resolve(self, info: ValidationInfo):
        config = run_config(info)
        if 1.0 in self.perturb_factors:
            raise problem(f"expected a non-empty list of positive numbers other than 1, got "
                          f"{list(self.perturb_factors)}", at=("perturb_factors",))
        if self.interval is None:
            self.interval = default_interval(config.total_env_steps, config.eval_interval)
        if int(self.quantile * config.pop_size) < 1:
            raise problem(f"int({show(self.quantile)} x pop_size {config.pop_size}) = 0 members replaced; "
                          f"use quantile >= {1 / config.pop_size:.3g} or a larger population", at=("quantile",))
        hparams_cls = LEARNERS[config.learner].hparams_cls
        space = self.search_space
        if space is None:  # the learner's own prior
            space = LEARNERS[config.learner].search_space
            if space is None:
                raise problem(f"the learner {config.learner!r} declares no prior; give one of "
                              f"{', '.join(SEARCH_SPACES)} or {{hparam: {{low, high, log, integer}}}}",
                              at=("search_space",))
        elif isinstance(space, str):
            space = SEARCH_SPACES[space]
        self._space = validate_space(space, hparams_cls, at=("search_space",), nested=True)
        return self

    def searched_hparams(self) -> frozenset[str]:
        return frozenset(self._space)

    def pbt_config(self) -> PBTConfig:
        return PBTConfig(interval=self.interval, quantile=self.quantile, explore=self.explore,
                         perturb_factors=tuple(float(f) for f in self.perturb_factors),
                         resample_probability=self.resample_probability, fitness_window=self.fitness_window,
                         copy_buffer=self.copy_buffer, search_space=tuple(sorted(self._space.items())))


def parse_pbt_config(raw: Mapping[str, Any], *, learner: str, hparams_names: tuple[str, ...] = (), pop_size: int,
                     total_env_steps: int, eval_interval: int) -> PBTConfig:
    """Validates a ``pbt`` options block for a run with these settings; raises a one-line ConfigError.

    ``hparams_names`` is unused (kept for callers): the learner's HParams declare the names and bounds.
    """
    del hparams_names
    context = SimpleNamespace(learner=learner, pop_size=pop_size, total_env_steps=total_env_steps,
                              eval_interval=eval_interval)
    return validate(PBTOptions, dict(raw or {}), at=("pbt",), context={"config": context}).pbt_config()


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




# --- the driver ----------------------------------------------------------------------------------
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
        new, hparams, info = exploit_and_explore(key, copied, state.hparams, fitness, config)
        return new, hparams, info["loser"], info["parent"]

    def keep():
        return copied, state.hparams, jnp.zeros(pop, bool), jnp.arange(pop, dtype=jnp.int32)

    copied, hparams, loser, parent = jax.lax.cond(ready, exploit, keep)
    record = PBTRecord(window=window, count=jnp.where(loser, 0, record.count + 1),
                       last_ready=jnp.where(ready, steps, record.last_ready), rounds=record.rounds + ready)
    info = {"ready": ready, "loser": loser, "parent": parent, "fitness": fitness, "old_hparams": state.hparams}
    state = state.replace(**copied, hparams=hparams, pbt=record)
    if on_replace is not None:
        state = jax.lax.cond(ready, lambda s: on_replace(s, loser), lambda s: s, state)
    return state, info


class PBTHost(DriverHost):
    """Writes the lineage (one entry per replaced member and round) around the host of the driver PBT
    transforms (``inner``; by default the plain one), which keeps its own rows, records and checkpoints."""

    def __init__(self, inner: DriverHost | None = None):
        self.inner = inner or DriverHost(lambda state: state.hparams)
        super().__init__(self.inner.hparams)
        self.lineage: list[dict[str, Any]] = []

    def rows(self, state, metrics, returns):
        return self.inner.rows(state, metrics, returns)

    def record(self, state, env_steps, returns, info) -> None:
        self.inner.record(state, env_steps, returns, info)
        if not info["ready"]:
            return
        old, new = hparams_table(info["old_hparams"]), hparams_table(state.hparams)
        fitness, parent = info["fitness"], info["parent"]
        for m in np.flatnonzero(info["loser"]).tolist():
            p = int(parent[m])
            self.lineage.append({
                "env_steps": int(env_steps), "member": m, "parent": p,
                "fitness": _json_float(fitness[m]), "parent_fitness": _json_float(fitness[p]),
                "old_hparams": {name: values[m] for name, values in old.items()},
                "new_hparams": {name: values[m] for name, values in new.items()},
            })

    def summary(self, state) -> dict[str, Any]:
        record = fetch(state.pbt)
        return {**self.inner.summary(state), "lineage": [dict(e) for e in self.lineage], "pbt": {
            "rounds": int(record.rounds), "last_ready_env_steps": int(record.last_ready),
            "fitness_window": [[_json_float(v) for v in row] for row in np.asarray(record.window).tolist()],
            "window_count": np.asarray(record.count).tolist()}}

    def state_dict(self) -> dict[str, Any]:
        return {**self.inner.state_dict(), "lineage": [dict(e) for e in self.lineage]}

    def load_state_dict(self, data) -> None:
        self.inner.load_state_dict(data)
        self.lineage = [dict(e) for e in data.get("lineage", [])]


def _json_float(x: float) -> float | None:
    """NaN/inf -> None, so the lineage is strict JSON."""
    x = float(x)
    return x if math.isfinite(x) else None


def with_prior_hparams(ctx: BuildContext, config: PBTConfig) -> BuildContext:
    """``ctx`` with the initial hparams of the PBT space drawn from the prior, except those the user fixed
    (``hparams``) or sampled (``search_space``)."""
    keep = set(ctx.config.hparams) | set(ctx.config.search_space)
    return dataclasses.replace(ctx, hparams=initial_hparams(ctx.setup_key, ctx.hparams, config.space, keep))


def with_pbt(build_inner: Callable[[BuildContext], Driver], config: PBTConfig,
             carried: tuple[str, ...] = ("learner",)) -> Callable[[BuildContext], Driver]:
    """PBT as a transformer of a driver: ``ctx -> Driver`` of ``build_inner`` with exploit/explore after its
    evaluations.

    The inner driver is built from the context with the PBT space's initial hparams drawn from the prior (except
    those the user fixed or sampled); its ``init(key, pbt=record)`` must keep the ``PBTRecord`` in its state's
    ``pbt`` field, and its state must have ``counters``, ``hparams`` and the member-axis fields named in
    ``carried`` (what a loser copies from its parent). Its ``after_eval`` becomes PBT's and its host is wrapped by
    ``PBTHost`` (the lineage). Used by ``pbt`` (around the independent population) and ``hts`` (at barriers).
    """
    def build(ctx: BuildContext) -> Driver:
        ctx = with_prior_hparams(ctx, config)
        inner = build_inner(ctx)
        pop, total = ctx.config.pop_size, ctx.config.total_env_steps
        return inner._replace(
            init=lambda key: inner.init(key, pbt=initial_record(config.fitness_window, pop)),
            after_eval=lambda key, state, returns: pbt_after_eval(key, state, returns, config, total, carried,
                                                                  inner.on_replace),
            host=PBTHost(inner.host))

    return build


def build(ctx: BuildContext, options: PBTOptions) -> Driver:
    """The independent population, started from the prior and exploited after evaluations."""
    return with_pbt(lambda c: make_population(c, PBTState, MEMBER_AXES), options.pbt_config())(ctx)


def pbt_run_plots(run_dir) -> list:
    """``pbt_hparams.png`` (schedules from metrics.csv) and ``pbt_lineage.png`` (from summary.json)."""
    cfg, rows = run_dir.read_config(), run_dir.read_metrics()
    summary = run_dir.read_summary() if (run_dir.path / "summary.json").exists() else {}
    definition = LEARNERS.get(cfg.get("learner"))
    names = [f.name for f in dataclasses.fields(definition.hparams_cls)] if definition else []
    written = []
    if rows and names:
        written.append(plots.pbt_hparams_plot(rows, names, run_dir.path / "plots" / "pbt_hparams.png",
                                              f"PBT hyperparameters: {cfg.get('learner')} on {cfg.get('env')}"))
    if summary:
        written.append(plots.pbt_lineage_plot(summary.get("lineage", []), int(cfg["pop_size"]),
                                              float(summary.get("env_steps", cfg["total_env_steps"])),
                                              run_dir.path / "plots" / "pbt_lineage.png",
                                              final_returns=summary.get("final_returns")))
    return written


DEFINITION = DriverDef(name="pbt", build=build, options=PBTOptions, plots=pbt_run_plots,
                       steps=(ReplayStep, RolloutStep), sources=None)
