"""Population-based training (Jaderberg et al. 2017) as one jitted population function.

``exploit_and_explore`` is pure jnp: rank the members by fitness, replace the bottom
``quantile`` (a static count ``int(quantile * N) >= 1``) by full copies of parents drawn
uniformly from the top ``quantile``, then explore the copied hyperparameters (resample from
the prior, the fast-PBT paper's choice, or perturb). The driver trains like ``independent``;
its state adds a ``PBTRecord`` (fitness window, counts, last round), so the whole decision
after an evaluation (record the returns, check readiness, exploit and explore) is one
compiled ``after_eval``; only the lineage is written on the host.

Every part of the round is an option (``PBTConfig``), so a strategy is data, not a branch elsewhere:
  * who is replaced and from whom: ``selection`` (``truncation``, or Isaac Lab's ``sigma`` threshold), ``parents``
    (``top`` or the release's ``non_bottom``), or multi-frequency PBT's ``subpopulations``/``frequencies``
    (``popjax.population.selection``);
  * what is copied: ``copy`` (``full`` or the release's ``policy``, the learner's declared ``policy_state``) and
    ``reset_optimizer`` (its declared ``optimizer_state``);
  * the new hparams: ``explore`` (``resample``, ``perturb``, or ``pb2``: proposed on the host by
    ``PBTHost.propose`` with ``popjax.population.pb2`` and written by the compiled ``set_hparams``), kept inside
    the ``constraints`` (``popjax.population.constraints``).

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

import csv
import dataclasses
import math
import warnings
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
from popjax.drivers.schedule import ancestry, best_member
from popjax.learners.base import ReplayStep, RolloutStep
from popjax.population import constraints, selection, tree
from popjax.population.constraints import Constraint
from popjax.population.hparams import Range, hparams_table, validate_space
from popjax.population.pb2 import PB2
from popjax.population.search_spaces import SEARCH_SPACES
from popjax.registry import LEARNERS
from popjax.schema import (
    Bool,
    ConfigError,
    Float,
    Int,
    Invalid,
    Kind,
    Number,
    NumberList,
    OneOf,
    problem,
    show,
    validate,
)
from popjax.types import Key, PyTree

EXPLORE_MODES = ("resample", "perturb", "pb2")
SELECTIONS = ("truncation", "sigma")
PARENTS = ("top", "non_bottom")
COPIES = ("full", "policy")


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
      selection: ``truncation`` (bottom/top ``quantile``) or ``sigma`` (Isaac Lab's mean ± k·σ rule).
      threshold_std, threshold_abs: ``sigma``'s k and absolute margin A.
      parents: ``top`` (the top quantile, or the leaders under ``sigma``) or ``non_bottom`` (every valid member
        that is not replaced: the fast-PBT release).
      copy: ``full`` (the whole learner state) or ``policy`` (only ``policy_state``: the release).
      reset_optimizer: replaced members start the optimizer states of what they copied afresh.
      policy_state: the learner state's policy fields (dotted paths; ``LearnerDef.policy_state``).
      optimizer_state: ``((optimizer field, params field), ...)`` of the learner state (``LearnerDef``).
      subpopulations, frequencies: multi-frequency PBT (``selection.multi_frequency``): sub-population sizes in
        member order and their evolution periods in rounds; empty: one population.
      constraints: relations the explored hparams keep (``popjax.population.constraints``).
      feasible: ``((name, value), ...)`` satisfying every constraint (the start's fallback).
    """

    interval: int = 10_000
    quantile: float = 0.3
    explore: str = "resample"
    perturb_factors: tuple[float, ...] = (0.8, 1.2)
    resample_probability: float = 0.25
    fitness_window: int = 1
    copy_buffer: bool = False
    search_space: tuple[tuple[str, Range], ...] = ()
    selection: str = "truncation"
    threshold_std: float = 0.1
    threshold_abs: float = 0.05
    parents: str = "top"
    copy: str = "full"
    reset_optimizer: bool = False
    policy_state: tuple[str, ...] = ()
    optimizer_state: tuple[tuple[str, str], ...] = ()
    subpopulations: tuple[int, ...] = ()
    frequencies: tuple[int, ...] = ()
    constraints: tuple[Constraint, ...] = ()
    feasible: tuple[tuple[str, float], ...] = ()

    def num_losers(self, pop_size: int) -> int:
        return int(self.quantile * pop_size)

    @property
    def space(self) -> dict[str, Range]:
        return dict(self.search_space)


PBT_KEYS = ("interval", "quantile", "explore", "perturb_factors", "resample_probability", "fitness_window",
            "copy_buffer", "search_space", "selection", "threshold_std", "threshold_abs", "parents", "copy",
            "reset_optimizer", "subpopulations", "frequencies", "constraints")


def default_interval(total_env_steps: int, eval_interval: int) -> int:
    """Ten PBT rounds per run by default, at least one evaluation apart."""
    return max(eval_interval, total_env_steps // 10)


@dataclasses.dataclass(frozen=True)
class SpaceOrName(Kind):
    """A named prior of ``SEARCH_SPACES`` or ``{hparam: {low, high, log, integer}}`` (checked with the learner)."""

    def describe(self) -> str:
        return f"one of {', '.join(SEARCH_SPACES)} or {{hparam: {{low, high, log, integer}} or {{choices}}}}"

    def convert(self, value, context=None):
        if isinstance(value, str):
            if value not in SEARCH_SPACES:
                raise Invalid(f"{show(value)} unknown (allowed: {', '.join(SEARCH_SPACES)} "
                              "or {hparam: {low, high, log, integer}})")
            return value
        if isinstance(value, Mapping) and value:
            return {name: dict(r) if isinstance(r, Mapping) else r for name, r in value.items()}
        raise self.expected(value)


@dataclasses.dataclass(frozen=True)
class ConstraintList(Kind):
    """A list of constraint texts (parsed with the run's explored hparams by ``PBTOptions``)."""

    def describe(self) -> str:
        return "a list of '<hparam> <op> <hparam or number>'"

    def convert(self, value, context=None):
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise self.expected(value)
        return tuple(value)


# The option is named ``copy`` as in the issue and the papers; pydantic warns that it shadows BaseModel.copy
# (deprecated; popjax uses model_copy nowhere on options).
warnings.filterwarnings("ignore", message='Field name "copy" in "PBTOptions" shadows', category=UserWarning)


class PBTOptions(DriverOptions):
    """``pbt`` options (see ``PBTConfig``). Each release variant names the fast-PBT paper's and release's choice."""

    interval: Int(ge=1, le=2**30) | None = Field(
        None, description="env steps per member between two exploit/explore rounds (checked at evaluations)",
        json_schema_extra={"default": "total_env_steps / 10, at least eval_interval"})
    quantile: Float(gt=0, le=0.5) = Field(
        0.3, description="fraction replaced at the bottom, and the parents' fraction at the top (fast-PBT paper: "
        "0.3; its release: 0.4 in train_pbt.py)")
    explore: OneOf(EXPLORE_MODES) = Field(
        "resample", description="new hparams of a replaced member: resample from the prior (paper and release), "
        "perturb, or pb2 (a time-varying GP bandit fitted to the population's recent improvements; the "
        "search_space ranges are its bounds)")
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
    selection: OneOf(SELECTIONS) = Field(
        "truncation", description="who is replaced: truncation (the bottom quantile), or sigma (Isaac Lab: "
        "fitness below min(mean - threshold_std * std, mean - threshold_abs); leaders above the mirrored cut)")
    threshold_std: Float(ge=0, le=100) = Field(0.1, description="sigma selection: k, in population stds "
                                                                "(Isaac Lab default)")
    threshold_abs: Float(ge=0) = Field(0.05, description="sigma selection: absolute margin A, in fitness units "
                                                          "(Isaac Lab default)")
    parents: OneOf(PARENTS) = Field(
        "top", description="parents of replaced members: top (the top quantile, or sigma's leaders: the paper) or "
        "non_bottom (every member not replaced: the fast-PBT release)")
    copy: OneOf(COPIES) = Field(
        "full", description="what a replaced member copies: full (learner state: the paper) or policy (the "
        "policy only, keeping its critic, optimizer and buffer: the fast-PBT release)")
    reset_optimizer: Bool = Field(
        False, description="replaced members start the optimizer state of what they copied afresh (the release "
        "resets the policy's Adam; the paper copies it)")
    subpopulations: Annotated[tuple[int, ...] | None, NumberList(
        Number(integer=True, ge=1), "a list of sub-population sizes summing to pop_size", min_len=2)] = Field(
        None, description="multi-frequency PBT (MF-PBT): sub-population sizes in member order; each evolves every "
        "interval x its frequency, and its quantile above the bottom takes better members of other sub-populations",
        json_schema_extra={"default": "none: one population"})
    frequencies: Annotated[tuple[int, ...] | None, NumberList(
        Number(integer=True, ge=1, le=1_000_000), "a list of increasing positive integers, one per sub-population",
        min_len=2, increasing=True)] = Field(
        None, description="multi-frequency PBT: each sub-population's evolution period in rounds (MF-PBT: "
        "[1, 10, 25, 50] with rounds of 1M env steps)", json_schema_extra={"default": "none"})
    constraints: Annotated[tuple[str, ...] | None, ConstraintList()] = Field(
        None, description="relations the explored hparams keep, e.g. 'noise_clip >= target_noise' or 'policy_delay "
        "divides 4'; explored values that break one are redrawn (or the parent's kept), never trained",
        json_schema_extra={"default": "none", "allowed": "a list of '<hparam> <op> <hparam, number or integer run "
                           "option>', op one of <=, >=, <, >, divides"})
    _space: dict[str, Range] = PrivateAttr(default_factory=dict)
    _learner: str = PrivateAttr("")
    _constraints: tuple[Constraint, ...] = PrivateAttr(())
    _feasible: dict[str, float] = PrivateAttr(default_factory=dict)

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
        self._learner = config.learner
        self._check_release_variants(config)
        self._check_subpopulations(config)
        self._check_constraints(config)
        return self

    def _check_constraints(self, config) -> None:
        if self.explore == "pb2":  # PB2's GP needs numeric bounds for every explored hparam
            for name, r in self._space.items():
                if r.choices:
                    raise problem("pb2 needs a {low, high} bound for every explored hparam; categorical choices have "
                                  "none (allowed: low and high, or explore: resample or perturb)",
                                  at=("search_space", name))
        if not self.constraints:
            return
        numbers = {f: getattr(config, f) for f in ("rollout_len", "envs_per_member", "batch_size", "pop_size")
                   if hasattr(config, f)}
        parsed = []
        for i, text in enumerate(self.constraints):
            try:
                parsed.append(constraints.parse(text, tuple(self._space), numbers))
            except Invalid as err:
                raise problem(str(err), at=("constraints", i)) from None
        fixed = set(getattr(config, "hparams", {})) | set(getattr(config, "search_space", {}))
        for i, c in enumerate(parsed):
            for name in c.names:
                if name in fixed:
                    raise problem(f"{name} is set by the run's hparams or search_space; a constrained hparam starts "
                                  "from the PBT prior (allowed: leave it out there)", at=("constraints", i))
        try:
            self._feasible = constraints.feasible_point(self._space, parsed)
        except Invalid as err:
            raise problem(str(err), at=("constraints", *err.at)) from None
        self._constraints = tuple(parsed)

    def _check_subpopulations(self, config) -> None:
        sizes, frequencies = self.subpopulations, self.frequencies
        if (sizes is None) != (frequencies is None):
            missing = "frequencies" if frequencies is None else "subpopulations"
            raise problem("required with " + ("subpopulations" if missing == "frequencies" else "frequencies") +
                          " (allowed: one per sub-population)", at=(missing,))
        if sizes is None:
            return
        if sum(sizes) != config.pop_size:
            raise problem(f"sizes {list(sizes)} sum to {sum(sizes)}, not pop_size {config.pop_size} (allowed: "
                          f"sizes summing to {config.pop_size})", at=("subpopulations",))
        if len(frequencies) != len(sizes):
            raise problem(f"{len(frequencies)} values for {len(sizes)} sub-populations (allowed: one per "
                          "sub-population)", at=("frequencies",))
        small = [n for n in sizes if not 1 <= int(self.quantile * n) <= n // 3]
        if small:
            raise problem(f"a sub-population of {small[0]} has no distinct top, third and bottom quantile at "
                          f"quantile {show(self.quantile)} (allowed: sizes n with 1 <= int(quantile x n) <= n/3)",
                          at=("subpopulations",))
        for field, value in (("selection", "truncation"), ("parents", "top")):
            if getattr(self, field) != value:
                raise problem(f"multi-frequency PBT has its own selection (allowed: {value} with subpopulations)",
                              at=(field,))

    def _check_release_variants(self, config) -> None:
        definition = LEARNERS[config.learner]
        if self.copy == "policy":
            if not definition.policy_state:
                offering = ", ".join(n for n, d in LEARNERS.items() if d.policy_state)
                raise problem(f"the learner {config.learner} declares no policy state to copy alone "
                              f"(allowed: full; policy with {offering})", at=("copy",))
            if getattr(config, "driver", "pbt") != "pbt":  # hts carries behaviour states and segments too
                raise problem(f"policy copies run under the pbt driver, not {config.driver} (allowed: full)",
                              at=("copy",))
            if self.copy_buffer:
                raise problem("a policy-only copy keeps the member's buffer (allowed: false with copy: policy)",
                              at=("copy_buffer",))
        if self.reset_optimizer and not definition.optimizer_state:
            offering = ", ".join(n for n, d in LEARNERS.items() if d.optimizer_state)
            raise problem(f"the learner {config.learner} declares no optimizer state (allowed: false; true with "
                          f"{offering})", at=("reset_optimizer",))

    def searched_hparams(self) -> frozenset[str]:
        return frozenset(self._space)

    def pbt_config(self) -> PBTConfig:
        definition = LEARNERS[self._learner]
        return PBTConfig(interval=self.interval, quantile=self.quantile, explore=self.explore,
                         perturb_factors=tuple(float(f) for f in self.perturb_factors),
                         resample_probability=self.resample_probability, fitness_window=self.fitness_window,
                         copy_buffer=self.copy_buffer, search_space=tuple(sorted(self._space.items())),
                         selection=self.selection, threshold_std=self.threshold_std,
                         threshold_abs=self.threshold_abs, parents=self.parents, copy=self.copy,
                         reset_optimizer=self.reset_optimizer, policy_state=tuple(definition.policy_state),
                         optimizer_state=tuple(sorted(definition.optimizer_state.items())),
                         subpopulations=tuple(self.subpopulations or ()), frequencies=tuple(self.frequencies or ()),
                         constraints=self._constraints, feasible=tuple(sorted(self._feasible.items())))


def parse_pbt_config(raw: Mapping[str, Any], *, learner: str, hparams_names: tuple[str, ...] = (), pop_size: int,
                     total_env_steps: int, eval_interval: int, **run: Any) -> PBTConfig:
    """Validates a ``pbt`` options block for a run with these settings (``run``: other RunConfig fields, e.g.
    ``rollout_len`` for constraints); raises a one-line ConfigError.

    ``hparams_names`` is unused (kept for callers): the learner's HParams declare the names and bounds.
    """
    del hparams_names
    context = SimpleNamespace(learner=learner, pop_size=pop_size, total_env_steps=total_env_steps,
                              eval_interval=eval_interval, **run)
    return validate(PBTOptions, dict(raw or {}), at=("pbt",), context={"config": context}).pbt_config()


# --- pure population functions ------------------------------------------------------------------

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


class PBTHost(DriverHost):
    """Writes the lineage (one entry per replaced member and round) around the host of the driver PBT
    transforms (``inner``; by default the plain one), which keeps its own rows, records and checkpoints. With
    ``explore: pb2`` it also keeps PB2's data and proposes the replaced members' hparams (seeded by the run's
    ``seed`` and the round's env steps, so a resumed run proposes the same)."""

    def __init__(self, inner: DriverHost | None = None, config: PBTConfig | None = None, seed: int = 0):
        self.inner = inner or DriverHost(lambda state: state.hparams)
        super().__init__(self.inner.hparams)
        self.lineage: list[dict[str, Any]] = []
        self.rounds: list[dict[str, Any]] = []  # lineage.csv: every member at every round (round 0: initial)
        self.pb2 = PB2(config.search_space) if config is not None and config.explore == "pb2" else None
        self.config, self.seed = config, seed

    def propose(self, state, info):
        if self.pb2 is None or not info["ready"]:
            return None
        t, fitness, parent = int(info["env_steps"]), np.asarray(info["fitness"]), np.asarray(info["parent"])
        old = hparams_table(info["old_hparams"])
        for m in range(len(fitness)):
            self.pb2.log(m, t, fitness[m], self.pb2.unit({name: old[name][m] for name, _ in self.pb2.space}))
        losers = np.flatnonzero(info["explored"]).tolist()
        contexts = [self.pb2.context(int(parent[m]), t) for m in losers]
        picks = self.pb2.propose(contexts, np.random.default_rng([self.seed, t]))
        hparams = fetch(self.hparams(state))
        columns = {name: np.array(getattr(hparams, name)) for name, _ in self.pb2.space}
        rng = np.random.default_rng([self.seed, t, 1])
        for m, pick in zip(losers, picks, strict=True):
            values = self._keep_constraints(self.pb2.values(pick), {n: old[n][parent[m]] for n in old}, rng)
            for name, value in values.items():
                columns[name][m] = value
            # the member's next improvement is measured from its parent's weights and fitness
            self.pb2.log(m, t, fitness[parent[m]], self.pb2.unit(values))
        return hparams.replace(**columns)

    def rows(self, state, metrics, returns):
        return self.inner.rows(state, metrics, returns)

    def record(self, state, env_steps, returns, info) -> None:
        self.inner.record(state, env_steps, returns, info)
        if not self.rounds:  # round 0: every member's initial hparams
            self._log_round(0, info["old_hparams"], range(len(returns)), [None] * len(returns))
        if not info["ready"]:
            return
        old, new = hparams_table(info["old_hparams"]), hparams_table(state.hparams)
        fitness, parent = info["fitness"], info["parent"]
        self._log_round(env_steps, state.hparams, parent.tolist(), fitness.tolist())
        for m in np.flatnonzero(info["loser"]).tolist():
            p = int(parent[m])
            self.lineage.append({
                "env_steps": int(env_steps), "member": m, "parent": p,
                "fitness": _json_float(fitness[m]), "parent_fitness": _json_float(fitness[p]),
                "old_hparams": {name: values[m] for name, values in old.items()},
                "new_hparams": {name: values[m] for name, values in new.items()},
            })

    def _keep_constraints(self, values: dict[str, float], parent: dict[str, float], rng) -> dict[str, float]:
        """A PB2 pick that breaks a constraint: redrawn from the prior, else the parent's values (as in the
        compiled explore)."""
        cs = self.config.constraints
        if not cs or constraints.satisfied(cs, values):
            return values
        names, space = sorted({n for c in cs for n in c.names}), self.config.space
        for _ in range(constraints.TRIES):
            draw = {**values, **{n: float(space[n].sample_numpy(rng, 1)[0]) for n in names}}
            if constraints.satisfied(cs, draw):
                return draw
        return {**values, **{n: parent[n] for n in names}}

    def _log_round(self, env_steps, hparams, parent, fitness) -> None:
        """One ``lineage.csv`` row per member: who it copied (itself when not replaced), its fitness at the round
        and the hparams it trains with from there."""
        r = self.rounds[-1]["round"] + 1 if self.rounds else 0
        table = hparams_table(hparams)
        for m, (p, f) in enumerate(zip(parent, fitness, strict=True)):
            self.rounds.append({"round": r, "member": m, "parent": int(p),
                                "fitness": None if f is None else _json_float(f), "env_steps": int(env_steps),
                                **{n: v[m] for n, v in table.items()}})

    def tables(self, state) -> dict[str, list[dict[str, Any]]]:
        return {**self.inner.tables(state), "lineage.csv": [dict(row) for row in self.rounds]}

    def summary(self, state) -> dict[str, Any]:
        record = fetch(state.pbt)
        return {**self.inner.summary(state), "lineage": [dict(e) for e in self.lineage], "pbt": {
            "rounds": int(record.rounds), "last_ready_env_steps": int(record.last_ready),
            "fitness_window": [[_json_float(v) for v in row] for row in np.asarray(record.window).tolist()],
            "window_count": np.asarray(record.count).tolist()}}

    def state_dict(self) -> dict[str, Any]:
        pb2 = {} if self.pb2 is None else {"pb2_rows": [list(r) for r in self.pb2.rows]}
        return {**self.inner.state_dict(), "lineage": [dict(e) for e in self.lineage],
                "rounds": [dict(r) for r in self.rounds], **pb2}

    def load_state_dict(self, data) -> None:
        self.inner.load_state_dict(data)
        self.lineage = [dict(e) for e in data.get("lineage", [])]
        self.rounds = [dict(r) for r in data.get("rounds", [])]
        if self.pb2 is not None:
            self.pb2.rows = [list(r) for r in data.get("pb2_rows", [])]


def _json_float(x: float) -> float | None:
    """NaN/inf -> None, so the lineage is strict JSON."""
    x = float(x)
    return x if math.isfinite(x) else None


def with_prior_hparams(ctx: BuildContext, config: PBTConfig) -> BuildContext:
    """``ctx`` with the initial hparams of the PBT space drawn from the prior, except those the user fixed
    (``hparams``) or sampled (``search_space``)."""
    keep = set(ctx.config.hparams) | set(ctx.config.search_space)
    return dataclasses.replace(ctx, hparams=initial_hparams(ctx.setup_key, ctx.hparams, config.space, keep, config))


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
            host=PBTHost(inner.host, config, ctx.config.seed),
            set_hparams=lambda state, hparams: write_hparams(state, hparams, inner.on_replace))

    return build


def write_hparams(state, hparams, on_replace: Callable | None = None):
    """``state`` with the host's ``hparams`` (PB2's proposals), and ``on_replace`` re-run for every member whose
    hparams changed: what a member derives from its learner state may depend on them (ReF-ER's ratios on TD3's
    sigma), and the round ran it with the parent's hparams, before the host proposed."""
    old, new = jax.tree.leaves(state.hparams), jax.tree.leaves(hparams)
    changed = [(a != b).reshape(a.shape[0], -1).any(axis=1) for a, b in zip(old, new, strict=True)]
    state = state.replace(hparams=hparams)
    return state if on_replace is None else on_replace(state, jnp.any(jnp.stack(changed), axis=0))


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
                                              final_returns=summary.get("final_returns"),
                                              winner=_winner_line(run_dir, summary)))
    return written


def _winner_line(run_dir, summary) -> list[tuple[float, int]] | None:
    """``[(env steps, member)]``: the best final member's line through every copy (from lineage.csv), or None."""
    path = run_dir.path / "lineage.csv"
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
        member = best_member(summary.get("final_returns", []))
    except (OSError, ConfigError):
        return None
    return [(float(row["env_steps"]), int(row["member"])) for row in ancestry(rows, member)] if rows else None


DEFINITION = DriverDef(name="pbt", build=build, options=PBTOptions, plots=pbt_run_plots,
                       steps=(ReplayStep, RolloutStep), sources=None)
