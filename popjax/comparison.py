"""``popjax compare`` and ``popjax export-returns``: run directories read back, never written.

``compare`` groups runs by a label (a config key such as ``learner``, ``driver`` or ``seed``, or ``name``, the
directory's name), aligns their evaluation curves on env steps and on wall time, and reports per group the IQM
of the final scores with its stratified bootstrap CI (or the seeds, with fewer than 4 runs), mean ± SD (ddof 1)
and P(improvement) against a baseline group (with its CI); it writes the table as JSON and CSV and draws the
aggregate curves, a performance profile and the P(improvement) matrix. Runs of different envs are normalised
by a stated reference ``{env: {low, high}}`` or refused.

A run is one independent seed: each member of an ``independent`` run (its members never interact) and each
whole run directory of any other driver, scored by its population mean (or best member: ``score="best"``).
For CEM-RL the members are a generation's samples; the CEM mean actor's return (``cem_mean_return``) is not read.
A run's score at step x is its evaluation return at x; the table's score is at the last env step every run
reached (a run still in progress cuts the others there, and the report says so).

``export_returns`` writes a run's evaluation returns in the marl-eval/Stoix JSON layout
``env -> task -> algorithm -> run -> step_k | absolute_metrics -> metric -> [values]``; ``read_marl_eval``
reads that layout back.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from popjax import stats
from popjax.config import ConfigError, make_config
from popjax.registry import DRIVERS
from popjax.rundir import RunDir

MARK = ".popjax-compare"  # a directory compare created: only it is written into again
OUTPUTS = ("compare.json", "compare.csv", "curves_env_steps.png", "curves_wall_time.png", "profile.png",
           "improvement.png", MARK)
REPS = 10_000


@dataclasses.dataclass
class RunData:
    """One run directory as read: its config, per-member curves and what is unusual about it."""

    path: Path
    config: dict[str, Any]
    curves: dict[int, np.ndarray]  # member -> [k, 3] rows (env_steps, wall_s, eval_return), by env step
    notes: list[str]

    @property
    def name(self) -> str:
        return self.path.name


def read_run(path: str | Path) -> RunData:
    """A run directory's config and evaluation curves; a ConfigError (one line naming the run) when it is not a
    run, has no evaluations, or holds a NaN return. Notes name a run still in progress (or killed before its
    end), rows logged twice (the last one counts) and members missing at some evaluation."""
    rd = RunDir(path)
    if not rd.path.is_dir():
        raise ConfigError(f"run_dir: {rd.path} is not a directory")
    config = rd.read_config()  # one-line error when not a run directory
    rows, unreadable = rd.scan_metrics()
    if unreadable:  # a comparison never rests on rows it skipped silently
        more = f" (and {len(unreadable) - 1} more)" if len(unreadable) > 1 else ""
        raise ConfigError(f"run_dir: {rd.metrics_path} {unreadable[0]}{more} cannot be read")
    if not rows:
        raise ConfigError(f"run_dir: {rd.path} has no evaluations yet (metrics.csv empty or missing)")
    notes, seen = [], {}
    for row in rows:
        if any(not math.isfinite(row.get(k, math.nan)) for k in ("env_steps", "member", "wall_s")):
            raise ConfigError(f"metrics.csv: {rd.path} has a row without env_steps, member or wall_s")
        key = (row["env_steps"], int(row["member"]))
        if key in seen:
            notes.append(f"{rd.path.name}: rows logged twice at env step {int(key[0])} (the last counts)")
        seen[key] = row
    bad = next(((s, m) for (s, m), row in seen.items() if not math.isfinite(row["eval_return"])), None)
    if bad is not None:
        raise ConfigError(f"eval_return: NaN in {rd.path} (member {bad[1]} at env step {int(bad[0])})")
    members = sorted({m for _, m in seen})
    steps = sorted({s for s, _ in seen})
    curves = {m: np.array([[s, seen[s, m]["wall_s"], seen[s, m]["eval_return"]] for s in steps if (s, m) in seen])
              for m in members}
    short = [m for m in members if len(curves[m]) < len(steps)]
    if short:
        notes.append(f"{rd.path.name}: members {short} miss some evaluations (their curves are interpolated)")
    total = config.get("total_env_steps")
    if not (rd.path / "summary.json").exists() or (total is not None and steps[-1] < float(total)):
        notes.append(f"{rd.path.name}: in progress or stopped at {int(steps[-1]):,} of {total} env steps")
    return RunData(rd.path, config, curves, list(dict.fromkeys(notes)))


def label_of(run: RunData, key: str) -> str:
    """The run's value of ``key``: ``name`` (the directory's name) or a config key (dotted for nested ones)."""
    if key == "name":
        return run.name
    value: Any = run.config
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise ConfigError(f"label: {key!r} is not a config key of {run.path} (allowed: name, "
                              f"{', '.join(sorted(run.config))})")
        value = value[part]
    return str(value)


AUTO_LABELS = ("learner", "driver", "env", "pop_size", "seed")


def _auto_label(runs: Sequence[RunData]) -> str:
    for key in AUTO_LABELS:
        if len({str(r.config.get(key)) for r in runs}) > 1:
            return key
    raise ConfigError(f"label: the runs differ in none of {', '.join(AUTO_LABELS)}; name one with --label KEY "
                      "(any config key, or name for the directory names)")


@dataclasses.dataclass
class Unit:
    """One independent seed: a member of an independent run, or a whole run directory."""

    group: str
    task: str
    seed: str
    curve: np.ndarray  # [k, 3]: env_steps, wall_s, score


def _members_independent(config: dict) -> bool:
    """Whether the run's driver, with the options it ran with, trains independent members (``DriverDef``)."""
    definition = DRIVERS.get(config.get("driver"))
    try:
        options = definition.parse_options(make_config(**config))
    except (AttributeError, ConfigError):  # a driver not registered here, a config this popjax refuses: one unit
        return False
    return definition.members_independent(options)


def _units(run: RunData, group: str, score: str) -> list[Unit]:
    task = str(run.config.get("env"))
    if _members_independent(run.config):
        base = run.config.get("seed", 0)
        return [Unit(group, task, f"{base}:{m}", c) for m, c in run.curves.items()]
    steps = sorted(set().union(*(c[:, 0].tolist() for c in run.curves.values())))
    values = np.stack([np.interp(steps, c[:, 0], c[:, 2]) for c in run.curves.values()])
    wall = np.stack([np.interp(steps, c[:, 0], c[:, 1]) for c in run.curves.values()]).max(0)
    reduce = {"mean": np.mean, "best": np.max}[score]
    return [Unit(group, task, str(run.config.get("seed", 0)), np.column_stack([steps, wall, reduce(values, 0)]))]


@dataclasses.dataclass
class Comparison:
    """What ``compare`` found: the table rows, the aligned data, notes, and the files written."""

    label: str
    baseline: str
    rows: list[dict[str, Any]]
    notes: list[str]
    final_step: float
    written: list[Path]
    text: str


def compare(run_dirs: Sequence[str | Path], label: str | None = None, baseline: str | None = None,
            out: str | Path | None = "compare", reference: Mapping[str, Mapping[str, float]] | None = None,
            score: str = "mean", reps: int = REPS, seed: int = 0) -> Comparison:
    """Compares run directories grouped by ``label`` (see the module docstring); writes ``compare.json``,
    ``compare.csv`` and the plots into ``out`` (None: nothing written) after every check has passed.

    Args:
      run_dirs: run directories written by ``popjax train`` (finished, resumed or still running).
      label: a config key (``learner``, ``driver``, ``seed``, ``pbt.interval`` ...) or ``name``; default the
        first of learner, driver, env, pop_size, seed that differs between the runs.
      baseline: the group P(improvement) is measured against (default: the first group in run order).
      out: a new directory, or one an earlier compare wrote; never a run directory.
      reference: ``{env: {"low": ..., "high": ...}}``: normalise each env's returns as (R − low)/(high − low);
        required when the runs have different envs.
      score: ``mean`` (population mean) or ``best`` (best member) for runs whose members interact.
    """
    if not run_dirs:
        raise ConfigError("run_dir: no run directories given (allowed: one or more directories of popjax train)")
    if score not in ("mean", "best"):
        raise ConfigError(f"score: {score!r} (allowed: mean, best)")
    seen = [Path(p).resolve() for p in run_dirs]
    twice = next((p for i, p in enumerate(run_dirs) if seen[i] in seen[:i]), None)
    if twice is not None:
        raise ConfigError(f"run_dir: {twice} is given twice (each run counts once)")
    runs = [read_run(p) for p in run_dirs]
    label = label or _auto_label(runs)
    groups: dict[str, list[RunData]] = {}
    for run in runs:
        groups.setdefault(label_of(run, label), []).append(run)
    baseline = baseline if baseline is not None else next(iter(groups))
    if baseline not in groups:
        raise ConfigError(f"baseline: {baseline!r} is no {label} of these runs (allowed: {', '.join(groups)})")
    envs = sorted({str(r.config.get("env")) for r in runs})
    normalised = _check_reference(envs, reference)
    out_dir = _check_out(out, runs) if out is not None else None

    units = [u for g, rs in groups.items() for r in rs for u in _units(r, g, score)]
    if normalised:
        for u in units:
            ref = reference[u.task]
            u.curve[:, 2] = stats.normalize(u.curve[:, 2], ref["low"], ref["high"])
    final_step = min(u.curve[-1, 0] for u in units)
    first_step = max(u.curve[0, 0] for u in units)
    notes = [n for r in runs for n in r.notes]
    if any(u.curve[-1, 0] > final_step for u in units):
        notes.append(f"scores are taken at env step {int(final_step):,}, the last one every run reached")
    if first_step > final_step:
        raise ConfigError(f"run_dir: the runs' evaluations do not overlap (one ends at env step {int(final_step):,}, "
                          f"another starts at {int(first_step):,})")
    grid = np.array(sorted({s for u in units for s in u.curve[:, 0] if first_step <= s <= final_step}))
    matrices = {g: _matrix([u for u in units if u.group == g], envs, grid) for g in groups}
    rows = [_row(g, matrices[g], matrices[baseline], g == baseline, reps, seed) for g in groups]
    text = _render(rows, label, baseline, final_step, normalised, score, notes)
    written: list[Path] = []
    if out_dir is not None:
        written = _write(out_dir, rows, label, baseline, final_step, notes, units, groups, grid, matrices, envs,
                         normalised, reference, reps, seed)
    return Comparison(label, baseline, rows, notes, float(final_step), written, text)


def _check_reference(envs: list[str], reference) -> bool:
    if reference is None:
        if len(envs) > 1:
            raise ConfigError(f"env: the runs have different envs ({', '.join(envs)}); give a reference "
                              "{env: {low, high}} (--reference FILE) to normalise their returns, or compare one env")
        return False
    missing = [e for e in envs if e not in reference or not {"low", "high"} <= set(reference[e])]
    if missing:
        raise ConfigError(f"reference: no low/high for {', '.join(missing)} (allowed: a mapping env -> "
                          "{low, high} covering every env of the runs)")
    for env in envs:
        if float(reference[env]["high"]) == float(reference[env]["low"]):
            raise ConfigError(f"reference.{env}: high equals low")
    return True


def _check_out(out: str | Path, runs: Sequence[RunData]) -> Path:
    out = Path(out)
    for run in runs:
        inside = out.resolve() == run.path.resolve() or run.path.resolve() in out.resolve().parents
        if inside:
            raise ConfigError(f"out: {out} is inside the run directory {run.path}; compare never writes there")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out: {out} is a file, not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / MARK).exists():
        raise ConfigError(f"out: {out} is not empty and compare did not create it (choose another --out)")
    return out


def _matrix(units: list[Unit], envs: list[str], grid: np.ndarray) -> dict[str, Any]:
    """A group's runs as score arrays: ``final`` (N, M), ``curves`` (N, M, T) on the env-step grid, the wall-time
    curves, and the seed ids of task 0 (for pairing). Every env must hold as many runs as the others."""
    by_task = {e: [u for u in units if u.task == e] for e in envs}
    counts = {e: len(v) for e, v in by_task.items()}
    if len(set(counts.values())) > 1:
        raise ConfigError(f"run_dir: group {units[0].group} has {counts} runs per env; every group needs the same "
                          "number of runs on every env of the comparison")
    curves = np.stack([np.stack([np.interp(grid, u.curve[:, 0], u.curve[:, 2]) for u in by_task[e]], 0)
                       for e in envs], 1)
    final = curves[:, :, -1]
    return {"final": final, "curves": curves, "seeds": [u.seed for u in by_task[envs[0]]],
            "wall": [u.curve[:, 1:] for u in units]}


def _row(group: str, m: dict, base: dict, is_base: bool, reps: int, seed: int) -> dict[str, Any]:
    final = m["final"]
    n, tasks = final.shape
    flat = final.mean(1)
    row: dict[str, Any] = {"group": group, "baseline": is_base, "runs": n, "tasks": tasks, "seeds": m["seeds"],
                           "mean": float(flat.mean()), "sd": float(flat.std(ddof=1)) if n > 1 else None,
                           "iqm": stats.iqm(final), "ci": None, "values": None,
                           "p_improvement": None, "p_ci": None, "paired_diff": None, "paired_ci": None}
    if n >= stats.MIN_BOOTSTRAP_SEEDS:
        ci = stats.stratified_ci(final, "iqm", reps, seed=seed)
        row["ci"] = [ci.low, ci.high]
    else:
        row["values"] = flat.tolist()
    if not is_base:
        p = stats.prob_improvement_ci(final, base["final"], reps=min(reps, 2000), seed=seed)
        row["p_improvement"] = p.point
        if n >= stats.MIN_BOOTSTRAP_SEEDS and base["final"].shape[0] >= stats.MIN_BOOTSTRAP_SEEDS:
            row["p_ci"] = [p.low, p.high]
        if sorted(m["seeds"]) == sorted(base["seeds"]) and n >= stats.MIN_BOOTSTRAP_SEEDS:
            d = stats.paired_ci(final, base["final"], seeds=(m["seeds"], base["seeds"]), reps=reps, seed=seed)
            row["paired_diff"], row["paired_ci"] = d.point, [d.low, d.high]
    return row


def _f(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


HEADER = ("group", "n", "IQM", "95% CI of IQM (or seeds, n<4)", "mean ± SD", "P(> baseline) [95% CI]",
          "paired Δ mean [95% CI]")


def _cells(row: dict[str, Any]) -> list[str]:
    spread = (f"[{_f(row['ci'][0])}, {_f(row['ci'][1])}]" if row["ci"] is not None
              else "seeds " + ", ".join(_f(v) for v in row["values"]))
    p = "baseline" if row["baseline"] else _f(row["p_improvement"], 3)
    if row["p_ci"] is not None:
        p += f" [{_f(row['p_ci'][0], 3)}, {_f(row['p_ci'][1], 3)}]"
    diff = "-" if row["paired_diff"] is None else \
        f"{_f(row['paired_diff'])} [{_f(row['paired_ci'][0])}, {_f(row['paired_ci'][1])}]"
    runs = f"{row['runs']}" + (f" x {row['tasks']} envs" if row["tasks"] > 1 else "")
    return [row["group"], runs, _f(row["iqm"]), spread, f"{_f(row['mean'])} ± {_f(row['sd'])}", p, diff]


def _render(rows, label, baseline, final_step, normalised, score, notes) -> str:
    table = [list(HEADER)] + [_cells(r) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    what = "normalised return" if normalised else "eval return"
    head = (f"{what} at env step {int(final_step):,} per member, grouped by {label}, baseline {baseline}; a run "
            f"is a member of an independent run, or a whole run scored by its population {score}; SD ddof 1")
    return "\n".join([head, *lines, *notes]) + "\n"


def _write(out: Path, rows, label, baseline, final_step, notes, units, groups, grid, matrices, envs, normalised,
           reference, reps, seed) -> list[Path]:
    from popjax import plots

    out.mkdir(parents=True, exist_ok=True)
    (out / MARK).write_text("written by popjax compare\n")
    clean = rows
    report = {"label": label, "baseline": baseline, "final_env_step": final_step, "envs": envs,
              "reference": dict(reference) if normalised else None, "bootstrap": {"reps": reps, "seed": seed,
              "level": 0.95, "method": "stratified percentile; P(improvement): independent; Δ: paired by seed"},
              "rows": clean, "notes": notes,
              "runs": {g: sorted({str(r.path) for r in rs}) for g, rs in groups.items()}}
    (out / "compare.json").write_text(json.dumps(report, indent=1) + "\n")
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["group", "runs", "tasks", "iqm", "ci_low", "ci_high", "mean", "sd", "p_improvement",
                     "p_ci_low", "p_ci_high", "paired_diff", "paired_ci_low", "paired_ci_high", "seeds"])
    for r in clean:
        ci, p_ci, d_ci = (r[k] if r[k] is not None else [None, None] for k in ("ci", "p_ci", "paired_ci"))
        writer.writerow([r["group"], r["runs"], r["tasks"], r["iqm"], *ci, r["mean"], r["sd"], r["p_improvement"],
                         *p_ci, r["paired_diff"], *d_ci, " ".join(r["seeds"])])
    (out / "compare.csv").write_text(buffer.getvalue())
    ylabel = "normalised return" if normalised else "eval return"
    step_bands = {g: _band(m["curves"], reps, seed) for g, m in matrices.items()}
    wall_grid, wall_bands = _wall_bands(units, groups, reps, seed)
    taus = np.linspace(min(m["final"].min() for m in matrices.values()),
                       max(m["final"].max() for m in matrices.values()), 50)
    profiles = {g: stats.profile_ci(m["final"], taus, reps=min(reps, 2000), seed=seed) for g, m in matrices.items()}
    names = list(groups)
    matrix = np.array([[stats.prob_improvement(matrices[a]["final"], matrices[b]["final"]) if a != b else np.nan
                        for b in names] for a in names])
    return [out / "compare.json", out / "compare.csv",
            plots.aggregate_curves(grid, step_bands, out / "curves_env_steps.png", "env steps per member", ylabel),
            plots.aggregate_curves(wall_grid, wall_bands, out / "curves_wall_time.png", "wall time (s)", ylabel),
            plots.profile_plot(taus, {g: (p.point, p.low, p.high) for g, p in profiles.items()},
                               out / "profile.png", ylabel),
            plots.improvement_matrix(names, matrix, out / "improvement.png")]


def _band(curves: np.ndarray, reps: int, seed: int) -> tuple:
    """IQM per step with its 95 % band (none with fewer than 4 runs)."""
    if curves.shape[0] < stats.MIN_BOOTSTRAP_SEEDS:
        point = stats.iqm(curves)
        return point, None, None
    ci = stats.stratified_ci(curves, "iqm", reps=min(reps, 2000), seed=seed)
    return ci.point, ci.low, ci.high


def _wall_bands(units, groups, reps, seed):
    start = max(u.curve[0, 1] for u in units)
    end = min(u.curve[-1, 1] for u in units)
    grid = np.linspace(start, end, 50) if end > start else np.array([start])
    bands = {}
    for g in groups:
        mine = [u for u in units if u.group == g]
        envs = sorted({u.task for u in mine})
        curves = np.stack([np.stack([np.interp(grid, u.curve[:, 1], u.curve[:, 2]) for u in mine if u.task == e])
                           for e in envs], 1)
        bands[g] = _band(curves, reps, seed)
    return grid, bands


# marl-eval / Stoix JSON layout ------------------------------------------------------------------------------

METRIC = "mean_episode_return"


def marl_eval_returns(run_dir: str | Path, algorithm: str | None = None) -> dict[str, Any]:
    """A run's evaluation returns in marl-eval's layout: ``{env family: {task: {algorithm: {"seed_<m>": {
    "step_<k>": {"step_count", "elapsed_time", "mean_episode_return": [return]}, "absolute_metrics": {
    "mean_episode_return": [final return]}}}}}}``, one run key per member ``m`` (``algorithm``: default the
    learner). ``absolute_metrics`` holds the final evaluation, not marl-eval's 10x re-evaluation of the best
    policy."""
    run = read_run(run_dir)
    family, _, task = str(run.config.get("env")).rpartition(":")
    algorithm = algorithm or str(run.config.get("learner"))
    if "," in algorithm:
        raise ConfigError(f"algorithm: {algorithm!r} contains a comma, which marl-eval does not allow")
    runs = {}
    for m, curve in run.curves.items():
        entry = {f"step_{k}": {"step_count": int(s), "elapsed_time": float(w), METRIC: [float(r)]}
                 for k, (s, w, r) in enumerate(curve)}
        entry["absolute_metrics"] = {METRIC: [float(curve[-1, 2])]}
        runs[f"seed_{m}"] = entry
    return {family or "popjax": {task: {algorithm: runs}}}


def export_returns(run_dir: str | Path, out: str | Path | None = None, fmt: str = "marl-eval",
                   algorithm: str | None = None) -> Path:
    """Writes ``marl_eval_returns`` as JSON to ``out`` (default ``<run directory name>-marl-eval.json`` in the
    current directory); refuses to overwrite a file or to write into the run directory."""
    if fmt != "marl-eval":
        raise ConfigError(f"format: {fmt!r} (allowed: marl-eval)")
    data = marl_eval_returns(run_dir, algorithm)
    out = Path(out) if out is not None else Path(f"{Path(run_dir).resolve().name}-marl-eval.json")
    if Path(run_dir).resolve() in out.resolve().parents:
        raise ConfigError(f"out: {out} is inside the run directory; export-returns never writes there")
    if out.exists():
        raise ConfigError(f"out: {out} exists; popjax never overwrites a file (choose another --out)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "x") as f:
        f.write(json.dumps(data, indent=1) + "\n")
    return out


def read_marl_eval(path: str | Path, metric: str = METRIC) -> dict[tuple[str, str, str], dict[str, np.ndarray]]:
    """A marl-eval JSON file as ``{(env, task, algorithm): {run: [steps, 3] (step_count, elapsed_time, mean of
    the metric's values)}}``; a ValueError when a run lacks a step, a metric or ``absolute_metrics``, or when the
    runs of one algorithm have different steps."""
    data = json.loads(Path(path).read_text())
    out = {}
    for env, tasks in data.items():
        for task, algorithms in tasks.items():
            for algorithm, runs in algorithms.items():
                table, keys = {}, None
                for run, entries in runs.items():
                    if "absolute_metrics" not in entries:
                        raise ValueError(f"{env}/{task}/{algorithm}/{run}: no absolute_metrics")
                    steps = sorted((k for k in entries if k.startswith("step_")), key=lambda k: int(k[5:]))
                    if keys is not None and steps != keys:
                        raise ValueError(f"{env}/{task}/{algorithm}/{run}: steps differ from the other runs'")
                    keys = steps
                    try:
                        table[run] = np.array([[entries[k]["step_count"], entries[k].get("elapsed_time", np.nan),
                                                np.mean(entries[k][metric])] for k in steps], dtype=float)
                    except KeyError as err:
                        raise ValueError(f"{env}/{task}/{algorithm}/{run}: no {err.args[0]}") from None
                out[env, task, algorithm] = table
    return out
