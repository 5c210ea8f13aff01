"""HTS-RL Table A1 analogue: how to correct the one-step lag. A2C on gym:CartPole-v1, 16 seeds, three learning rates.

    PYTHONPATH=. .venv/bin/python experiments/hts_table_a1.py [--steps 100000] [--seeds 16] [--lrs 3.5e-4,7e-4,1.4e-3]

Four arms, each one ``hts`` population whose members are the seeds (``seed=0`` in every arm, so member m starts
from the same keys everywhere: the arms are paired by member); 16 envs per member, alpha = 5 (the paper's A2C
unroll), 8 executors, 2 actors, rl-zoo's A2C CartPole hparams (no entropy bonus) with the learning rate varied:

- ``lockstep``: synchronous A2C (a barrier every step, no lag): the reference;
- ``eq6``: HTS with the delayed gradient, Eq. 6 (the gradient at the behaviour parameters, applied to the current);
- ``truncated_is``: HTS, the gradient at the current parameters with each sample weighted by min(1, pi/mu)
  (``learner_config.lag_correction: truncated_is``, ``is_clip`` 1);
- ``none``: HTS without correction (the gradient at the current parameters, the lagged data unweighted).

The paper (Table A1, Atari, delayed gradient / truncated IS / no correction): BankHeist 987 / 881 / 877, Breakout
415 / 390 / 402, Seaquest 1831 / 1827 / 1784: Eq. 6 best on all three games. Score per seed: the mean evaluation
return over training (area under the curve) and the final return. Held when Eq. 6's mean score is at least each
other correction's at every learning rate; the paired differences and their 95 % bootstrap intervals say whether
the order is resolved. Writes experiments/results/hts_table_a1/<arm>_lr<lr>.json (per seed curves and scores; a
killed sweep goes on where it stopped) and experiments/plots/hts_table_a1.png.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from sweep_common import member_rows, plot_curves, saved_or_run

import popjax
from popjax.plots import save_figure

HERE = Path(__file__).parent
RESULTS = HERE / "results" / "hts_table_a1"
ARMS = {"lockstep": ({"lockstep": True}, "gradient"), "eq6": ({"delayed_gradient": "eq6"}, "gradient"),
        "truncated_is": ({"delayed_gradient": "eq6"}, "truncated_is"),
        "none": ({"delayed_gradient": "none"}, "gradient")}
LABELS = {"lockstep": "lock-step A2C", "eq6": "HTS, delayed gradient (Eq. 6)", "truncated_is": "HTS, truncated IS",
          "none": "HTS, no correction"}


def result_path(arm: str, lr: float) -> Path:
    return RESULTS / f"{arm}_lr{lr:g}.json"


def run(arm: str, lr: float, args) -> dict:
    hts, correction = ARMS[arm]
    start = time.perf_counter()
    result = popjax.train(learner="a2c", env="gym:CartPole-v1", driver="hts", pop_size=args.seeds, seed=0,
                          envs_per_member=16, total_env_steps=args.steps, eval_interval=args.steps // 20,
                          eval_episodes=5, hparams={"ent_coef": 0.0, "lr": lr, "is_clip": 1.0}, progress=False,
                          preset="none", learner_config={"lag_correction": correction},
                          out_dir=Path(args.out) / f"{arm}_lr{lr:g}", overwrite=True,
                          hts={"alpha": 5, "executors": 8, "actors": 2, **hts})
    curves = [[(int(r["env_steps"]), float(r["eval_return"])) for r in rows]
              for rows in member_rows(result.out_dir, args.seeds)]
    record = {"arm": arm, "lr": lr, "steps": args.steps, "seeds": args.seeds, "hts": hts, "lag_correction": correction,
              "curves": curves, "auc": [float(np.mean([v for _, v in c])) for c in curves],
              "final": [c[-1][1] for c in curves], "wall_s": round(time.perf_counter() - start, 1)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    result_path(arm, lr).write_text(json.dumps(record, indent=1) + "\n")
    print(f"{arm} lr {lr:g}: mean return over training {np.mean(record['auc']):.1f}, final "
          f"{np.mean(record['final']):.1f}, {record['wall_s']} s", flush=True)
    return record


def plot(records: list[dict], path: Path) -> None:
    import matplotlib.pyplot as plt  # headless: popjax.plots selected the Agg backend

    lrs = sorted({r["lr"] for r in records})
    fig, axes = plt.subplots(1, len(lrs), figsize=(5 * len(lrs), 4), squeeze=False)
    for ax, lr in zip(axes[0], lrs, strict=True):
        for i, arm in enumerate(ARMS):
            for r in records:
                if r["arm"] == arm and r["lr"] == lr:
                    plot_curves(ax, r["curves"], f"C{i}", f"{LABELS[arm]} (n = {r['seeds']})")
        ax.set(xlabel="env steps per member", ylabel="eval return", title=f"lr {lr:g}")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("A2C on CartPole-v1: correcting HTS-RL's one-step lag (Table A1 analogue)", fontsize=10)
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--lrs", default="3.5e-4,7e-4,1.4e-3")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--out", default="runs/hts_table_a1")
    args = parser.parse_args()
    records = []
    for lr in (float(x) for x in args.lrs.split(",")):
        for arm in args.arms.split(","):
            records.append(saved_or_run(result_path(arm, lr), {"steps": args.steps, "seeds": args.seeds},
                                        lambda arm=arm, lr=lr: run(arm, lr, args)))
    plot(records, HERE / "plots" / "hts_table_a1.png")


if __name__ == "__main__":
    main()
