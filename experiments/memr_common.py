"""MEMR vs SAC, shared by ``memr_pendulum.py`` and ``memr_hopper.py``: SAC vs MEMR (prioritized start states) vs
MEMR (uniform start states), the seeds of each arm trained as ONE population.

All arms run with ``seed=0``, so member m of every arm starts from the same keys: the arms are paired by member and
compared with paired bootstrap intervals (``popjax.stats.paired_ci``). Arms:

- ``sac``: SAC on real transitions (uniform replay), one update per env step;
- ``memr``: ``memr_sac`` with ``buffer: prioritized`` (alpha 0.6, the thesis's best; beta 0.4), one policy
  update per env step (G = 1), M = ``batch_size`` one-step rollouts per env step;
- ``memr_uniform``: the ablation, uniform start states, the same number of policy updates and rollouts;
- ``memr_oracle``: ``memr_uniform`` with ``model: oracle`` (the pure-JAX env's own step as the model; pure-JAX envs
  only): if it does not match SAC per env step, the gap is in the rollout/segment/weight path, not in the model;
- ``memr_oracle_real`` (diagnostic): ``memr_oracle`` with ``real_ratio: 1``, so SAC trains on the step's real start
  transitions only (each once, in a random order) through MEMR's own update path: it should match SAC;
- ``memr_full`` (issue 48): ``memr`` with every rollout of the run kept (the learned model; the docs' advice);
- ``memr_oracle_full`` (diagnostic): ``memr_oracle`` with a model buffer holding every rollout of the run (the
  default keeps the last 1e5, i.e. the actions of the last ~800 env steps' policies): does the gap come from SAC
  training on near-on-policy actions only?

Besides the returns, each evaluation row keeps the learner's logs of its iteration (``MODEL_LOGS``: held-out model
NLL, the rollouts' and the real start transitions' termination rates, the mean importance weight, the priority and
its spread). ``--tag`` names a separate results file (a re-run beside an earlier one).

``rollout_len`` env steps then as many updates per iteration. The thesis's claim (Ch. 3): MEMR
matches SAC's return per env step (with fewer policy updates than MBPO; here G = 1 = SAC's ratio, so policy
updates per env step are equal by construction and the policy-update axis is the env-step axis scaled) and
prioritized start states beat uniform ones. Scores per seed: the mean of the last 3 evaluations (final) and the
mean over all evaluations after warm-up (area under the curve). Writes
experiments/results/memr_<name>/results.json (per seed curves) and experiments/plots/memr_<name>.png (``--steps``
other than the setting's default: ``results_<k>k.json``, ``memr_<name>_<k>k.png``).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from results_memr import MEMR_PAIRS, memr_scores
from sweep_common import member_rows, plot_curves, run_sweep

import popjax
from popjax import stats
from popjax.plots import save_figure

HERE = Path(__file__).parent
ARMS = {"sac": ("sac", "uniform", {"start_states": None}),
        "memr": ("memr_sac", "prioritized", {"start_states": "prioritized"}),
        "memr_uniform": ("memr_sac", "uniform", {"start_states": "uniform"}),
        "memr_oracle": ("memr_sac", "uniform", {"start_states": "uniform", "model": "oracle"}),
        "memr_oracle_real": ("memr_sac", "uniform", {"start_states": "uniform", "model": "oracle", "real_ratio": 1.0}),
        # model_buffer is capped at one segment per update of the run, so this keeps every rollout
        "memr_oracle_full": ("memr_sac", "uniform", {"start_states": "uniform", "model": "oracle",
                                                     "model_buffer": 100_000_000}),
        # issue 48: the docs' advice (model buffer as large as memory allows) with the learned model
        "memr_full": ("memr_sac", "prioritized", {"start_states": "prioritized", "model_buffer": 100_000_000})}
LABELS = {"sac": "SAC", "memr": "MEMR (prioritized start states)", "memr_uniform": "MEMR (uniform start states)",
          "memr_oracle": "MEMR (uniform start states, the env as model)",
          "memr_oracle_real": "MEMR's path on real rows only (env as model, real_ratio 1)",
          "memr_oracle_full": "MEMR (env as model, every rollout kept)",
          "memr_full": "MEMR (prioritized, every rollout kept)",
          # a record kept from before real rows were drawn without replacement (not an arm this script runs)
          "memr_oracle_real_resampled": "as real_ratio 1, real rows drawn with replacement (before the fix)"}
COLORS = {"sac": "C0", "memr": "C1", "memr_uniform": "C2", "memr_oracle": "C3", "memr_oracle_real": "C4",
          "memr_oracle_full": "C5", "memr_oracle_real_resampled": "C6",
          "memr_full": "C7"}
MODEL_LOGS = ("model_val_nll", "model_done", "real_done", "is_weight", "priority", "priority_std")


@dataclass(frozen=True)
class Setting:
    """One environment's experiment: what differs between the Pendulum and the Hopper runs."""

    name: str  # results/memr_<name>/, plots/memr_<name>.png
    env: str
    steps: int  # the default env steps per seed
    warmup: int
    eval_interval: int
    eval_episodes: int
    batch: int  # SAC's batch = MEMR's start states M per env step = its SAC batch from a model segment
    hidden: list[int]
    rollout_len: int  # env steps then as many updates per iteration
    hparams: dict
    memr: dict = field(default_factory=dict)  # memr_sac's model and pi_psi options


def run_config(setting: Setting, name: str, steps: int, seeds: int, out: Path) -> dict:
    learner, buffer, arm = ARMS[name]
    learner_config = {"hidden": setting.hidden}
    if arm["start_states"] is not None:
        learner_config.update(setting.memr, **arm, sac_batch=setting.batch)
    started = time.time()
    run = popjax.train(
        learner=learner, env=setting.env, driver="independent", pop_size=seeds, seed=0, preset="none",
        total_env_steps=steps, warmup_steps=setting.warmup, rollout_len=setting.rollout_len, update_ratio=1.0,
        batch_size=setting.batch, buffer_size=steps, buffer=buffer, per_alpha=0.6, per_beta=0.4,
        eval_interval=setting.eval_interval, eval_episodes=setting.eval_episodes, checkpoint_interval=0,
        progress=False, hparams=setting.hparams, learner_config=learner_config, out_dir=out)
    s = run.summary
    policy_per_update = s["counts"]["policy_updates"] / max(s["updates"], 1)
    curves = [[[int(r["env_steps"]), float(r["eval_return"]), int(r["updates"]) * policy_per_update] for r in rows]
              for rows in member_rows(out, seeds)]
    logs = [[[int(r["env_steps"]), *(float(r[k]) if r.get(k) else None for k in MODEL_LOGS)] for r in rows]
            for rows in member_rows(out, seeds)] if learner == "memr_sac" else None
    return {"config": name, "env": setting.env, "learner": learner, "buffer": buffer,
            "learner_config": learner_config, "hparams": setting.hparams, "warmup": setting.warmup,
            "curves": curves, "model_logs": logs, "model_log_fields": ["env_steps", *MODEL_LOGS],
            "counts": s["counts"], "final_returns": s["final_returns"], "updates": s["updates"],
            "wall_s": s["wall_s"], "compile_s": s["compile_s"], "total_s": time.time() - started, "out": str(out)}


def summarize(results: list[dict], warmup: int) -> dict:
    by = {r["config"]: r for r in results}
    per_arm = {name: memr_scores(r["curves"], warmup) for name, r in by.items()}
    table = {name: {**{k: v.tolist() for k, v in per_arm[name].items()},
                    **{f"{k}_mean": float(v.mean()) for k, v in per_arm[name].items()},
                    "counts": r["counts"], "wall_s": r["wall_s"], "total_s": r["total_s"]}
             for name, r in by.items()}
    comparisons = {}
    for a, b in MEMR_PAIRS:
        if a in by and b in by:
            comparisons[f"{a} - {b}"] = {}
            for score in ("final", "auc"):
                ci = stats.paired_ci(per_arm[a][score], per_arm[b][score], kind="difference", stat="mean")
                comparisons[f"{a} - {b}"][score] = {"difference": float(ci.point), "low": float(ci.low),
                                                    "high": float(ci.high), "level": ci.level}
    return {"configs": table, "paired_differences": comparisons}


def plot(setting: Setting, results: list[dict], path: Path, steps: int) -> None:
    import matplotlib.pyplot as plt  # headless: popjax.plots selected the Agg backend

    # a row below the panels holds the legend: with the diagnostic arms it would cover the curves
    rows = -(-len(results) // 2)
    fig = plt.figure(figsize=(12, 4.4 + 0.25 * rows))
    grid = fig.add_gridspec(2, 2, height_ratios=[4.4, 0.25 * rows + 0.1])
    axes = [fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])]
    for r in results:
        label = f"{LABELS[r['config']]}, mean of {len(r['curves'])} seeds"
        plot_curves(axes[0], [[row[:2] for row in c] for c in r["curves"]], COLORS[r["config"]], label)
        plot_curves(axes[1], [[[row[2], row[1]] for row in c] for c in r["curves"]], COLORS[r["config"]], label)
    axes[0].set_xlabel("env steps per seed")
    axes[1].set_xlabel("SAC policy updates per seed")
    for ax in axes:
        ax.set_ylabel(f"eval return ({setting.eval_episodes} deterministic episodes)")
        ax.grid(alpha=0.3)
    legend = fig.add_subplot(grid[1, :])
    legend.axis("off")
    legend.legend(*axes[0].get_legend_handles_labels(), loc="center", ncol=2, fontsize=8, frameon=False)
    fig.suptitle(f"MEMR vs SAC on {setting.env}, {steps} env steps per seed", fontsize=10)
    save_figure(fig, path)


def main(setting: Setting, doc: str) -> None:
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    oracle = "memr_oracle," if setting.env.startswith("probe:") else ""  # the oracle is a pure-JAX env's step
    parser.add_argument("--configs", default=f"sac,{oracle}memr_uniform,memr",
                        help="comma-separated; done arms are skipped")
    parser.add_argument("--steps", type=int, default=setting.steps, help="env steps per seed")
    parser.add_argument("--seeds", type=int, default=5, help="members (seeds) of each arm's population")
    parser.add_argument("--out", default=f"runs/memr_{setting.name}")
    parser.add_argument("--tag", default="", help="appended to the results, plot and run names (a separate re-run)")
    args = parser.parse_args()
    suffix = ("" if args.steps == setting.steps else f"_{args.steps // 1000}k") + (f"_{args.tag}" if args.tag else "")
    results_path = HERE / "results" / f"memr_{setting.name}" / f"results{suffix}.json"
    data = run_sweep(results_path, args.steps, args.configs.split(","), lambda runs: {r["config"] for r in runs},
                     lambda name: run_config(setting, name, args.steps, args.seeds, Path(args.out + suffix) / name),
                     lambda runs: summarize(runs, setting.warmup))
    plot(setting, data["runs"], HERE / "plots" / f"memr_{setting.name}{suffix}.png", args.steps)
    print(json.dumps(data["summary"], indent=1))
