"""Study ``train``: end-to-end throughput of ``popjax.experiment.train`` (independent driver).

For each env, device count and population size, a real ``popjax.experiment.train`` run
(warm-up, collect, K updates per iteration, a final evaluation and checkpoint, run directory)
with every compiled program wrapped by a timer (``train(..., instrument=CallTimer())``, which the
loop's ``Compiler`` applies to each program it hands out) that blocks on the program's outputs. Reported:

- ``env_steps_per_s``: all members' env steps / the loop's wall time (compile excluded,
  everything else included: warm-up, acting, final evaluation); ``env_steps_per_s_steady``:
  the same over whole training iterations only;
- ``update_fraction``: steady-state share of wall time spent inside the compiled update,
  measured over whole training iterations (from the end of the first training call to the
  end of the last one: collect + update of training iterations 2..n). Host path (``gym:``):
  the ``learn`` call (add the iteration's transitions + K updates). JAX path (``brax:``,
  ``probe:``): an iteration is one compiled ``iteration`` call, collect and update together;
  its first ``ceil(warmup / rollout_len)`` calls are the warm-up ones (collect only, decided
  inside the compiled call), whose median is the collect part subtracted from every training
  call. ``update_fraction_overall`` divides by the whole wall time;
- ``compiled_fraction``: share of wall time inside any compiled program of the loop (acting,
  collect, learn, evaluation; not the set-up programs ``init`` and ``reset``, which run before
  the loop's clock starts);
- ``devices`` / ``state_shards``: the device count the population was split over
  (``RunConfig.devices``) and into how many pieces the final state really is split;
- ``iteration_s`` / ``iteration_iqr_s``: median and IQR of the wall time of the training
  iterations (from the end of one iteration's compiled call to the end of the next; at least
  10, the warm-up iterations left out).

The study runs in a ``common.Sitting`` (load check, the dense-matmul peak before and after, and
the N×[B,h]@[h,h] ceiling of the update's dominant layer at each population size).

Blocking in the timer costs (almost) nothing on the host path: the next collect needs the
updated policy anyway.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, ClassVar

import jax

from popjax_bench import common
from popjax_bench import options as opt
from popjax_bench.common import log

STUDY = "train"
SETUP_PROGRAMS = ("init", "reset")  # compiled, but run before the loop's wall clock starts
MIN_ITERATIONS = 10  # timed training iterations per point


def _learners():
    from popjax.learners import LEARNERS

    return LEARNERS


@dataclasses.dataclass(frozen=True)
class Options(opt.StudyOptions):
    """``popjax bench train`` (and ``train.run(...)``)."""

    STUDY: ClassVar[str] = STUDY
    envs: tuple[str, ...] = opt.names(("gym:HalfCheetah-v5", "brax:halfcheetah"), "comma-separated env names",
                                      flag="--env", check=opt.env_check())
    learner: str = opt.text("td3", "the learner", allowed=_learners, what=" learner")
    pops: tuple[int, ...] = opt.ints((1, 4, 16), "population sizes, comma-separated", flag="--pop")
    env_steps: int = opt.integer(3000, "env steps per member")
    warmup: int = opt.integer(500, "random warm-up env steps per member", ge=0)
    rollout_len: int = opt.integer(50, "env steps per env per iteration (K)")
    batch_size: int = opt.integer(256, "batch size")
    hidden: tuple[int, ...] | None = opt.ints(None, "hidden sizes (default: the learner's, 256,256)")
    overlap: tuple[str, ...] = opt.names(("off",), "overlap modes to compare on gym envs (off, on): acting overlapped "
                                                   "with the update (RunConfig.overlap)", allowed=("off", "on"))

    def devices_needed(self) -> list[int]:
        """Overlap acts on a device of its own: one more than the most the population is split over."""
        return list(self.devices) + ([max(self.devices) + 1] if "on" in self.overlap else [])

    def check(self) -> None:
        iterations = math.ceil(self.env_steps / self.rollout_len)
        timed = iterations - max(1, math.ceil(self.warmup / self.rollout_len))
        if timed < MIN_ITERATIONS:
            raise ValueError(f"--env-steps: {self.env_steps} env steps with --warmup {self.warmup} and --rollout-len "
                             f"{self.rollout_len} give {timed} timed training iterations; at least {MIN_ITERATIONS} "
                             "are needed")


class CallTimer:
    """An ``instrument`` of ``popjax.experiment.train`` (``popjax.loop.Compiler``): times every compiled call by
    name, blocking on its outputs.

    ``block=False`` (overlap runs) records when each call returns without waiting for its
    outputs: blocking on the update would undo the overlap being measured.
    """

    def __init__(self, block: bool = True):
        self.block = block
        self.times: dict[str, list[float]] = defaultdict(list)
        self.spans: list[tuple[str, float, float]] = []

    def __call__(self, name: str, compiled):
        def timed(*args):
            start = time.perf_counter()
            out = compiled(*args)
            if self.block:
                out = jax.block_until_ready(out)
            end = time.perf_counter()
            self.times[name].append(end - start)
            self.spans.append((name, start, end))
            return out

        return timed

    def iteration_times(self, name: str, skip: int = 0) -> list[float]:
        """Wall time of each iteration after the first ``skip``: from the end of one ``name`` call to the end
        of the next (the iteration's host work and its compiled call)."""
        ends = [e for n, _, e in self.spans if n == name]
        return [b - a for a, b in zip(ends[max(0, skip - 1):], ends[max(1, skip):], strict=False)]

    def steady_state(self, name: str, subtract: float = 0.0, skip: int = 0) -> dict[str, float] | None:
        """Share of time in ``name`` calls between the end of its first call and the end of its last.

        The first ``skip`` calls of ``name`` are left out (JAX path: the warm-up iterations).
        That window holds whole iterations only (collect i, update i for i = 2..n): no first-call
        compilation of the acting policy, no warm-up, no final evaluation or checkpoint.
        ``subtract`` seconds are removed from every call (JAX path: the collect part).
        """
        spans = [(s, e) for n, s, e in self.spans if n == name][skip:]
        if len(spans) < 2:
            return None
        window = spans[-1][1] - spans[0][1]
        inside = sum(max(0.0, e - s - subtract) for s, e in spans[1:])
        return {"iterations": len(spans) - 1, "window_s": window, "update_s": inside,
                "fraction": inside / window, "s_per_iteration": window / (len(spans) - 1)}


def run_one(env: str, learner: str, pop: int, env_steps: int, warmup: int, rollout_len: int, batch_size: int,
            hidden, seed: int, work_dir: Path, devices: int = 1, overlap: bool = False) -> dict[str, Any]:
    from popjax.experiment import train

    options = dict(learner=learner, env=env, pop_size=pop, total_env_steps=env_steps, warmup_steps=warmup,
                   rollout_len=rollout_len, batch_size=batch_size, buffer_size=max(env_steps, batch_size),
                   eval_interval=env_steps, eval_episodes=1, seed=seed, progress=False, devices=devices,
                   overlap=overlap, preset="none")
    if hidden:
        options["learner_config"] = {"hidden": list(hidden)}
    timer = CallTimer(block=not overlap)
    start = time.perf_counter()
    name = f"{env.replace(':', '_')}-{learner}-{pop}-d{devices}" + ("-overlap" if overlap else "")
    run = train(out_dir=work_dir / name, instrument=timer, **options)
    total_s = time.perf_counter() - start
    s = run.summary
    wall = s["wall_s"]
    sums = {name: sum(ts) for name, ts in timer.times.items()}
    warmup_calls = 0
    collect_only = None
    warmup_iterations = math.ceil(warmup / rollout_len)
    if "learn" in timer.times:  # host path
        update_s = sums["learn"]
        steady = timer.steady_state("learn")
        iterations = timer.iteration_times("learn", warmup_iterations)
    else:  # JAX path: collect+update in one call; subtract the collect-only (warm-up) call time
        calls = timer.times.get("iteration", [])
        warmup_calls = min(len(calls), math.ceil(warmup / rollout_len))  # envs_per_member is 1
        collect_only = statistics.median(calls[:warmup_calls]) if warmup_calls else 0.0
        training = calls[warmup_calls:]
        update_s = max(0.0, sum(training) - collect_only * len(training))
        steady = timer.steady_state("iteration", subtract=collect_only, skip=warmup_calls)
        iterations = timer.iteration_times("iteration", warmup_iterations)
    iteration = common.summarize(iterations) if iterations else None
    compiled_s = sum(t for name, t in sums.items() if name not in SETUP_PROGRAMS)
    total_steps = pop * s["env_steps"]
    return {
        "env": env, "learner": learner, "pop": pop, "devices": devices, "state_shards": common.shards(run.state),
        "overlap": overlap if not env.startswith(("brax:", "probe:")) else None,
        "env_steps_per_member": s["env_steps"], "updates": s["updates"],
        "wall_s": wall, "compile_s": s["compile_s"], "total_s": total_s,
        "env_steps_per_s": total_steps / wall, "env_steps_per_s_incl_compile": total_steps / total_s,
        "env_steps_per_s_steady": None if steady is None else pop * rollout_len / steady["s_per_iteration"],
        "iteration_s": iteration and iteration["median_s"], "iteration_iqr_s": iteration and iteration["iqr_s"],
        "iterations_timed": len(iterations),
        "update_s": update_s, "update_fraction_overall": update_s / wall,
        "update_fraction": None if steady is None else steady["fraction"], "steady_state": steady,
        "warmup_calls": warmup_calls, "collect_only_s": collect_only,
        "compiled_s": compiled_s, "compiled_fraction": compiled_s / wall,
        "calls": {name: {"count": len(ts), "total_s": sums[name], "median_s": statistics.median(ts)}
                  for name, ts in timer.times.items()},
        "config": options,
    }


def run(options: Options | None = None, /, **overrides: Any) -> dict[str, Any]:
    """Runs the study and writes ``<out_dir>/train.json`` (and ``.png``); returns the payload.

    ``devices``: device counts the population is split over (``RunConfig.devices``), one row
    per count; a population that does not divide is recorded as skipped.
    """
    o = Options.build(options, overrides)
    envs, learner, pops, env_steps, warmup = o.envs, o.learner, o.pops, o.env_steps, o.warmup
    rollout_len, batch_size, hidden, seed = o.rollout_len, o.batch_size, o.hidden, o.seed
    devices = list(o.devices)
    common.request_devices(o.devices_needed())
    modes = lambda env: o.overlap if env.startswith("gym:") else ("off",)  # JAX envs fuse acting and learning
    started = common.utc_now()
    sitting = common.Sitting(allow_busy=o.allow_busy, wait_quiet=o.wait_quiet, seed=seed)
    width = max(hidden or _learners()[learner].config_cls().hidden) if learner in ("td3", "sac") else None
    results = []
    with tempfile.TemporaryDirectory(prefix="popjax-bench-train-") as tmp:
        for env in envs:
            for d in devices:
                for pop, mode in itertools.product(pops, modes(env)):
                    row = {"env": env, "learner": learner, "pop": pop, "devices": d}
                    where = f"{env} {learner} pop {pop:3d} d={d}" + (" overlap" if mode == "on" else "")
                    if pop % d:
                        row["skipped"] = f"{pop} members do not divide over {d} devices"
                    else:
                        layer = width and sitting.layer(pop, batch_size, width, d)
                        try:
                            row = run_one(env, learner, pop, env_steps, warmup, rollout_len, batch_size, hidden,
                                          seed, Path(tmp), devices=d, overlap=mode == "on") | {"layer_gflops": layer}
                            frac = row["update_fraction"]
                            log(f"  {where}: {row['env_steps_per_s']:8.0f} env steps/s, "
                                f"{'?' if frac is None else f'{100 * frac:.0f}'}% of wall time in the compiled "
                                f"update (wall {row['wall_s']:.1f}s + compile {row['compile_s']:.1f}s)")
                        except Exception as err:  # noqa: BLE001 - record it: one env failing must not lose the study
                            row["skipped"] = f"{type(err).__name__}: {err}"
                    if "skipped" in row:
                        log(f"  {where}: skipped ({row['skipped']})")
                    results.append(row)
    add_overlap_shares(results)
    params = {"envs": list(envs), "learner": learner, "pops": list(pops), "devices": devices,
              "overlap": list(o.overlap),
              "env_steps_per_member": env_steps, "warmup_steps": warmup, "rollout_len": rollout_len,
              "updates_per_iter": rollout_len, "batch_size": batch_size, "hidden": list(hidden or (256, 256)),
              "seed": seed, "driver": "independent", "eval": "one deterministic episode per member at the end"}
    payload = common.study_payload(STUDY, params, results, started, **sitting.record())
    return common.write_study(o.out_dir, STUDY, payload, plot_train, o.plot)


def add_overlap_shares(results: list[dict[str, Any]]) -> None:
    """On each overlap row: ``overlap_share``, the share of its iteration time in which env stepping and the
    update ran at once, ``(rollout + update - overlapped iteration) / overlapped iteration``, with the rollout
    and update times of the same point without overlap; and ``speedup`` of its steady env steps/s over it."""
    for row in results:
        base = next((r for r in results if r.get("overlap") is False and "skipped" not in r and
                     (r["env"], r["pop"], r["devices"]) == (row["env"], row["pop"], row["devices"])), None)
        if not row.get("overlap") or "skipped" in row or base is None or not base.get("iteration_s"):
            continue
        update = base["calls"]["learn"]["median_s"]
        rollout = base["iteration_s"] - update
        together = row["steady_state"]["s_per_iteration"] if row.get("steady_state") else row["iteration_s"]
        row["overlap_share"] = max(0.0, rollout + update - together) / together
        row["speedup"] = (row["env_steps_per_s_steady"] or row["env_steps_per_s"]) / \
            (base["env_steps_per_s_steady"] or base["env_steps_per_s"])


def main(options: Options) -> dict[str, Any]:
    """``popjax bench train``."""
    return run(options)


def plot_train(payload: dict[str, Any], path) -> Any:
    plt = common.pyplot()
    rows = [r for r in payload["results"] if "skipped" not in r]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for env, d in dict.fromkeys((r["env"], r.get("devices", 1)) for r in rows):
        series = sorted((r for r in rows if r["env"] == env and r.get("devices", 1) == d), key=lambda r: r["pop"])
        pops = [r["pop"] for r in series]
        label = env + (f" ({d} devices)" if d > 1 else "")
        axes[0].plot(pops, [r["env_steps_per_s"] for r in series], marker="o", label=label)
        axes[1].plot(pops, [100 * (r["update_fraction"] or 0) for r in series], marker="o", label=f"{label} update")
        axes[1].plot(pops, [100 * r["compiled_fraction"] for r in series], marker="x", ls=":",
                     label=f"{label} any compiled step")
    axes[0].set(xscale="log", yscale="log", xlabel="population size", ylabel="env steps/s (all members)",
                title=f"popjax.train, {payload['params']['learner']}, independent driver")
    axes[1].axhline(70, color="0.5", lw=0.8, ls="--")
    axes[1].set(xscale="log", xlabel="population size", ylabel="% of wall time", ylim=(0, 100),
                title="time inside the compiled update")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    return common.save_figure(fig, path, payload["machine"])
