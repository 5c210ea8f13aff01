"""Drawing helpers for run directories (matplotlib, headless).

Which plots a run gets is decided by its driver (``DriverDef.plots``); this module only draws. matplotlib is
imported at the first drawing, so importing popjax (or a driver) never loads it.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path


def pyplot():
    """``matplotlib.pyplot`` on the headless Agg backend (imported once, at the first plot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> Path:
    """Lays out, writes (creating the folder) and closes ``fig``."""
    plt = pyplot()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def learning_curves(rows: list[dict[str, float]], path: Path, title: str = "") -> Path:
    """Eval return vs env steps per member (thin lines) and the best member at each eval (thick)."""
    plt = pyplot()
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
    return save_figure(fig, path)


def pbt_hparams_plot(rows: list[dict[str, float]], names: list[str], path: Path, title: str = "") -> Path:
    """PBT schedules: every hyperparameter that changes, per member over env steps (from metrics.csv).

    A row logged at an evaluation holds the hparams used up to it; an exploit right after
    the evaluation shows up at the next one (steps-post drawing).
    """
    plt = pyplot()
    varying = [n for n in names if len({row[n] for row in rows if n in row}) > 1] or \
        [n for n in names if rows and n in rows[0]]
    cols = min(3, max(1, len(varying)))
    nrows = max(1, -(-len(varying) // cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 2.8 * nrows), squeeze=False)
    members = sorted({int(row["member"]) for row in rows})
    cmap = plt.get_cmap("tab10" if len(members) <= 10 else "tab20")
    for ax, name in zip(axes.flat, varying, strict=False):
        values = []
        for i, m in enumerate(members):
            points = sorted((row["env_steps"], row[name]) for row in rows if int(row["member"]) == m)
            xs, ys = zip(*points, strict=True)
            values += ys
            ax.step(xs, ys, where="pre", lw=1.2, alpha=0.8, color=cmap(i % cmap.N), label=f"member {m}")
        if min(values) > 0 and max(values) / min(values) > 10:
            ax.set_yscale("log")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("env steps per member", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(varying):]:
        ax.axis("off")
    if varying:
        axes.flat[0].legend(fontsize=6, ncol=2)
    fig.suptitle(title or "PBT hyperparameter schedules", fontsize=10)
    return save_figure(fig, path)


def pbt_lineage_plot(lineage: list[dict], pop_size: int, total_env_steps: float, path: Path, title: str = "",
                     final_returns: list[float] | None = None) -> Path:
    """PBT lineage: one line per member slot, coloured by the original member its weights descend
    from; each exploit is an arrow from the parent's slot to the replaced member's slot."""
    plt = pyplot()
    cmap = plt.get_cmap("tab10" if pop_size <= 10 else "tab20")
    color = lambda a: cmap(a % cmap.N)
    ancestor = list(range(pop_size))
    start = [0.0] * pop_size
    fig, ax = plt.subplots(figsize=(8, 0.35 * pop_size + 2.2))
    rounds: dict[float, list[dict]] = defaultdict(list)
    for entry in lineage:
        rounds[float(entry["env_steps"])].append(entry)
    for t in sorted(rounds):
        new_ancestor = list(ancestor)
        for e in rounds[t]:
            m, p = int(e["member"]), int(e["parent"])
            ax.plot([start[m], t], [m, m], lw=3, color=color(ancestor[m]), solid_capstyle="butt")
            ax.annotate("", xy=(t, m), xytext=(t, p),
                        arrowprops={"arrowstyle": "->", "color": color(ancestor[p]), "lw": 1.2})
            new_ancestor[m], start[m] = ancestor[p], t
        ancestor = new_ancestor
    for m in range(pop_size):
        ax.plot([start[m], total_env_steps], [m, m], lw=3, color=color(ancestor[m]), solid_capstyle="butt")
        if final_returns is not None and m < len(final_returns):
            ax.text(total_env_steps, m, f"  {final_returns[m]:.4g}", va="center", fontsize=7)
    ax.set_yticks(range(pop_size))
    ax.set_ylabel("member")
    ax.set_xlabel("env steps per member")
    ax.set_xlim(0, total_env_steps * (1.12 if final_returns is not None else 1.0))
    ax.set_ylim(-0.7, pop_size - 0.3)
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title or f"PBT lineage ({len(lineage)} exploits; colour = original member; right: final return)",
                 fontsize=9)
    return save_figure(fig, path)


def _per_step(rows: list[dict[str, float]], column: str) -> tuple[list[float], list[float]]:
    """One value of a population-wide column per logged env step (finite values only)."""
    seen: dict[float, float] = {}
    for row in rows:
        value = row.get(column, float("nan"))
        if value == value and row["env_steps"] not in seen:  # not NaN
            seen[row["env_steps"]] = value
    steps = sorted(seen)
    return steps, [seen[s] for s in steps]


def cemrl_plot(rows: list[dict[str, float]], path: Path, title: str = "") -> Path:
    """CEM-RL: fitness mean ± std over the population per generation, best fitness, the CEM mean
    actor's return (the reported metric), and the CEM's mean standard deviation."""
    plt = pyplot()
    by_step: dict[float, list[float]] = defaultdict(list)
    for row in rows:
        by_step[row["env_steps"]].append(row["eval_return"])
    steps = sorted(by_step)
    mean = [sum(by_step[s]) / len(by_step[s]) for s in steps]
    std = [(sum((v - m) ** 2 for v in by_step[s]) / len(by_step[s])) ** 0.5 for s, m in zip(steps, mean, strict=True)]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(7, 6.5), sharex=True, height_ratios=(3, 1.3))
    ax.plot(steps, mean, "C0-", lw=1.5, label="fitness mean")
    ax.fill_between(steps, [m - s for m, s in zip(mean, std, strict=True)],
                    [m + s for m, s in zip(mean, std, strict=True)], color="C0", alpha=0.2, label="fitness ± std")
    ax.plot(steps, [max(by_step[s]) for s in steps], "C2-", lw=1, alpha=0.8, label="best fitness")
    xs, ys = _per_step(rows, "cem_mean_return")
    if xs:
        ax.plot(xs, ys, "k.-", lw=2, ms=6, label="CEM mean actor (eval)")
    ax.set_ylabel("episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    xs, ys = _per_step(rows, "cem_std_mean")
    if xs:
        ax2.semilogy(xs, ys, "C3-", label="mean CEM std (sqrt var)")
    xs, ys = _per_step(rows, "cov_noise")
    if xs:
        ax2.semilogy(xs, [y ** 0.5 for y in ys], "C4--", label="sqrt(cov noise)")
    ax2.set_xlabel("env steps per member")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    return save_figure(fig, path)


def dvd_plot(rows: list[dict[str, float]], path: Path, title: str = "", schedule: dict | None = None,
             pop_size: int = 1) -> Path:
    """DvD: the diversity weight (schedule and logged values), -log det K and the embedding distance.

    ``schedule`` (summary.json's ``dvd_schedule``) has thresholds in env steps summed over members;
    they are drawn at ``threshold / pop_size`` on the per-member axis.
    """
    plt = pyplot()
    fig, axes = plt.subplots(3, 1, figsize=(7, 7), sharex=True)
    for ax, column, label in zip(axes, ("diversity_weight", "diversity_loss", "embedding_distance"),
                                 ("diversity weight", "-log det(K + eps I)", "mean RMS action distance"), strict=True):
        xs, ys = _per_step(rows, column)
        if xs:
            ax.plot(xs, ys, "C0o" if column == "diversity_weight" else "C0.-",
                    label="logged (last training call)" if column == "diversity_weight" else None)
        ax.set_ylabel(label, fontsize=9)
        ax.grid(alpha=0.3)
    if schedule and rows:
        end = max(row["env_steps"] for row in rows)
        edges = [0.0] + [t / pop_size for t in schedule["thresholds"] if t / pop_size < end] + [end]
        weights = schedule["weights"][: len(edges) - 1]
        axes[0].step(edges, weights + weights[-1:], "C1-", where="post", label="schedule")
        axes[0].legend(fontsize=8)
    axes[0].set_title(title)
    axes[-1].set_xlabel("env steps per member")
    return save_figure(fig, path)


def aggregate_curves(x, bands: dict, path: Path, xlabel: str, ylabel: str) -> Path:
    """Per group, the IQM curve over runs with its 95 % bootstrap band (``bands``: group -> (point, low, high),
    low/high None when a group has fewer than 4 runs)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (group, (point, low, high)) in enumerate(bands.items()):
        ax.plot(x, point, color=f"C{i}", lw=2, label=group if low is not None else f"{group} (n<4: no band)")
        if low is not None:
            ax.fill_between(x, low, high, color=f"C{i}", alpha=0.2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"IQM of {ylabel}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def profile_plot(taus, profiles: dict, path: Path, xlabel: str) -> Path:
    """Performance profiles: per group the fraction of runs scoring above τ, with 95 % bootstrap bands."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for i, (group, (point, low, high)) in enumerate(profiles.items()):
        ax.plot(taus, point, color=f"C{i}", lw=2, label=group)
        ax.fill_between(taus, low, high, color=f"C{i}", alpha=0.15)
    ax.set_xlabel(f"{xlabel} τ")
    ax.set_ylabel("fraction of runs with score > τ")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def improvement_matrix(names: list[str], matrix, path: Path) -> Path:
    """P(row > column) for every pair of groups (the diagonal is blank)."""
    plt = pyplot()
    size = 1.2 * len(names) + 2
    fig, ax = plt.subplots(figsize=(size + 1, size))
    image = ax.imshow(matrix, vmin=0, vmax=1, cmap="RdBu")
    for i in range(len(names)):
        for j in range(len(names)):
            if i != j:
                ax.text(j, i, f"{matrix[i][j]:.2f}", ha="center", va="center", fontsize=9,
                        color="white" if abs(matrix[i][j] - 0.5) > 0.3 else "black")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("Y")
    ax.set_ylabel("X")
    ax.set_title("P(X > Y)")
    fig.colorbar(image, ax=ax)
    return save_figure(fig, path)
