"""S3: SPO-TD3 on Pendulum, the thesis's two-phase version vs the naive one (R = 2, H = 10), plain TD3 as reference.

    PYTHONPATH=. .venv/bin/python experiments/spo_pendulum.py [--configs two_phase,naive,td3]
        [--steps 30000] [--seeds 3] [--out runs/spo_pendulum]

``probe:pendulum`` is popjax's pure-JAX port of gymnasium's Pendulum-v1 (200-step episodes): the
whole iteration (acting, replay, update, evaluation) is one jitted call, much faster on a CPU than
``gym:Pendulum-v1``. Each configuration trains 3 seeds as ONE population of 3 members
(``driver=independent``: the members' keys differ, so they are 3 seeds). Configurations:

- ``two_phase``: ``spo_td3`` (thesis Alg. 8), R = 2 replicas, H = 10 local steps per round: H critic
  steps, average critic, H actor steps on the same batches against the averaged critic, average actor;
- ``naive``: ``spo_td3`` with ``naive: true``, each replica's actor follows its own local critic, then both
  are averaged (the thesis's diverging variant);
- ``td3``: plain TD3 (Polyak tau 0.005, policy delay 2).

Both SPO variants copy the targets every F = 20 rounds (F * H = 200 updates = 1/tau). Shared settings: the
preset's TD3 Pendulum hparams (lr 1e-3, discount 0.98, exploration noise 0.1; target noise 0.2 / clip 0.5),
hidden (64, 64), global batch B = 256 per update (each SPO replica b = 128), 1k random warm-up steps, 50 env
steps then 50 updates per iteration. Writes experiments/results/spo_pendulum/results.json and
experiments/plots/spo_pendulum.png (``--seeds N`` other than 3: ``results_Nseeds.json``,
``spo_pendulum_Nseeds.png``); pass criterion: the two-phase version does not diverge (its final return
is finite and better than its first evaluation).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
from results_cemrl_dvd_spo import spo_pendulum_table
from sweep_common import member_rows, plot_curves, run_sweep

import popjax
from popjax.plots import save_figure

HERE = Path(__file__).parent
NON_FINITE = ("nan", "inf", "-inf", "+inf")
B = 256
REPLICAS = 2
LOCAL_STEPS = 10
TARGET_ROUNDS = 20  # F * H = 200 updates = 1 / tau of TD3
HPARAMS = {"actor_lr": 1e-3, "critic_lr": 1e-3, "discount": 0.98, "exploration_noise": 0.1}
CONFIGS = {
    "two_phase": ("spo_td3", {"replicas": REPLICAS, "local_steps": LOCAL_STEPS, "target_rounds": TARGET_ROUNDS}),
    "naive": ("spo_td3", {"replicas": REPLICAS, "local_steps": LOCAL_STEPS, "target_rounds": TARGET_ROUNDS,
                          "naive": True}),
    "td3": ("td3", {}),
}
LABELS = {"two_phase": f"SPO-TD3 two-phase (R = {REPLICAS}, H = {LOCAL_STEPS})",
          "naive": f"SPO-TD3 naive (R = {REPLICAS}, H = {LOCAL_STEPS})", "td3": "TD3 (tau 0.005, delay 2)"}


def to_float(x: str) -> float:
    try:
        return float(x)
    except ValueError:
        return math.nan


def run_config(name: str, steps: int, seeds: int, out: Path) -> dict:
    """One population of ``seeds`` members; per-seed eval curves vs env steps and a non-finite check."""
    learner, learner_config = CONFIGS[name]
    started = time.time()
    run = popjax.train(
        learner=learner, env="probe:pendulum", driver="independent", pop_size=seeds, seed=0, preset="none",
        total_env_steps=steps, warmup_steps=1_000, rollout_len=50, update_ratio=1.0, batch_size=B,
        buffer_size=steps, eval_interval=1_000, eval_episodes=10, checkpoint_interval=0, progress=False,
        hparams=HPARAMS, learner_config={"hidden": [64, 64], **learner_config}, out_dir=out)
    members = member_rows(out, seeds)
    curves, non_finite, q_means = [], [], []
    for member in members:
        curves.append([[int(r["env_steps"]), to_float(r["eval_return"])] for r in member])
        # any non-finite number the run logged for this member (returns, losses, Q means); the warm-up rows
        # (0 updates) log nan losses by construction, so only their returns are checked
        bad = sorted({k for r in member for k, v in r.items() if str(v).strip().lower() in NON_FINITE
                      and (int(r["updates"]) > 0 or k == "eval_return")})
        non_finite.append(bad)
        q_means.append([[int(r["env_steps"]), to_float(r["q_mean"])] for r in member if int(r["updates"]) > 0])
    s = run.summary
    return {"config": name, "learner": learner, "learner_config": learner_config, "curves": curves,
            "non_finite_columns": non_finite, "q_means": q_means,
            "columns": list(members[0][0].keys()) if members[0] else [],
            "final_returns": s["final_returns"], "updates": s["updates"], "wall_s": s["wall_s"],
            "compile_s": s["compile_s"], "total_s": time.time() - started, "out": str(out)}


def summarize(results: list[dict]) -> dict:
    table = {}
    for r in results:
        c = np.asarray(r["curves"], dtype=float)  # [seeds, evals, 2]
        finals, firsts = c[:, -1, 1], c[:, 0, 1]
        q = np.asarray(r["q_means"], dtype=float)[:, :, 1]  # logged mean Q of the last update chunk per eval
        finite = bool(np.isfinite(c[:, :, 1]).all()) and not any(r["non_finite_columns"])
        table[r["config"]] = {
            "final_returns": finals.tolist(), "final_mean": float(np.mean(finals)),
            "final_sd": float(np.std(finals, ddof=1)),
            "best": float(np.nanmax(c[:, :, 1])), "best_per_seed": np.nanmax(c[:, :, 1], axis=1).tolist(),
            "last5_mean": float(np.mean(c[:, -5:, 1])), "q_mean_min": float(np.min(q)),
            "q_mean_max": float(np.max(q)), "first_eval": firsts.tolist(), "all_finite": finite,
            "non_finite_columns": r["non_finite_columns"],
            "wall_s": r["wall_s"], "total_s": r["total_s"]}
    two = table.get("two_phase")
    passed = None
    if two:
        passed = two["all_finite"] and two["final_mean"] > float(np.mean(two["first_eval"]))
    return {"configs": table, "criterion": {"rule": "two-phase: every value finite and final mean return > first "
                                                    "evaluation mean", "passed": passed}}


def plot(results: list[dict], path: Path, steps: int) -> None:
    import matplotlib.pyplot as plt  # headless: popjax.plots selected the Agg backend

    fig, ax = plt.subplots(figsize=(8.5, 4.6))
    colors = {"two_phase": "C1", "naive": "C3", "td3": "C0"}
    for r in results:
        plot_curves(ax, r["curves"], colors[r["config"]], f"{LABELS[r['config']]}, mean of {len(r['curves'])} seeds")
    ax.set_xlabel("env steps per seed")
    ax.set_ylabel("eval return (10 deterministic episodes)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"SPO-TD3 on probe:pendulum, {steps} env steps per seed, B = {B}, F = {TARGET_ROUNDS} rounds",
                 fontsize=10)
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="two_phase,naive,td3", help="comma-separated; done configs are skipped")
    parser.add_argument("--steps", type=int, default=30_000, help="env steps per seed")
    parser.add_argument("--seeds", type=int, default=3, help="members (seeds) of each configuration's population")
    parser.add_argument("--out", default="runs/spo_pendulum")
    args = parser.parse_args()
    suffix = "" if args.seeds == 3 else f"_{args.seeds}seeds"
    results_path = HERE / "results" / "spo_pendulum" / f"results{suffix}.json"
    data = run_sweep(results_path, args.steps, args.configs.split(","), lambda runs: {r["config"] for r in runs},
                     lambda name: run_config(name, args.steps, args.seeds, Path(args.out + suffix) / name), summarize)
    plot(data["runs"], HERE / "plots" / f"spo_pendulum{suffix}.png", args.steps)
    print("\n".join(spo_pendulum_table(data["summary"])))
    print(json.dumps(data["summary"]["criterion"]))


if __name__ == "__main__":
    main()
