"""Ask-and-tell over one slot population: batches of trials asked together, each slot's objective told to its trial.

A generation starts when every slot is free: up to ``pop_size`` trials are asked together and every slot is
refilled (counters zeroed, so the warm-up runs again). At each evaluation every trial that reached an evaluation
point reports its objective so far (``trial.report(value, env_steps)``); a trial that reached its budget is told
its objective (COMPLETE), one the pruner stops is told PRUNED and its slot is refilled at once with the next asked
trial (while other slots still train), so the population stays full. A trial whose return is not finite is told
FAIL (``diverged``); it counts as finished (it spent its budget).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from popjax.loop import crossed
from popjax.sweeps.options import SweepOptions, objective_value
from popjax.sweeps.slots import SlotPopulation, values_of

OWNER = "popjax_sweep"  # user attribute: the id of the sweep (directory) that runs a trial


@dataclasses.dataclass
class Running:
    """A trial in a slot: where its budget started, and its evaluations ``(own env steps, return)``."""

    trial: Any
    start_steps: int
    start_updates: int
    evaluations: list[tuple[int, float]] = dataclasses.field(default_factory=list)


def finished_here(study, sweep_id: str) -> int:
    """Trials of this sweep that count towards ``n_trials``: completed, pruned, or failed by divergence."""
    from optuna.trial import TrialState

    done = 0
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get(OWNER) != sweep_id:
            continue
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED) or (t.state == TrialState.FAIL
                                                                    and t.user_attrs.get("diverged")):
            done += 1
    return done


def run_trials(study, population: SlotPopulation, options: SweepOptions, distributions: Mapping[str, Any],
               sweep_id: str, on_trial: Callable[[Any, str, float], None] | None = None,
               fixed: Mapping[str, Any] | None = None) -> None:
    """Runs trials until ``options.n_trials`` of this sweep are finished. ``fixed``: the static values (encoded)
    the population was built with; every trial asked must carry them (the study's sampler fixes them)."""
    from optuna.trial import TrialState

    config = population.config
    budget, interval = config.total_env_steps, config.eval_interval
    slots: list[Running | None] = [None] * population.size
    generation = len({t.user_attrs.get("generation") for t in study.get_trials(deepcopy=False)
                      if t.user_attrs.get(OWNER) == sweep_id})

    def ask(count: int, new_generation: bool) -> dict[int, tuple[int, dict[str, float]]]:
        free = [i for i, s in enumerate(slots) if s is None][:count]
        updates = 0 if new_generation else population.updates()
        steps = 0 if new_generation else population.env_steps
        assignments = {}
        for slot in free:
            trial = study.ask(dict(distributions))
            wrong = {k: trial.params.get(k) for k, v in (fixed or {}).items() if trial.params.get(k) != v}
            if wrong:  # e.g. a re-queued trial of another group: it cannot train in this population
                study.tell(trial, state=TrialState.FAIL)
                raise RuntimeError(f"trial {trial.number} asks for {wrong}, but this population was built with "
                                   f"{fixed}")
            for key, value in {OWNER: sweep_id, "slot": slot, "generation": generation,
                               "refilled": not new_generation, "start_env_steps": steps}.items():
                trial.set_user_attr(key, value)
            slots[slot] = Running(trial, steps, updates)
            assignments[slot] = (trial.number, values_of(trial.params, population.names))  # static ones: fixed
        return assignments

    def finish(slot: int, state, value: float) -> None:
        running = slots[slot]
        trial = running.trial
        trial.set_user_attr("env_steps", population.env_steps - running.start_steps)
        trial.set_user_attr("updates", population.updates() - running.start_updates)
        trial.set_user_attr("evaluations", [[s, r] for s, r in running.evaluations])
        if state == TrialState.FAIL:
            trial.set_user_attr("diverged", True)
        study.tell(trial, value if state == TrialState.COMPLETE else None, state=state)
        slots[slot] = None
        if on_trial is not None:
            on_trial(trial, state.name, value)

    while True:
        to_ask = min(population.size, options.n_trials - finished_here(study, sweep_id))
        if to_ask <= 0:
            return
        population.refill(ask(to_ask, True), new_generation=True)
        while any(s is not None for s in slots):
            before = population.env_steps
            population.step()
            due = [i for i, s in enumerate(slots) if s is not None and _due(before - s.start_steps,
                                                                            population.env_steps - s.start_steps,
                                                                            interval, budget)]
            if not due:
                continue
            returns = population.evaluate()
            for slot in due:
                running = slots[slot]
                steps = population.env_steps - running.start_steps
                running.evaluations.append((steps, float(returns[slot])))
                value = objective_value(options.objective, options.last_k, [r for _, r in running.evaluations])
                if not math.isfinite(value):
                    finish(slot, TrialState.FAIL, value)
                elif steps >= budget:
                    finish(slot, TrialState.COMPLETE, value)
                else:
                    running.trial.report(value, steps)
                    if running.trial.should_prune():
                        finish(slot, TrialState.PRUNED, value)
            active = sum(s is not None for s in slots)
            free = population.size - active
            more = options.n_trials - finished_here(study, sweep_id) - active
            if active and free and more > 0:  # refill in place: the population stays full
                population.refill(ask(min(free, more), False), new_generation=False)
        generation += 1


def _due(before: int, after: int, interval: int, budget: int) -> bool:
    """Whether a trial that trained from ``before`` to ``after`` of its own env steps is evaluated now."""
    return after >= budget or crossed(before, after, interval)
