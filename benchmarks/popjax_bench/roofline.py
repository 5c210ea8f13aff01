"""Study ``roofline``: achieved GFLOP/s of the population update against the machine's matmul peak.

1. Peak: a large dense float32 ``jnp.dot`` (several sizes, best kept; ``common.matmul_gflops``),
   timed like every other call (compiled once, median of repeats, output blocked on). With
   several devices the matmul is batched over the devices (one ``[n, n] @ [n, n]`` per device,
   sharded), so the peak is that of all devices together. The study also runs in a
   ``common.Sitting`` (load check, the 2048² peak before and after, and the N×[B,h]@[h,h]
   ceiling of the update's dominant layer at each point: ``common.layer_gflops``).
2. Achieved: the TD3/SAC population update ``jit(vmap(update))`` at each N; FLOPs per
   population step from XLA's cost analysis of the compiled 1-step program
   (``jitted.lower(...).compile().cost_analysis()["flops"]``; XLA counts a scan body once,
   so K-step programs are never used for the count), cross-checked with an analytic count
   of the dense-layer matmuls (forward, weight gradients, input gradients).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from popjax_bench import common, update
from popjax_bench import options as opt
from popjax_bench.common import log

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
        rows.append(common.matmul_gflops(n, devices, repeats=getattr(opts, "repeats", 10),
                                         min_time=getattr(opts, "min_time", 1.0)))
        log(f"  matmul {n}x{n} x{devices} device(s): {rows[-1]['gflops']:.1f} GFLOP/s")
    best = max(rows, key=lambda r: r["gflops"])
    return {"devices": devices, "peak_gflops": best["gflops"], "best_n": best["n"], "sizes": rows}


IMPLS = ("vmap", "vmap_scan")  # one step per call, K steps per call


@dataclasses.dataclass(frozen=True)
class Options(opt.StudyOptions):
    """``popjax bench roofline`` (and ``roofline.run(...)``)."""

    STUDY: ClassVar[str] = STUDY
    learners: tuple[str, ...] = opt.names(("td3", "sac"), "comma-separated learners", flag="--learner",
                                          allowed=("td3", "sac"), what=" learner")
    pops: tuple[int, ...] = opt.ints(update.DEFAULT_POPS, "population sizes, comma-separated", flag="--pop")
    impls: tuple[str, ...] = opt.names(("vmap",), "vmap and/or vmap_scan (K steps per call)", flag="--impl",
                                       allowed=IMPLS, what=" implementation")
    k: int | None = opt.integer(None, "update steps per compiled call of vmap_scan (default: 50)")
    hidden: tuple[int, ...] | None = opt.ints(None, "override hidden sizes, e.g. 64,64")
    batch_size: int | None = opt.integer(None, "override the batch size")
    matmul_sizes: tuple[int, ...] = opt.ints((1024, 2048), "square matmul sizes for the peak")
    repeats: int = opt.repeats()
    min_time: float = opt.min_time()
    max_seconds: float = opt.max_seconds()


def run(options: Options | None = None, /, **overrides: Any) -> dict[str, Any]:
    """Runs the study and writes ``<out_dir>/roofline.json`` (and ``.png``); returns the payload.

    ``options``: an ``Options``; ``overrides``: any of its fields.
    """
    o = Options.build(options, overrides)
    learners, pops, devices, impls, max_seconds = o.learners, o.pops, o.devices, o.impls, o.max_seconds
    started = common.utc_now()
    problems = [update.problem(name, o.hidden, o.batch_size, o.k) for name in learners]
    common.request_devices(devices)
    sitting = common.Sitting(allow_busy=o.allow_busy, wait_quiet=o.wait_quiet, repeats=o.repeats,
                             min_time=o.min_time, seed=o.seed)
    peaks = {d: matmul_peak(d, o.matmul_sizes, o) for d in devices}
    results: list[dict[str, Any]] = []
    for p in problems:
        name = p.learner
        analytic = analytic_flops(p)
        for d in devices:
            last = None  # (pop, {impl: (s per call, warm-up calls)})
            for pop in pops:
                if pop % d:
                    continue
                if last:
                    estimate = sum(common.estimated_seconds(call_s, pop / last[0], repeats=o.repeats,
                                                            min_time=o.min_time, warmup=warmup)
                                   for call_s, warmup in last[1].values())
                    if estimate > max_seconds:
                        reason = (f"estimated {estimate:.0f}s for warm-up and {o.repeats} timed calls > --max-seconds "
                                  f"{max_seconds:.0f}")
                        log(f"  {name} N={pop:3d} d={d}: skipped ({reason})")
                        results.append({"learner": name, "pop": pop, "devices": d, "skipped": reason})
                        continue
                entries = {"vmap": update.prepare_vmap(p, pop, d, 1, o, reuse=True)}
                if "vmap_scan" in impls:
                    entries["vmap_scan"] = update.prepare_vmap(p, pop, d, p.k, o, reuse=True)
                # The same N independent [B, h] @ [h, h] products alone: what XLA attains at these shapes.
                layer = sitting.layer(pop, p.batch_size, max(p.config.hidden), d)
                timings = dict(zip(entries, update.measure(list(entries.values()), o), strict=True))
                one = timings["vmap"]
                flops_step = one["xla_flops_per_call"]
                row = {
                    "learner": name,
                    "pop": pop,
                    "devices": d,
                    "xla_flops_per_pop_step": flops_step,
                    "analytic_flops_per_pop_step": analytic["per_member_step"] * pop,
                    "xla_over_analytic": None if not flops_step else flops_step / (analytic["per_member_step"] * pop),
                    "peak_gflops": peaks[d]["peak_gflops"],
                    "layer_gflops": layer,
                    "compile_s": one["compile"]["compile_s"],
                }
                for impl, out in timings.items():
                    # each program's own FLOPs per step: TD3's chunked K-step program does no discarded actor work
                    flops = out.get("xla_flops_per_step") or flops_step or analytic["per_member_step"] * pop
                    sec = out["timing"]["median_s"] / out["steps_per_call"]
                    row[impl] = {
                        "ms_per_pop_step": 1e3 * sec,
                        "ms_per_pop_step_iqr": 1e3 * out["timing"]["iqr_s"] / out["steps_per_call"],
                        "gflops": flops / sec / 1e9,
                        "fraction_of_peak": flops / sec / 1e9 / peaks[d]["peak_gflops"],
                        "fraction_of_layer": flops / sec / 1e9 / layer,
                        "steps_per_call": out["steps_per_call"],
                        "xla_flops_per_pop_step": flops,
                        "timing": out["timing"],
                    }
                best = max(timings, key=lambda i: row[i]["gflops"])
                row["best_impl"] = best
                row["gflops"] = row[best]["gflops"]
                row["fraction_of_peak"] = row[best]["fraction_of_peak"]
                row["fraction_of_layer"] = row[best]["fraction_of_layer"]
                results.append(row)
                last = (pop, {impl: (out["timing"]["median_s"], out["warmup_calls"]) for impl, out in timings.items()})
                log(
                    f"  {name} N={pop:3d} d={d}: {row['gflops']:.1f} GFLOP/s = "
                    f"{100 * row['fraction_of_peak']:.0f}% of peak, {100 * row['fraction_of_layer']:.0f}% of the "
                    f"layer ceiling ({best}); XLA/analytic FLOPs {row['xla_over_analytic'] or float('nan'):.2f}"
                )
    params = {
        "learners": list(learners),
        "pops": list(pops),
        "devices": list(devices),
        "impls": list(impls),
        "matmul_sizes": list(o.matmul_sizes),
        "repeats": o.repeats,
        "min_time_s": o.min_time,
        "max_seconds": max_seconds,
        "seed": o.seed,
        "flops_source": "XLA cost_analysis of the compiled 1-step vmapped update (scan bodies are counted "
        "once by XLA, so K-step programs are not used for counting)",
        "analytic": {p.learner: analytic_flops(p) for p in problems},
    }
    payload = common.study_payload(STUDY, params, results, started, matmul={str(d): v for d, v in peaks.items()},
                                   **sitting.record())
    return common.write_study(o.out_dir, STUDY, payload, plot_roofline, o.plot)


def main(options: Options) -> dict[str, Any]:
    """``popjax bench roofline``."""
    return run(options)


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
