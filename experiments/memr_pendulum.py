"""MEMR on Pendulum: SAC vs MEMR (prioritized start states) vs MEMR (uniform start states), 5 seeds per arm.

    PYTHONPATH=. .venv/bin/python experiments/memr_pendulum.py [--configs sac,memr,memr_uniform]
        [--steps 20000] [--seeds 5] [--out runs/memr_pendulum]

Each arm trains its seeds as ONE population on ``probe:pendulum`` (the pure-JAX port of gymnasium's Pendulum-v1),
all arms with ``seed=0``, so member m of every arm starts from the same keys: the arms are paired by member and
compared with paired bootstrap intervals (``popjax.stats.paired_ci``). Arms:

- ``sac``: SAC on real transitions (uniform replay), one update per env step;
- ``memr``: ``memr_sac`` with ``buffer: prioritized`` (alpha 0.6, the thesis's best; beta 0.4), one policy
  update per env step (G = 1), M = ``batch_size`` one-step rollouts per env step;
- ``memr_uniform``: the ablation, uniform start states, the same number of policy updates and rollouts.

Shared: hidden (64, 64), batch 128, lr 1e-3 (the SAC Pendulum preset's), 1k warm-up steps, 50 env steps then 50
updates per iteration (MEMR: one model fit per iteration, 2 passes). The thesis's claim (Ch. 3): MEMR matches SAC's
return per env step (with fewer policy updates than MBPO; here G = 1 = SAC's ratio, so policy updates per env step
are equal by construction and the policy-update axis is the env-step axis scaled) and prioritized start states beat
uniform ones. Scores per seed: the mean of the last 3 evaluations (final) and the mean over all evaluations after
warm-up (area under the curve). Writes experiments/results/memr_pendulum/results.json (per seed curves) and
experiments/plots/memr_pendulum.png (``--steps`` other than 20000: ``results_<k>k.json``, ``memr_pendulum_<k>k.png``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from sweep_common import member_rows, plot_curves, run_sweep

import popjax
from popjax import stats
from popjax.plots import save_figure

HERE = Path(__file__).parent
B = 128
HPARAMS = {"actor_lr": 1e-3, "critic_lr": 1e-3, "alpha_lr": 1e-3}
MEMR = {"ensemble": 5, "model_hidden": [64, 64], "model_epochs": 2, "psi_hidden": [32, 32], "psi_epochs": 2,
        "segments": 100, "sac_batch": B, "policy_updates": 1, "model_update_every": 50}
CONFIGS = {
    "sac": ("sac", "uniform", {}),
    "memr": ("memr_sac", "prioritized", {**MEMR, "start_states": "prioritized"}),
    "memr_uniform": ("memr_sac", "uniform", {**MEMR, "start_states": "uniform"}),
}
LABELS = {"sac": "SAC", "memr": "MEMR (prioritized start states)", "memr_uniform": "MEMR (uniform start states)"}
COLORS = {"sac": "C0", "memr": "C1", "memr_uniform": "C2"}
WARMUP = 1_000


def run_config(name: str, steps: int, seeds: int, out: Path) -> dict:
    learner, buffer, learner_config = CONFIGS[name]
    started = time.time()
    run = popjax.train(
        learner=learner, env="probe:pendulum", driver="independent", pop_size=seeds, seed=0, preset="none",
        total_env_steps=steps, warmup_steps=WARMUP, rollout_len=50, update_ratio=1.0, batch_size=B,
        buffer_size=steps, buffer=buffer, per_alpha=0.6, per_beta=0.4, eval_interval=1_000, eval_episodes=5,
        checkpoint_interval=0, progress=False, hparams=HPARAMS,
        learner_config={"hidden": [64, 64], **learner_config}, out_dir=out)
    s = run.summary
    policy_per_update = s["counts"]["policy_updates"] / max(s["updates"], 1)
    curves = [[[int(r["env_steps"]), float(r["eval_return"]), int(r["updates"]) * policy_per_update] for r in rows]
              for rows in member_rows(out, seeds)]
    return {"config": name, "learner": learner, "buffer": buffer, "learner_config": learner_config,
            "curves": curves, "counts": s["counts"], "final_returns": s["final_returns"], "updates": s["updates"],
            "wall_s": s["wall_s"], "compile_s": s["compile_s"], "total_s": time.time() - started, "out": str(out)}


def scores(run: dict) -> dict[str, np.ndarray]:
    c = np.asarray(run["curves"], dtype=float)  # [seeds, evals, (env steps, return, policy updates)]
    trained = c[:, :, 0] > WARMUP
    return {"final": c[:, -3:, 1].mean(axis=1),
            "auc": np.array([c[m, trained[m], 1].mean() for m in range(len(c))])}


def summarize(results: list[dict]) -> dict:
    by = {r["config"]: r for r in results}
    table = {name: {**{k: v.tolist() for k, v in scores(r).items()},
                    **{f"{k}_mean": float(v.mean()) for k, v in scores(r).items()},
                    "counts": r["counts"], "wall_s": r["wall_s"], "total_s": r["total_s"]}
             for name, r in by.items()}
    comparisons = {}
    for a, b in (("memr", "sac"), ("memr_uniform", "sac"), ("memr", "memr_uniform")):
        if a in by and b in by:
            comparisons[f"{a} - {b}"] = {}
            for score in ("final", "auc"):
                ci = stats.paired_ci(scores(by[a])[score], scores(by[b])[score], kind="difference", stat="mean")
                comparisons[f"{a} - {b}"][score] = {"difference": float(ci.point), "low": float(ci.low),
                                                    "high": float(ci.high), "level": ci.level}
    return {"configs": table, "paired_differences": comparisons}


def plot(results: list[dict], path: Path, steps: int) -> None:
    import matplotlib.pyplot as plt  # headless: popjax.plots selected the Agg backend

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    for r in results:
        label = f"{LABELS[r['config']]}, mean of {len(r['curves'])} seeds"
        plot_curves(axes[0], [[row[:2] for row in c] for c in r["curves"]], COLORS[r["config"]], label)
        plot_curves(axes[1], [[[row[2], row[1]] for row in c] for c in r["curves"]], COLORS[r["config"]], label)
    axes[0].set_xlabel("env steps per seed")
    axes[1].set_xlabel("SAC policy updates per seed")
    for ax in axes:
        ax.set_ylabel("eval return (5 deterministic episodes)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"MEMR vs SAC on probe:pendulum, {steps} env steps per seed", fontsize=10)
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="sac,memr,memr_uniform", help="comma-separated; done arms are skipped")
    parser.add_argument("--steps", type=int, default=20_000, help="env steps per seed (at most 30k)")
    parser.add_argument("--seeds", type=int, default=5, help="members (seeds) of each arm's population")
    parser.add_argument("--out", default="runs/memr_pendulum")
    args = parser.parse_args()
    suffix = "" if args.steps == 20_000 else f"_{args.steps // 1000}k"
    results_path = HERE / "results" / "memr_pendulum" / f"results{suffix}.json"
    data = run_sweep(results_path, args.steps, args.configs.split(","), lambda runs: {r["config"] for r in runs},
                     lambda name: run_config(name, args.steps, args.seeds, Path(args.out + suffix) / name), summarize)
    plot(data["runs"], HERE / "plots" / f"memr_pendulum{suffix}.png", args.steps)
    print(json.dumps(data["summary"], indent=1))


if __name__ == "__main__":
    main()
