"""Per-member hyperparameters: their declared bounds, and ``[pop]`` HParams from defaults, lists
and search spaces.

Each learner declares what every hyperparameter allows on the field itself::

    @struct.dataclass
    class TD3HParams:
        discount: jax.Array = hparam("discount factor", ge=0, le=1)
        policy_delay: jax.Array = hparam("critic steps per policy step", ge=1, integer=True)

(``hparam`` is a ``flax.struct.field`` whose metadata holds a ``popjax.schema.Number``). User
values (``hparams``: a scalar or one value per member), search ranges (``search_space`` and PBT's
priors, which must stay inside those bounds) and the arrays finally built are all checked
against these declarations.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import jax
import jax.numpy as jnp
import numpy as np
import pydantic
from flax import struct

from popjax.distributed import fetch
from popjax.schema import (
    Bool,
    Float,
    Invalid,
    Kind,
    Number,
    NumberList,
    Schema,
    convert,
    fail,
    problem,
    show,
    validate,
)
from popjax.types import Key


def hparam(help: str, *, gt: float | None = None, ge: float | None = None, lt: float | None = None,
           le: float | None = None, integer: bool = False):
    """A field of a learner's HParams with its allowed values (bounds; ``integer`` for int32 leaves)."""
    number = Number(gt=gt, ge=ge, lt=lt, le=le, integer=integer, float32=not integer)
    return struct.field(pytree_node=True, metadata={"hparam": number, "help": help})


def hparam_bounds(hparams_cls) -> dict[str, Number]:
    """``{name: Number}``: what each hyperparameter of a learner allows (declared with ``hparam``)."""
    fields = dataclasses.fields(hparams_cls)
    undeclared = [f.name for f in fields if not isinstance(f.metadata.get("hparam"), Number)]
    if undeclared:
        name = getattr(hparams_cls, "__name__", type(hparams_cls).__name__)
        raise TypeError(f"{name}: {', '.join(undeclared)} declare no allowed values; "
                        "declare each field with popjax.population.hparams.hparam(...)")
    return {f.name: f.metadata["hparam"] for f in fields}


def extend(base, hparams_cls, **values):
    """``hparams_cls`` (whose fields include those of ``base``'s class) with ``base``'s values and ``values``: a
    wrapper's defaults from its base learner's (``values`` override)."""
    return hparams_cls(**{**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)}, **values})


def restrict(hparams, hparams_cls):
    """The ``hparams_cls`` part of ``hparams`` (a wrapper's hparams as its base learner sees them)."""
    return hparams_cls(**{f.name: getattr(hparams, f.name) for f in dataclasses.fields(hparams_cls)})


def hparam_help(hparams_cls) -> dict[str, str]:
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(hparams_cls)}


@dataclasses.dataclass(frozen=True)
class PerMember(Kind):
    """One value for every member, or a list of ``pop_size`` values (the context's ``pop_size``)."""

    number: Number

    def describe(self) -> str:
        return f"{self.number.describe()}, or a list of one such value per member"

    def convert(self, value, context=None):
        pop = (context or {}).get("pop_size")
        if getattr(value, "ndim", 0) == 1 and hasattr(value, "tolist"):  # a numpy or JAX vector
            value = value.tolist()
        if isinstance(value, list | tuple):
            if pop is not None and len(value) != pop:
                raise Invalid(f"a list needs {pop} values (one per member), got {len(value)}: {show(list(value))}")
            out = []
            for i, item in enumerate(value):
                try:
                    out.append(self.number.convert(item))
                except Invalid as err:
                    raise Invalid(str(err), at=(i,)) from None
            return out
        return self.number.convert(value)


@functools.cache
def hparams_schema(hparams_cls) -> type[Schema]:
    """The schema of user-given hparams of a learner: ``{name: value or [value per member]}``."""
    helps = hparam_help(hparams_cls)
    fields = {name: (Annotated[Any, PerMember(number)], pydantic.Field(None, description=helps[name]))
              for name, number in hparam_bounds(hparams_cls).items()}
    model = pydantic.create_model(f"{hparams_cls.__name__}Values", __base__=Schema, **fields)
    model.key_kind = "hparam"
    return model


def validate_hparams(values: Any, hparams_cls, pop_size: int, *, at: Sequence[str | int] = ("hparams",),
                     nested: bool = False) -> dict[str, Any]:
    """User-given hparams checked against the declared bounds; returns them normalised (numbers, lists)."""
    model = validate(hparams_schema(hparams_cls), values, at=at, context={"pop_size": pop_size}, nested=nested)
    return {name: getattr(model, name) for name in values}


class RangeSchema(Schema):
    """A one-dimensional prior ``{low, high, log, integer}`` or ``{choices}`` (see ``Range``)."""

    low: Float() | None = pydantic.Field(None, description="smallest value")
    high: Float() | None = pydantic.Field(None, description="largest value (>= low)")
    log: Bool = pydantic.Field(False, description="log-uniform (needs low > 0)")
    integer: Bool = pydantic.Field(False, description="uniform over the integers low..high")
    choices: Annotated[tuple[float, ...] | None, NumberList(Number(), "a non-empty list of numbers", min_len=1)] = \
        pydantic.Field(None, description="categorical: uniform over these values (instead of low and high)")

    @pydantic.model_validator(mode="after")
    def _ordered(self):
        if self.choices is not None:
            given = [k for k in ("low", "high", "log", "integer") if k in self.model_fields_set]
            if given:
                raise problem("choices exclude low, high, log and integer (allowed: either choices or low and high)",
                              at=(given[0],))
            return self
        for side in ("low", "high"):
            if getattr(self, side) is None:
                raise problem("required, but missing (or give choices)", at=(side,))
        if not self.low <= self.high:
            raise problem(f"must be >= low ({show(self.low)}), got {show(self.high)}", at=("high",))
        if self.log and self.low <= 0:
            raise problem(f"a log-uniform range needs low > 0, got {show(self.low)}", at=("low",))
        return self

    def range(self) -> Range:
        if self.choices is not None:
            values = tuple(sorted(set(self.choices)))
            return Range(values[0], values[-1], integer=all(float(v).is_integer() for v in values), choices=values)
        return Range(self.low, self.high, self.log, self.integer)


def validate_space(space: Any, hparams_cls, *, at: Sequence[str | int] = ("search_space",), fixed=(),
                   nested: bool = False) -> dict[str, Range]:
    """``{hparam: {low, high, log?, integer?}}`` checked against the learner's hparams: known
    names, ranges inside each hparam's bounds, integer ranges for integer hparams."""
    bounds = hparam_bounds(hparams_cls)
    if not isinstance(space, Mapping):
        fail(f"expected {{hparam: {{low, high, log, integer}} or {{choices}}}}, got {show(space)}", at=at,
             nested=nested)
    out = {}
    for name, raw in space.items():
        if name not in bounds:
            fail(f"unknown hparam (allowed: {', '.join(bounds)})", at=(*at, name), nested=nested)
        if name in fixed:
            fail("also set in hparams; an hparam is either fixed or sampled", at=(*at, name), nested=nested)
        r = validate(RangeSchema, raw, at=(*at, name), nested=nested)
        if r.choices is not None:
            for i, value in enumerate(r.choices):
                convert(bounds[name], value, at=(*at, name, "choices", i), nested=nested)
        else:
            for side in ("low", "high"):
                convert(bounds[name], getattr(r, side), at=(*at, name, side), nested=nested)
        if bounds[name].integer and not r.range().integer:
            fail(f"{name} is an integer hparam; set integer: true", at=(*at, name, "integer"), nested=nested)
        out[name] = r.range()
    return out


@dataclasses.dataclass(frozen=True)
class Range:
    """A one-dimensional prior: uniform on [low, high], log-uniform if ``log``, rounded if ``integer``; with
    ``choices``, uniform over those values (sorted; ``low`` and ``high`` are the first and last)."""

    low: float
    high: float
    log: bool = False
    integer: bool = False
    choices: tuple[float, ...] = ()

    def __post_init__(self):
        if not self.low <= self.high:
            raise ValueError(f"search range needs low <= high, got [{self.low}, {self.high}]")
        if self.log and self.low <= 0:
            raise ValueError(f"a log-uniform range needs low > 0, got {self.low}")

    def sample(self, key: Key, shape: tuple[int, ...]) -> jax.Array:
        """Draws from the prior; integer ranges are uniform over ``{low, ..., high}``."""
        if self.choices:
            return jnp.asarray(self.choices, jnp.float32)[jax.random.randint(key, shape, 0, len(self.choices))]
        u = jax.random.uniform(key, shape)
        if self.integer:
            return jnp.minimum(jnp.floor(self.low + u * (self.high - self.low + 1.0)), self.high)
        if self.log:
            return jnp.exp(jnp.log(self.low) + u * (jnp.log(self.high) - jnp.log(self.low)))
        return self.low + u * (self.high - self.low)

    def sample_numpy(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` host draws from the same prior (numpy)."""
        if self.choices:
            return np.asarray(self.choices)[rng.integers(0, len(self.choices), n)]
        u = rng.uniform(size=n)
        if self.integer:
            return np.minimum(np.floor(self.low + u * (self.high - self.low + 1.0)), self.high)
        if self.log:
            return np.exp(np.log(self.low) + u * (np.log(self.high) - np.log(self.low)))
        return self.low + u * (self.high - self.low)

    def clip(self, value: jax.Array) -> jax.Array:
        return jnp.clip(value, self.low, self.high)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Range:
        """``{low, high, log?, integer?}`` (raises ``ConfigError`` naming the bad key)."""
        return validate(RangeSchema, d).range()


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

    return {name: [plain(v) for v in fetch(getattr(hparams, name)).tolist()] for name in hparam_names(hparams)}


def check_hparams(hparams) -> None:
    """Raises ``ConfigError`` naming the first member value outside its hparam's declared bounds."""
    for name, number in hparam_bounds(type(hparams)).items():
        for i, value in enumerate(np.asarray(jax.device_get(getattr(hparams, name))).reshape(-1).tolist()):
            convert(number, value, at=("hparams", name, i))
