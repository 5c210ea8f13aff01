"""The run configuration: one validated, fully resolved description of an experiment.

Every check runs before anything is compiled, and every failure is a ``ConfigError`` with
one line naming the field, the bad value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

PARALLEL_MODES = ("sharding", "pmap")


class ConfigError(ValueError):
    """A user error in the run configuration (reported without a traceback)."""


@dataclasses.dataclass(frozen=True)
class RunConfig:
    learner: str = "td3"
    env: str = "probe:pendulum"
    driver: str = "independent"
    pop_size: int = 4
    seed: int = 0
    total_env_steps: int = 20_000  # per member
    envs_per_member: int = 1
    rollout_len: int = 50  # env steps per env between two compiled training calls
    update_ratio: float = 1.0  # gradient steps per env step, per member
    warmup_steps: int = 1_000  # per member, uniform random actions, no updates
    batch_size: int = 256
    buffer_size: int = 100_000  # per member (shared buffers: in total)
    eval_interval: int = 5_000  # env steps per member
    eval_episodes: int = 5
    learner_config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    hparams: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    search_space: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # {driver name: its options}; in YAML, the CLI and keyword options each is a block named
    # after its driver (``pbt: {interval: 5000}``), so a new driver needs no field here.
    driver_options: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    devices: int = 1
    parallel: str = "sharding"  # how --devices splits the population: "sharding" or "pmap"
    checkpoint_interval: int = 0  # env steps per member between checkpoints; 0 = at evaluations only
    progress: bool = True
    tensorboard: bool = False

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


def _plain(value):
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


_POSITIVE = ("pop_size", "total_env_steps", "envs_per_member", "rollout_len", "batch_size", "buffer_size",
             "eval_interval", "eval_episodes", "devices")
_NON_NEGATIVE = ("seed", "warmup_steps", "checkpoint_interval")


def _coerce(name: str, value: Any, kind: type) -> Any:
    """Converts ``value`` to ``kind`` where that is lossless (``1e6`` -> 1000000), else raises."""
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
    elif kind in (int, float):
        number = value
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                pass
        if isinstance(number, int | float) and not isinstance(number, bool) and math.isfinite(number) \
                and (kind is float or float(number).is_integer()):
            return kind(number)
    elif kind is str:
        if isinstance(value, str):
            return value
    elif isinstance(value, Mapping):
        return dict(value)
    raise ConfigError(f"{name}: expected {kind.__name__}, got {value!r} ({type(value).__name__})")


def make_config(**options: Any) -> RunConfig:
    """Builds and validates a RunConfig from keyword options (as from the API, CLI or YAML).

    An option named after a registered driver (``pbt={...}``) is that driver's options block.
    """
    from popjax.drivers import DRIVERS

    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    blocks = {name: options.pop(name) for name in list(options) if name in DRIVERS and name not in fields}
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise ConfigError(f"unknown option(s) {', '.join(unknown)}; allowed: {', '.join([*fields, *DRIVERS])}")
    kinds = {name: _field_kind(f) for name, f in fields.items()}
    values = {name: _coerce(name, v, kinds[name]) for name, v in options.items() if v is not None}
    driver_options = {**values.get("driver_options", {})}
    for name, block in blocks.items():
        if block is not None:
            driver_options[name] = _coerce(name, block, dict)
    values["driver_options"] = driver_options
    config = RunConfig(**values)
    validate(config)
    return config


def _field_kind(field: dataclasses.Field) -> type:
    annotation = str(field.type)
    for name, kind in (("Mapping", dict), ("bool", bool), ("int", int), ("float", float), ("str", str)):
        if annotation.startswith(name):
            return kind
    raise TypeError(f"no coercion for {field.name}: {annotation}")


def validate(config: RunConfig) -> None:
    """Static checks that need no environment or compilation."""
    from popjax.drivers import DRIVERS
    from popjax.envs.registry import parse
    from popjax.learners import LEARNERS

    if config.learner not in LEARNERS:
        raise ConfigError(f"learner: {config.learner!r} unknown; allowed: {', '.join(LEARNERS)}")
    if config.driver not in DRIVERS:
        raise ConfigError(f"driver: {config.driver!r} unknown; allowed: {', '.join(DRIVERS)}")
    if config.parallel not in PARALLEL_MODES:
        raise ConfigError(f"parallel: {config.parallel!r} unknown; allowed: {', '.join(PARALLEL_MODES)}")
    if config.parallel == "pmap" and not DRIVERS[config.driver].pmap:
        raise ConfigError(f"parallel: the {config.driver} driver does not run as one program per device (pmap); "
                          "use parallel=sharding")
    try:
        parse(config.env)
    except ValueError as err:
        raise ConfigError(f"env: {err}") from None
    for name in _POSITIVE:
        if getattr(config, name) <= 0:
            raise ConfigError(f"{name}: must be a positive integer, got {getattr(config, name)}")
    for name in _NON_NEGATIVE:
        if getattr(config, name) < 0:
            raise ConfigError(f"{name}: must be >= 0, got {getattr(config, name)}")
    if not config.update_ratio > 0:
        raise ConfigError(f"update_ratio: must be > 0, got {config.update_ratio}")
    if config.pop_size % config.devices:
        raise ConfigError(f"pop_size: {config.pop_size} members do not divide over devices={config.devices}; "
                          f"use a multiple of {config.devices}")
    if config.batch_size > config.buffer_size:
        raise ConfigError(f"batch_size: {config.batch_size} is larger than buffer_size {config.buffer_size}")
    if config.steps_per_iter > config.buffer_size:
        raise ConfigError(f"buffer_size: {config.buffer_size} is smaller than one iteration's "
                          f"{config.steps_per_iter} transitions (rollout_len x envs_per_member)")
    if config.warmup_steps >= config.total_env_steps:
        raise ConfigError(f"warmup_steps: {config.warmup_steps} leaves no training within "
                          f"total_env_steps={config.total_env_steps}")
