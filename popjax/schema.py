"""One validation mechanism for everything a user configures (pydantic v2).

Every configuration popjax reads is a schema built from the kinds below: ``RunConfig`` and each
learner's static ``Config`` (pydantic dataclasses), each driver's options block and a search
range (``Schema`` models), and the per-member hyperparameters (the bounds each learner declares
on its ``HParams`` fields with ``popjax.population.hparams.hparam``). The same declarations
give the error messages and the CLI help (``describe``).

A *kind* (``Number``, ``Flag``, ``Choice``, ``NumberList``, ``AnyMapping``, ...) converts one
value the way a user means it, whether it comes from YAML, a flag or Python: integers stay
integers (``1e3`` and ``"1e3"`` are 1000, ``1.5`` is not an integer, ``True`` is not a
number), numbers are finite, lists stay lists. A failure is a ``ConfigError`` (a
``ValueError``) of one line, ``field: problem (allowed: ...)``::

    pbt.quantile: must lie in (0, 0.5], got 0.6
    hparams.policy_delay: expected an integer >= 1, got 1.5
    learner_config.hidden: expected a list of positive integers (...), got 'abc'

Validators of a schema raise ``problem(message, at=...)``; ``validate`` turns the first error
of a ``pydantic.ValidationError`` into the ``ConfigError`` with the dotted path of the field.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Annotated, Any, ClassVar

import numpy as np
import pydantic
from pydantic import ConfigDict, ValidationError
from pydantic_core import ArgsKwargs, PydanticCustomError, PydanticUndefined, core_schema


class ConfigError(ValueError):
    """A user error in the configuration: one line naming the field (reported without a traceback)."""


MODEL_CONFIG = ConfigDict(extra="forbid", arbitrary_types_allowed=True, validate_default=False)
INT32_MAX = 2**31 - 1


def problem(message: str, at: Sequence[str | int] = (), absolute: bool = False) -> PydanticCustomError:
    """The error a validator raises: ``message`` about the field at ``at`` (relative to the value
    being validated, or from the root of the whole configuration when ``absolute``)."""
    return PydanticCustomError("popjax", "{message}", {"message": message, "at": tuple(at), "absolute": absolute})


class Invalid(Exception):
    """Raised by a kind's ``convert``; becomes a ``problem`` at the field being validated (+ ``at``)."""

    def __init__(self, message: str, at: Sequence[str | int] = ()):
        super().__init__(message)
        self.at = tuple(at)


def show(value: Any, limit: int = 60) -> str:
    """A value as it appears in a message (numbers as numbers, strings quoted, long ones cut)."""
    if isinstance(value, bool | np.bool_):
        return str(bool(value)).lower()
    if isinstance(value, int | np.integer):
        value = int(value)
        if abs(value) < 10**16:
            return str(value)
        return f"{float(value):.6g}" if abs(value) < 10**300 else f"an integer of {len(str(abs(value)))} digits"
    if isinstance(value, float | np.floating):
        return repr(float(value))
    if isinstance(value, ArgsKwargs):
        value = value.kwargs or list(value.args)
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- kinds: how one value is converted, described and checked -------------------------------------
class Kind:
    """Converts one user value (``convert``) and says what is allowed (``describe``).

    Used as ``Annotated[T, kind]`` in a schema; ``convert`` gets the validation context
    (``{"config": ...}`` for driver options, ``{"pop_size": ...}`` for hparams).
    """

    def describe(self) -> str:
        raise NotImplementedError

    def convert(self, value: Any, context: Mapping[str, Any]) -> Any:
        raise NotImplementedError

    def expected(self, value: Any) -> Invalid:
        return Invalid(f"expected {self.describe()}, got {show(value)}")

    def __get_pydantic_core_schema__(self, source, handler):
        def validate(value, info):
            try:
                return self.convert(value, info.context or {})
            except Invalid as err:
                raise problem(str(err), at=err.at) from None

        return core_schema.with_info_plain_validator_function(validate)


def _bound(x: float) -> str:
    return show(int(x)) if float(x).is_integer() and abs(x) < 10**16 else show(x)


@dataclasses.dataclass(frozen=True)
class Number(Kind):
    """A finite number (``integer``: an integer) within optional bounds.

    ``float32``: the value must also hold as a float32 (hyperparameters are float32 arrays: 1e-50
    would become 0, 1e39 infinity).
    """

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    integer: bool = False
    float32: bool = False

    def bounds(self) -> str:
        low = f"({_bound(self.gt)}" if self.gt is not None else f"[{_bound(self.ge)}" if self.ge is not None else None
        high = f"{_bound(self.lt)})" if self.lt is not None else f"{_bound(self.le)}]" if self.le is not None else None
        if low and high:
            return f"in {low}, {high}"
        if low:
            return f"{'>' if low[0] == '(' else '>='} {low[1:]}"
        if high:
            return f"{'<' if high[-1] == ')' else '<='} {high[:-1]}"
        return ""

    def describe(self) -> str:
        bounds = self.bounds()
        if self.integer:
            return f"an integer {bounds}".rstrip()
        return f"a number {bounds}" if bounds else "a finite number"

    def inside(self, x: float) -> bool:
        return not ((self.gt is not None and not x > self.gt) or (self.ge is not None and not x >= self.ge)
                    or (self.lt is not None and not x < self.lt) or (self.le is not None and not x <= self.le))

    def convert(self, value: Any, context: Mapping[str, Any] | None = None) -> int | float:
        number = parse_number(value)
        if number is None or (self.integer and isinstance(number, float) and not number.is_integer()):
            raise self.expected(value)
        try:
            number = int(number) if self.integer else float(number)
        except OverflowError:  # an integer beyond any float
            raise self.expected(value) from None
        bounds = self.bounds()
        if not self.inside(number):
            verb = "lie" if bounds.startswith("in ") else "be"
            raise Invalid(f"must {verb} {bounds}, got {show(number)}")
        if self.float32 and not self.integer:
            with np.errstate(over="ignore"):  # beyond float32 it is inf, refused below (no RuntimeWarning line)
                single = float(np.float32(number))
            if not math.isfinite(single) or not self.inside(single):
                raise Invalid(f"{show(number)} is {show(single)} as a float32; allowed: {self.describe()}")
        return number


def parse_number(value: Any) -> int | float | None:
    """``value`` as an int or a finite float (strings such as ``"1e3"`` included), else None."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # a numpy or JAX scalar array
        value = value.item()
    if isinstance(value, bool | np.bool_):
        return None
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        try:
            return int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                return None
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating) and math.isfinite(value):
        return float(value)
    return None


@dataclasses.dataclass(frozen=True)
class Flag(Kind):
    """``true`` or ``false`` (a bool; strings and numbers are not flags)."""

    def describe(self) -> str:
        return "true or false"

    def convert(self, value, context=None):
        if isinstance(value, bool | np.bool_):
            return bool(value)
        raise self.expected(value)


@dataclasses.dataclass(frozen=True)
class Choice(Kind):
    """One of ``values`` (or of ``values()``, read when validating: a registry that may grow)."""

    values: tuple[str, ...] | Callable[[], Iterable[str]]

    def allowed(self) -> tuple[str, ...]:
        return tuple(self.values() if callable(self.values) else self.values)

    def describe(self) -> str:
        return "one of " + ", ".join(self.allowed())

    def convert(self, value, context=None):
        allowed = self.allowed()
        if isinstance(value, str) and value in allowed:
            return value
        raise Invalid(f"{show(value)} unknown (allowed: {', '.join(allowed)})")


@dataclasses.dataclass(frozen=True)
class Choices(Kind):
    """Some of ``values`` (a list without repeats, or one name alone), as a tuple; ``values`` as in ``Choice``."""

    values: tuple[str, ...] | Callable[[], Iterable[str]]

    def describe(self) -> str:
        return f"a list of {', '.join(Choice(self.values).allowed())} (or one of them alone)"

    def convert(self, value, context=None):
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, list | tuple):
            raise self.expected(value)
        out = tuple(Choice(self.values).convert(name) for name in names)
        twice = [name for i, name in enumerate(out) if name in out[:i]]
        if twice:
            raise Invalid(f"{show(twice[0])} is given twice")
        return out


@dataclasses.dataclass(frozen=True)
class NumberList(Kind):
    """A list (or tuple) of ``item`` numbers, between ``min_len`` and ``max_len`` long; a tuple."""

    item: Number
    description: str
    min_len: int = 0
    max_len: int | None = None
    increasing: bool = False

    def describe(self) -> str:
        return self.description

    def convert(self, value, context=None):
        if getattr(value, "ndim", 0) == 1 and hasattr(value, "tolist"):  # a numpy or JAX vector
            value = value.tolist()
        if not isinstance(value, list | tuple) or len(value) < self.min_len or \
                (self.max_len is not None and len(value) > self.max_len):
            raise self.expected(value)
        try:
            out = tuple(self.item.convert(v) for v in value)
        except Invalid:
            raise self.expected(value) from None
        if self.increasing and list(out) != sorted(out):
            raise Invalid(f"must be increasing, got {show(list(value))}")
        return out


@dataclasses.dataclass(frozen=True)
class AnyMapping(Kind):
    """A mapping with string keys (its values are checked by whoever reads it); a dict."""

    description: str = "a mapping {name: value}"

    def describe(self) -> str:
        return self.description

    def convert(self, value, context=None):
        if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
            return dict(value)
        raise self.expected(value)


@dataclasses.dataclass(frozen=True)
class Either(Kind):
    """A string among ``words`` or a value of ``kind`` (e.g. ``"auto"`` or a number > 0)."""

    words: tuple[str, ...]
    kind: Kind

    def describe(self) -> str:
        return f"{self.kind.describe()} or {' or '.join(repr(w) for w in self.words)}"

    def convert(self, value, context=None):
        if isinstance(value, str) and value in self.words:
            return value
        try:
            return self.kind.convert(value, context or {})
        except Invalid:
            raise self.expected(value) from None


# Annotated shorthands used in schemas.
def Int(**bounds) -> Any:  # noqa: N802 - a type factory
    return Annotated[int, Number(integer=True, **bounds)]


def Float(**bounds) -> Any:  # noqa: N802
    return Annotated[float, Number(**bounds)]


Bool = Annotated[bool, Flag()]


def OneOf(values) -> Any:  # noqa: N802
    return Annotated[str, Choice(values if callable(values) else tuple(values))]


def SomeOf(values) -> Any:  # noqa: N802
    return Annotated[tuple[str, ...], Choices(values if callable(values) else tuple(values))]


def kind_of(field: pydantic.fields.FieldInfo) -> Kind | None:
    """The kind declared on a schema field, also inside ``Optional[...]`` (None for plain annotations)."""
    metadata = list(field.metadata)
    for arg in typing.get_args(field.annotation):
        metadata += list(getattr(arg, "__metadata__", ()))
    for item in metadata:
        if isinstance(item, Kind):
            return item
    return None


# --- schemas -----------------------------------------------------------------------------------------
def check_keys(cls, data: Any, what: str = "key") -> Any:
    """Before validation: a mapping (or keyword arguments) whose keys are all fields of ``cls``."""
    names = tuple(schema_fields(cls))
    if isinstance(data, ArgsKwargs):
        keys = list(data.kwargs or {})
    elif isinstance(data, Mapping):
        keys = list(data)
    elif dataclasses.is_dataclass(data) and isinstance(data, cls) or isinstance(data, pydantic.BaseModel):
        return data
    else:
        raise problem(f"expected a mapping of options, got {show(data)}")
    for key in keys:
        if key not in names:
            allowed = ", ".join(names) if names else "none, this takes no options"
            raise problem(f"unknown {what} (allowed: {allowed})", at=(str(key),))
    return data


def check_keys_of(cls, data: Mapping[str, Any], *, at: Sequence[str | int] = (), nested: bool = True) -> None:
    """Only the keys of ``data`` checked against the fields of ``cls`` (no values)."""
    names = tuple(schema_fields(cls))
    for key in data:
        if key not in names:
            allowed = ", ".join(names) if names else "none, this takes no options"
            fail(f"unknown key (allowed: {allowed})", at=(*at, key), nested=nested)


class Schema(pydantic.BaseModel):
    """A validated block of options: unknown keys and wrong values are one-line errors."""

    model_config = MODEL_CONFIG
    key_kind: ClassVar[str] = "key"  # "unknown <key_kind>" in messages

    @pydantic.model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data):
        return check_keys(cls, data, cls.key_kind)


def dataclass(cls=None, /, *, what: str = "key"):
    """``@schema.dataclass``: a frozen pydantic dataclass whose constructor raises ``ConfigError``.

    It stays a dataclass (``dataclasses.fields``, ``replace``, ``asdict``); ``replace`` validates
    again. Unknown keys are named with ``what`` ("unknown option", "unknown key").
    """

    def wrap(cls):
        def _known_keys(klass, data):
            return check_keys(klass, data, what)

        cls._known_keys = pydantic.model_validator(mode="before")(classmethod(_known_keys))
        cls = pydantic.dataclasses.dataclass(frozen=True, config=MODEL_CONFIG)(cls)
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            try:
                init(self, *args, **kwargs)
            except ValidationError as err:
                raise config_error(err) from None

        cls.__init__ = __init__
        return cls

    return wrap if cls is None else wrap(cls)


def schema_fields(cls) -> dict[str, pydantic.fields.FieldInfo]:
    """``{name: FieldInfo}`` of a Schema model or a pydantic dataclass."""
    if isinstance(cls, type) and issubclass(cls, pydantic.BaseModel):
        return dict(cls.model_fields)
    return dict(getattr(cls, "__pydantic_fields__", {}))


@functools.cache
def _adapter(cls) -> pydantic.TypeAdapter:
    return pydantic.TypeAdapter(cls)


def validate(cls, data: Any, *, at: Sequence[str | int] = (), context: Mapping[str, Any] | None = None,
             nested: bool = False):
    """``data`` validated by the schema ``cls`` (a Schema model or a pydantic dataclass).

    Raises ``ConfigError`` naming ``at`` + the field, or (``nested``, inside another validator)
    the ``problem`` that the enclosing validation reports at its own location + ``at``.
    """
    try:
        if isinstance(cls, type) and issubclass(cls, pydantic.BaseModel):
            return cls.model_validate(data, context=dict(context or {}))
        return _adapter(cls).validate_python(data, context=dict(context or {}))
    except ValidationError as err:
        loc, message, absolute = _first_error(err)
        if nested:
            raise problem(message, at=loc if absolute else (*at, *loc), absolute=absolute) from None
        raise ConfigError(_line(loc if absolute else (*at, *loc), message)) from None


def convert(kind: Kind, value: Any, *, at: Sequence[str | int] = (), context: Mapping[str, Any] | None = None,
            nested: bool = False):
    """One value of ``kind`` (same errors as ``validate``)."""
    try:
        return kind.convert(value, context or {})
    except Invalid as err:
        fail(str(err), at=(*at, *err.at), nested=nested)


def fail(message: str, *, at: Sequence[str | int] = (), nested: bool = False, absolute: bool = False):
    """Raises the error of the field at ``at``: a ``ConfigError``, or (``nested``) a ``problem``."""
    if nested:
        raise problem(message, at=at, absolute=absolute)
    raise ConfigError(_line(tuple(at), message))


def config_error(err: ValidationError, at: Sequence[str | int] = ()) -> ConfigError:
    """The one-line ``ConfigError`` of a pydantic ``ValidationError`` (its first error)."""
    loc, message, absolute = _first_error(err)
    return ConfigError(_line(loc if absolute else (*at, *loc), message))


def _first_error(err: ValidationError) -> tuple[tuple, str, bool]:
    first = err.errors(include_url=False)[0]
    loc, ctx, kind = tuple(first["loc"]), first.get("ctx") or {}, first["type"]
    if kind == "popjax":
        absolute = bool(ctx.get("absolute"))
        return (tuple(ctx.get("at", ())) if absolute else (*loc, *ctx.get("at", ()))), ctx["message"], absolute
    if kind == "value_error" and isinstance(ctx.get("error"), ConfigError):
        return (), str(ctx["error"]), True
    if kind in ("missing", "missing_argument"):
        return loc, "required, but missing", False
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        return loc, "unknown key", False
    message = str(first["msg"]).splitlines()[0]
    return loc, f"{message[0].lower()}{message[1:]}, got {show(first.get('input'))}", False


def _line(loc: Sequence[str | int], message: str) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += ("." if path else "") + str(part)
    line = f"{path}: {message}" if path else message
    return " ".join(line.split())  # one line, whatever the message held


# --- documentation -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class FieldDoc:
    name: str
    help: str
    default: str
    allowed: str


def describe(cls) -> list[FieldDoc]:
    """What each field of a schema means, its default and what is allowed (for help texts)."""
    docs = []
    for name, field in schema_fields(cls).items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if "default" in extra:
            default = str(extra["default"])
        elif field.default_factory is not None:
            default = show_default(field.default_factory())
        else:
            default = show_default(field.default)
        kind = kind_of(field)
        allowed = str(extra.get("allowed") or (kind.describe() if kind else ""))
        docs.append(FieldDoc(name, field.description or "", default, allowed))
    return docs


def show_default(value: Any) -> str:
    if value is None or value is PydanticUndefined:
        return "none"
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict) and not value:
        return "{}"
    return str(value)
