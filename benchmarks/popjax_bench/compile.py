"""Study ``compile`` (fast-PBT paper Table 3): compile time of the K-step population update vs N.

The program compiled is the one the ``update`` study times as ``vmap_scan``:
``jit(scan(vmap(update)))`` over ``[K, N, B, ...]`` batches (K = 50 for TD3/SAC, 10 for
DQN), with the member axis split over ``d`` devices when asked. Reported per point:
``trace_lower_s`` (Python tracing + StableHLO lowering), ``xla_compile_s`` (XLA) and their
sum ``compile_s`` (what a user waits for before the first step), median over
``--compile-repeats`` fresh compilations (a new function object every time, so no
in-process cache is hit; the persistent compilation cache is reported in ``params``).
The paper's number is the first call (compile + one execution); ours excludes the
execution, which the ``update`` study reports. XLA compiles on the host CPU, so the study runs
in a ``common.Sitting`` (load check, the dense-matmul peak before and after: how fast the
machine was while compiling); the workload has no layer ceiling (nothing is executed).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, ClassVar

import jax

from popjax_bench import common, update
from popjax_bench import options as opt
from popjax_bench.common import log

STUDY = "compile"


@dataclasses.dataclass(frozen=True)
class Options(opt.StudyOptions):
    """``popjax bench compile`` (and ``compile.run(...)``)."""

    STUDY: ClassVar[str] = STUDY
    learners: tuple[str, ...] = opt.names(("td3", "sac"), "comma-separated learners", flag="--learner",
                                          allowed=update.PROBLEMS, what=" learner")
    pops: tuple[int, ...] = opt.ints(update.DEFAULT_POPS, "population sizes, comma-separated", flag="--pop")
    k: int | None = opt.integer(None, "update steps per compiled call (default: 50 TD3/SAC, 10 DQN)")
    hidden: tuple[int, ...] | None = opt.ints(None, "override hidden sizes, e.g. 64,64 (DQN: its MLP head)")
    batch_size: int | None = opt.integer(None, "override the batch size")
    compile_repeats: int = opt.integer(1, "fresh compilations per point (median)")
    repeats: int = opt.repeats()
    min_time: float = opt.min_time()
    max_seconds: float = opt.max_seconds()


def compile_once(p: update.Problem, pop: int, devices: int, k: int, seed: int = 0) -> dict[str, Any]:
    learner, _ = update.make_learner(p)
    state, hparams = update.population_state(p, pop, seed)
    batches = update.synthetic_batches(p, k, pop, seed)
    keys = jax.random.split(jax.random.key(seed), (k, pop))
    state, hparams = common.place(state, devices), common.place(hparams, devices)
    batches, keys = common.place(batches, devices, 1), common.place(keys, devices, 1)
    fn = update.scanned_step(learner)
    step = lambda *args: fn(*args)  # a fresh function object: no jit cache hit across repeats
    compiled, times = common.compile_timed(step, keys, state, batches, hparams, donate_argnums=(1,))
    return {**times, "xla_memory": common.memory_analysis(compiled)}


def run(options: Options | None = None, /, **overrides: Any) -> dict[str, Any]:
    """Runs the study and writes ``<out_dir>/compile.json`` (and ``.png``); returns the payload.

    ``--repeats`` / ``--min-time`` time the ceilings; a point whose compilations took more than
    ``--max-seconds`` ends the N sweep of its learner (compile time hardly grows with N): the larger
    N are recorded as skipped.
    """
    o = Options.build(options, overrides)
    learners, pops, devices, max_seconds = o.learners, o.pops, o.devices, o.max_seconds
    started = common.utc_now()
    problems = [update.problem(name, o.hidden, o.batch_size, o.k) for name in learners]
    common.request_devices(devices)
    sitting = common.Sitting(allow_busy=o.allow_busy, wait_quiet=o.wait_quiet, repeats=o.repeats,
                             min_time=o.min_time, seed=o.seed)
    results = []
    for p in problems:
        name = p.learner
        for d in devices:
            over = None  # the reason the rest of the sweep is skipped
            for pop in pops:
                if pop % d:
                    continue
                if over:
                    results.append({"learner": name, "pop": pop, "devices": d, "k": p.k, "skipped": over})
                    log(f"  {name} K={p.k} N={pop:3d} d={d}: skipped ({over})")
                    continue
                start = time.perf_counter()
                runs = [compile_once(p, pop, d, p.k, o.seed) for _ in range(o.compile_repeats)]
                row = {
                    "learner": name,
                    "pop": pop,
                    "devices": d,
                    "k": p.k,
                    "repeats": len(runs),
                    "compile_s": statistics.median(r["compile_s"] for r in runs),
                    "trace_lower_s": statistics.median(r["lower_s"] for r in runs),
                    "xla_compile_s": statistics.median(r["xla_compile_s"] for r in runs),
                    "all_compile_s": [r["compile_s"] for r in runs],
                    "xla_memory": runs[-1]["xla_memory"],
                }
                results.append(row)
                log(
                    f"  {name} K={p.k} N={pop:3d} d={d}: compile {row['compile_s']:.2f}s "
                    f"(trace+lower {row['trace_lower_s']:.2f}s, XLA {row['xla_compile_s']:.2f}s)"
                )
                spent = time.perf_counter() - start
                if spent > max_seconds:
                    over = (f"N={pop} took {spent:.0f}s > --max-seconds {max_seconds:.0f} (compile time hardly "
                            "grows with N)")
    params = {
        "learners": list(learners),
        "pops": list(pops),
        "devices": list(devices),
        "k": {p.learner: p.k for p in problems},
        "compile_repeats": o.compile_repeats,
        "seed": o.seed,
        "persistent_cache_dir": jax.config.values.get("jax_compilation_cache_dir"),
        "measured": "AOT jax.jit(fn).lower(args).compile(); excludes the first execution",
    }
    payload = common.study_payload(STUDY, params, results, started, **sitting.record())
    return common.write_study(o.out_dir, STUDY, payload, plot_compile, o.plot)


def main(options: Options) -> dict[str, Any]:
    """``popjax bench compile``."""
    return run(options)


def plot_compile(payload: dict[str, Any], path) -> Any:
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    rows = [r for r in payload["results"] if "skipped" not in r]
    for name in dict.fromkeys(r["learner"] for r in rows):
        for d in dict.fromkeys(r["devices"] for r in rows):
            series = sorted(
                (r for r in rows if r["learner"] == name and r["devices"] == d), key=lambda r: r["pop"]
            )
            if series:
                ax.plot(
                    [r["pop"] for r in series],
                    [r["compile_s"] for r in series],
                    marker="o",
                    label=f"{name}, K={series[0]['k']} ({d} dev)",
                )
    ax.set(
        xscale="log",
        xlabel="population size N",
        ylabel="compile time (s)",
        ylim=(0, None),
        title="Compile time of the K-step population update",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return common.save_figure(fig, path, payload["machine"])
