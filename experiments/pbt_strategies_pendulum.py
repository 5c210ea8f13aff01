"""PBT strategies at equal compute (issue 28): TD3 on ``probe:pendulum``, pop 8.

Arms (same population size, network, batch, env steps, evaluations and prior: the fast-PBT TD3 space):

  * ``pbt``: truncation (bottom/top 25 %), perturb x0.8/x1.2 (25 % resampling);
  * ``pb2``: truncation 25 %, new hparams from PB2's GP bandit;
  * ``mfpbt``: multi-frequency PBT, two sub-populations of 4 evolving every round and every second round;
  * ``random``: random search: the independent driver with every member's hparams drawn from the same prior.

One run directory per (arm, seed) under ``--out``; ``results/pbt_strategies_pendulum/<arm>_s<seed>.json`` keeps
each run's numbers (final best return, best return, final returns, wall time). ``--arm table`` prints the
comparison per seed and the paired difference to random search, for the final best return (the best member at
the end: what tuning delivers), the best return over the run, and the population's mean final return.

    PYTHONPATH=. .venv/bin/python experiments/pbt_strategies_pendulum.py --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from results_speed_pbt_hts import pbt_strategies_pendulum

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "pbt_strategies_pendulum"
ARMS = {
    "pbt": {"driver": "pbt", "pbt": {"quantile": 0.25, "explore": "perturb"}},
    "pb2": {"driver": "pbt", "pbt": {"quantile": 0.25, "explore": "pb2"}},
    "mfpbt": {"driver": "pbt", "pbt": {"quantile": 0.25, "explore": "perturb", "subpopulations": [4, 4],
                                       "frequencies": [1, 2]}},
    "random": {"driver": "independent", "search_space": "td3"},
}


def options(arm: str, seed: int, args) -> dict:
    from popjax.population.search_spaces import SEARCH_SPACES

    base = dict(learner="td3", env="probe:pendulum", pop_size=8, seed=seed, total_env_steps=args.steps,
                warmup_steps=1_000, eval_interval=1_000, eval_episodes=3, batch_size=128, buffer_size=args.steps,
                rollout_len=50, update_ratio=args.update_ratio, learner_config={"hidden": [64, 64]},
                checkpoint_interval=0, progress=False)
    arm_options = json.loads(json.dumps(ARMS[arm]))
    if arm_options.get("search_space") == "td3":
        arm_options["search_space"] = SEARCH_SPACES["td3"]
    if "pbt" in arm_options:
        arm_options["pbt"]["interval"] = args.interval
    return {**base, **arm_options}


def run(arm: str, seed: int, args) -> dict:
    import popjax

    out = Path(args.out) / f"{arm}_s{seed}"
    start = time.time()
    # overwrite: a previous run of this arm is replaced; popjax removes only the files it wrote there
    result = popjax.train(out_dir=out, overwrite=True, **options(arm, seed, args))
    s = result.summary
    record = {"arm": arm, "seed": seed, "final_best": max(s["final_returns"]), "best_return": s["best_return"],
              "final_returns": s["final_returns"], "exploits": len(s.get("lineage", [])), "wall_s": s["wall_s"],
              "compile_s": s["compile_s"], "total_s": round(time.time() - start, 1), "env_steps": s["env_steps"],
              "options": {k: v for k, v in options(arm, seed, args).items() if k != "search_space"}}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{arm}_s{seed}.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"{arm} seed {seed}: final best {record['final_best']:.1f}, best {record['best_return']:.1f}, "
          f"{record['total_s']:.0f} s", flush=True)
    return record


def table() -> None:
    """The comparison table of RESULTS.md, generated from the per-seed JSON (``experiments/results.py``)."""
    print("\n".join(pbt_strategies_pendulum()))


def plot(out: Path) -> Path:
    """Mean over seeds of the best member's return vs env steps, one line per arm (from the runs' metrics.csv)."""
    import csv
    from collections import defaultdict

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for arm in ARMS:
        curves = []
        for run_dir in sorted(out.glob(f"{arm}_s*")):
            best = defaultdict(lambda: -float("inf"))
            with (run_dir / "metrics.csv").open(newline="") as f:
                for row in csv.DictReader(f):
                    best[float(row["env_steps"])] = max(best[float(row["env_steps"])], float(row["eval_return"]))
            curves.append([best[k] for k in sorted(best)])
            steps = sorted(best)
        if curves:
            ax.plot(steps, np.mean(curves, axis=0), label=f"{arm} (n = {len(curves)})")
    ax.set_xlabel("env steps per member")
    ax.set_ylabel("best member's return (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("TD3 on probe:pendulum, pop 8: PBT strategies vs random search", fontsize=10)
    path = HERE / "plots" / "pbt_strategies_pendulum.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arm", default="all", help="an arm, all, table, or plot (from the runs in --out)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--interval", type=int, default=2_000)
    parser.add_argument("--update-ratio", type=float, default=1.0)
    parser.add_argument("--out", default="runs/pbt_strategies_pendulum")
    args = parser.parse_args()
    if args.arm == "plot":
        return print(plot(Path(args.out)))
    if args.arm == "table":
        return table()
    arms = list(ARMS) if args.arm == "all" else args.arm.split(",")
    for seed in (int(s) for s in args.seeds.split(",")):
        for arm in arms:
            run(arm, seed, args)
    table()


if __name__ == "__main__":
    main()
