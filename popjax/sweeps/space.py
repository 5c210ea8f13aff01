"""A sweep's search space: traced hparams only, as popjax ranges and as Optuna distributions.

A space is a name of ``popjax.population.search_spaces.SEARCH_SPACES``, or a mapping (a YAML file's contents)
``{hparam: spec}`` where ``spec`` is popjax's range ``{low, high, log?, integer?}`` / ``{choices}`` or Optuna's
distribution in words::

    actor_lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}   # log-float
    policy_delay: {type: int, low: 1, high: 5}
    discount: {type: categorical, choices: [0.95, 0.98, 0.99]}

Every name must be one of the learner's traced hparams (they change per member without recompiling), or a static
option of the learner's config (``hidden``, ``n_step``, ...: it sets array shapes or the compiled program) given
as a list of choices: ``hidden: {choices: [[64, 64], [256, 256]]}``. Each combination of static values trains in a
population of its own (``split_static``); a static option given as a range, or a run option, is refused in one line.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Mapping
from typing import Any

from popjax.config import ConfigError
from popjax.population.hparams import Range, hparam_bounds, validate_space
from popjax.population.search_spaces import SEARCH_SPACES

OPTUNA_TYPES = ("float", "int", "categorical")


def resolve_space(space: str | Mapping[str, Any] | None, learner: str, learner_def, fixed: tuple[str, ...] = (),
                  static_fields: tuple[str, ...] = ()) -> dict[str, Range]:
    """The space as validated popjax ``Range``s (one-line ``ConfigError`` naming the problem).

    ``None`` is the learner's named space; ``fixed``: hparams the run sets (they cannot also be searched);
    ``static_fields``: the learner's static options (refused with the traced alternatives)."""
    if space is None:
        if learner not in SEARCH_SPACES:
            raise ConfigError(f"search_space: no default space for {learner} (give one: a name of "
                              f"{', '.join(SEARCH_SPACES)} or {{hparam: {{low, high}}}})")
        space = learner
    if isinstance(space, str):
        if space not in SEARCH_SPACES:
            raise ConfigError(f"search_space: {space!r} unknown (allowed: {', '.join(SEARCH_SPACES)}, or a YAML file "
                              "of {hparam: {type, low, high, log} | {type: categorical, choices}})")
        space = SEARCH_SPACES[space]
    if not isinstance(space, Mapping) or not space:
        raise ConfigError(f"search_space: expected a non-empty mapping {{hparam: range}}, got {space!r}")
    traced = tuple(hparam_bounds(learner_def.hparams_cls))
    for name in space:
        if name not in traced and name in static_fields:
            raise ConfigError(f"search_space.{name}: a static option of {learner} (it sets array shapes or the "
                              f"compiled program), so it cannot vary inside one population; sweep traced hparams "
                              f"(allowed: {', '.join(traced)}) or run one sweep per {name}")
    return validate_space({name: popjax_range(name, spec) for name, spec in space.items()}, learner_def.hparams_cls,
                          fixed=fixed)


def split_static(space: str | Mapping[str, Any] | None, learner: str, learner_def,
                 config_fields: tuple[str, ...]) -> tuple[Any, dict[str, tuple]]:
    """``(traced part of space, {static option: choices})``: the entries naming a field of the learner's config
    (``config_fields``) leave the space; each must be ``{choices: [...]}`` (Optuna's words or popjax's) of distinct
    values. A name or None (a named space) has no static part."""
    if not isinstance(space, Mapping):
        return space, {}
    traced = tuple(hparam_bounds(learner_def.hparams_cls))
    static = {}
    for name, spec in space.items():
        if name in traced or name not in config_fields:
            continue
        choices = spec.get("choices") if isinstance(spec, Mapping) else None
        extra = set(spec) - {"choices", "type"} if isinstance(spec, Mapping) else set()
        if (not isinstance(choices, list) or not choices or extra
                or (isinstance(spec, Mapping) and spec.get("type", "categorical") != "categorical")):
            raise ConfigError(f"search_space.{name}: a static option of {learner} (it sets array shapes or the "
                              "compiled program) is searched over a list of values, one population each (allowed: "
                              f"{{choices: [...]}}), got {spec!r}")
        if len({encode(v) for v in choices}) < len(choices):
            raise ConfigError(f"search_space.{name}.choices: a value is given twice ({choices!r})")
        static[name] = tuple(choices)
    return {k: v for k, v in space.items() if k not in static}, static


def combinations(static: Mapping[str, tuple]) -> list[dict[str, Any]]:
    """Every combination of static values (one population each), in the order given: ``[{}]`` without any."""
    names = list(static)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*(static[n] for n in names))]


def encode(value: Any) -> Any:
    """A static value as an Optuna categorical choice (a number or string as it is, a list as its JSON text)."""
    return value if isinstance(value, (bool, int, float, str)) or value is None else json.dumps(value)


def decode(value: Any) -> Any:
    """``encode``'s inverse (a JSON list or mapping text back to the value)."""
    if isinstance(value, str) and value[:1] in ("[", "{"):
        return json.loads(value)
    return value


def static_distributions(static: Mapping[str, tuple]) -> dict[str, Any]:
    """Optuna's categorical distributions of the static options (their values encoded)."""
    import optuna.distributions as dist

    return {name: dist.CategoricalDistribution([encode(v) for v in choices]) for name, choices in static.items()}


def popjax_range(name: str, spec: Any) -> Any:
    """Optuna's words (``type``) as popjax's range dict; a popjax range is returned as it is."""
    if not isinstance(spec, Mapping) or "type" not in spec:
        return spec
    kind, rest = spec["type"], {k: v for k, v in spec.items() if k != "type"}
    if kind not in OPTUNA_TYPES:
        raise ConfigError(f"search_space.{name}.type: {kind!r} unknown (allowed: {', '.join(OPTUNA_TYPES)})")
    if kind == "categorical":
        return rest
    if kind == "int":
        if rest.get("log"):
            raise ConfigError(f"search_space.{name}.log: a log-int range is not supported (allowed: false)")
        return {**rest, "integer": True}
    return rest


def distributions(space: Mapping[str, Range]) -> dict[str, Any]:
    """Optuna distributions of validated ranges (integer: ``IntDistribution``; choices: ``CategoricalDistribution``)."""
    import optuna.distributions as dist

    out = {}
    for name, r in space.items():
        if r.choices:
            out[name] = dist.CategoricalDistribution([int(v) if r.integer else float(v) for v in r.choices])
        elif r.integer:
            out[name] = dist.IntDistribution(int(r.low), int(r.high))
        else:
            out[name] = dist.FloatDistribution(float(r.low), float(r.high), log=r.log)
    return out


def as_plain(space: Mapping[str, Range]) -> dict[str, dict[str, Any]]:
    """Validated ranges as popjax's range dicts (for sweep.yaml)."""
    out = {}
    for name, r in space.items():
        if r.choices:
            out[name] = {"choices": list(r.choices)}
        else:
            fields = {k: v for k, v in dataclasses.asdict(r).items() if k != "choices"}
            out[name] = {k: v for k, v in fields.items() if k in ("low", "high") or v}
    return out
