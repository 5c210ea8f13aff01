"""The sweep studies' sections of ``benchmarks/RESULTS.md`` (issue 47): ``benchmarks/sweep_quality.py``'s
``sweep_quality`` (batched vs sequential TPE) and ``sweep_pruning`` (median pruner vs none).

Every interval and verdict is computed here from the per-seed values in the JSON, by the rule the script's docstring
fixed before the data (``popjax.stats.paired_verdict`` against the margin the JSON records)."""

from __future__ import annotations

from typing import Any

import numpy as np

from popjax import stats
from popjax_bench.report_gpu import _table

REPS = 10_000  # bootstrap replicates (seed 0), as the rule says


def _n(x: float, digits: int = 1) -> str:
    return f"{x:,.{digits}f}"


def _interval(pair, digits: int = 1) -> str:
    return "—" if pair is None else f"[{_n(pair[0], digits)}, {_n(pair[1], digits)}]"


def _load(arm: dict[str, Any]) -> str:
    return f"{arm['load_1min_before']:.2f} → {arm['load_1min_after']:.2f}"


def paired_lines(a, b, margin: float, claim: str, label: str, kind: str = "difference") -> list[str]:
    """The paired summary of per-seed ``a`` against ``b``: mean and SD (ddof 1) of the differences, or the ratio
    of means; the 95 % t-interval (Fieller's for a ratio) and percentile paired bootstrap; the verdict on ``claim``."""
    v = stats.paired_verdict(np.asarray(a, float), np.asarray(b, float), margin, kind=kind, reps=REPS)
    digits = 1 if kind == "difference" else 2
    if kind == "difference":
        d = np.asarray(a, float) - np.asarray(b, float)
        head = f"{label} per seed: mean {_n(v['point'])}, SD {_n(float(d.std(ddof=1)))} (ddof 1)"
    else:
        head = f"{label}: ratio of means {v['point']:.2f}×"
    t_name = "t-interval" if kind == "difference" else "Fieller t-interval"
    lows = [i[0] for i in (v["t"], v["percentile"]) if i is not None]
    bound = f"; the most it may cost on these data: {_n(-min(lows))} (the lowest interval end)" \
        if kind == "difference" and min(lows) < 0 else ""
    return [f"- {head}; 95 % {t_name} {_interval(v['t'], digits)}; 95 % percentile paired bootstrap "
            f"{_interval(v['percentile'], digits)} ({REPS:,} replicates, n = {v['n']}): **{claim}: {v['verdict']}**"
            + bound]


def _run_line(p: dict[str, Any]) -> str:
    run = p["run"]
    return (f"{p['trials']} TPE trials of {run['learner']} {tuple(run['learner_config']['hidden'])} on {run['env']}, "
            f"{run['total_env_steps']:,} env steps each, evaluated every {run['eval_interval']:,} "
            f"({run['eval_episodes']} episode); objective: the final return; {len(p['seeds'])} study seeds (each "
            "seeds the sampler and training)")


def section_sweep_quality(p: dict[str, Any]) -> list[str]:
    """Batched (pop 8) against sequential TPE: each study's best objective, paired by study seed."""
    m = p["margin"]
    lines = [f"## sweep_quality — TPE in batches of {p['pop']} vs one trial at a time, best objective", "",
             f"Written by `benchmarks/sweep_quality.py --study quality` (not `make bench`): {_run_line(p)}. "
             f"Batched: `popjax sweep` (pop {p['pop']}, {p['trials'] // p['pop']} generations); sequential: Optuna "
             "asking one trial at a time, `popjax.train` pop 1 in the process. Rule fixed before the data (the "
             f"script's docstring): batching costs at most M = {_n(m)} (0.1 of the random-to-solved range) when "
             "both intervals of mean(batched − sequential) lie above −M. Wall times on a shared machine (load "
             "beside them): a cost there, not a speed result.", ""]
    rows = [[s["seed"], _n(s["batched"]["best"]), _n(s["sequential"]["best"]),
             _n(s["batched"]["best"] - s["sequential"]["best"]), _n(s["batched"]["wall_s"]),
             _n(s["sequential"]["wall_s"]), _load(s["batched"]), _load(s["sequential"])] for s in p["seeds"]]
    lines += _table(["study seed", "batched best", "sequential best", "batched − sequential", "batched wall s",
                     "sequential wall s", "load (batched)", "load (sequential)"], rows)
    if len(p["seeds"]) < 2:
        return lines + ["(fewer than 2 study seeds: no interval)", ""]
    best = lambda arm: [s[arm]["best"] for s in p["seeds"]]  # noqa: E731
    return lines + paired_lines(best("batched"), best("sequential"), -m, f"batching costs at most {_n(m)}",
                                "best: batched − sequential") + [""]


def section_sweep_pruning(p: dict[str, Any]) -> list[str]:
    """The median pruner against none: best objective and finished trials per hour, paired by study seed."""
    m = p["margin"]
    lines = [f"## sweep_pruning — the median pruner vs no pruning, `popjax sweep` pop {p['pop']}", "",
             f"Written by `benchmarks/sweep_quality.py --study pruning` (not `make bench`): {_run_line(p)}; the "
             "arms' order alternates with the seed. 'trials/h': finished (completed + pruned) trials per hour of "
             "wall clock on a shared machine (load beside it: a cost there, not a speed result); 'env steps': "
             "what the study's trials trained in all. Rules fixed before the data (the script's docstring): "
             f"pruning costs at most M = {_n(m)} of the best objective when both intervals of mean(median − none) "
             "lie above −M; it finishes more trials per hour when both intervals of the ratio of means lie "
             "above 1.", ""]
    rows = [[s["seed"], _n(s["median"]["best"]), _n(s["none"]["best"]), s["median"]["pruned"],
             f"{s['median']['trial_env_steps']:,} / {s['none']['trial_env_steps']:,}",
             _n(s["median"]["trials_per_hour"], 0), _n(s["none"]["trials_per_hour"], 0), _load(s["median"]),
             _load(s["none"])] for s in p["seeds"]]
    lines += _table(["study seed", "median best", "none best", "pruned", "env steps (median / none)",
                     "median trials/h", "none trials/h", "load (median)", "load (none)"], rows)
    if len(p["seeds"]) < 2:
        return lines + ["(fewer than 2 study seeds: no interval)", ""]
    col = lambda arm, key: [s[arm][key] for s in p["seeds"]]  # noqa: E731
    return (lines + paired_lines(col("median", "best"), col("none", "best"), -m, f"pruning costs at most {_n(m)}",
                                 "best: median − none")
            + paired_lines(col("median", "trials_per_hour"), col("none", "trials_per_hour"), 1.0,
                           "pruning finishes more trials per hour", "trials/h: median / none", kind="ratio") + [""])


SECTIONS = {"sweep_quality": section_sweep_quality, "sweep_pruning": section_sweep_pruning}
