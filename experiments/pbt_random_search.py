"""PBT against random search and against default hyperparameters at equal compute (fast-PBT R2, with its controls).

    PYTHONPATH=. .venv/bin/python experiments/pbt_random_search.py [--env probe:pendulum] [--seeds 0,1,2,3,4]
        [--steps 30000] [--interval 5000] [--arms pbt,random,defaults]

TD3, population 8, hidden (64, 64), batch 256, ``--steps`` env steps per member, one update per env step. Three
arms, each one run per seed (``seed`` s in every arm, so member m of every arm starts from the same keys):

- ``pbt``: the fast-PBT TD3 search space sampled at the start, then every ``--interval`` updates the bottom 25 %
  (2 of 8) copy a top-25 % member and perturb its hparams (x0.8 / x1.2, resampled with probability 0.25);
- ``random``: random search at equal compute: the independent driver with 8 draws from the same prior (not the
  same draws as PBT's: each driver draws with its own key), no exploit;
- ``defaults``: 8 members with the library's default hparams, the independent driver.

No env preset (``preset="none"``): the defaults are the library's TD3 defaults on every env, as on Pendulum.

Per run: the best member's final return (mean of its last 3 evaluations: what tuning delivers), normalised as the
spec's R2 does: ``(R - R_random_policy) / (R_defaults_best - R_random_policy)`` with the ``defaults`` arm of the
same seed as the reference (so that arm is 1 by construction). Verdict: PBT - random search per seed with its
paired bootstrap interval; IQM over seeds per arm. Writes experiments/results/pbt_random_search_<env>/<arm>_s<seed>.json
and experiments/plots/pbt_random_search_<env>.png; tables: ``make results``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from rlx2_pendulum import random_policy
from sweep_common import member_rows, saved_or_run

import popjax
from popjax.plots import save_figure
from popjax.population.search_spaces import SEARCH_SPACES

HERE = Path(__file__).resolve().parent
ARMS = {"pbt": {"driver": "pbt", "pbt": {"quantile": 0.25, "explore": "perturb"}},
        "random": {"driver": "independent", "search_space": SEARCH_SPACES["td3"]},
        "defaults": {"driver": "independent"}}
COLORS = {"pbt": "C1", "random": "C0", "defaults": "C2"}
ENVS = {"probe:pendulum": {"hidden": [64, 64], "warmup": 1_000, "eval_interval": 1_000, "eval_episodes": 3},
        "gym:HalfCheetah-v5": {"hidden": [64, 64], "warmup": 5_000, "eval_interval": 2_500, "eval_episodes": 3}}


def results_dir(env: str) -> Path:
    return HERE / "results" / f"pbt_random_search_{env.split(':')[-1].lower()}"


def options(arm: str, seed: int, args) -> dict:
    env = ENVS[args.env]
    arm_options = dict(ARMS[arm])
    if "pbt" in arm_options:
        arm_options["pbt"] = {**arm_options["pbt"], "interval": args.interval, "search_space": SEARCH_SPACES["td3"]}
    return dict(learner="td3", env=args.env, preset="none", pop_size=8, seed=seed, total_env_steps=args.steps,
                warmup_steps=env["warmup"], eval_interval=env["eval_interval"], eval_episodes=env["eval_episodes"],
                batch_size=256, buffer_size=args.steps, rollout_len=50, update_ratio=1.0,
                learner_config={"hidden": env["hidden"]}, checkpoint_interval=0, progress=False, **arm_options)


def run(arm: str, seed: int, args) -> dict:
    start = time.time()
    result = popjax.train(out_dir=Path(args.out) / f"{arm}_s{seed}", overwrite=True, **options(arm, seed, args))
    s = result.summary
    curves = [[[int(r["env_steps"]), float(r["eval_return"])] for r in rows] for rows in member_rows(result.out_dir, 8)]
    finals = [float(np.mean([v for _, v in c[-3:]])) for c in curves]
    record = {"arm": arm, "seed": seed, "env": args.env, "steps": args.steps, "interval": args.interval,
              "final_best": max(finals), "final_per_member": finals, "curves": curves,
              "exploits": len(s.get("lineage", [])), "wall_s": s["wall_s"], "compile_s": s["compile_s"],
              "total_s": round(time.time() - start, 1)}
    path = results_dir(args.env) / f"{arm}_s{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{arm} seed {seed}: final best {record['final_best']:.1f}, {record['total_s']:.0f} s", flush=True)
    return record


def plot(records: list[dict], env: str) -> Path:
    import matplotlib.pyplot as plt  # headless: popjax.plots selected the Agg backend

    fig, ax = plt.subplots(figsize=(7, 4))
    for arm in ARMS:
        best = [np.max([[v for _, v in c] for c in r["curves"]], axis=0) for r in records if r["arm"] == arm]
        if best:
            steps = [x for x, _ in next(r for r in records if r["arm"] == arm)["curves"][0]]
            n = min(len(b) for b in best)
            ax.plot(steps[:n], np.mean([b[:n] for b in best], axis=0), color=COLORS[arm],
                    label=f"{arm} (n = {len(best)})")
    ax.set(xlabel="env steps per member", ylabel="best member's return (mean over seeds)",
           title=f"TD3 on {env}, pop 8: PBT vs random search vs defaults")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, HERE / "plots" / f"pbt_random_search_{env.split(':')[-1].lower()}.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="probe:pendulum", choices=sorted(ENVS))
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--steps", type=int, default=30_000)
    parser.add_argument("--interval", type=int, default=5_000)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--out", default=None, help="run directories (default runs/pbt_random_search_<env>)")
    args = parser.parse_args()
    args.out = args.out or f"runs/{results_dir(args.env).name}"
    random_policy(results_dir(args.env), args.env)
    records = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for arm in args.arms.split(","):
            records.append(saved_or_run(results_dir(args.env) / f"{arm}_s{seed}.json",
                                        {"steps": args.steps, "interval": args.interval},
                                        lambda arm=arm, seed=seed: run(arm, seed, args)))
    print(plot(records, args.env))


if __name__ == "__main__":
    main()
