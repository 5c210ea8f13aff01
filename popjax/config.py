"""The run configuration: one validated, fully resolved description of an experiment.

``RunConfig`` is a ``popjax.schema.dataclass``: constructing one (from ``make_config``, YAML,
the CLI, ``popjax.train`` keyword options, ``dataclasses.replace`` or directly) validates every
field, the learner's ``Config`` (``learner_config``), the hyperparameters against the bounds the
learner declares (``hparams``), the search ranges (``search_space``) and the options block of
the run's driver (the driver's schema, ``DriverDef.options``). Every failure is a
``ConfigError`` of one line naming the field, the bad value and what is allowed, raised before
anything is compiled or written. ``check_memory`` adds the checks that need the environment's
shapes (replay buffers and evaluation batch against the machine's memory).
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from collections.abc import Mapping
from typing import Annotated, Any

import numpy as np
from pydantic import Field, model_validator

from popjax import schema
from popjax.precision import MATMUL_PRECISIONS
from popjax.registry import DRIVERS, LEARNERS, LOGGERS, SOURCES
from popjax.schema import (
    INT32_MAX,
    AnyMapping,
    Bool,
    ConfigError,
    Float,
    Int,
    Invalid,
    Kind,
    OneOf,
    SomeOf,
    fail,
    show,
    validate,
)

__all__ = ["ConfigError", "PARALLEL_MODES", "RunConfig", "check_memory", "check_options", "make_config",
           "make_learner_config", "saved_options"]

PARALLEL_MODES = ("sharding", "pmap")
EVAL_STARTS = ("common", "member")  # evaluation start states: shared by every member (fresh each time) or per member
MAX_STEPS = 2**30  # env steps per member: int32 counters (plus one iteration) never overflow


# Names are read when a value is checked, so entries registered after this module was imported are known.
def _learners() -> tuple[str, ...]:
    return tuple(LEARNERS)


def _sources() -> tuple[str, ...]:
    return tuple(SOURCES)


def _drivers() -> tuple[str, ...]:
    return tuple(DRIVERS)


def _loggers() -> tuple[str, ...]:
    return tuple(LOGGERS)


DEFAULT_BUFFER = "uniform"  # the run's replay source when it names none (and the one on-policy runs keep)


@dataclasses.dataclass(frozen=True)
class EnvName(Kind):
    """``gym:<id>``, ``brax:<name>[@backend]``, ``probe:<name>`` or a JAX env family's ``<prefix>:<id>`` (checked
    by ``popjax.envs.registry``)."""

    def describe(self) -> str:
        from popjax.envs.probes import PROBES
        from popjax.envs.registry import BRAX_NAMES, GYM_IDS

        return (f"gym:<id> ({', '.join(GYM_IDS)}, or another gymnasium id with Box observations), "
                f"brax:<name>[@backend] ({', '.join(BRAX_NAMES)}), probe:<name> ({', '.join(PROBES)}), "
                "gymnax:<id>, craftax:<name>, jumanji:<id>, playground:<name> (docs/environments.md)")

    def convert(self, value, context=None):
        from popjax.envs.registry import parse

        if not isinstance(value, str):
            raise Invalid(f"expected gym:<id>, brax:<name>, probe:<name> or <family>:<id>, got {show(value)}")
        try:
            parse(value)
        except ValueError as err:
            message = str(err)
            raise Invalid(message[4:] if message.startswith("env ") else message) from None
        return value


Options = Annotated[dict[str, Any], AnyMapping()]

_SIZE_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
               "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


@dataclasses.dataclass(frozen=True)
class MemorySize(Kind):
    """``auto`` or a size in bytes: ``141GB`` (GB = 10^9 bytes, as GPU makers count), ``80GiB`` (2^30) or a number."""

    def describe(self) -> str:
        return "auto, or a size such as 141GB, 80GiB or a number of bytes"

    def convert(self, value, context=None):
        if value == "auto":
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            number, unit = float(value), ""
        else:
            match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(value)) \
                if isinstance(value, str) else None
            if match is None or match.group(2).lower() not in _SIZE_UNITS:
                raise self.expected(value)
            number, unit = float(match.group(1)), match.group(2).lower()
        size = number * _SIZE_UNITS[unit]
        if not math.isfinite(size) or size < 1:
            raise Invalid(f"must be at least 1 byte, got {show(value)}")
        return int(size)


@schema.dataclass(what="option")
class RunConfig:
    learner: OneOf(_learners) = Field("td3", description="the learner every member runs")
    env: Annotated[str, EnvName()] = Field("probe:pendulum", description="the environment, <prefix>:<name>")
    driver: OneOf(_drivers) = Field("independent", description="how the population is trained")
    pop_size: Int(ge=1, le=65_536) = Field(4, description="members in the population")
    seed: Int(ge=0, le=INT32_MAX) = Field(0, description="the run's seed; every random key derives from it")
    total_env_steps: Int(ge=1, le=MAX_STEPS) = Field(20_000, description="env steps per member in the whole run")
    envs_per_member: Int(ge=1, le=10_000) = Field(1, description="envs each member steps in parallel")
    rollout_len: Int(ge=1, le=1_000_000) = Field(
        50, description="env steps per env between two compiled training calls")
    update_ratio: Float(gt=0, le=1_000) = Field(1.0, description="gradient steps per env step, per member")
    warmup_steps: Int(ge=0, le=MAX_STEPS) = Field(
        1_000, description="env steps per member with uniform random actions and no updates (off-policy "
        "learners; on-policy learners ignore it: random actions are not their policy's data)")
    batch_size: Int(ge=1, le=1_048_576) = Field(256, description="transitions per gradient step")
    buffer_size: Int(ge=1, le=INT32_MAX) = Field(
        100_000, description="replay capacity in transitions, per member (shared buffers: in total); "
        "must fit in the machine's memory")
    buffer: OneOf(_sources) = Field(
        DEFAULT_BUFFER, description="the replay source: uniform, or prioritized by |TD error| (K-ary sum tree; "
        "independent and pbt drivers; learners that return TD magnitudes, spo_dqn/spo_td3 with one bank per replica)")
    per_alpha: Float(ge=0, le=1) = Field(0.6, description="prioritized replay: priority exponent, (|TD| + eps)^alpha "
                                                          "(popjax default)")
    per_beta: Float(ge=0, le=1) = Field(0.4, description="prioritized replay: importance-weight exponent "
                                                         "(popjax default)")
    per_eps: Float(gt=0, le=1) = Field(1e-6, description="prioritized replay: added to |TD| so no row starves "
                                                         "(popjax default)")
    per_delay: Int(ge=1, le=1_000_000) = Field(
        1, description="prioritized replay: samplings between computing a priority and writing it (D; 1 = written "
                       "before the next sampling)")
    eval_interval: Int(ge=1, le=MAX_STEPS) = Field(5_000, description="env steps per member between evaluations")
    eval_episodes: Int(ge=1, le=10_000) = Field(
        5, description="deterministic episodes per member at each evaluation")
    eval_starts: OneOf(EVAL_STARTS) = Field(
        "common", description="evaluation start states: common (episode e of every member starts from the same "
        "state, fresh at each evaluation, so members are ranked on the same episodes) or member (each its own)")
    learner_config: Options = Field(
        default_factory=dict, description="static options of the learner (network sizes, ...)",
        json_schema_extra={"allowed": "{key: value}, the learner's keys (listed below)"})
    hparams: Options = Field(
        default_factory=dict, description="per-member hyperparameters: one value for all members or a list of "
        "pop_size values", json_schema_extra={"allowed": "{name: value or [values]}, within each hparam's bounds"})
    search_space: Options = Field(
        default_factory=dict, description="hyperparameters sampled per member from a prior",
        json_schema_extra={"allowed": "{name: {low, high, log, integer} or {choices: [...]}} inside its bounds"})
    # {driver name: its options}; in YAML, the CLI and keyword options each is a block named
    # after its driver (``pbt: {interval: 5000}``), so a new driver needs no field here.
    driver_options: Options = Field(
        default_factory=dict, description="options of each driver; written as a block named after the driver",
        json_schema_extra={"allowed": "{driver: {key: value}} (listed below)"})
    devices: Int(ge=1, le=4_096) = Field(
        1, description="devices the population is split over; pop_size must be a multiple (a run over several "
        "processes: every device of the job, when not given)")
    parallel: OneOf(PARALLEL_MODES) = Field("sharding", description="how --devices splits the population")
    overlap: Bool = Field(False, description="gym path: step the envs of iteration t+1 while the update of iteration t "
                                             "runs (one iteration of policy lag, deterministic)")
    checkpoint_interval: Int(ge=0, le=MAX_STEPS) = Field(
        0, description="env steps per member between checkpoints; 0 = at evaluations only")
    progress: Bool = Field(True, description="show progress: a bar on a terminal, complete lines in a log or file")
    logger: SomeOf(_loggers) = Field(
        (), description="where every metric also goes: tensorboard (<run_dir>/tensorboard/), wandb (one Weights & "
        "Biases run per population: members' curves and hparams, PBT's exploits; pip install 'popjax[wandb]')")
    matmul_precision: OneOf(MATMUL_PRECISIONS) = Field(
        "default", description="arithmetic of every matrix product and convolution the run compiles: default (JAX's: "
        "TF32 on a recent NVIDIA GPU, float32 on a CPU), tf32, highest (full float32) or bf16 (the networks' "
        "products from bfloat16 operands with float32 accumulation; everything else, env physics included, as "
        "highest); see docs/gpu.md")
    device_memory: Annotated[int | str, MemorySize()] = Field(
        "auto", description="memory each device may use: auto (a GPU's or TPU's own, the host's RAM on a CPU), or a "
        "size to plan for another device or leave room; a run that cannot fit is refused before anything is written, "
        "naming what to lower (popjax train --plan prints the plan; see docs/planning.md)")

    @model_validator(mode="after")
    def _check(self):
        _check_run(self)
        return self

    @property
    def updates_per_iter(self) -> int:
        """K: gradient steps per member per compiled training call."""
        return max(1, round(self.rollout_len * self.envs_per_member * self.update_ratio))

    @property
    def steps_per_iter(self) -> int:
        """Env steps per member per iteration."""
        return self.rollout_len * self.envs_per_member

    @property
    def options(self) -> Mapping[str, Any]:
        """The options block of this run's driver."""
        return self.driver_options.get(self.driver, {})

    def to_dict(self) -> dict[str, Any]:
        """Plain values, with each driver's options as a block named after the driver."""
        out = {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "driver_options"}
        out.update({name: _plain(block) for name, block in self.driver_options.items()})
        return out


def saved_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """A saved configuration (a run's config.yaml, a checkpoint's) in today's options: runs written before
    ``logger`` existed say ``tensorboard: true`` (now ``logger: [tensorboard]``) or ``tensorboard: false``."""
    options = dict(options)
    if isinstance(options.get("tensorboard"), bool) and "logger" not in options:
        options["logger"] = ["tensorboard"] if options.pop("tensorboard") else []
    return options


def _plain(value):
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _set(config: RunConfig, name: str, value: Any) -> None:
    object.__setattr__(config, name, value)  # normalising a frozen dataclass while it is validated


def _check_run(config: RunConfig) -> None:
    """Checks across fields and the nested schemas; stores the nested blocks normalised."""
    from popjax.population.hparams import validate_hparams, validate_space

    c = config
    if c.parallel == "pmap" and not DRIVERS[c.driver].pmap:
        fail(f"the {c.driver} driver does not run as one program per device (allowed: sharding)",
             at=("parallel",), nested=True)
    if c.pop_size % c.devices:
        fail(f"{c.pop_size} members do not divide over devices={c.devices}; use a multiple of {c.devices}",
             at=("pop_size",), nested=True)
    step_kind = LEARNERS[c.learner].step_kind
    if not DRIVERS[c.driver].accepts_step(step_kind):
        allowed = ", ".join(name for name, d in DRIVERS.items() if d.accepts_step(step_kind))
        what = f"the on-policy learner {c.learner}" if LEARNERS[c.learner].on_policy else f"the learner {c.learner}"
        fail(f"the {c.driver} driver trains from a replay buffer, not {what} (allowed: {allowed})", at=("driver",),
             nested=True)
    if DRIVERS[c.driver].shared_critic and LEARNERS[c.learner].fit.own_replay:
        allowed = ", ".join(name for name, d in DRIVERS.items() if not d.shared_critic and d.accepts_step(step_kind))
        fail(f"{c.learner} {LEARNERS[c.learner].fit.own_replay}, and the {c.driver} driver trains from one buffer "
             f"shared by the population (allowed drivers: {allowed})", at=("learner",), nested=True)
    if DRIVERS[c.driver].shared_critic and LEARNERS[c.learner].shared_critic is None:
        offering = ", ".join(name for name, d in LEARNERS.items() if d.shared_critic is not None)
        fail(f"the {c.driver} driver trains TD3 actors with a shared critic (allowed: {offering}), got {c.learner!r}",
             at=("learner",), nested=True)
    if c.overlap and LEARNERS[c.learner].on_policy:  # learn never sees the snapshot that acted
        fail(f"acting one update behind would hand the on-policy learner {c.learner} data of a policy its update "
             "does not know (allowed: false)", at=("overlap",), nested=True)
    if c.buffer != DEFAULT_BUFFER and LEARNERS[c.learner].on_policy:
        fail(f"the on-policy learner {c.learner} keeps no replay buffer (allowed: {DEFAULT_BUFFER}, the default)",
             at=("buffer",), nested=True)
    if not DRIVERS[c.driver].accepts_source(c.buffer):
        fail(f"the {c.driver} driver has no {c.buffer} replay (allowed: {', '.join(DRIVERS[c.driver].sources)})",
             at=("buffer",), nested=True)
    if c.per_delay != 1 and "per_delay" not in SOURCES[c.buffer].options:
        reading = ", ".join(name for name, d in SOURCES.items() if "per_delay" in d.options)
        fail(f"only applies to buffer: {reading}, got {c.per_delay} with buffer: {c.buffer} (allowed: 1)",
             at=("per_delay",), nested=True)
    replay = not LEARNERS[c.learner].on_policy  # on-policy learners have no buffer and no warm-up
    if replay and c.batch_size > c.buffer_size:
        fail(f"{c.batch_size} is larger than buffer_size {c.buffer_size}", at=("batch_size",), nested=True)
    if replay and c.steps_per_iter > c.buffer_size:
        fail(f"{c.buffer_size} is smaller than one iteration's {c.steps_per_iter} transitions "
             "(rollout_len x envs_per_member)", at=("buffer_size",), nested=True)
    if replay and c.warmup_steps >= c.total_env_steps:
        fail(f"{c.warmup_steps} leaves no training within total_env_steps={c.total_env_steps} "
             f"(allowed: less than {c.total_env_steps})", at=("warmup_steps",), nested=True)
    updates = math.ceil(c.total_env_steps / c.steps_per_iter) * c.updates_per_iter
    if updates > INT32_MAX:
        fail(f"{show(c.update_ratio)} makes {updates} gradient steps per member, more than the int32 update "
             f"counter holds ({INT32_MAX})", at=("update_ratio",), nested=True)

    definition = LEARNERS[c.learner]
    _set(c, "learner_config", _learner_config(c, definition, nested=True)[1])
    hparams = validate_hparams(c.hparams, definition.hparams_cls, c.pop_size, nested=True)
    _set(c, "hparams", _plain(hparams))
    space = validate_space(c.search_space, definition.hparams_cls, fixed=tuple(hparams), nested=True)
    _set(c, "search_space", {name: {k: getattr(space[name], k) for k in raw} for name, raw in c.search_space.items()})

    blocks = {}
    for name, block in c.driver_options.items():
        if name not in DRIVERS:
            fail(f"unknown driver (allowed: {', '.join(DRIVERS)})", at=(name,), nested=True)
        schema.convert(AnyMapping("a mapping of options {key: value}"), block, at=(name,), nested=True)
        blocks[name] = dict(block)
    _set(c, "driver_options", blocks)
    for name, block in blocks.items():  # another driver's block: only its keys are checked
        if name != c.driver:
            schema.check_keys_of(DRIVERS[name].options, block, at=(name,))
    if c.driver in blocks:
        options = DRIVERS[c.driver].parse_options(c, nested=True)
        blocks[c.driver] = options.given(blocks[c.driver])
    else:
        DRIVERS[c.driver].parse_options(c, nested=True)


def _learner_config(config: RunConfig, definition, nested: bool = False):
    """``(the learner's Config, the user's learner_config normalised)``; fields named like a run option
    (``batch_size``) come from the run."""
    run_fields = {f.name for f in dataclasses.fields(RunConfig)}
    given = dict(config.learner_config)
    cls = definition.config_cls
    own = [name for name in schema.schema_fields(cls) if name not in run_fields]  # what learner_config accepts
    for key in given:
        if key in run_fields:
            fail(f"set by the run option {key}, not in learner_config", at=("learner_config", key), nested=nested)
    for key in given:
        if key not in own:
            allowed = ", ".join(own) if own else f"none, {config.learner} takes no learner_config keys"
            fail(f"unknown key (allowed: {allowed})", at=("learner_config", key), nested=nested)
    from_run = {name: getattr(config, name) for name in schema.schema_fields(cls) if name in run_fields}
    learner_config = validate(cls, {**given, **from_run}, at=("learner_config",), nested=nested)
    return learner_config, {key: _plain(getattr(learner_config, key)) for key in given}


def make_learner_config(config: RunConfig):
    """The run's learner ``Config`` (e.g. ``TD3Config``), from ``learner_config`` and the run's batch size."""
    return _learner_config(config, LEARNERS[config.learner])[0]


def _allowed(name: str) -> str:
    """What option ``name`` (a RunConfig field or a driver block) accepts, for messages."""
    if name in DRIVERS:
        return "a mapping of options {key: value}"
    field = schema.schema_fields(RunConfig)[name]
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, Mapping) else {}
    kind = schema.kind_of(field)
    allowed = extra.get("allowed") or (kind.describe() if kind is not None else "a value")
    return str(allowed).replace(" (listed below)", "")


def check_options(options: Mapping[str, Any]) -> None:
    """Each option alone: a known name, a value (not None) and a value of the right type, in the
    order of RunConfig's fields, then the driver blocks. Runs before anything reads the options
    (presets look up ``learner`` and ``env``); the checks across fields come with ``RunConfig``."""
    fields = schema.schema_fields(RunConfig)
    for name in options:
        if name not in fields and name not in DRIVERS:
            fail(f"unknown option (allowed: {', '.join([*fields, *DRIVERS])})", at=(name,))
    for name, value in options.items():
        if value is None:
            fail(f"no value given; leave the option out for its default (allowed: {_allowed(name)})", at=(name,))
    for name, field in fields.items():
        kind = schema.kind_of(field)
        if name in options and kind is not None:
            schema.convert(kind, options[name], at=(name,))
    for name in DRIVERS:
        if name in options:
            schema.convert(AnyMapping("a mapping of options {key: value}"), options[name], at=(name,))


def _job_devices() -> int | None:
    """Every device of the job when this process joined a job of several processes (``jax.distributed``),
    else None. Never imports JAX: a process that has not imported it has joined no job."""
    if "jax" not in sys.modules:
        return None
    from popjax import distributed

    if distributed.processes() == 1:
        return None
    import jax

    return jax.device_count()


def make_config(**options: Any) -> RunConfig:
    """Builds and validates a RunConfig from keyword options (as from the API, CLI or YAML).

    An option named after a registered driver (``pbt={...}``) is that driver's options block. An
    option left out takes its default (``devices``, in a run over several processes: every device of the
    job, which such a run must use); one given as ``None`` (an empty or null YAML value) is refused:
    a user who wrote the key meant something.
    """
    check_options(options)
    if "devices" not in options and (job_devices := _job_devices()) is not None:
        options = {**options, "devices": job_devices}  # a run over several processes uses every device of the job
    fields = [f.name for f in dataclasses.fields(RunConfig)]
    values = {name: value for name, value in options.items() if name in fields}
    blocks = {name: value for name, value in options.items() if name not in fields}
    if blocks:
        given = values.get("driver_options") or {}
        values["driver_options"] = {**given, **blocks} if isinstance(given, Mapping) else given
    return RunConfig(**values)


# --- memory: checked once the environment's shapes are known, before anything is allocated -----
JAX_ENV_BYTES = 4_096  # rough size of one JAX env state beyond its observation (brax pipeline state)
HOST_ENV_BYTES = 256 * 1024  # rough size of one gymnasium env (MuJoCo model and data)


def machine_memory() -> int:
    """Bytes of physical memory of this machine."""
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except ImportError:  # pragma: no cover - psutil is a dependency
        import os

        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1024 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def replay_transitions(config: RunConfig) -> int:
    """Replay transitions the run holds in total: none for an on-policy learner (it trains on each rollout)."""
    return 0 if LEARNERS[config.learner].on_policy else DRIVERS[config.driver].replay_transitions(config)


def memory_estimate(config: RunConfig, spec) -> dict[str, int]:
    """Bytes the run needs at least: ``replay`` (the replay buffers and one iteration's transitions)
    and ``evaluation`` (the envs of one evaluation, all members at once)."""
    from popjax.envs.registry import is_jax_env

    obs = 4 * math.prod(spec.obs_shape)
    row = 2 * obs + 4 * max(1, spec.action_dim) + 8  # obs, next_obs, action, reward, terminated
    row += SOURCES[config.buffer].row_bytes  # what the source keeps per row beyond the transition
    rows = replay_transitions(config) + config.pop_size * config.steps_per_iter
    per_env = (2 * obs + JAX_ENV_BYTES) if is_jax_env(config.env) else HOST_ENV_BYTES
    return {"replay": rows * row, "row": row, "evaluation": config.pop_size * config.eval_episodes * per_env,
            "per_env": per_env}


def check_memory(config: RunConfig, spec, memory: int | None = None) -> None:
    """Raises ``ConfigError`` if the replay buffers and the evaluation batch cannot fit in memory.

    ``memory``: bytes available (default: the machine's physical memory).
    """
    memory = memory or machine_memory()
    need = memory_estimate(config, spec)
    replay, evaluation = need["replay"], need["evaluation"]
    if replay + evaluation <= memory:
        return
    if replay >= evaluation and not replay_transitions(config):  # on-policy: one iteration's rollout
        fail(f"one iteration's {config.pop_size} x {config.steps_per_iter} transitions ({need['row']} B each) need "
             f"about {_size(replay)}, more than this machine's {_size(memory)} of memory", at=("rollout_len",))
    if replay >= evaluation:
        per_unit = replay_transitions(config) / config.buffer_size
        most = max(0, int((memory - evaluation) / need["row"] / per_unit) - config.steps_per_iter)
        buffers = round(per_unit)
        what = (f"{buffers} replay buffers of {config.buffer_size} transitions" if buffers > 1
                else f"a replay buffer of {config.buffer_size} transitions")
        fail(f"{what} ({need['row']} B each) need about {_size(replay)}, more than this machine's "
             f"{_size(memory)} of memory (allowed: at most about {most} transitions"
             f"{' per member' if buffers > 1 else ''})", at=("buffer_size",))
    most = max(0, int((memory - replay) / need["per_env"] / config.pop_size))
    fail(f"{config.pop_size} members x {config.eval_episodes} episodes evaluated at once need about "
         f"{_size(evaluation)}, more than this machine's {_size(memory)} of memory "
         f"(allowed: at most about {most})", at=("eval_episodes",))
