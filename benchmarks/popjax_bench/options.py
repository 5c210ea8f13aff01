"""The options of a benchmark study: one frozen dataclass per study (``popjax_bench.<study>.Options``).

Every option is declared once, as a field of that dataclass with its default, help text,
command-line flag and kind (``integer``, ``number``, ``ints``, ``names``, ``text``,
``switch``). From the declaration come

- the ``popjax bench <study>`` parser (``add_to_parser``: one flag per field, help with the default);
- the conversion of the command line (``from_namespace``: ``"1,4,16"`` -> ``(1, 4, 16)``);
- the checks (``BaseOptions.__post_init__``: one-line ``ValueError``s naming the flag, for
  values from the command line and from Python alike; a study adds cross-field checks in
  ``check``);
- the run: ``<study>.run(options)`` or ``<study>.run(**overrides)`` (the defaults are the
  dataclass's; an option the study does not declare is a ``TypeError`` in Python and an
  unknown option on the command line).

This module imports no JAX: ``popjax bench --help`` stays fast, and a study's parser is
completed (its module imported) only when that study is used.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Callable, Collection
from typing import Any, ClassVar

INT, NUMBER, INTS, NAMES, TEXT, SWITCH = "integer", "number", "ints", "names", "text", "switch"


def _field(default: Any, help: str, kind: str, flag: str | None = None, **meta: Any) -> Any:
    return dataclasses.field(default=default, metadata={"help": help, "kind": kind, "flag": flag, **meta})


def integer(default: int | None, help: str, *, flag: str | None = None, ge: int = 1,
            check: Callable[[str, Any], None] | None = None) -> Any:
    """An integer ``>= ge`` (``None`` allowed when it is the default: "the study's own choice")."""
    return _field(default, help, INT, flag, ge=ge, check=check)


def number(default: float, help: str, *, flag: str | None = None, ge: float = 0.0) -> Any:
    """A finite number ``>= ge``."""
    return _field(default, help, NUMBER, flag, ge=ge)


def ints(default: tuple[int, ...] | None, help: str, *, flag: str | None = None) -> Any:
    """A comma-separated list of positive integers (a tuple; ``None`` allowed when it is the default)."""
    return _field(default, help, INTS, flag)


def names(default: tuple[str, ...], help: str, *, flag: str | None = None,
          allowed: Collection[str] | Callable[[], Collection[str]] | None = None, what: str = "",
          empty: bool = False, check: Callable[[str, Any], None] | None = None) -> Any:
    """A comma-separated list of names (a tuple), each in ``allowed`` (a collection, or a function
    returning one, called when checking); ``empty``: an empty list is allowed (``--gym ''``);
    ``check(flag, name)``: a further check of each name."""
    return _field(default, help, NAMES, flag, allowed=allowed, what=what, empty=empty, check=check)


def text(default: str | None, help: str, *, flag: str | None = None,
         allowed: Collection[str] | Callable[[], Collection[str]] | None = None, what: str = "",
         check: Callable[[str, Any], None] | None = None) -> Any:
    """One string (optionally one of ``allowed``)."""
    return _field(default, help, TEXT, flag, allowed=allowed, what=what, check=check)


def switch(default: bool, help: str, *, flag: str) -> Any:
    """A boolean set by a flag without value: ``--allow-busy`` (default False) or ``--no-plot`` (default True)."""
    return _field(default, help, SWITCH, flag)


def toggle(default: bool, help: str, *, flag: str) -> Any:
    """A boolean with both spellings, ``flag`` and ``--no-`` + its name (``--memory-fit`` / ``--no-memory-fit``),
    whatever the study's default: an option several studies share is spelled the same in all of them."""
    return _field(default, help, SWITCH, flag, paired=True)


# --- options several studies have ------------------------------------------------------------------------
def repeats() -> Any:
    return integer(10, "minimum timed calls per point, K-step calls included (at least 10)", ge=10)


def min_time() -> Any:
    return number(1.0, "minimum seconds of timed calls per point")


def max_seconds(default: float = 120.0) -> Any:
    return number(default, "per-point budget: a larger N whose estimated time (warm-up and timed calls) exceeds "
                           "it is skipped and recorded as skipped")


def memory_fit(default: bool) -> Any:
    """``--memory-fit`` / ``--no-memory-fit`` (``update`` and ``accelerator``)."""
    return toggle(default, "search the largest population whose compiled K-step update fits in the device's memory "
                  "(compiles one program per size tried: about a minute on a CPU, minutes on a GPU)",
                  flag="--memory-fit")


@dataclasses.dataclass(frozen=True)
class BaseOptions:
    """Checks every field on construction (also ``dataclasses.replace``), then ``check()``."""

    STUDY: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = _checked(f, getattr(self, f.name))
            object.__setattr__(self, f.name, value)
        self.check()

    def check(self) -> None:
        """Checks involving several options (a study overrides it); ``ValueError``, one line."""

    def check_split(self) -> None:
        """The command line's check of how the populations split over the devices (``StudyOptions``)."""

    def devices_needed(self) -> list[int]:
        """The device counts the study uses (forced as host devices before JAX starts, where needed)."""
        return list(getattr(self, "devices", (1,)))

    @classmethod
    def build(cls, options: BaseOptions | None = None, overrides: dict[str, Any] | None = None):
        """``options`` (or the defaults) with ``overrides`` applied; ``TypeError`` for an option the study lacks."""
        base = options if options is not None else cls()
        if not isinstance(base, cls):
            raise TypeError(f"expected {cls.__module__}.{cls.__qualname__}, got {type(base).__name__}")
        unknown = sorted(set(overrides or {}) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TypeError(f"{cls.STUDY or cls.__qualname__}: unknown option(s) {', '.join(unknown)} "
                            f"(allowed: {', '.join(f.name for f in dataclasses.fields(cls))})")
        return dataclasses.replace(base, **overrides) if overrides else base


@dataclasses.dataclass(frozen=True)
class SittingOptions(BaseOptions):
    """Options every timed study has: seed, output, plot, and the load discipline
    (``popjax_bench.common.Sitting``)."""

    seed: int = integer(0, "PRNG seed", ge=0)
    out_dir: str = text("benchmarks/results", "output directory (or a .json file path) for <study>.json and "
                        "<study>.png", flag="--out")
    plot: bool = switch(True, "write the JSON only", flag="--no-plot")
    allow_busy: bool = switch(False, "run even when the 1-minute load average exceeds half the cores; the "
                              "results are stamped busy and get no verdict in the report", flag="--allow-busy")
    wait_quiet: float = number(0.0, "seconds to wait for the 1-minute load average to fall to half the cores "
                               "before refusing (make bench: the previous study's own load takes about a minute "
                               "to decay)")


@dataclasses.dataclass(frozen=True)
class StudyOptions(SittingOptions):
    """A timed study that splits its population over ``--devices`` (the ``spo`` study places replicas instead)."""

    SPLIT: ClassVar[str] = "pops"  # the field of the population size(s) split over --devices, if the study has it
    devices: tuple[int, ...] = ints((1,), "device counts to split the population over, e.g. 1,2")

    def device_splits(self) -> list[int]:
        """The device counts a population is split over, one per ``--devices`` value."""
        return list(self.devices)

    def check_split(self) -> None:
        """A one-line ValueError for a device count that no population size divides (its every point would be
        skipped). The command line runs it before anything is timed or written; a Python caller gets the
        skipped rows."""
        field = next((f for f in dataclasses.fields(self) if f.name == self.SPLIT), None)
        if field is None:
            return
        sizes = getattr(self, field.name)
        sizes = sizes if isinstance(sizes, tuple) else (sizes,)
        for devices in self.device_splits():
            if all(n % devices for n in sizes):
                fits = sorted({d for n in sizes for d in range(1, n + 1) if n % d == 0})
                shown = ", ".join(map(str, fits[:12])) + (", ..." if len(fits) > 12 else "")
                what = (f"{sizes[0]} member{'s' if sizes[0] > 1 else ''} cannot" if len(sizes) == 1
                        else f"none of {flag_of(field)} {', '.join(map(str, sizes))} can")
                raise ValueError(f"--devices: {what} be split over {devices} devices (allowed: device counts that "
                                 f"divide a {flag_of(field)} value: {shown})")


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _allowed(meta) -> Collection[str] | None:
    allowed = meta.get("allowed")
    return allowed() if callable(allowed) else allowed


def _checked(f: dataclasses.Field, value: Any) -> Any:
    """``value`` of field ``f`` checked and normalised (lists -> tuples); ValueError naming the flag."""
    meta, flag = f.metadata, flag_of(f)
    kind = meta.get("kind")
    if value is None and f.default is None:
        return None
    if kind == INT:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{flag}: expected an integer, got {value!r}")
        if value < meta["ge"]:
            raise ValueError(f"{flag}: must be >= {meta['ge']}, got {value}")
    elif kind == NUMBER:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                or value < meta["ge"]:
            raise ValueError(f"{flag}: expected a finite number >= {meta['ge']:g}, got {value}")
        value = float(value)
    elif kind == INTS:
        if isinstance(value, int) and not isinstance(value, bool):
            value = (value,)
        values = tuple(value) if isinstance(value, list | tuple) else None
        if not values or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in values):
            raise ValueError(f"{flag}: expected a comma-separated list of positive integers, got {value!r}")
        value = values
    elif kind == NAMES:
        values = (value,) if isinstance(value, str) else tuple(value)
        if not values and not meta["empty"]:
            raise ValueError(f"{flag}: expected a comma-separated list, got {value!r}")
        allowed = _allowed(meta)
        for name in values:
            if allowed is not None and name not in allowed:
                raise ValueError(f"{flag}: {name!r} unknown{meta['what']} (allowed: {', '.join(allowed)})")
        value = values
    elif kind == TEXT:
        allowed = _allowed(meta)
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str):
            raise ValueError(f"{flag}: expected a string, got {value!r}")
        if allowed is not None and value not in allowed:
            raise ValueError(f"{flag}: {value!r} unknown{meta['what']} (allowed: {', '.join(allowed)})")
    elif kind == SWITCH:
        value = bool(value)
    check = meta.get("check")
    if check is not None:
        for item in (value if kind == NAMES else (value,)):
            check(flag, item)
    return value


# --- command line ---------------------------------------------------------------------------------------
def parse_int_list(text: str) -> list[int]:
    """``"1,2,4"`` (or ``1e3``-style integers) -> ``[1, 2, 4]``; ValueError unless all are positive integers."""
    from popjax.schema import parse_number

    numbers = [parse_number(x) for x in str(text).replace(" ", "").split(",") if x]
    if not numbers or any(n is None or not float(n).is_integer() or n < 1 for n in numbers):
        raise ValueError(f"expected a comma-separated list of positive integers, got {text!r}")
    return [int(n) for n in numbers]


def _from_text(f: dataclasses.Field, text: str) -> Any:
    """A command-line string converted to the field's type (ValueError naming the flag)."""
    from popjax.schema import parse_number

    kind, flag = f.metadata.get("kind"), flag_of(f)
    if kind == INTS:
        try:
            return tuple(parse_int_list(text))
        except ValueError as err:
            raise ValueError(f"{flag}: {err}") from None
    if kind == NAMES:
        return tuple(x for x in text.replace(" ", "").split(",") if x)
    if kind in (INT, NUMBER):
        number = parse_number(text)
        if kind == NUMBER:
            try:
                return float(text) if number is None else float(number)  # "nan" and "inf" are then refused
            except ValueError:
                raise ValueError(f"{flag}: expected a finite number >= {f.metadata['ge']:g}, got {text!r}") from None
        if number is None or not float(number).is_integer():
            raise ValueError(f"{flag}: expected an integer, got {text!r}")
        return int(number)
    return text


def _shown(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(str(x) for x in value) or "none"
    return "the study's own" if value is None else str(value)


def add_to_parser(parser: argparse.ArgumentParser, cls: type[BaseOptions]) -> None:
    """One flag per field of ``cls`` (its ``dest`` is the field name; absent unless given), the study's own
    options first."""
    common = {f.name for f in dataclasses.fields(StudyOptions)}
    for f in sorted(dataclasses.fields(cls), key=lambda f: f.name in common):
        meta = f.metadata
        help_text = meta.get("help", "").replace("%", "%%")
        if meta.get("kind") == SWITCH:
            if meta.get("paired"):
                parser.add_argument(flag_of(f), dest=f.name, action=argparse.BooleanOptionalAction,
                                    default=argparse.SUPPRESS, help=f"{help_text} (default: "
                                    f"{flag_of(f) if f.default else '--no-' + flag_of(f)[2:]})")
            else:
                parser.add_argument(flag_of(f), dest=f.name, action="store_false" if f.default else "store_true",
                                    default=argparse.SUPPRESS, help=help_text)
            continue
        shown = "" if f.default is None and "default" in help_text else f" (default: {_shown(f.default)})"
        parser.add_argument(flag_of(f), dest=f.name, default=argparse.SUPPRESS, help=help_text + shown)


def from_namespace(cls: type[BaseOptions], namespace: argparse.Namespace) -> BaseOptions:
    """The options given on the command line (``namespace``), converted and checked; the rest default."""
    given = vars(namespace)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in given:
            value = given[f.name]
            kwargs[f.name] = _from_text(f, value) if isinstance(value, str) and f.metadata["kind"] != TEXT else value
    return cls(**kwargs)


def env_check(jax_only: bool = False, prefix: str | None = None) -> Callable[[str, str], None]:
    """A ``check`` for env names (``popjax.envs.registry``); ``prefix`` is added to a name without one
    (``--gym HalfCheetah-v5`` -> ``gym:HalfCheetah-v5``); ``jax_only`` refuses gymnasium envs."""

    def check(flag: str, name: str) -> None:
        from popjax.envs import registry

        full = name if (prefix is None or ":" in name) else f"{prefix}:{name}"
        try:
            registry.parse(full)
        except ValueError as err:
            raise ValueError(f"{flag}: {err}") from None
        if jax_only and not registry.is_jax_env(full):
            raise ValueError(f"{flag}: {full!r} is a gymnasium env; this study needs a JAX env (brax:, probe:)")

    return check
