"""Plots of a run directory (matplotlib, headless)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def learning_curves(rows: list[dict[str, float]], path: Path, title: str = "") -> Path:
    """Eval return vs env steps per member (thin lines) and the best member at each eval (thick)."""
    by_member: dict[int, list[tuple[float, float]]] = defaultdict(list)
    by_step: dict[float, list[float]] = defaultdict(list)
    for row in rows:
        by_member[int(row["member"])].append((row["env_steps"], row["eval_return"]))
        by_step[row["env_steps"]].append(row["eval_return"])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m, points in sorted(by_member.items()):
        xs, ys = zip(*sorted(points), strict=True)
        ax.plot(xs, ys, lw=1, alpha=0.6, label=f"member {m}")
    steps = sorted(by_step)
    ax.plot(steps, [max(by_step[s]) for s in steps], "k-", lw=2.5, label="best")
    ax.set_xlabel("env steps per member")
    ax.set_ylabel("eval return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_run(run_dir) -> list[Path]:
    """Regenerates every plot of a run directory; returns the written paths."""
    from popjax.rundir import RunDir

    rd = RunDir(run_dir)
    rows = rd.read_metrics()
    if not rows:
        raise ValueError(f"{rd.metrics_path} has no evaluations to plot yet")
    cfg = rd.read_config()
    title = f"{cfg.get('learner')} on {cfg.get('env')} ({cfg.get('driver')}, pop {cfg.get('pop_size')})"
    written = [learning_curves(rows, rd.path / "plots" / "learning_curves.png", title)]
    from popjax.drivers import extra_plots

    written += extra_plots(cfg.get("driver"), rd)
    return written
