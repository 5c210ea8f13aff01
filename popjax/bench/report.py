"""``popjax bench report``: ``benchmarks/results/*.json`` -> ``benchmarks/RESULTS.md``.

The Markdown holds the headline ratios of every study present, the targets of the
benchmark issue with measured values and a met/missed verdict, the machine and its load
average while each study ran, and (verbatim, when the file exists) the hand-written
analysis in ``benchmarks/ANALYSIS.md`` that explains what limits each number.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

STUDY_ORDER = ("update", "roofline", "compile", "envstep", "train", "shared_critic", "drivers")


def load_results(results_dir: str | Path) -> dict[str, list[dict[str, Any]]]:
    """``{study: [payload, ...]}``: ``<study>.json`` first, then ``<study>_<variant>.json`` (e.g. the
    DQN or multi-device runs of ``update``, each its own process and therefore its own set of ratios)."""
    out: dict[str, list[dict[str, Any]]] = {}
    results_dir = Path(results_dir)
    for study in STUDY_ORDER:
        paths = [results_dir / f"{study}.json"] + sorted(results_dir.glob(f"{study}_*.json"))
        for path in paths:
            if not path.exists() or (study != "shared_critic" and path.stem.startswith("shared_critic")):
                continue
            payload = json.loads(path.read_text())
            if payload.get("study", study) != study:
                continue
            payload["_file"] = path.stem
            out.setdefault(study, []).append(payload)
    return out


def merged(data: dict[str, list[dict[str, Any]]], study: str) -> dict[str, Any] | None:
    """All runs of ``study`` with their results concatenated (for the targets table)."""
    runs = data.get(study)
    if not runs:
        return None
    out = dict(runs[0])
    out["results"] = [r for run in runs for r in run["results"]]
    return out


def _f(x, digits: int = 2, suffix: str = "") -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        if abs(x) >= 100:
            return f"{x:,.0f}{suffix}"
        return f"{x:.{digits}f}{suffix}"
    return f"{x}{suffix}"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines + [""]


_IMAGES = {"prefix": "results"}


def _image(study: str) -> str:
    prefix = _IMAGES["prefix"]
    return f"![{study}]({'' if prefix in ('', '.') else prefix + '/'}{study}.png)"


def _ok(flag: bool | None) -> str:
    return "—" if flag is None else ("**met**" if flag else "**missed**")


# --- targets -----------------------------------------------------------------------------------------
def _under_load(payload: dict[str, Any] | None) -> str:
    """' (load 12.1)' when the study ran on a machine busier than its core count, else ''."""
    if not payload:
        return ""
    loads = [x[0] for x in (payload.get("load_before"), payload.get("load_after"),
                            payload["machine"].get("load_average")) if x]
    cores = payload["machine"].get("cpu_count") or 1
    return f" — measured at load {max(loads):.1f} on {cores} cores" if loads and max(loads) > cores else ""


def targets(data: dict[str, list[dict[str, Any]]]) -> list[list[Any]]:
    rows = []
    update = merged(data, "update")
    note = {study: _under_load(merged(data, study)) for study in STUDY_ORDER}
    if update:
        for learner in ("td3", "sac"):
            recs = [r for r in update["results"] if r["learner"] == learner and "skipped" not in r
                    and r["impl"] in ("vmap", "vmap_scan") and r["devices"] == 1 and r["pop"] >= 4
                    and r.get("speedup_vs_torch_seq")]
            by_pop: dict[int, float] = {}
            for r in recs:
                by_pop[r["pop"]] = max(by_pop.get(r["pop"], 0.0), r["speedup_vs_torch_seq"])
            k1 = [r["speedup_vs_torch_seq"] for r in recs if r["impl"] == "vmap"]
            if by_pop:
                worst = min(by_pop.values())
                rows.append([f"{learner.upper()}: vectorized ≥ 2× PyTorch sequential per population step, N ≥ 4",
                             f"min over N ∈ {sorted(by_pop)} of the best popjax variant: {worst:.2f}× "
                             f"(K=1 only: {min(k1):.2f}×)" + note["update"] if k1 else f"{worst:.2f}×",
                             _ok(worst >= 2.0)])
            else:
                rows.append([f"{learner.upper()}: ≥ 2× PyTorch sequential, N ≥ 4", "not measured (no PyTorch run)",
                             "—"])
    roof = merged(data, "roofline")
    if roof:
        for learner in dict.fromkeys(r["learner"] for r in roof["results"]):
            recs = [r for r in roof["results"] if r["learner"] == learner and "skipped" not in r and r["pop"] >= 16
                    and r["devices"] == 1]
            if recs:
                worst = min(r["fraction_of_peak"] for r in recs)
                rows.append([f"{learner.upper()}: ≥ 60% of matmul GFLOP/s at N ≥ 16",
                             f"min {100 * worst:.0f}% (N ∈ {[r['pop'] for r in recs]}; peak "
                             f"{recs[0]['peak_gflops']:.0f} GFLOP/s)" + note["roofline"], _ok(worst >= 0.6)])
    comp = merged(data, "compile")
    if comp:
        recs = [r for r in comp["results"] if r["learner"] == "td3" and r["pop"] == 64 and r["devices"] == 1
                and r["k"] == 50]
        if recs:
            rows.append(["TD3 50-step population update compiles in < 30 s at N = 64",
                         f"{recs[0]['compile_s']:.1f} s" + note["compile"], _ok(recs[0]["compile_s"] < 30.0)])
        else:
            rows.append(["TD3 50-step population update compiles in < 30 s at N = 64", "N = 64 not measured", "—"])
    train = merged(data, "train")
    if train:
        recs = [r for r in train["results"] if r["env"] == "gym:HalfCheetah-v5" and r["pop"] == 16
                and r.get("devices", 1) == 1 and "skipped" not in r]
        if recs and recs[0].get("update_fraction") is not None:
            frac = recs[0]["update_fraction"]
            rows.append(["train, gym:HalfCheetah-v5, pop 16: ≥ 70% of wall time in the compiled update",
                         f"{100 * frac:.0f}%" + note["train"], _ok(frac >= 0.7)])
    return rows


# --- per-study sections --------------------------------------------------------------------------------
def _load_line(payload: dict[str, Any]) -> str:
    m = payload["machine"]
    return (f"_{payload['started_utc']} → {payload['finished_utc']}; load average (1, 5, 15 min) before "
            f"{payload.get('load_before') or m.get('load_average')}, after {payload.get('load_after')}; "
            f"backend {m['backend']}, "
            f"{m['device_count']} device(s); XLA_FLAGS='{m['xla_flags']}'._")


def section_update(p: dict[str, Any]) -> list[str]:
    lines = ["## update — one population-wide update step (paper Fig. 2)", "", _load_line(p), "",
             "ms per population step (median of timed calls after warm-up, ÷ K for K-step calls); speed-ups are "
             "against **PyTorch sequential, one step per call** (the paper's baseline) and **JAX sequential** "
             "(the same jitted single-member update called member after member), measured in the same process.",
             "", _image(p.get("_file", "update")), ""]
    notes = p.get("notes") or []
    lines += [f"> {n}" for n in notes] + ([""] if notes else [])
    res = [r for r in p["results"] if "skipped" not in r]
    for learner in dict.fromkeys(r["learner"] for r in p["results"]):
        prob = p["params"]["problems"].get(learner, {})
        k = prob.get("k")
        cfg = prob.get("config", {})
        lines += [f"### {learner.upper()} (hidden {cfg.get('hidden')}, batch {cfg.get('batch_size')}, "
                  f"obs {prob.get('obs_shape')}, K = {k})", ""]
        base: dict[tuple[str, int], dict[str, Any]] = {}  # the fastest run of each baseline (PyTorch thread counts)
        for r in res:
            if r["learner"] == learner and r["impl"] in ("jax_seq", "torch_seq"):
                key = (r["impl"], r["pop"])
                if key not in base or r["ms_per_pop_step"] < base[key]["ms_per_pop_step"]:
                    base[key] = r
        rows = []
        for r in sorted((r for r in res if r["learner"] == learner and r["impl"] in ("vmap", "vmap_scan")),
                        key=lambda r: (r["devices"], r["pop"], r["impl"])):
            t = base.get(("torch_seq", r["pop"]))
            j = base.get(("jax_seq", r["pop"]))
            mem = r.get("memory") or {}
            rows.append([r["pop"], r["devices"], "vmap" if r["impl"] == "vmap" else f"vmap+scan K={k}",
                         _f(r["ms_per_pop_step"], 3), _f(j and j["ms_per_pop_step"], 3),
                         _f(t and t["ms_per_pop_step"], 3) + (f" ({t['torch_threads']} thr)" if t and
                                                               t.get("torch_threads") else ""),
                         _f(r.get("speedup_vs_torch_seq"), 2, "×"),
                         _f(r.get("speedup_vs_jax_seq"), 2, "×"), _f(r.get("compile_s"), 1),
                         _f(mem.get("rss_delta_mb"), 0)])
        lines += _table(["N", "devices", "popjax", "popjax ms", "JAX seq ms", "PyTorch seq ms", "vs PyTorch seq",
                         "vs JAX seq", "compile s", "peak RSS Δ MB"], rows)
        skipped = [r for r in p["results"] if r["learner"] == learner and "skipped" in r]
        if skipped:
            lines += ["Skipped points: " + "; ".join(f"{r['impl']} N={r['pop']} d={r['devices']} ({r['skipped']})"
                                                      for r in skipped), ""]
    return lines


def section_roofline(p: dict[str, Any]) -> list[str]:
    lines = ["## roofline — achieved vs dense-matmul GFLOP/s", "", _load_line(p), "",
             _image(p.get("_file", "roofline")), ""]
    for d, m in p["matmul"].items():
        sizes = ", ".join(f"{s['n']}: {s['gflops']:.1f}" for s in m["sizes"])
        lines.append(f"- dense float32 matmul peak on {d} device(s): **{m['peak_gflops']:.1f} GFLOP/s** "
                     f"(n×n, GFLOP/s by n: {sizes})")
    lines += ["", "FLOPs per population step from XLA's cost analysis of the compiled 1-step update; "
              "'XLA/analytic' divides it by the analytic matmul count (elementwise work such as Adam, "
              "activations and the RNG makes it > 1). 'N×[B,h]@[h,h]' is the throughput XLA attains on the "
              "update's dominant layer alone at the same shapes (N independent 256×256 products of a 256-row "
              "batch): the realistic ceiling for this workload.", ""]
    rows = []
    for r in sorted((r for r in p["results"] if "skipped" not in r),
                    key=lambda r: (r["learner"], r["devices"], r["pop"])):
        rows.append([r["learner"].upper(), r["pop"], r["devices"], _f(r[r["best_impl"]]["ms_per_pop_step"], 3),
                     _f(r["xla_flops_per_pop_step"] and r["xla_flops_per_pop_step"] / 1e9, 3),
                     _f(r["gflops"], 1), f"{100 * r['fraction_of_peak']:.0f}%", _f(r.get("layer_gflops"), 1),
                     _f(r.get("xla_over_analytic"), 2),
                     r["best_impl"]])
    header = ["learner", "N", "devices", "ms/step", "GFLOP/step", "GFLOP/s", "% of peak",
              "N×[B,h]@[h,h] GFLOP/s", "XLA/analytic", "variant"]
    return lines + _table(header, rows)


def section_compile(p: dict[str, Any]) -> list[str]:
    lines = ["## compile — compile time of the K-step population update (paper Table 3)", "", _load_line(p), "",
             _image(p.get("_file", "compile")), "",
             "AOT `jax.jit(f).lower(...).compile()` of `jit(scan(vmap(update)))`; the first execution is not "
             "included (the paper's number includes one). Paper (N = 20, K = 50, GPUs): TD3 4.8–7.3 s, "
             "SAC 6.5–9.5 s.", ""]
    rows = [[r["learner"].upper(), r["k"], r["pop"], r["devices"], _f(r["compile_s"], 2), _f(r["trace_lower_s"], 2),
             _f(r["xla_compile_s"], 2)] for r in sorted(p["results"], key=lambda r: (r["learner"], r["devices"],
                                                                                      r["pop"]))]
    return lines + _table(["learner", "K", "N", "devices", "compile s", "trace+lower s", "XLA s"], rows)


def section_envstep(p: dict[str, Any]) -> list[str]:
    lines = ["## envstep — ms per environment interaction (paper Table 2)", "", _load_line(p), "",
             _image(p.get("_file", "envstep")), "",
             f"gym: gymnasium MuJoCo v5 on the host (`single`: one env and one member's jitted policy, one call "
             f"per step, as the paper's Table 2; `vector`: one training iteration's interaction, "
             f"`Loop.collect` of `popjax train`, pop × {p['params']['envs_per_member']} env(s), one compiled "
             f"population act per step). brax/probe: the same `Loop.collect`, one compiled scan of vmapped "
             f"steps (brax backend `{p['params'].get('brax_backend')}`). 'devices': the population split over "
             "that many devices. Paper (Xeon 2.8 GHz, v2/v3 envs): HalfCheetah 0.94 ms (TD3) / 0.66 ms (SAC).",
             ""]
    rows = []
    for r in p["results"]:
        head = [r["path"], r["env"], r["mode"], r["learner"], r["pop"], r.get("devices", 1)]
        if "skipped" in r:
            rows.append(head + ["skipped: " + r["skipped"][:60], "", ""])
            continue
        rows.append(head + [_f(r["ms_per_interaction"], 4), _f(r.get("env_only_ms_per_interaction"), 4),
                            _f(r.get("ms_per_member_step"), 4)])
    return lines + _table(["path", "env", "mode", "policy", "N", "devices", "ms / interaction", "env only ms",
                           "ms / member step"], rows)


def section_train(p: dict[str, Any]) -> list[str]:
    prm = p["params"]
    lines = ["## train — end-to-end `popjax.experiment.train` (independent driver)", "", _load_line(p), "",
             _image(p.get("_file", "train")), "",
             f"{prm['learner'].upper()}, hidden {prm['hidden']}, batch {prm['batch_size']}, "
             f"{prm['env_steps_per_member']} env steps per member ({prm['warmup_steps']} random warm-up), "
             f"K = {prm['updates_per_iter']} updates per {prm['rollout_len']}-step iteration, one evaluation "
             "episode per member at the end. Wall time excludes compilation (reported separately). "
             "'update' = time inside the compiled update call (JAX path: collect-only calls subtracted).", ""]
    rows = []
    for r in p["results"]:
        head = [r["env"], r["pop"], r.get("devices", 1)]
        if "skipped" in r:
            rows.append(head + ["skipped: " + r["skipped"][:80], "", "", "", "", "", ""])
            continue
        pct = lambda x: "—" if x is None else f"{100 * x:.0f}%"
        rows.append(head + [_f(r.get("env_steps_per_s_steady"), 0), _f(r["env_steps_per_s"], 0),
                            pct(r["update_fraction"]), pct(r.get("update_fraction_overall")),
                            pct(r["compiled_fraction"]), _f(r["wall_s"], 1), _f(r["compile_s"], 1)])
    return lines + _table(["env", "pop", "devices", "env steps/s (training iterations)", "env steps/s (whole run)",
                           "update share (training iterations)", "update share (whole run)",
                           "any compiled step (whole run)", "wall s", "compile s"], rows)


def section_generic(study: str, p: dict[str, Any]) -> list[str]:
    lines = [f"## {study}", ""]
    if "machine" in p and "started_utc" in p:
        lines += [_load_line(p), ""]
    lines += [_image(p.get("_file", study)), ""]
    results = p.get("results") or []
    scalar_keys = [k for k in (results[0] if results else {}) if isinstance(results[0][k], int | float | str)]
    if results and scalar_keys:
        rows = [[_f(r.get(k), 3) for k in scalar_keys] for r in results if isinstance(r, dict)]
        lines += _table(scalar_keys, rows)
    return lines


def section_shared_critic(p: dict[str, Any]) -> list[str]:
    lines = ["## shared_critic — shared-critic TD3 update (CEM-RL / DvD; paper Fig. 4)", "", _load_line(p), "",
             _image(p.get("_file", "shared_critic")), "",
             "One population step = one shared-critic update + N actor updates; `vectorized` = the fast-PBT "
             "modification, `sequential` = the CEM-RL order compiled as one program, `sequential_loop` = the same "
             "order as a Python loop of jitted calls (see `popjax/bench/shared_critic.py`). 'devices': the "
             "vectorized step split over that many devices (actors split, critic replicated); the sequential "
             "orders always run on one device.", ""]
    impls = [i for i in ("vectorized", "sequential", "sequential_loop")
             if any(f"{i}_step_s" in r for r in p["results"])]
    rows = []
    for r in p["results"]:
        row = [r.get("pop"), r.get("k"), r.get("devices", 1)]
        if "skipped" in r:
            rows.append(row + ["skipped: " + r["skipped"][:60]] + [""] * (len(impls) + 2))
            continue
        row += [_f(r.get(f"{i}_step_s") and 1e3 * r[f"{i}_step_s"], 3) for i in impls]
        row += [_f(r.get("speedup_vs_sequential"), 2, "×"), _f(r.get("speedup_vs_sequential_loop"), 2, "×"),
                _f(r.get("vectorized_gflops_per_s"), 1)]
        rows.append(row)
    return lines + _table(["N", "K", "devices"] + [f"{i} ms" for i in impls] + ["vs sequential",
                                                                                "vs sequential loop",
                                                                                "vectorized GFLOP/s"], rows)


def section_drivers(p: dict[str, Any]) -> list[str]:
    params = p["params"]
    lines = ["## drivers — one training iteration of every driver, 1 vs more devices", "", _load_line(p), "",
             _image(p.get("_file", "drivers")), "",
             f"One iteration = {params['rollout_len']} env steps per member + {params['updates_per_iteration']} "
             f"updates (CEM-RL: one generation), pop {params['pop']}, {params['env']}, hidden "
             f"{tuple(params['hidden'])}, batch {params['batch_size']}; median of the compiled iteration calls "
             "(the first quarter, with the warm-up, left out). On a CPU the devices are forced host devices "
             "sharing its cores.", ""]
    rows = [[r["driver"], r["devices"], r["parallel"], _f(1e3 * r["iteration_s"], 2), _f(1e3 * r["iteration_iqr_s"], 2),
             r["iterations_timed"], _f(r.get("vs_one_device"), 2, "×"), _f(r["compile_s"], 1)] for r in p["results"]]
    return lines + _table(["driver", "devices", "parallel", "ms/iteration", "IQR ms", "calls", "time / 1 device",
                           "compile s"], rows)


def render(data: dict[str, list[dict[str, Any]]], analysis: str | None = None) -> str:
    lines = ["# popjax benchmark results", "",
             "Generated by `popjax bench report` (run by `make bench`) from `benchmarks/results/*.json`; do not "
             "edit by hand — the analysis at the end comes from `benchmarks/ANALYSIS.md`. Every number is a "
             "median of repeated timed calls after warm-up, outputs blocked on, compile time excluded; ratios "
             "are measured within one run of one process.", ""]
    if not data:
        return "\n".join(lines + ["No results yet: run `make bench`.", ""])
    machine = next(iter(data.values()))[0]["machine"]
    lines += ["## Machine", "",
              f"- CPU: {machine['cpu']} — {machine['cpu_count']} cores, {machine.get('memory_gb')} GB RAM",
              f"- JAX {machine['jax']} (jaxlib {machine['jaxlib']}), flax {machine['flax']}, optax {machine['optax']}, "
              f"PyTorch {machine.get('torch') or 'not installed'}; backend `{machine['backend']}`, devices: "
              + ", ".join(f"{d['platform']}:{d['kind']}" for d in machine["devices"]),
              "- The machine is shared: the load average while each study ran is given with it "
              "(2 cores, so a load above 2 means other processes competed for the CPU).", ""]
    rows = targets(data)
    if rows:
        lines += ["## Targets (2-core CPU)", ""] + _table(["target", "measured", "verdict"], rows)
    sections = {"update": section_update, "roofline": section_roofline, "compile": section_compile,
                "envstep": section_envstep, "train": section_train, "shared_critic": section_shared_critic,
                "drivers": section_drivers}
    for study in STUDY_ORDER:
        for payload in data.get(study, []):
            fn = sections.get(study)
            try:
                section = fn(payload) if fn else section_generic(study, payload)
                if payload.get("_file", study) != study:
                    section[0] += f" (`{payload['_file']}.json`)"
                lines += section
            except (KeyError, TypeError, IndexError) as err:  # a result file of another shape: say so
                lines += [f"## {payload.get('_file', study)}", "", f"(could not summarise: {err!r})", ""]
    if analysis:
        lines += [analysis.strip(), ""]
    return "\n".join(lines)


def write_report(results_dir: str | Path = "benchmarks/results", output: str | Path = "benchmarks/RESULTS.md",
                 analysis_path: str | Path | None = None) -> Path:
    output = Path(output)
    analysis_path = Path(analysis_path) if analysis_path else output.parent / "ANALYSIS.md"
    analysis = analysis_path.read_text() if analysis_path.exists() else None
    output.parent.mkdir(parents=True, exist_ok=True)
    _IMAGES["prefix"] = Path(os.path.relpath(Path(results_dir).resolve(), output.parent.resolve())).as_posix()
    output.write_text(render(load_results(results_dir), analysis))
    return output
