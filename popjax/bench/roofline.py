"""Study ``roofline``: achieved GFLOP/s of the population update against the machine's matmul peak.

1. Peak: a large dense float32 ``jnp.dot`` (several sizes, best kept), timed like every
   other call (compiled once, median of repeats, output blocked on). With several devices
   the matmul is batched over the devices (one ``[n, n] @ [n, n]`` per device, sharded),
   so the peak is that of all devices together.
2. Achieved: the TD3/SAC population update ``jit(vmap(update))`` at each N; FLOPs per
   population step from XLA's cost analysis of the compiled 1-step program
   (``jitted.lower(...).compile().cost_analysis()["flops"]``; XLA counts a scan body once,
   so K-step programs are never used for the count), cross-checked with an analytic count
   of the dense-layer matmuls (forward, weight gradients, input gradients).
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

import jax
import jax.numpy as jnp

from popjax.bench import common, update
from popjax.bench.common import log

STUDY = "roofline"


def _layer_flops(dims: list[int], batch: int) -> list[float]:
    return [2.0 * batch * a * b for a, b in zip(dims[:-1], dims[1:], strict=True)]


def analytic_flops(p: update.Problem) -> dict[str, float]:
    """Matmul FLOPs of one single-member update step (elementwise work not counted).

    With ``F`` = forward FLOPs of a network on the batch and ``F'`` = the same without its
    first layer (no gradient is needed w.r.t. the batch inputs):

    - TD3: target actor ``Fa`` + target twin ``2Fq``; critic step forward ``2Fq``, weight
      grads ``2Fq``, input grads ``2F'q``; actor step (computed every step: the delay is a
      select) forward ``Fa + Fq``, input grads through critic 1 ``Fq``, actor weight grads
      ``Fa`` and input grads ``F'a``: total ``3Fa + F'a + 8Fq + 2F'q``.
    - SAC: as TD3 but the actor (output ``2|A|``) goes through both Q heads:
      ``3Fa + F'a + 10Fq + 2F'q``.
    """
    obs, act, b = p.spec.obs_shape[0], p.spec.action_dim, p.batch_size
    hidden = list(p.config.hidden)
    q = _layer_flops([obs + act, *hidden, 1], b)
    fq, fq_nf = sum(q), sum(q[1:])
    if p.learner == "td3":
        a = _layer_flops([obs, *hidden, act], b)
        fa, fa_nf = sum(a), sum(a[1:])
        total = 3 * fa + fa_nf + 8 * fq + 2 * fq_nf
    elif p.learner == "sac":
        a = _layer_flops([obs, *hidden, 2 * act], b)
        fa, fa_nf = sum(a), sum(a[1:])
        total = 3 * fa + fa_nf + 10 * fq + 2 * fq_nf
    else:
        raise ValueError(f"no analytic FLOP count for {p.learner}")
    return {"per_member_step": total, "actor_forward": fa, "q_forward": fq}


def matmul_peak(devices: int, sizes=(1024, 2048), opts=None) -> dict[str, Any]:
    """Dense float32 matmul throughput (GFLOP/s) on ``devices`` devices; best over ``sizes``."""
    rows = []
    for n in sizes:
        key_a, key_b = jax.random.split(jax.random.key(n))
        a = jax.random.normal(key_a, (devices, n, n), jnp.float32)
        b = jax.random.normal(key_b, (devices, n, n), jnp.float32)
        a, b = common.place(a, devices), common.place(b, devices)
        compiled, _ = common.compile_timed(lambda x, y: jnp.einsum("dij,djk->dik", x, y), a, b)
        call = functools.partial(compiled, a, b)
        timing = common.time_calls(
            call, warmup=2, min_repeats=getattr(opts, "repeats", 5), min_time=getattr(opts, "min_time", 1.0)
        )
        flops = 2.0 * devices * n**3
        rows.append(
            {
                "n": n,
                "devices": devices,
                "flops": flops,
                "xla_flops": common.cost_flops(compiled),
                "gflops": flops / timing["median_s"] / 1e9,
                "timing": timing,
            }
        )
        log(f"  matmul {n}x{n} x{devices} device(s): {rows[-1]['gflops']:.1f} GFLOP/s")
        del a, b, call
    best = max(rows, key=lambda r: r["gflops"])
    return {"devices": devices, "peak_gflops": best["gflops"], "best_n": best["n"], "sizes": rows}


def batched_layer_gflops(pop: int, devices: int, batch: int, width: int, opts=None) -> float:
    """GFLOP/s of ``pop`` independent ``[batch, width] @ [width, width]`` matmuls (one vmapped dot):
    the dominant layer of the population update at its real shapes — the attainable peak for it."""
    key_a, key_b = jax.random.split(jax.random.key(pop))
    a = common.place(jax.random.normal(key_a, (pop, batch, width), jnp.float32), devices)
    b = common.place(jax.random.normal(key_b, (pop, width, width), jnp.float32), devices)
    compiled, _ = common.compile_timed(lambda x, y: jnp.einsum("nbi,nio->nbo", x, y), a, b)
    timing = common.time_calls(
        functools.partial(compiled, a, b),
        warmup=2,
        min_repeats=getattr(opts, "repeats", 5),
        min_time=getattr(opts, "min_time", 1.0),
    )
    return 2.0 * pop * batch * width * width / timing["median_s"] / 1e9


IMPLS = ("vmap", "vmap_scan")  # one step per call, K steps per call


def run(
    learners=("td3", "sac"),
    pops=update.DEFAULT_POPS,
    devices=(1,),
    impls=("vmap",),
    out_dir=common.DEFAULT_OUT,
    hidden=None,
    batch_size=None,
    k=None,
    matmul_sizes=(1024, 2048),
    repeats=10,
    min_time=1.0,
    max_seconds=120.0,
    seed=0,
    plot=True,
) -> dict[str, Any]:
    opts = argparse.Namespace(repeats=repeats, min_time=min_time, max_seconds=max_seconds, seed=seed)
    started = common.utc_now()
    unknown = sorted(set(impls) - set(IMPLS))
    if unknown:
        raise ValueError(f"--impl: unknown implementation(s) {', '.join(unknown)} (allowed: {', '.join(IMPLS)})")
    for name in learners:
        update.problem(name, hidden, batch_size, k)  # unknown learners fail before anything is timed
    common.request_devices(devices)
    load_before = common.load_average()
    peaks = {d: matmul_peak(d, matmul_sizes, opts) for d in devices}
    results: list[dict[str, Any]] = []
    for name in learners:
        p = update.problem(name, hidden, batch_size, k)
        analytic = analytic_flops(p)
        for d in devices:
            last = None
            for pop in pops:
                if pop % d:
                    continue
                if last and last[1] * pop / last[0] > max_seconds:
                    results.append(
                        {
                            "learner": name,
                            "pop": pop,
                            "devices": d,
                            "skipped": f"estimated {last[1] * pop / last[0]:.0f}s > --max-seconds",
                        }
                    )
                    continue
                one = update.run_vmap(p, pop, d, 1, opts, reuse=True)
                flops_step = one["xla_flops_per_call"]
                row = {
                    "learner": name,
                    "pop": pop,
                    "devices": d,
                    "xla_flops_per_pop_step": flops_step,
                    "analytic_flops_per_pop_step": analytic["per_member_step"] * pop,
                    "xla_over_analytic": None if not flops_step else flops_step / (analytic["per_member_step"] * pop),
                    "peak_gflops": peaks[d]["peak_gflops"],
                    # The same N independent [B, h] @ [h, h] products alone: what XLA attains at these shapes.
                    "layer_gflops": batched_layer_gflops(pop, d, p.batch_size, max(p.config.hidden), opts),
                    "compile_s": one["compile"]["compile_s"],
                }
                timings = {"vmap": one}
                if "vmap_scan" in impls:
                    timings["vmap_scan"] = update.run_vmap(p, pop, d, p.k, opts, reuse=True)
                flops = flops_step or analytic["per_member_step"] * pop
                for impl, out in timings.items():
                    sec = out["timing"]["median_s"] / out["steps_per_call"]
                    row[impl] = {
                        "ms_per_pop_step": 1e3 * sec,
                        "gflops": flops / sec / 1e9,
                        "fraction_of_peak": flops / sec / 1e9 / peaks[d]["peak_gflops"],
                        "steps_per_call": out["steps_per_call"],
                        "timing": out["timing"],
                    }
                best = max(timings, key=lambda i: row[i]["gflops"])
                row["best_impl"] = best
                row["gflops"] = row[best]["gflops"]
                row["fraction_of_peak"] = row[best]["fraction_of_peak"]
                row["fraction_of_layer"] = row["gflops"] / row["layer_gflops"]
                results.append(row)
                last = (pop, sum(sum(o["timing"]["times_s"]) for o in timings.values()))  # execution only
                log(
                    f"  {name} N={pop:3d} d={d}: {row['gflops']:.1f} GFLOP/s = "
                    f"{100 * row['fraction_of_peak']:.0f}% "
                    f"of peak ({best}); XLA/analytic FLOPs {row['xla_over_analytic'] or float('nan'):.2f}"
                )
    params = {
        "learners": list(learners),
        "pops": list(pops),
        "devices": list(devices),
        "impls": list(impls),
        "matmul_sizes": list(matmul_sizes),
        "repeats": repeats,
        "min_time_s": min_time,
        "seed": seed,
        "flops_source": "XLA cost_analysis of the compiled 1-step vmapped update (scan bodies are counted "
        "once by XLA, so K-step programs are not used for counting)",
        "analytic": {name: analytic_flops(update.problem(name, hidden, batch_size, k)) for name in learners},
    }
    payload = common.study_payload(
        STUDY,
        params,
        results,
        started,
        matmul={str(d): v for d, v in peaks.items()},
        load_before=load_before,
        load_after=common.load_average(),
    )
    return common.write_study(out_dir, STUDY, payload, plot_roofline, plot)


def plot_roofline(payload: dict[str, Any], path) -> Any:
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    rows = [r for r in payload["results"] if "skipped" not in r]
    for d, peak in payload["matmul"].items():
        ax.axhline(peak["peak_gflops"], ls=":", color="0.3")
        ax.text(
            1,
            peak["peak_gflops"] * 1.02,
            f"matmul peak, {d} device(s): {peak['peak_gflops']:.0f} GFLOP/s",
            fontsize=7,
        )
    for name in dict.fromkeys(r["learner"] for r in rows):
        for d in dict.fromkeys(r["devices"] for r in rows):
            series = sorted((r for r in rows if r["learner"] == name and r["devices"] == d), key=lambda r: r["pop"])
            if series:
                ax.plot(
                    [r["pop"] for r in series],
                    [r["gflops"] for r in series],
                    marker="o",
                    label=f"{name} population update ({d} dev)",
                )
    ax.set(
        xscale="log",
        xlabel="population size N",
        ylabel="GFLOP/s (XLA cost analysis / median time)",
        title="Achieved vs dense-matmul GFLOP/s",
        ylim=(0, None),
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return common.save_figure(fig, path, payload["machine"])


def main(args: argparse.Namespace) -> dict[str, Any]:
    return run(
        learners=[x for x in args.learner.split(",") if x],
        pops=common.parse_int_list(args.pop),
        devices=common.parse_int_list(args.devices),
        impls=[x for x in args.impl.split(",") if x],
        out_dir=args.out,
        hidden=common.parse_int_list(args.hidden) if args.hidden else None,
        batch_size=args.batch_size,
        k=args.k,
        matmul_sizes=common.parse_int_list(args.matmul_sizes),
        repeats=args.repeats,
        min_time=args.min_time,
        max_seconds=args.max_seconds,
        seed=args.seed,
        plot=not args.no_plot,
    )
