"""Study ``compile`` (fast-PBT paper Table 3): compile time of the K-step population update vs N.

The program compiled is the one the ``update`` study times as ``vmap_scan``:
``jit(scan(vmap(update)))`` over ``[K, N, B, ...]`` batches (K = 50 for TD3/SAC, 10 for
DQN), with the member axis split over ``d`` devices when asked. Reported per point:
``trace_lower_s`` (Python tracing + StableHLO lowering), ``xla_compile_s`` (XLA) and their
sum ``compile_s`` (what a user waits for before the first step), median over
``--compile-repeats`` fresh compilations (a new function object every time, so no
in-process cache is hit; the persistent compilation cache is reported in ``params``).
The paper's number is the first call (compile + one execution); ours excludes the
execution, which the ``update`` study reports.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import jax

from popjax.bench import common, update
from popjax.bench.common import log

STUDY = "compile"


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


def run(
    learners=("td3", "sac"),
    pops=update.DEFAULT_POPS,
    devices=(1,),
    out_dir=common.DEFAULT_OUT,
    hidden=None,
    batch_size=None,
    k=None,
    compile_repeats=1,
    max_seconds=120.0,
    seed=0,
    plot=True,
) -> dict[str, Any]:
    started = common.utc_now()
    common.request_devices(devices)
    load_before = common.load_average()
    results = []
    for name in learners:
        p = update.problem(name, hidden, batch_size, k)
        for d in devices:
            for pop in pops:
                if pop % d:
                    continue
                start = time.perf_counter()
                runs = [compile_once(p, pop, d, p.k, seed) for _ in range(compile_repeats)]
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
                if time.perf_counter() - start > max_seconds:
                    log(
                        f"  {name}: N sweep stopped (last point took > --max-seconds {max_seconds})"
                    )
                    break
    params = {
        "learners": list(learners),
        "pops": list(pops),
        "devices": list(devices),
        "k": {name: update.problem(name, hidden, batch_size, k).k for name in learners},
        "compile_repeats": compile_repeats,
        "seed": seed,
        "persistent_cache_dir": jax.config.values.get("jax_compilation_cache_dir"),
        "measured": "AOT jax.jit(fn).lower(args).compile(); excludes the first execution",
    }
    payload = common.study_payload(
        STUDY, params, results, started, load_before=load_before, load_after=common.load_average()
    )
    return common.write_study(out_dir, STUDY, payload, plot_compile, plot)


def plot_compile(payload: dict[str, Any], path) -> Any:
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    rows = payload["results"]
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


def main(args: argparse.Namespace) -> dict[str, Any]:
    return run(
        learners=[x for x in args.learner.split(",") if x],
        pops=common.parse_int_list(args.pop),
        devices=common.parse_int_list(args.devices),
        out_dir=args.out,
        hidden=common.parse_int_list(args.hidden) if args.hidden else None,
        batch_size=args.batch_size,
        k=args.k,
        compile_repeats=args.compile_repeats,
        max_seconds=args.max_seconds,
        seed=args.seed,
        plot=not args.no_plot,
    )
