"""S2: SPO-DQN learning efficiency vs replicas R and local steps H on CartPole.

    PYTHONPATH=. .venv/bin/python experiments/spo_cartpole.py [--configs 1x10,2x10,4x10,1x5,...]
        [--steps 100000] [--seeds 3] [--buffer uniform|prioritized] [--out runs/spo_cartpole]

``probe:cartpole`` is popjax's pure-JAX port of gymnasium's CartPole-v1 (500-step episodes, max
return 500): the whole iteration (acting, replay, update) is one jitted call, much faster on a CPU
than ``gym:CartPole-v1``. Each configuration ``RxH`` (R replicas, H local steps per round) trains
3 seeds as ONE population of 3 members (``driver=independent``: the members' keys differ, so they
are 3 seeds). Global batch B = 256 (each replica b = B/R), hard target copy every 150 updates
(F = 150/H rounds), the rl-zoo CartPole DQN hparams otherwise (lr 2.3e-3, epsilon 1 -> 0.04 over
4k updates), hidden (64, 64). One update = one local step on the global batch, so curves at
different R share the x axis (policy updates). Writes experiments/results/spo_cartpole/results.json
and experiments/plots/spo_cartpole.png (``--seeds N`` other than 3: ``results_Nseeds.json``,
``spo_cartpole_Nseeds.png``); the gate is AUC(R = 2, 4; H = 10) >= 0.85 x AUC(R = 1, H = 10).
``--buffer prioritized``: the thesis's configuration, SPO-DQN on its banked prioritized replay (replica r samples
bank r; alpha 0.6, beta 0.4; importance weights in the TD loss), 200 env steps then 100 updates per iteration so
H = 100 divides them, F = max(1, 150 // H); ``results_per[_Nseeds].json``, ``spo_cartpole_per[_Nseeds].png``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from results_cemrl_dvd_spo import spo_cartpole_table
from sweep_common import member_rows, plot_curves, run_sweep

import popjax
from popjax.plots import save_figure

HERE = Path(__file__).parent
B = 256
TARGET_PERIOD = 150  # updates between hard target copies (F * H)
THRESHOLD = 475.0  # "solved" return for updates-to-threshold


def target_rounds(local_steps: int) -> int:
    """F: rounds between hard target copies, F * H = TARGET_PERIOD updates (at least one round)."""
    return max(1, TARGET_PERIOD // local_steps)


def run_config(replicas: int, local_steps: int, steps: int, seeds: int, out: Path, buffer: str = "uniform") -> dict:
    """One population of ``seeds`` members of SPO-DQN with R replicas and H local steps; per-seed curves vs updates.
    ``buffer: prioritized`` is the thesis's banked replay (one bank per replica, alpha 0.6, beta 0.4), with 200 env
    steps then 100 updates per iteration so that H = 100 divides them."""
    started = time.time()
    run = popjax.train(
        learner="spo_dqn", env="probe:cartpole", driver="independent", pop_size=seeds, seed=0,
        total_env_steps=steps, warmup_steps=1_000, rollout_len=100 if buffer == "uniform" else 200, update_ratio=0.5,
        batch_size=B, buffer_size=steps, buffer=buffer, eval_interval=steps // 50, eval_episodes=10,
        checkpoint_interval=0, progress=False,
        hparams={"lr": 2.3e-3, "discount": 0.99, "epsilon_end": 0.04, "epsilon_decay_steps": 4_000},
        learner_config={"hidden": [64, 64], "replicas": replicas, "local_steps": local_steps,
                        "target_rounds": target_rounds(local_steps)},
        out_dir=out)
    curves = [[[int(r["updates"]), float(r["eval_return"])] for r in member] for member in member_rows(out, seeds)]
    s = run.summary
    return {"replicas": replicas, "local_steps": local_steps, "target_rounds": target_rounds(local_steps),
            "buffer": buffer, "curves": curves, "final_returns": s["final_returns"], "updates": s["updates"],
            "wall_s": s["wall_s"], "compile_s": s["compile_s"], "total_s": time.time() - started, "out": str(out)}


def auc(curve: list[list[float]]) -> float:
    """Trapezoid area under return vs updates, normalised by the update span (= mean return over training)."""
    c = np.asarray(curve)
    return float(np.trapezoid(c[:, 1], c[:, 0]) / (c[-1, 0] - c[0, 0]))


def updates_to(curve: list[list[float]], threshold: float) -> float | None:
    hit = [u for u, ret in curve if ret >= threshold]
    return hit[0] if hit else None


def summarize(results: list[dict]) -> dict:
    """Per-config AUCs (per seed), ratios to R = 1 at the same H (seed-paired and of means), updates to threshold."""
    table = {}
    for r in results:
        aucs = [auc(c) for c in r["curves"]]
        table[f"{r['replicas']}x{r['local_steps']}"] = {
            "replicas": r["replicas"], "local_steps": r["local_steps"], "auc": aucs, "auc_mean": float(np.mean(aucs)),
            "updates_to_threshold": [updates_to(c, THRESHOLD) for c in r["curves"]],
            "final_returns": r["final_returns"], "wall_s": r["wall_s"], "total_s": r["total_s"]}
    for row in table.values():
        base = table.get(f"1x{row['local_steps']}")
        if base:
            row["auc_ratio_of_means"] = row["auc_mean"] / base["auc_mean"]
            row["auc_ratio_per_seed"] = [a / b for a, b in zip(row["auc"], base["auc"], strict=True)]
    gate = [table.get(k, {}).get("auc_ratio_of_means") for k in ("2x10", "4x10")]
    return {"threshold": THRESHOLD, "configs": table,
            "gate": {"rule": "AUC(R, H=10) >= 0.85 AUC(1, H=10) for R = 2, 4", "ratios": gate,
                     "passed": None if None in gate else all(g >= 0.85 for g in gate)}}


def plot(results: list[dict], path: Path, steps: int) -> None:
    import matplotlib.pyplot as plt  # headless: popjax.plots selected the Agg backend

    hs = sorted({r["local_steps"] for r in results})
    fig, axes = plt.subplots(1, len(hs), figsize=(max(5.5 * len(hs), 8.5), 4.2), squeeze=False, sharey=True)
    for ax, h in zip(axes[0], hs, strict=True):
        for r in sorted((r for r in results if r["local_steps"] == h), key=lambda r: r["replicas"]):
            color = {1: "C0", 2: "C1", 4: "C2"}.get(r["replicas"], "C3")
            plot_curves(ax, r["curves"], color,
                        f"R = {r['replicas']} (b = {B // r['replicas']}), mean of {len(r['curves'])} seeds")
        ax.set_title(f"H = {h} local steps per round", fontsize=10)
        ax.set_xlabel("policy updates (local steps on the global batch B = 256)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0, 0].set_ylabel("eval return (10 deterministic episodes)")
    fig.suptitle(f"SPO-DQN on probe:cartpole, {steps} env steps per seed, target copy every {TARGET_PERIOD} "
                 "updates", fontsize=10)
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="1x10,2x10,4x10,1x5,2x5,4x5,1x25,2x25,4x25",
                        help="comma-separated RxH (replicas x local steps); done configs are skipped")
    parser.add_argument("--steps", type=int, default=100_000, help="env steps per seed")
    parser.add_argument("--seeds", type=int, default=3, help="members (seeds) of each configuration's population")
    parser.add_argument("--buffer", default="uniform", choices=("uniform", "prioritized"),
                        help="prioritized: the banked prioritized replay, one bank per replica (results_per_*.json)")
    parser.add_argument("--out", default="runs/spo_cartpole")
    args = parser.parse_args()
    suffix = ("" if args.buffer == "uniform" else "_per") + ("" if args.seeds == 3 else f"_{args.seeds}seeds")
    results_path = HERE / "results" / "spo_cartpole" / f"results{suffix}.json"

    def run(cfg: str) -> dict:
        replicas, local_steps = (int(x) for x in cfg.split("x"))
        return run_config(replicas, local_steps, args.steps, args.seeds, Path(args.out + suffix) / cfg, args.buffer)

    data = run_sweep(results_path, args.steps, args.configs.split(","),
                     lambda runs: {f"{r['replicas']}x{r['local_steps']}" for r in runs}, run, summarize)
    plot(data["runs"], HERE / "plots" / f"spo_cartpole{suffix}.png", args.steps)
    print("\n".join(spo_cartpole_table(data["summary"])))
    print(json.dumps(data["summary"]["gate"]))


if __name__ == "__main__":
    main()
