"""Does naive local SGD diverge? SPO-TD3 two-phase vs naive on Pendulum over H and the optimizer-state rule (issue 27).

    PYTHONPATH=. .venv/bin/python experiments/spo_divergence.py [--steps 20000] [--seeds 10]
        [--configs two_phase-average-10,naive-local-200,...] [--lr 1e-3] [--buffer uniform] [--tag TAG]

The thesis (Ch. 5) motivates SPO-TD3's two-phase round by the divergence of the naive one: local actors following
their own local critics, then averaged. The S3 run (``spo_pendulum.py``, R = 2, H = 10, Adam moments averaged) saw
none. This grid widens it: R = 4 replicas, H in {10, 50, 200} local steps per round, ``opt_state`` in {average,
local} (Adam moments averaged with the weights, or kept per replica), two-phase vs naive: 12 configurations, each
one population of ``--seeds`` members (``seed: 0``: member m starts from the same keys in every configuration, so
the configurations are paired by member). Targets are copied every F rounds with F * H = 200 updates (1/tau of
TD3). Shared: ``probe:pendulum``, the S3 hparams (lr 1e-3, discount 0.98, exploration noise 0.1), hidden (64, 64),
global batch 256 (64 per replica), 1k random warm-up steps, 200 env steps then 200 updates per iteration (so every
H divides them), an evaluation of 10 episodes every 1k env steps.

Logged per round, before each average: ``critic_spread`` and ``actor_spread``, the replicas' RMS distance from their
mean over the mean's RMS (``spo.replica_spread``). A configuration **diverges** in a seed when any logged value is
non-finite or its final return (mean of the last 3 evaluations) is no better than its untrained first evaluation.
Held (the thesis's claim) when naive diverges in more seeds than two-phase in some (H, opt_state) cell. Writes
experiments/results/spo_divergence/<config>.json (per seed curves, spreads, verdict inputs, AUC) and
experiments/plots/spo_divergence.png.

At real drift (issue 39): ``--lr`` sets both learning rates (1e-2 moves the replicas apart), ``--buffer
prioritized`` is the thesis's banked replay (replica r samples bank r; alpha 0.6, beta 0.4), and H may exceed the
200 updates of an iteration (H = 1000: 1000 env steps then 1000 updates per iteration, targets copied after every
round); ``--tag`` writes results/spo_divergence_<tag>/ and plots/spo_divergence_<tag>.png instead. Each seed's
AUC is its mean evaluation return over training (trapezoid over env steps / their span).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
from spo_pendulum import NON_FINITE, to_float
from sweep_common import member_rows, plot_curves, saved_or_run

import popjax
from popjax.plots import save_figure

HERE = Path(__file__).parent
REPLICAS, B, COPY_EVERY, ITERATION = 4, 256, 200, 200
HPARAMS = {"actor_lr": 1e-3, "critic_lr": 1e-3, "discount": 0.98, "exploration_noise": 0.1}
CONFIGS = [f"{variant}-{opt}-{h}" for h in (10, 50, 200) for opt in ("average", "local")
           for variant in ("two_phase", "naive")]


def learner_config(name: str) -> dict:
    variant, opt_state, h = name.split("-")
    return {"hidden": [64, 64], "replicas": REPLICAS, "local_steps": int(h),
            "target_rounds": max(1, COPY_EVERY // int(h)), "opt_state": opt_state, "naive": variant == "naive"}


def auc(curve: list[list[float]]) -> float:
    """Mean evaluation return over training: trapezoid area under return vs env steps over their span."""
    c = np.asarray(curve, dtype=float)
    return float(np.trapezoid(c[:, 1], c[:, 0]) / (c[-1, 0] - c[0, 0]))


def run(name: str, args, results: Path) -> dict:
    started = time.time()
    out = Path(args.out) / name
    hparams = {**HPARAMS, "actor_lr": args.lr, "critic_lr": args.lr}
    result = popjax.train(
        learner="spo_td3", env="probe:pendulum", driver="independent", pop_size=args.seeds, seed=0, preset="none",
        total_env_steps=args.steps, warmup_steps=1_000, rollout_len=max(ITERATION, learner_config(name)["local_steps"]),
        update_ratio=1.0, batch_size=B, buffer_size=args.steps, buffer=args.buffer, eval_interval=1_000,
        eval_episodes=10, checkpoint_interval=0, progress=False, hparams=hparams,
        learner_config=learner_config(name), out_dir=out, overwrite=True)
    curves, spreads, bad = [], [], []
    for member in member_rows(out, args.seeds):
        curves.append([[int(r["env_steps"]), to_float(r["eval_return"])] for r in member])
        trained = [r for r in member if int(r["updates"]) > 0]
        spreads.append([[int(r["env_steps"]), to_float(r["critic_spread"]), to_float(r["actor_spread"])]
                        for r in trained])
        bad.append(sorted({k for r in member for k, v in r.items() if str(v).strip().lower() in NON_FINITE
                           and (int(r["updates"]) > 0 or k == "eval_return")}))
    c = np.asarray(curves, dtype=float)
    first = c[:, 0, 1]  # the untrained policy's evaluation (at the end of the random warm-up)
    final = c[:, -3:, 1].mean(axis=1)
    diverged = [bool(b) or not (math.isfinite(f) and f > f0) for b, f, f0 in zip(bad, final, first, strict=True)]
    record = {"config": name, "learner_config": learner_config(name), "steps": args.steps, "seeds": args.seeds,
              "curves": curves, "spreads": spreads, "non_finite_columns": bad, "first": first.tolist(),
              "final": final.tolist(), "diverged": diverged, "wall_s": result.summary["wall_s"],
              "total_s": round(time.time() - started, 1)}
    if args.tag:  # the issue-27 records predate these fields
        record.update(lr=args.lr, buffer=args.buffer, auc=[auc(curve) for curve in curves])
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"{name}: final {np.nanmean(final):.0f}, diverged {sum(diverged)}/{args.seeds}, "
          f"critic spread {np.nanmean([s[1] for m in spreads for s in m]):.3g}, {record['total_s']:.0f} s", flush=True)
    return record


def plot(records: list[dict], path: Path) -> None:
    import matplotlib.pyplot as plt  # headless: popjax.plots selected the Agg backend

    hs = sorted({r["learner_config"]["local_steps"] for r in records})
    fig, axes = plt.subplots(2, len(hs), figsize=(5 * len(hs), 7.5), squeeze=False)
    colors = {("two_phase", "average"): "C0", ("two_phase", "local"): "C2", ("naive", "average"): "C1",
              ("naive", "local"): "C3"}
    for col, h in enumerate(hs):
        for r in records:
            variant, opt_state, rh = r["config"].split("-")
            if int(rh) != h:
                continue
            color = colors[(variant, opt_state)]
            label = f"{variant}, opt_state {opt_state} (n = {r['seeds']})"
            plot_curves(axes[0][col], r["curves"], color, label)
            plot_curves(axes[1][col], [[[s[0], s[1]] for s in m] for m in r["spreads"]], color, label)
        axes[0][col].set(title=f"R = {REPLICAS}, H = {h}", ylabel="eval return (10 episodes)")
        axes[1][col].set(xlabel="env steps per seed", ylabel="critic spread before each average", yscale="log")
        for ax in axes[:, col]:
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("SPO-TD3 on probe:pendulum: naive vs two-phase local SGD", fontsize=10)
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--lr", type=float, default=HPARAMS["actor_lr"], help="actor and critic learning rate")
    parser.add_argument("--buffer", default="uniform", choices=("uniform", "prioritized"),
                        help="prioritized: the banked prioritized replay, one bank per replica")
    parser.add_argument("--tag", default="", help="results under results/spo_divergence_<tag>/ (default: no tag)")
    parser.add_argument("--out", default="runs/spo_divergence")
    args = parser.parse_args()
    if not args.tag and (args.lr != HPARAMS["actor_lr"] or args.buffer != "uniform"):
        parser.exit(2, "--tag: required with --lr or --buffer (allowed: any name; the untagged folder holds the "
                       "issue-27 grid)\n")
    stem = f"spo_divergence_{args.tag}" if args.tag else "spo_divergence"
    settings = {"steps": args.steps, "seeds": args.seeds}
    if args.tag:
        settings.update(lr=args.lr, buffer=args.buffer)
    records = []
    for name in args.configs.split(","):
        records.append(saved_or_run(HERE / "results" / stem / f"{name}.json", settings,
                                    lambda name=name: run(name, args, HERE / "results" / stem)))
    plot(records, HERE / "plots" / f"{stem}.png")


if __name__ == "__main__":
    main()
