"""P2: DQN with prioritized replay on CartPole vs the priority-write delay D.

    PYTHONPATH=. .venv/bin/python experiments/per_delay_cartpole.py [--delays 1,10,50,100,200]
        [--steps 50000] [--seeds 3] [--out runs/per_delay_cartpole]

The delay D (``per_delay``) is the number of samplings between computing a batch's |TD errors| and writing them
as its rows' priorities (Zhang 2022, thesis Ch. 4: "the number of samplings performed ahead of priority update");
D = 1 writes before the next sampling. Each D trains 3 seeds as ONE population of 3 members
(``driver=independent``) of DQN on ``probe:cartpole`` (the pure-JAX CartPole-v1, max return 500) with
``buffer: prioritized`` (alpha 0.6, beta 0.4, the popjax defaults), 50 updates per 100 env steps, batch 128,
hidden (64, 64), hard target copy every 150 updates, the rl-zoo CartPole DQN lr 2.3e-3 and epsilon 1 -> 0.04 over
4k updates. With 50 updates per iteration, D > 50 carries pending writes across iterations. Writes
experiments/results/per_delay_cartpole/results.json and experiments/plots/per_delay_cartpole.png; the check is
mean final return (D = 200) >= 0.9 x mean final return (D = 1).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from results_cemrl_dvd_spo import per_delay_table
from sweep_common import member_rows, plot_curves, run_sweep

import popjax
from popjax.plots import save_figure

HERE = Path(__file__).parent
B = 128
LAST = 5  # evaluations averaged for the "late" return (the last one alone is noisy on CartPole)


def run_config(delay: int, steps: int, seeds: int, out: Path) -> dict:
    """One population of ``seeds`` DQN + PER members with priority-write delay ``delay``; curves vs env steps."""
    started = time.time()
    run = popjax.train(
        learner="dqn", env="probe:cartpole", driver="independent", pop_size=seeds, seed=0,
        total_env_steps=steps, warmup_steps=1_000, rollout_len=100, update_ratio=0.5, batch_size=B,
        buffer_size=steps, buffer="prioritized", per_delay=delay, eval_interval=steps // 50, eval_episodes=10,
        checkpoint_interval=0, progress=False,
        hparams={"lr": 2.3e-3, "discount": 0.99, "epsilon_end": 0.04, "epsilon_decay_steps": 4_000},
        learner_config={"hidden": [64, 64], "target_update_period": 150}, out_dir=out)
    curves = [[[int(r["env_steps"]), float(r["eval_return"])] for r in member] for member in member_rows(out, seeds)]
    s = run.summary
    return {"delay": delay, "curves": curves, "final_returns": s["final_returns"], "updates": s["updates"],
            "wall_s": s["wall_s"], "compile_s": s["compile_s"], "total_s": time.time() - started, "out": str(out)}


def summarize(results: list[dict]) -> dict:
    table = {}
    for r in results:
        late = [float(np.mean([ret for _, ret in c[-LAST:]])) for c in r["curves"]]
        table[str(r["delay"])] = {"delay": r["delay"], "final_returns": r["final_returns"],
                                  "final_mean": float(np.mean(r["final_returns"])),
                                  "final_sd": float(np.std(r["final_returns"], ddof=1)), "late_returns": late,
                                  "late_mean": float(np.mean(late)), "wall_s": r["wall_s"], "total_s": r["total_s"]}
    base, far = table.get("1"), table.get("200")
    ratio = far["final_mean"] / base["final_mean"] if base and far and base["final_mean"] > 0 else None
    late_ratio = far["late_mean"] / base["late_mean"] if base and far and base["late_mean"] > 0 else None
    return {"configs": table, "check": {"rule": "mean final return (D = 200) >= 0.9 x (D = 1)", "ratio": ratio,
                                        "passed": None if ratio is None else ratio >= 0.9,
                                        f"ratio_of_last_{LAST}_evaluations": late_ratio}}


def plot(results: list[dict], summary: dict, path: Path, steps: int) -> None:
    import matplotlib.pyplot as plt  # headless: popjax.plots selected the Agg backend

    fig, (ax_final, ax_curves) = plt.subplots(1, 2, figsize=(12, 4.2))
    rows = sorted(summary["configs"].values(), key=lambda row: row["delay"])
    delays = [row["delay"] for row in rows]
    for i, row in enumerate(rows):
        ax_final.scatter([row["delay"]] * len(row["final_returns"]), row["final_returns"], color="C0", s=14,
                         alpha=0.6, label="final return per seed" if i == 0 else None)
        ax_final.scatter([row["delay"]] * len(row["late_returns"]), row["late_returns"], color="C1", marker="x",
                         s=18, alpha=0.6, label=f"mean of last {LAST} evals per seed" if i == 0 else None)
    ax_final.plot(delays, [row["final_mean"] for row in rows], color="C0", lw=2, label="final, mean over seeds")
    ax_final.plot(delays, [row["late_mean"] for row in rows], color="C1", lw=2, ls="--",
                  label=f"last {LAST} evals, mean")
    if rows and rows[0]["delay"] == 1:
        ax_final.axhline(0.9 * rows[0]["final_mean"], color="gray", ls=":", label="0.9 x final (D = 1)")
    ax_final.set_xscale("log")
    ax_final.set_xticks(delays, [str(d) for d in delays])
    ax_final.minorticks_off()
    ax_final.set_xlabel("priority-write delay D (samplings)")
    ax_final.set_ylabel("eval return (10 deterministic episodes)")
    ax_final.grid(alpha=0.3)
    ax_final.legend(fontsize=7)
    for i, r in enumerate(sorted(results, key=lambda r: r["delay"])):
        plot_curves(ax_curves, r["curves"], f"C{i}", f"D = {r['delay']}")
    ax_curves.set_xlabel("env steps per seed")
    ax_curves.grid(alpha=0.3)
    ax_curves.legend(fontsize=8)
    seeds = len(results[0]["curves"]) if results else 0
    fig.suptitle(f"DQN + prioritized replay on probe:cartpole, {steps} env steps, {seeds} seeds per D", fontsize=10)
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delays", default="1,10,50,100,200", help="comma-separated D; done ones are skipped")
    parser.add_argument("--steps", type=int, default=50_000, help="env steps per seed")
    parser.add_argument("--seeds", type=int, default=3, help="members (seeds) of each delay's population")
    parser.add_argument("--out", default="runs/per_delay_cartpole")
    args = parser.parse_args()
    suffix = "" if args.seeds == 3 else f"_{args.seeds}seeds"
    results_path = HERE / "results" / "per_delay_cartpole" / f"results{suffix}.json"
    data = run_sweep(results_path, args.steps, args.delays.split(","), lambda runs: {str(r["delay"]) for r in runs},
                     lambda d: run_config(int(d), args.steps, args.seeds, Path(args.out + suffix) / f"D{d}"),
                     summarize)
    plot(data["runs"], data["summary"], HERE / "plots" / f"per_delay_cartpole{suffix}.png", args.steps)
    print("\n".join(per_delay_table(data["summary"])))
    print(json.dumps(data["summary"]["check"]))


if __name__ == "__main__":
    main()
