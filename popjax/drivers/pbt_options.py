"""PBT's options: the ``pbt`` block of a run, validated against the learner (``PBTOptions``), and the static
``PBTConfig`` the compiled round is built from."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Annotated, Any

from pydantic import Field, PrivateAttr, ValidationInfo, model_validator

from popjax.drivers.base import DriverOptions, run_config
from popjax.population import constraints
from popjax.population.constraints import Constraint
from popjax.population.hparams import Range, validate_space
from popjax.population.search_spaces import SEARCH_SPACES
from popjax.registry import DRIVERS, LEARNERS
from popjax.schema import (
    Bool,
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
      policy_state: the learner state's policy fields (dotted paths; ``PBTSupport.policy_state``).
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
            space = LEARNERS[config.learner].pbt.search_space
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
            if not definition.pbt.policy_state:
                offering = ", ".join(n for n, d in LEARNERS.items() if d.pbt.policy_state)
                raise problem(f"the learner {config.learner} declares no policy state to copy alone "
                              f"(allowed: full; policy with {offering})", at=("copy",))
            driver = getattr(config, "driver", None)
            if driver is not None and not DRIVERS[driver].policy_copy:  # hts: behaviour states, segments
                fitting = ", ".join(n for n, d in DRIVERS.items() if d.policy_copy)
                raise problem(f"policy copies run under the {fitting} driver, not {driver} (allowed: full)",
                              at=("copy",))
            if self.copy_buffer:
                raise problem("a policy-only copy keeps the member's buffer (allowed: false with copy: policy)",
                              at=("copy_buffer",))
        if self.reset_optimizer and not definition.pbt.optimizer_state:
            offering = ", ".join(n for n, d in LEARNERS.items() if d.pbt.optimizer_state)
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
                         reset_optimizer=self.reset_optimizer, policy_state=tuple(definition.pbt.policy_state),
                         optimizer_state=tuple(sorted(definition.pbt.optimizer_state.items())),
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
