"""What the experiment scripts share: per-member curves from a run's metrics, a resumable sweep, seed plots.
Statistics (SDs, bootstrap intervals) come from popjax.stats, the tables from experiments/results.py."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np


def member_rows(run_dir: Path, members: int) -> list[list[dict[str, str]]]:
    """The metrics.csv rows of each member of a run (as written: strings)."""
    with (run_dir / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    return [[r for r in rows if int(r["member"]) == m] for m in range(members)]


def run_sweep(results_path: Path, steps: int, names: list[str], done: Callable[[list[dict]], set[str]],
              run: Callable[[str], dict], summarize: Callable[[list[dict]], dict]) -> dict:
    """Runs the configurations ``names`` not yet ``done`` (the names of the saved runs), saving the results after
    each (a killed sweep goes on where it stopped); returns ``{"steps", "runs", "summary"}``. The results file must
    hold ``steps``."""
    data = json.loads(results_path.read_text()) if results_path.exists() else {"steps": steps, "runs": []}
    if data["steps"] != steps:
        raise SystemExit(f"{results_path} holds a {data['steps']}-step sweep; move it away to run {steps} steps")
    for name in names:
        if name in done(data["runs"]):
            continue
        data["runs"].append(run(name))
        data["summary"] = summarize(data["runs"])
        results_path.parent.mkdir(parents=True, exist_ok=True)
        results_path.write_text(json.dumps(data, indent=1) + "\n")
        print(json.dumps({"config": name, **data["summary"]["configs"][name],
                          "compile_s": data["runs"][-1]["compile_s"]}), flush=True)
    return data


def saved_or_run(path: Path, settings: dict, run: Callable[[], dict]) -> dict:
    """The record saved at ``path`` if it was made with ``settings`` (its fields of those names), else ``run()``
    (which saves its record there): a killed sweep of one-file-per-run scripts goes on where it stopped."""
    if path.exists():
        saved = json.loads(path.read_text())
        if all(saved.get(k) == v for k, v in settings.items()):
            return saved
    return run()

def plot_curves(ax, curves, color: str, label: str) -> None:
    """Each seed's curve ([x, return] rows) thin, and their mean over seeds (to the shortest) thick."""
    curves = [np.asarray(c, dtype=float) for c in curves]
    for c in curves:
        ax.plot(c[:, 0], c[:, 1], color=color, lw=0.8, alpha=0.35)
    n = min(len(c) for c in curves)
    stacked = np.stack([c[:n] for c in curves])
    ax.plot(stacked[0, :, 0], stacked[:, :, 1].mean(0), color=color, lw=2.2, label=label)

