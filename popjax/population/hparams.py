"""Per-member hyperparameters: building ``[pop]`` HParams from defaults, lists and search spaces."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from popjax.types import Key


@dataclasses.dataclass(frozen=True)
class Range:
    """A one-dimensional prior: uniform on [low, high], log-uniform if ``log``, rounded if ``integer``."""

    low: float
    high: float
    log: bool = False
    integer: bool = False

    def __post_init__(self):
        if not self.low <= self.high:
            raise ValueError(f"search range needs low <= high, got [{self.low}, {self.high}]")
        if self.log and self.low <= 0:
            raise ValueError(f"a log-uniform range needs low > 0, got {self.low}")

    def sample(self, key: Key, shape: tuple[int, ...]) -> jax.Array:
        """Draws from the prior; integer ranges are uniform over ``{low, ..., high}``."""
        u = jax.random.uniform(key, shape)
        if self.integer:
            return jnp.minimum(jnp.floor(self.low + u * (self.high - self.low + 1.0)), self.high)
        if self.log:
            return jnp.exp(jnp.log(self.low) + u * (jnp.log(self.high) - jnp.log(self.low)))
        return self.low + u * (self.high - self.low)

    def clip(self, value: jax.Array) -> jax.Array:
        return jnp.clip(value, self.low, self.high)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Range:
        unknown = set(d) - {"low", "high", "log", "integer"}
        if unknown or not {"low", "high"} <= set(d):
            raise ValueError(f"a search range is {{low, high, log?, integer?}}, got keys {sorted(d)}")
        return cls(float(d["low"]), float(d["high"]), bool(d.get("log", False)), bool(d.get("integer", False)))


SearchSpace = Mapping[str, Range]


def hparam_names(hparams) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(hparams))


def population_hparams(defaults, pop_size: int, values: Mapping[str, Any] | None = None,
                       space: SearchSpace | None = None, key: Key | None = None):
    """Stacks ``defaults`` to ``[pop_size]`` and applies per-member settings.

    Args:
      defaults: a single-member HParams (scalar leaves).
      pop_size: number of members.
      values: name -> scalar (all members) or list of ``pop_size`` values (one per member).
      space: name -> Range; those hparams are sampled per member with ``key``.
      key: PRNG key for sampling ``space``.

    Raises:
      ValueError: unknown names, wrong list lengths, or a missing key for sampling.
    """
    names = hparam_names(defaults)
    values, space = dict(values or {}), dict(space or {})
    for name in list(values) + list(space):
        if name not in names:
            raise ValueError(f"hparam {name!r} unknown; allowed: {', '.join(names)}")
    both = set(values) & set(space)
    if both:
        raise ValueError(f"hparams {sorted(both)} are both fixed and sampled; choose one")
    if space and key is None:
        raise ValueError("sampling a search space needs a key")
    out = {}
    keys = dict(zip(sorted(space), jax.random.split(key, len(space)), strict=True)) if space else {}
    for name in names:
        leaf = getattr(defaults, name)
        if name in space:
            column = space[name].sample(keys[name], (pop_size,))
        elif name in values:
            column = jnp.asarray(values[name], jnp.float32)
            if column.ndim == 0:
                column = jnp.full((pop_size,), column)
            elif column.shape != (pop_size,):
                raise ValueError(f"hparam {name!r}: a list needs {pop_size} values (one per member), "
                                 f"got {column.shape[0] if column.ndim == 1 else column.shape}")
        else:
            column = jnp.full((pop_size,), leaf)
        out[name] = column.astype(leaf.dtype)
    return type(defaults)(**out)


def hparams_table(hparams) -> dict[str, list[float]]:
    """``{name: [value per member]}`` as plain Python numbers (for logs and summaries)."""
    def plain(x):  # float32 -> shortest decimal that round-trips (3e-4, not 0.0003000000142)
        return float(f"{x:.7g}") if isinstance(x, float) else x

    return {name: [plain(v) for v in jax.device_get(getattr(hparams, name)).tolist()] for name in hparam_names(hparams)}


# Allowed values by hparam name (suffix match); every learner's HParams fields are covered.
_BOUNDS = (
    ("_lr", 0.0, math.inf), ("lr", 0.0, math.inf), ("discount", 0.0, 1.0), ("tau", 0.0, 1.0),
    ("epsilon_start", 0.0, 1.0), ("epsilon_end", 0.0, 1.0), ("_noise", 0.0, math.inf), ("noise_clip", 0.0, math.inf),
    ("policy_delay", 1, math.inf), ("_scale", 0.0, math.inf), ("_steps", 0.0, math.inf),
)


def check_hparams(hparams) -> None:
    """Raises ValueError naming the first hparam with a non-finite or out-of-range member value."""
    for name, values in hparams_table(hparams).items():
        values = jnp.asarray(values, jnp.float32)
        if not bool(jnp.isfinite(values).all()):
            raise ValueError(f"hparams.{name}: values must be finite, got {values.tolist()}")
        for suffix, low, high in _BOUNDS:
            if name.endswith(suffix):
                if bool((values < low).any() | (values > high).any()):
                    raise ValueError(f"hparams.{name}: values must lie in [{low}, {high}], got {values.tolist()}")
                break
