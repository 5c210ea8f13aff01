"""PBT vs the same population trained independently with default hparams (best-of-N), shared code.

Used by ``pbt_td3_halfcheetah.py``, ``pbt_sac_halfcheetah.py`` and ``pbt_ppo_halfcheetah.py``. Both arms use the same
population size, seed, network, batch, budget and evaluation; they differ only in the driver:

  * ``pbt``: hparams sampled from the fast-PBT paper's prior; every ``interval`` env steps the
    bottom 30 % copy the full state of a top-30 % member and resample their hparams (paper);
  * ``baseline``: ``driver=independent`` with the learner's default (paper) hparams: N seeds;
  * ``hts_pbt`` (optional, not in ``both``): the ``pbt`` arm on the HTS-RL schedule (``driver=hts``,
    ``population: pbt``, ``alpha`` = the rollout length): executor threads step the envs while the learner
    updates on the previous segment, and PBT exploits at barriers.

Each arm is one run directory under ``--out``; ``--arm plot`` (run after both) writes a
comparison plot of the best member's return vs env steps and vs wall-clock and a JSON summary.
Runs can be resumed after a kill with ``popjax resume <run_dir>``.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent


def common_options(learner: str, args) -> dict:
    return dict(learner=learner, env="gym:HalfCheetah-v5", pop_size=args.pop, seed=args.seed,
                total_env_steps=args.steps, warmup_steps=args.warmup, eval_interval=args.eval_interval,
                eval_episodes=args.eval_episodes, batch_size=args.batch, buffer_size=args.steps,
                rollout_len=50, learner_config={"hidden": list(args.hidden)}, checkpoint_interval=0,
                progress=False)


def best_curve(run_dir: Path) -> tuple[list[float], list[float], list[float]]:
    """(env_steps, wall_s, best member's eval return) per evaluation, from metrics.csv."""
    import csv
    from collections import defaultdict

    best, wall = defaultdict(lambda: -float("inf")), {}
    with (run_dir / "metrics.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            step = float(row["env_steps"])
            best[step] = max(best[step], float(row["eval_return"]))
            wall[step] = float(row["wall_s"])
    steps = sorted(best)
    return steps, [wall[s] for s in steps], [best[s] for s in steps]


def compare(name: str, out: Path) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = {}
    fig, (ax_steps, ax_wall) = plt.subplots(1, 2, figsize=(11, 4))
    for arm, style in (("pbt", "C3-"), ("baseline", "C0-"), ("hts_pbt", "C2-")):
        run_dir = out / arm
        if arm == "hts_pbt" and not (run_dir / "summary.json").exists():
            continue
        steps, wall, best = best_curve(run_dir)
        summary = json.loads((run_dir / "summary.json").read_text())
        result[arm] = {"final_best": max(summary["final_returns"]), "best_return": summary["best_return"],
                       "final_returns": summary["final_returns"], "wall_s": summary["wall_s"],
                       "compile_s": summary["compile_s"], "env_steps": summary["env_steps"],
                       "exploits": len(summary.get("lineage", [])), "best_curve": list(zip(steps, best, strict=True))}
        label = {"pbt": "PBT (prior-sampled hparams)", "baseline": "independent, default hparams (best-of-N)",
                 "hts_pbt": "PBT on the HTS-RL schedule"}[arm]
        ax_steps.plot(steps, best, style, label=label)
        ax_wall.plot(wall, best, style, label=label)
    for ax, xlabel in ((ax_steps, "env steps per member"), (ax_wall, "wall-clock s (excl. compile)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("best member's eval return")
        ax.grid(alpha=0.3)
    ax_steps.legend(fontsize=8)
    fig.suptitle(f"{name}: PBT vs best-of-N independent", fontsize=10)
    fig.tight_layout()
    plots = HERE / "plots"
    plots.mkdir(exist_ok=True)
    fig.savefig(plots / f"pbt_{name}.png", dpi=110)
    plt.close(fig)
    for arm in ("pbt",):
        for plot in ("pbt_hparams.png", "pbt_lineage.png"):
            if (out / arm / "plots" / plot).exists():
                shutil.copy(out / arm / "plots" / plot, plots / f"pbt_{name}_{plot.removeprefix('pbt_')}")
    (out / "comparison.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(learner: str, name: str, defaults: dict) -> None:
    parser = argparse.ArgumentParser(description=f"PBT vs best-of-N independent: {name}")
    parser.add_argument("--arm", choices=("pbt", "baseline", "both", "hts_pbt", "plot"), default="both")
    parser.add_argument("--steps", type=int, default=defaults["steps"], help="env steps per member")
    parser.add_argument("--pop", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden", type=int, nargs="+", default=defaults["hidden"])
    parser.add_argument("--batch", type=int, default=defaults["batch"])
    parser.add_argument("--warmup", type=int, default=defaults["warmup"])
    parser.add_argument("--eval-interval", type=int, default=defaults["eval_interval"])
    parser.add_argument("--eval-episodes", type=int, default=2)
    parser.add_argument("--interval", type=int, default=defaults["interval"], help="PBT interval (env steps)")
    parser.add_argument("--out", type=Path, default=Path(f"runs/pbt_{name}"))
    parser.add_argument("--hparams", type=json.loads, default={},
                        help='fixed hparams of every member as JSON, e.g. \'{"ent_coef": 0.0}\' (PBT does not '
                             'sample them initially)')
    parser.add_argument("--hts", type=json.loads, default={},
                        help='extra hts options of the hts_pbt arm as JSON, e.g. \'{"lockstep": true}\'')
    args = parser.parse_args()

    import popjax

    options = {**common_options(learner, args), **defaults.get("run", {})}  # e.g. an on-policy learner's rollout
    options["hparams"] = args.hparams
    pbt = {"interval": args.interval, "quantile": 0.3, "explore": "resample", "fitness_window": 2}
    if args.arm in ("pbt", "both"):
        popjax.train(out_dir=args.out / "pbt", driver="pbt", pbt=pbt, **options)
    if args.arm == "hts_pbt":
        popjax.train(out_dir=args.out / "hts_pbt", driver="hts", pbt=pbt,
                     hts={"alpha": options["rollout_len"], "population": "pbt", "actors": 2, **args.hts}, **options)
    if args.arm in ("baseline", "both"):
        popjax.train(out_dir=args.out / "baseline", driver="independent", **options)
    if args.arm in ("plot", "both"):
        print(json.dumps(compare(name, args.out), indent=2))
