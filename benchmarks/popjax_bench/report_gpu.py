"""The GPU section of ``benchmarks/RESULTS.md``: update studies run on an accelerator, and end-to-end runs.

Inputs in the results folder: the ``update`` payloads whose machine's backend is not the CPU
(``update_<backend>_<device>_<precision>*.json``, as ``popjax bench accelerator`` names them), the
``summary.json`` of end-to-end runs copied as ``endtoend_<backend>_<device>_<env>_pop<N>.json``, and
``gpu_provenance.yaml``: what those files do not record (driver, device memory, CUDA builds, the matmul
precision of each side, the command). Every figure printed comes from the JSON files; ratios are computed
here from their times (the arithmetic named in each header) and only between sides of equal arithmetic.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PROVENANCE = "gpu_provenance.yaml"
ENDTOEND = "endtoend_*.json"
POPJAX_IMPLS = ("vmap_scan", "vmap", "jax_seq")
TORCH_IMPLS = ("torch_seq", "torch_compile", "torch_vmap", "torch_vmap_compile", "torch_vmap_cudagraph")


def on_accelerator(payload: dict[str, Any]) -> bool:
    """Whether a study ran on an accelerator (its machine's JAX backend is not the CPU)."""
    return ((payload.get("machine") or {}).get("backend") or "cpu") != "cpu"


def load_provenance(results_dir: str | Path) -> list[dict[str, Any]]:
    """The runs of ``gpu_provenance.yaml`` ([] when there is none)."""
    import yaml

    path = Path(results_dir) / PROVENANCE
    if not path.exists():
        return []
    data = yaml.safe_load(path.read_text()) or {}
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, list) or not all(isinstance(r, dict) and isinstance(r.get("files", {}), dict)
                                             for r in runs):
        raise ValueError(f"--results: {path} must hold `runs:`, a list of mappings (name, device, driver, files)")
    return runs


def load_endtoend(results_dir: str | Path) -> list[dict[str, Any]]:
    """The end-to-end summaries (``endtoend_*.json``), each with its file name as ``_file``."""
    out = []
    for path in sorted(Path(results_dir).glob(ENDTOEND)):
        payload = json.loads(path.read_text())
        payload["_file"] = path.stem
        out.append(payload)
    return out


def _f(x: float | None) -> str:
    """Three significant digits, or whole numbers from 100 on (with thousands separators)."""
    if x is None:
        return "—"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}" if abs(x) >= 1 \
        else f"{x:.3f}"


def _ratio(x: float) -> str:
    return f"{x:,.0f}×" if x >= 100 else f"{x:.1f}×" if x >= 10 else f"{x:.2f}×"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows] + [""]


def _fastest(rows: list[dict[str, Any]]) -> dict[tuple[str, str, int], dict[str, Any]]:
    """The fastest measured row of each (learner, impl, N) (several PyTorch thread counts: the fastest)."""
    best: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in rows:
        if "skipped" in r:
            continue
        key = (r["learner"], r["impl"], r["pop"])
        if key not in best or r["ms_per_pop_step"] < best[key]["ms_per_pop_step"]:
            best[key] = r
    return best


def arithmetic(info: dict[str, Any]) -> tuple[str | None, str | None]:
    """``(JAX side, PyTorch side)`` of a file's provenance entry (e.g. ``("fp32", "fp32")``)."""
    sides = info.get("arithmetic") or {}
    return sides.get("jax"), sides.get("torch")


def update_table(payload: dict[str, Any], info: dict[str, Any]) -> list[str]:
    """One update run on an accelerator: ms per population step of every implementation at each (learner, N),
    the fastest PyTorch variant, and popjax's K-step update against it and against PyTorch sequential (ratios
    of this run's times, printed only when both sides ran the same arithmetic)."""
    jax_side, torch_side = arithmetic(info)
    matched = jax_side is not None and jax_side == torch_side
    impls = [i for i in (*POPJAX_IMPLS, *TORCH_IMPLS) if i in payload["params"].get("impls", [])]
    torch_impls = [i for i in impls if i in TORCH_IMPLS]
    best = _fastest(payload["results"])
    skipped = {(r["learner"], r["impl"], r["pop"]): r["skipped"] for r in payload["results"] if "skipped" in r}
    k = {name: prob.get("k") for name, prob in payload["params"].get("problems", {}).items()}
    label = {"vmap_scan": "popjax K={k} scan", "vmap": "popjax one step"}
    on = f"{jax_side} both sides" if matched else f"JAX {jax_side or '?'}, PyTorch {torch_side or '?'}"
    ratio_head = ([f"speed-up vs fastest PyTorch (its ms ÷ K-step ms, {on})",
                   f"speed-up vs torch_seq (its ms ÷ K-step ms, {on})"] if torch_impls else [])
    rows = []
    for learner, pop in sorted({(r["learner"], r["pop"]) for r in payload["results"]}):
        cells: list[Any] = [learner.upper(), pop]
        for impl in impls:
            r = best.get((learner, impl, pop))
            cells.append(_f(r["ms_per_pop_step"]) if r else "skipped" if (learner, impl, pop) in skipped else "—")
        measured = {i: best[(learner, i, pop)]["ms_per_pop_step"] for i in torch_impls if (learner, i, pop) in best}
        fastest = min(measured, key=measured.get) if measured else None
        scan = best.get((learner, "vmap_scan", pop))
        if torch_impls:
            cells.append(fastest or "—")
            for against in (fastest, "torch_seq"):
                if not (scan and against in measured):
                    cells.append("—")
                elif not matched:
                    cells.append("not compared (unequal arithmetic)")
                else:
                    cells.append(f"{_ratio(measured[against] / scan['ms_per_pop_step'])} "
                                 f"({_f(measured[against])} ÷ {_f(scan['ms_per_pop_step'])})")
        tflops = scan.get("gflops") if scan else None
        ceiling = scan.get("layer_gflops") if scan else None
        cells += [_f(tflops / 1e3 if tflops else None), _f(ceiling / 1e3 if ceiling else None),
                  _f(scan.get("compile_s") if scan else None)]
        rows.append(cells)
    header = ["learner", "N", *[label.get(i, i).format(k="/".join(sorted({str(v) for v in k.values()})) or "K")
                                for i in impls]]
    header += (["fastest PyTorch"] + ratio_head if torch_impls else [])
    header += ["K-step TFLOP/s (XLA's count)", "N×[B,h]@[h,h] ceiling TFLOP/s", "K-step compile s"]
    return _table(header, rows)


def _run_lines(payload: dict[str, Any], info: dict[str, Any]) -> list[str]:
    """The conditions of one update run: precision of both sides, the peak measured in it, what it skipped."""
    peak = (payload.get("ceilings") or {}).get("dense_matmul") or {}
    before, after = (peak.get("before") or {}).get("gflops"), (peak.get("after") or {}).get("gflops")
    lines = [f"**`{payload['_file']}.json`** ({payload['started_utc']} → {payload['finished_utc']}): "
             f"{info.get('precision', 'precision not recorded')}. Dense matmul {peak.get('n', '?')}² in the same "
             f"run: {_f(before / 1e3 if before else None)} TFLOP/s"
             + (f" before, {_f(after / 1e3)} after" if after else " (before; none after: the run was stopped)")
             + f"; PyTorch threads {payload['params'].get('torch_threads')}.", ""]
    if info.get("command"):
        lines += [f"Command: `{' '.join(str(info['command']).split())}`", ""]
    timed = {r["learner"] for r in payload["results"]}
    missing = [name for name in payload["params"].get("learners", []) if name not in timed]
    skipped = [r for r in payload["results"] if "skipped" in r]
    if payload.get("partial") or missing or skipped:
        parts = []
        if payload.get("partial"):
            parts.append("**partial**: the run was stopped before its end")
        if missing:
            parts.append(f"{', '.join(m.upper() for m in missing)} not timed")
        parts += [f"{r['learner'].upper()} {r['impl']} N={r['pop']} skipped ({r['skipped']})" for r in skipped]
        lines += ["; ".join(parts) + ".", ""]
    return lines


def endtoend_table(runs: list[dict[str, Any]]) -> list[str]:
    """End-to-end runs: compile, training wall, agent env steps per second (pop × env steps ÷ wall), returns."""
    rows = []
    for s in runs:
        iqm = s.get("final_iqm") or {}
        ci = iqm.get("ci") or [None, None]
        rate = s["pop_size"] * s["env_steps"] / s["wall_s"]
        rows.append([s["learner"].upper(), s["env"], s["pop_size"], f"{s['env_steps']:,}", f"{s['updates']:,}",
                     _f(s["compile_s"]), _f(s["wall_s"]), f"{_f(rate)} ({s['pop_size']} × {s['env_steps']:,} ÷ "
                     f"{_f(s['wall_s'])})", _f(s["best_return"]),
                     f"{_f(iqm.get('iqm'))} [{_f(ci[0])}, {_f(ci[1])}]"])
    return _table(["learner", "env", "pop", "env steps per member", "updates per member", "compile s",
                   "training wall s", "agent env steps / s", "best return",
                   "final IQM [95 % CI]"], rows)


def section(payloads: list[dict[str, Any]], endtoend: list[dict[str, Any]],
            provenance: list[dict[str, Any]]) -> list[str]:
    """The GPU section: per run of ``provenance`` (and for files it does not describe), the device, driver and
    software, then each update run's table and the end-to-end runs."""
    if not payloads and not endtoend:
        return []
    described = {stem for run in provenance for stem in run.get("files", {})}
    groups = [(run, [p for p in payloads if p["_file"] in run.get("files", {})],
               [s for s in endtoend if s["_file"] in run.get("files", {})]) for run in provenance]
    others = ([p for p in payloads if p["_file"] not in described],
              [s for s in endtoend if s["_file"] not in described])
    if any(others):
        groups.append(({"name": "runs not described in gpu_provenance.yaml", "files": {}}, *others))
    lines = []
    for run, updates, e2e in groups:
        if not (updates or e2e):
            continue
        machine = (updates[0] if updates else {}).get("machine") or {}
        kinds = sorted({d["kind"] for d in machine.get("devices", [])}) or [run.get("device", "?")]
        lines += [f"## GPU — {run['name']}", ""]
        software = (f"Python {machine.get('python')}, JAX {machine.get('jax')} (jaxlib {machine.get('jaxlib')}), "
                    f"flax {machine.get('flax')}, optax {machine.get('optax')}, PyTorch {machine.get('torch')}, "
                    f"NumPy {machine.get('numpy')}" if machine else "not recorded")
        lines += [f"- Device: {run.get('device', ', '.join(kinds))}; driver {run.get('driver', 'not recorded')}; "
                  f"{machine.get('device_count', '?')} device(s), backend `{machine.get('backend', '?')}`",
                  f"- Host: {machine.get('cpu', '?')}, {machine.get('cpu_count', '?')} cores, "
                  f"{machine.get('memory_gb', '?')} GB RAM",
                  f"- Software (from the JSON): {software}"
                  + (f"; builds: {run['builds']}" if run.get("builds") else ""),
                  f"- popjax: {run.get('popjax', 'not recorded')}", ""]
        if updates:
            lines += ["One population update step, TD3/SAC (256, 256), batch 256, HalfCheetah shapes: ms per "
                      "population step, the median of at least 10 timed calls after warm-up (K-step calls ÷ K), "
                      "compile excluded; each table is one run, its ratios that run's times (the fastest PyTorch "
                      "variant's ms ÷ popjax's K-step ms), printed only where both sides ran the same arithmetic. "
                      "TFLOP/s: XLA's FLOP count of the K-step program ÷ its time, beside N independent "
                      "[B,h]@[h,h] products measured just before the point.", ""]
            for p in updates:
                info = run.get("files", {}).get(p["_file"], {})
                lines += _run_lines(p, info) + update_table(p, info)
        if e2e:
            how = []
            for s in e2e:
                info = run.get("files", {}).get(s["_file"], {})
                how.append(f"pop {s['pop_size']}: " + (f"`{' '.join(str(info['command']).split())}`" if
                                                       info.get("command") else "command not recorded")
                           + (f", {info['process_s']} s in all with imports and start-up" if info.get("process_s")
                              else "") + f", {info.get('precision', 'precision not recorded')}")
            lines += ["End to end (`popjax train`, the JAX path): " + "; ".join(how) + ".", ""]
            lines += endtoend_table(e2e)
        if run.get("not_measured"):
            lines += ["Not measured in this run: " + "; ".join(" ".join(str(x).split()) for x in run["not_measured"])
                      + ".", ""]
    return lines
