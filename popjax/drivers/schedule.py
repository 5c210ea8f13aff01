"""Replaying a PBT run's winning hparam schedule without PBT (Ray Tune's ``PopulationBasedTrainingReplay``).

``best_schedule`` follows the best final member of a PBT run back through every copy in its ``lineage.csv``:
at each round the member's hparams from there on, then its parent before the round. ``popjax pbt-schedule RUN_DIR``
writes that as YAML (``learner``, ``env``, ``member``, ``final_return``, ``schedule: [{env_steps, hparams}]``);
``popjax train --schedule FILE`` trains the ``independent`` driver with that file as its ``schedule`` option, every
member starting from the first entry and switching to entry k at the first evaluation at or after its ``env_steps``
(where PBT switched them), in the compiled ``after_eval`` (the schedule is a constant of the program: traced once).
Unlike Ray's replay (one trial), every member follows the schedule: a population of seeds of the winner's schedule.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from pydantic import Field, ValidationInfo, model_validator

from popjax.config import ConfigError
from popjax.drivers.base import BuildContext, Driver, run_config
from popjax.population.hparams import hparam_names, validate_hparams
from popjax.registry import LEARNERS
from popjax.schema import Int, Invalid, Kind, Schema, problem, show

Entry = dict[str, Any]  # {"env_steps": int, "hparams": {name: value}}


def best_member(final_returns: Sequence[float]) -> int:
    """The member with the highest finite final return (the lower index on a tie)."""
    finite = [(r, m) for m, r in enumerate(final_returns) if r is not None and math.isfinite(r)]
    if not finite:
        raise ConfigError("run_dir: no member has a finite final return; there is no best schedule")
    return max(finite, key=lambda rm: (rm[0], -rm[1]))[1]


def ancestry(rounds: Sequence[Mapping[str, Any]], member: int) -> list[Mapping[str, Any]]:
    """The lineage.csv rows of ``member``'s line, oldest first: at each round the member that held its weights
    from there on (followed back through every ``parent``)."""
    by_round: dict[int, dict[int, Mapping[str, Any]]] = {}
    for row in rounds:
        by_round.setdefault(int(row["round"]), {})[int(row["member"])] = row
    line = []
    for r in sorted(by_round, reverse=True):
        row = by_round[r][member]
        line.append(row)
        member = int(row["parent"])
    return line[::-1]


def best_schedule(rounds: Sequence[Mapping[str, Any]], final_returns: Sequence[float],
                  names: Sequence[str]) -> tuple[int, list[Entry]]:
    """``(member, schedule)``: the best final member and the hparams its line trained with, one entry per round
    from round 0, from lineage.csv rows (``round``, ``member``, ``parent``, ``env_steps``, one column per name)."""
    best = best_member(final_returns)
    return best, [{"env_steps": int(row["env_steps"]), "hparams": {n: _number(row[n]) for n in names}}
                  for row in ancestry(rounds, best)]


def _number(value) -> int | float:
    number = float(value)
    return int(number) if number.is_integer() and "." not in str(value) and "e" not in str(value) else number


@dataclasses.dataclass(frozen=True)
class ScheduleList(Kind):
    """``[{env_steps, hparams}, ...]``: increasing env steps from 0 (hparams checked with the learner)."""

    def describe(self) -> str:
        return "a list of {env_steps, hparams} with increasing env_steps, the first at 0"

    def convert(self, value, context=None):
        if not isinstance(value, list | tuple) or not value:
            raise self.expected(value)
        out, last = [], -1
        for i, entry in enumerate(value):
            if not isinstance(entry, Mapping) or set(entry) != {"env_steps", "hparams"}:
                raise Invalid(f"expected {{env_steps, hparams}}, got {show(entry)}", at=(i,))
            steps = entry["env_steps"]
            if not isinstance(steps, int) or isinstance(steps, bool) or steps <= last or (i == 0 and steps != 0):
                raise Invalid(f"expected an integer {'0' if i == 0 else f'> {last}'}, got {show(steps)}",
                              at=(i, "env_steps"))
            if not isinstance(entry["hparams"], Mapping):
                raise Invalid(f"expected {{hparam: value}}, got {show(entry['hparams'])}", at=(i, "hparams"))
            out.append({"env_steps": steps, "hparams": dict(entry["hparams"])})
            last = steps
        return out


class Schedule(Schema):
    """A schedule file written by ``popjax pbt-schedule`` (the ``independent`` driver's ``schedule`` option)."""

    learner: str = Field(description="the learner the schedule was found for (must be the run's)")
    env: str = Field(description="the env the schedule was found on (must be the run's)")
    schedule: Any = Field(description="the hparams from each env step on")
    member: Int(ge=0) | None = Field(None, description="the PBT member it was read from (information)")
    final_return: Any = Field(None, description="that member's final return (information)")
    source: Any = Field(None, description="the PBT run directory (information)")

    @model_validator(mode="before")
    @classmethod
    def _entries(cls, data):
        if isinstance(data, Mapping) and "schedule" in data:
            try:
                data = {**data, "schedule": ScheduleList().convert(data["schedule"])}
            except Invalid as err:
                raise problem(str(err), at=("schedule", *err.at)) from None
        return data

    @model_validator(mode="after")
    def _fits_the_run(self, info: ValidationInfo):
        config = run_config(info)
        for field in ("learner", "env"):
            if getattr(self, field) != getattr(config, field):
                raise problem(f"the schedule is for {getattr(self, field)}, this run trains "
                              f"{getattr(config, field)} (allowed: {getattr(self, field)})", at=(field,))
        hparams_cls = LEARNERS[config.learner].hparams_cls
        for i, entry in enumerate(self.schedule):
            validate_hparams(entry["hparams"], hparams_cls, 1, at=("schedule", i, "hparams"), nested=True)
        return self

    def hparams(self) -> frozenset[str]:
        """Every hparam the schedule sets (the learner may not specialise on them)."""
        return frozenset(name for entry in self.schedule for name in entry["hparams"])


def with_schedule(ctx: BuildContext, build_inner: Callable[[BuildContext], Driver], schedule: Schedule) -> Driver:
    """``build_inner``'s driver started from the schedule's first hparams, set to entry k at the first evaluation
    at or after its env steps (every member alike)."""
    entries = schedule.schedule
    first = entries[0]["hparams"]
    ctx = dataclasses.replace(ctx, hparams=ctx.hparams.replace(**{
        name: jnp.full_like(getattr(ctx.hparams, name), value) for name, value in first.items()}))
    inner = build_inner(ctx)
    points = jnp.asarray([e["env_steps"] for e in entries], jnp.int32)
    columns = {n: jnp.asarray([e["hparams"].get(n, first[n]) for e in entries], getattr(ctx.hparams, n).dtype)
               for n in hparam_names(ctx.hparams) if n in first}

    def after_eval(key, state, returns):
        del key, returns
        k = jnp.sum(points <= state.counters.env_steps) - 1
        pop = jax.tree.leaves(state.hparams)[0].shape[0]
        values = {n: jnp.full((pop,), column[k]) for n, column in columns.items()}
        return state.replace(hparams=state.hparams.replace(**values)), {}

    return inner._replace(after_eval=after_eval)


def schedule_options(data: Any, path) -> dict[str, Any]:
    """The ``independent`` options block replaying a schedule file's parsed YAML (one line when it is not one)."""
    if not isinstance(data, Mapping) or "schedule" not in data:
        raise ConfigError(f"--schedule: {path} is not a schedule file (written by popjax pbt-schedule)")
    return {"schedule": {**data, "source": str(data.get("source", path))}}

