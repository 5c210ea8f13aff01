"""H3 (optional): does HTS-RL's one-step lag cost data efficiency? A2C on gym:CartPole-v1.

    PYTHONPATH=. .venv/bin/python experiments/hts_learning.py [--steps 200000] [--seeds 3]

Three configurations of the ``hts`` driver, each one population whose members are the seeds
(16 envs per member, alpha = 5 as the paper's A2C unroll, 8 executors, 2 actors; rl-zoo's A2C
CartPole hparams: lr 7e-4, no entropy bonus): ``lockstep`` (synchronous A2C: barrier every step,
no lag), ``eq6`` (HTS with the delayed gradient of Liu et al. 2020, Eq. 6) and ``none`` (HTS
without correction: the gradient at the current parameters on data from the previous ones).
Pass (the paper's "does not trade data efficiency"): the HTS-Eq. 6 mean return over training
is within the seed spread of lock-step A2C. Writes experiments/results/hts_learning.json and
experiments/plots/hts_learning.png.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from sweep_common import member_rows

import popjax

HERE = Path(__file__).parent
CONFIGS = {"lockstep": {"lockstep": True}, "eq6": {"delayed_gradient": "eq6"}, "none": {"delayed_gradient": "none"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("runs/hts_learning"))
    args = parser.parse_args()
    results = {"steps": args.steps, "seeds": args.seeds, "runs": {}}
    for name, extra in CONFIGS.items():
        start = time.perf_counter()
        run = popjax.train(learner="a2c", env="gym:CartPole-v1", driver="hts", pop_size=args.seeds,
                           envs_per_member=16, total_env_steps=args.steps, eval_interval=args.steps // 20,
                           eval_episodes=5, hparams={"ent_coef": 0.0}, progress=False, preset="none",
                           out_dir=args.out / name, overwrite=True,
                           hts={"alpha": 5, "executors": 8, "actors": 2, **extra})
        curves = [[(int(r["env_steps"]), float(r["eval_return"])) for r in rows]
                  for rows in member_rows(run.out_dir, args.seeds)]
        means = [float(np.mean([v for _, v in c])) for c in curves]
        results["runs"][name] = {"curves": curves, "mean_return_per_seed": means,
                                 "final_per_seed": [c[-1][1] for c in curves],
                                 "wall_s": round(time.perf_counter() - start, 1)}
        print(f"{name}: mean return over training {np.mean(means):.1f} (per seed {np.round(means, 1).tolist()}), "
              f"final {np.round(results['runs'][name]['final_per_seed'], 1).tolist()}, "
              f"{results['runs'][name]['wall_s']} s")
    sync = results["runs"]["lockstep"]["mean_return_per_seed"]
    eq6 = float(np.mean(results["runs"]["eq6"]["mean_return_per_seed"]))
    results["pass"] = bool(min(sync) <= eq6 <= max(sync)) or eq6 >= float(np.mean(sync))
    print("H3", "PASS" if results["pass"] else "FAIL", f"(HTS-Eq.6 mean {eq6:.1f}; lock-step seeds {sync})")
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "hts_learning.json").write_text(json.dumps(results, indent=1) + "\n")
    plot(results, HERE / "plots" / "hts_learning.png")


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (name, run) in enumerate(results["runs"].items()):
        steps = np.array([s for s, _ in run["curves"][0]])
        values = np.array([[v for _, v in c] for c in run["curves"]])
        ax.plot(steps, values.mean(0), color=f"C{i}", label=f"{name} (mean of {len(values)} seeds)")
        ax.fill_between(steps, values.min(0), values.max(0), color=f"C{i}", alpha=0.2)
    ax.set(xlabel="env steps per member", ylabel="eval return", title="A2C on CartPole-v1: lock-step vs HTS")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")


if __name__ == "__main__":
    main()
