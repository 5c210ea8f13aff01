"""Study ``train``: end-to-end throughput of ``popjax.experiment.train`` (independent driver).

For each env, device count and population size, a real ``popjax.experiment.train`` run
(warm-up, collect, K updates per iteration, a final evaluation and checkpoint, run directory)
with every compiled program wrapped by a timer (``popjax.loop.Compiler.call_wrapper``) that
blocks on the program's outputs. Reported:

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
  (``RunConfig.devices``) and into how many pieces the final state really is split.

Blocking in the timer costs (almost) nothing on the host path: the next collect needs the
updated policy anyway.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import jax

from popjax.bench import common
from popjax.bench.common import log

STUDY = "train"
SETUP_PROGRAMS = ("init", "reset")  # compiled, but run before the loop's wall clock starts


class CallTimer:
    """``popjax.loop.Compiler.call_wrapper``: times every compiled call by name, blocking on its outputs."""

    def __init__(self):
        self.times: dict[str, list[float]] = defaultdict(list)
        self.spans: list[tuple[str, float, float]] = []

    def __call__(self, name: str, compiled):
        def timed(*args):
            start = time.perf_counter()
            out = jax.block_until_ready(compiled(*args))
            end = time.perf_counter()
            self.times[name].append(end - start)
            self.spans.append((name, start, end))
            return out

        return timed

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


@contextlib.contextmanager
def timing_hook(timer: CallTimer):
    """Every program ``popjax.loop.Compiler`` hands out is wrapped by ``timer`` inside the block."""
    from popjax.loop import Compiler

    previous = Compiler.__dict__.get("call_wrapper")
    Compiler.call_wrapper = staticmethod(timer)
    try:
        yield
    finally:
        Compiler.call_wrapper = previous


def run_one(env: str, learner: str, pop: int, env_steps: int, warmup: int, rollout_len: int, batch_size: int,
            hidden, seed: int, work_dir: Path, devices: int = 1) -> dict[str, Any]:
    from popjax.experiment import train

    options = dict(learner=learner, env=env, pop_size=pop, total_env_steps=env_steps, warmup_steps=warmup,
                   rollout_len=rollout_len, batch_size=batch_size, buffer_size=max(env_steps, batch_size),
                   eval_interval=env_steps, eval_episodes=1, seed=seed, progress=False, devices=devices)
    if hidden:
        options["learner_config"] = {"hidden": list(hidden)}
    timer = CallTimer()
    start = time.perf_counter()
    with timing_hook(timer):
        run = train(out_dir=work_dir / f"{env.replace(':', '_')}-{learner}-{pop}-d{devices}", **options)
    total_s = time.perf_counter() - start
    s = run.summary
    wall = s["wall_s"]
    sums = {name: sum(ts) for name, ts in timer.times.items()}
    warmup_calls = 0
    collect_only = None
    if "learn" in timer.times:  # host path
        update_s = sums["learn"]
        steady = timer.steady_state("learn")
    else:  # JAX path: collect+update in one call; subtract the collect-only (warm-up) call time
        calls = timer.times.get("iteration", [])
        warmup_calls = min(len(calls), math.ceil(warmup / rollout_len))  # envs_per_member is 1
        collect_only = statistics.median(calls[:warmup_calls]) if warmup_calls else 0.0
        training = calls[warmup_calls:]
        update_s = max(0.0, sum(training) - collect_only * len(training))
        steady = timer.steady_state("iteration", subtract=collect_only, skip=warmup_calls)
    compiled_s = sum(t for name, t in sums.items() if name not in SETUP_PROGRAMS)
    total_steps = pop * s["env_steps"]
    return {
        "env": env, "learner": learner, "pop": pop, "devices": devices, "state_shards": common.shards(run.state),
        "env_steps_per_member": s["env_steps"], "updates": s["updates"],
        "wall_s": wall, "compile_s": s["compile_s"], "total_s": total_s,
        "env_steps_per_s": total_steps / wall, "env_steps_per_s_incl_compile": total_steps / total_s,
        "env_steps_per_s_steady": None if steady is None else pop * rollout_len / steady["s_per_iteration"],
        "update_s": update_s, "update_fraction_overall": update_s / wall,
        "update_fraction": None if steady is None else steady["fraction"], "steady_state": steady,
        "warmup_calls": warmup_calls, "collect_only_s": collect_only,
        "compiled_s": compiled_s, "compiled_fraction": compiled_s / wall,
        "calls": {name: {"count": len(ts), "total_s": sums[name], "median_s": statistics.median(ts)}
                  for name, ts in timer.times.items()},
        "config": options,
    }


def run(envs=("gym:HalfCheetah-v5", "brax:halfcheetah"), learner="td3", pops=(1, 4, 16), env_steps=3000,
        warmup=500, rollout_len=50, batch_size=256, hidden=None, out_dir=common.DEFAULT_OUT, seed=0,
        plot=True, devices=(1,)) -> dict[str, Any]:
    """Runs the study and writes ``<out_dir>/train.json`` (and ``.png``); returns the payload.

    ``devices``: device counts the population is split over (``RunConfig.devices``), one row
    per count; a population that does not divide is recorded as skipped.
    """
    devices = list(devices)
    common.request_devices(devices)
    started = common.utc_now()
    load_before = common.load_average()
    results = []
    with tempfile.TemporaryDirectory(prefix="popjax-bench-train-") as tmp:
        for env in envs:
            for d in devices:
                for pop in pops:
                    row = {"env": env, "learner": learner, "pop": pop, "devices": d}
                    where = f"{env} {learner} pop {pop:3d} d={d}"
                    if pop % d:
                        row["skipped"] = f"{pop} members do not divide over {d} devices"
                    else:
                        try:
                            row = run_one(env, learner, pop, env_steps, warmup, rollout_len, batch_size, hidden,
                                          seed, Path(tmp), devices=d)
                            frac = row["update_fraction"]
                            log(f"  {where}: {row['env_steps_per_s']:8.0f} env steps/s, "
                                f"{'?' if frac is None else f'{100 * frac:.0f}'}% of wall time in the compiled "
                                f"update (wall {row['wall_s']:.1f}s + compile {row['compile_s']:.1f}s)")
                        except Exception as err:  # noqa: BLE001 - record it: one env failing must not lose the study
                            row["skipped"] = f"{type(err).__name__}: {err}"
                    if "skipped" in row:
                        log(f"  {where}: skipped ({row['skipped']})")
                    results.append(row)
    params = {"envs": list(envs), "learner": learner, "pops": list(pops), "devices": devices,
              "env_steps_per_member": env_steps, "warmup_steps": warmup, "rollout_len": rollout_len,
              "updates_per_iter": rollout_len, "batch_size": batch_size, "hidden": list(hidden or (256, 256)),
              "seed": seed, "driver": "independent", "eval": "one deterministic episode per member at the end"}
    payload = common.study_payload(STUDY, params, results, started, load_before=load_before,
                                   load_after=common.load_average())
    return common.write_study(out_dir, STUDY, payload, plot_train, plot)


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


def main(args: argparse.Namespace) -> dict[str, Any]:
    return run(envs=[x for x in args.env.split(",") if x], learner=args.learner.split(",")[0],
               pops=common.parse_int_list(args.pop), devices=common.parse_int_list(args.devices),
               env_steps=args.env_steps, warmup=args.warmup,
               rollout_len=args.rollout_len, batch_size=args.batch_size or 256,
               hidden=common.parse_int_list(args.hidden) if args.hidden else None, out_dir=args.out,
               seed=args.seed, plot=not args.no_plot)
