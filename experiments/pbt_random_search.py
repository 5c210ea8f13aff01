"""PBT against random search and against default hyperparameters at equal compute (fast-PBT R2, with its controls).

    PYTHONPATH=. .venv/bin/python experiments/pbt_random_search.py [--env probe:pendulum] [--seeds 0,1,2,3,4]
        [--steps 30000] [--interval 5000] [--arms pbt,random,defaults] [--protocol spec|paper]

TD3, population 8, hidden (64, 64), batch 256, ``--steps`` env steps per member, one update per env step. Three
arms, each one run per seed (``seed`` s in every arm, so member m of every arm starts from the same keys):

- ``pbt``: the fast-PBT TD3 search space sampled at the start, then every ``--interval`` updates the bottom 25 %
  (2 of 8) copy a top-25 % member and perturb its hparams (x0.8 / x1.2, resampled with probability 0.25);
- ``random``: random search at equal compute: the independent driver with 8 draws from the same prior (not the
  same draws as PBT's: each driver draws with its own key), no exploit;
- ``defaults``: 8 members with the library's default hparams, the independent driver.

No env preset (``preset="none"``): the defaults are the library's TD3 defaults on every env, as on Pendulum.

``--protocol paper`` runs R2 as the fast-PBT paper states it (results in ``pbt_paper_<env>/``): the bottom 30 %
(``int(0.3 * 8)`` = 2 members) resampled from the prior (``explore: resample``), fitness = the mean of the last 2
evaluations x 5 episodes (every 5k steps), exploit every ``--interval`` (default 10k), 60k steps; the member each
arm would pick (best fitness at the end) is then re-scored on ``RESCORE_EPISODES`` fresh episodes
(``rescore.py``), and that re-scored return is the arm's score.

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
from rescore import rescore
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
# What each protocol changes: the PBT round, the evaluation cadence, the final-return window, re-scoring.
PROTOCOLS = {"spec": {"pbt": {}, "eval": {}, "window": 3, "rescore": 0, "steps": 30_000, "interval": 5_000},
             "paper": {"pbt": {"quantile": 0.3, "explore": "resample", "fitness_window": 2},
                       "eval": {"eval_interval": 5_000, "eval_episodes": 5}, "window": 2, "rescore": 20,
                       "steps": 60_000, "interval": 10_000}}
RESCORE_EPISODES = PROTOCOLS["paper"]["rescore"]


def results_dir(env: str, protocol: str = "spec") -> Path:
    name = "pbt_random_search" if protocol == "spec" else f"pbt_{protocol}"
    return HERE / "results" / f"{name}_{env.split(':')[-1].lower()}"


def options(arm: str, seed: int, args) -> dict:
    protocol = PROTOCOLS[args.protocol]
    env = {**ENVS[args.env], **protocol["eval"]}
    arm_options = dict(ARMS[arm])
    if "pbt" in arm_options:
        arm_options["pbt"] = {**arm_options["pbt"], **protocol["pbt"], "interval": args.interval,
                              "search_space": SEARCH_SPACES["td3"]}
    return dict(learner="td3", env=args.env, preset="none", pop_size=8, seed=seed, total_env_steps=args.steps,
                warmup_steps=env["warmup"], eval_interval=env["eval_interval"], eval_episodes=env["eval_episodes"],
                batch_size=256, buffer_size=args.steps, rollout_len=50, update_ratio=1.0,
                learner_config={"hidden": env["hidden"]}, checkpoint_interval=0, progress=False, **arm_options)


def run(arm: str, seed: int, args) -> dict:
    start = time.time()
    result = popjax.train(out_dir=Path(args.out) / f"{arm}_s{seed}", overwrite=True, **options(arm, seed, args))
    s = result.summary
    curves = [[[int(r["env_steps"]), float(r["eval_return"])] for r in rows] for rows in member_rows(result.out_dir, 8)]
    protocol = PROTOCOLS[args.protocol]
    finals = [float(np.mean([v for _, v in c[-protocol["window"]:]])) for c in curves]
    record = {"arm": arm, "seed": seed, "env": args.env, "steps": args.steps, "interval": args.interval,
              "final_best": max(finals), "final_per_member": finals, "curves": curves,
              "exploits": len(s.get("lineage", [])), "wall_s": s["wall_s"], "compile_s": s["compile_s"]}
    if args.protocol != "spec":
        chosen = int(np.argmax(finals))
        returns = rescore(result.out_dir, chosen, args.env, protocol["rescore"], seed)
        record.update(protocol=args.protocol, window=protocol["window"], chosen_member=chosen,
                      rescored_returns=returns, rescored=float(np.mean(returns)))
    record["total_s"] = round(time.time() - start, 1)
    path = results_dir(args.env, args.protocol) / f"{arm}_s{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{arm} seed {seed}: final best {record['final_best']:.1f}, {record['total_s']:.0f} s", flush=True)
    return record


def plot(records: list[dict], env: str, protocol: str = "spec") -> Path:
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
    return save_figure(fig, HERE / "plots" / f"{results_dir(env, protocol).name}.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="probe:pendulum", choices=sorted(ENVS))
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--protocol", default="spec", choices=sorted(PROTOCOLS),
                        help="spec: perturb the bottom 25 %%, last-3 evaluations; paper: see above")
    parser.add_argument("--steps", type=int, default=None, help="env steps per member (30k spec, 60k paper)")
    parser.add_argument("--interval", type=int, default=None, help="exploit interval (5k spec, 10k paper)")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--out", default=None, help="run directories (default runs/pbt_random_search_<env>)")
    parser.add_argument("--commit", action="store_true", help="git-commit each seed's JSON once all its arms are done")
    args = parser.parse_args()
    args.steps = args.steps or PROTOCOLS[args.protocol]["steps"]
    args.interval = args.interval or PROTOCOLS[args.protocol]["interval"]
    out_dir = results_dir(args.env, args.protocol)
    args.out = args.out or f"runs/{out_dir.name}"
    random_policy(out_dir, args.env)
    records = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for arm in args.arms.split(","):
            records.append(saved_or_run(out_dir / f"{arm}_s{seed}.json",
                                        {"steps": args.steps, "interval": args.interval},
                                        lambda arm=arm, seed=seed: run(arm, seed, args)))
        if args.commit:
            commit_seed(out_dir, seed)
    print(plot(records, args.env, args.protocol))


def commit_seed(out_dir: Path, seed: int) -> None:
    """Commits the seed's JSON files (and the random-policy reference) so that a killed sweep keeps them."""
    import subprocess

    files = sorted(str(p) for p in out_dir.glob(f"*_s{seed}.json")) + sorted(str(p) for p in out_dir.glob("random*"))
    subprocess.run(["git", "add", *files], cwd=HERE.parent, check=False)  # a busy index must not kill the sweep
    subprocess.run(["git", "commit", "-q", "-m", f"experiments: {out_dir.name} seed {seed} (all arms), per-seed JSON",
                    "--", *files], cwd=HERE.parent, check=False)


if __name__ == "__main__":
    main()
