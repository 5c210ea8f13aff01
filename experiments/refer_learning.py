"""F2: TD3 vs ReF-ER-TD3 (spec refer.md §10), 5 seeds as one population per arm, paired by member.

    PYTHONPATH=. .venv/bin/python experiments/refer_learning.py [--env probe:pendulum] [--steps 50000]
        [--seeds 5] [--out runs/refer_learning]

Arms (same run seed, so member i starts from the same parameters and acts with the same keys in both):

- ``td3``: ``refer_td3`` with C = 1e30 and beta0 = 1: nothing is ever far (log rho is clipped at +-7) and beta
  stays exactly 1, so every update is TD3's bit for bit (tests/test_refer.py, E3); the learner still records the
  behaviour, which is how the baseline's replay-averaged KL(mu || pi) is measured.
- ``refer``: ``refer_td3`` with sigma 0.2, C 4, D 0.1, A = 5 / T (the paper's A T = 5 of a 1e7-step run), beta step
  1e-3, beta0 = 0.

Both: exploration sigma 0.2 (the sigma of rho and KL), hidden (128, 128), B 128, N = 2^14 rows, N_start = 2^12
env steps acted by the policy before the first update, 50 env steps then 50 updates per iteration, TD3's other
defaults (lr 3e-4, delay 2, tau 0.005; Pendulum: discount 0.98). Every 5k env steps: ``--eval-episodes``
(default 10) deterministic episodes,
and the metrics row's ``kl`` / ``far_fraction`` (KL averaged over the iteration's 50 batches of 128 uniform replay
samples: the replay average; the far fraction over every stored rho of the replay).

Pass [spec]: (a) the replay-averaged KL is lower with ReF-ER in >= 4 of 5 seeds (mean over the evaluations after
the first 20 % of training); (b) ReF-ER's far fraction within [0.05, 0.2] at every evaluation after the first 20 %;
(c) final normalised return >= baseline - 0.1, normalised as (R - R_low) / (R_high - R_low) with fixed
per-env constants (``NORMALISE``; not measured), difference with a paired percentile bootstrap 95 % CI
(``popjax.stats.paired_ci``, 10,000 replicates). Running it again with the same options only re-summarises and
re-plots the arms already in the JSON.
Writes experiments/results/refer_learning_<env>.json and experiments/plots/refer_learning_<env>.png.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from sweep_common import member_rows

import popjax
from popjax import stats
from popjax.plots import save_figure

HERE = Path(__file__).parent
# (R_low, R_high): about a random policy's and a solved one's return (fixed constants).
NORMALISE = {"probe:pendulum": (-1400.0, -150.0), "gym:Hopper-v5": (0.0, 3000.0),
             "gym:HalfCheetah-v5": (-300.0, 8000.0)}
DISCOUNT = {"probe:pendulum": 0.98}


def arm_hparams(arm: str, steps: int) -> dict:
    common = {"exploration_noise": 0.2, "beta_lr": 1e-3}
    if arm == "td3":
        return {**common, "refer_c": 1e30, "refer_a": 0.0, "beta_init": 1.0}
    return {**common, "refer_c": 4.0, "refer_d": 0.1, "refer_a": 5.0 / steps, "beta_init": 0.0}


def run_arm(arm: str, env: str, steps: int, seeds: int, out: Path, eval_episodes: int) -> dict:
    started = time.time()
    hparams = arm_hparams(arm, steps)
    if env in DISCOUNT:
        hparams["discount"] = DISCOUNT[env]
    run = popjax.train(learner="refer_td3", env=env, driver="independent", pop_size=seeds, seed=0, preset="none",
                       total_env_steps=steps, warmup_steps=2 ** 12, rollout_len=50, update_ratio=1.0, batch_size=128,
                       buffer_size=2 ** 14, eval_interval=5_000, eval_episodes=eval_episodes, checkpoint_interval=0,
                       progress=False, hparams=hparams, learner_config={"hidden": [128, 128]}, out_dir=out / arm,
                       overwrite=True)
    members = []
    for rows in member_rows(out / arm, seeds):
        pick = lambda key, rows=rows: [float(r[key]) if r[key] not in ("", "nan") else None for r in rows]  # noqa: E731
        members.append({"env_steps": [int(r["env_steps"]) for r in rows], "eval_return": pick("eval_return"),
                        "kl": pick("kl"), "far_fraction": pick("far_fraction"), "beta": pick("beta"),
                        "c_max": pick("c_max")})
    return {"arm": arm, "hparams": hparams, "members": members, "wall_s": round(time.time() - started, 1),
            "compile_s": run.summary.get("compile_s"), "final_returns": run.summary["final_returns"]}


def summarize(runs: dict, env: str, steps: int) -> dict:
    low, high = NORMALISE[env]
    norm = lambda r: (np.asarray(r, float) - low) / (high - low)  # noqa: E731
    base, ref = runs["td3"]["members"], runs["refer"]["members"]
    after = lambda m: [i for i, s in enumerate(m["env_steps"]) if s > 0.2 * steps]  # noqa: E731
    kl_base = np.array([np.mean([m["kl"][i] for i in after(m)]) for m in base])
    kl_ref = np.array([np.mean([m["kl"][i] for i in after(m)]) for m in ref])
    far = [[m["far_fraction"][i] for i in after(m)] for m in ref]
    final_base = norm([m["eval_return"][-1] for m in base])
    final_ref = norm([m["eval_return"][-1] for m in ref])
    diff = final_ref - final_base
    ci = stats.paired_ci(final_ref, final_base, reps=10_000)  # 95 % percentile, seed i of both arms drawn together
    lower_kl = int(np.sum(kl_ref < kl_base))
    far_ok = all(0.05 <= f <= 0.2 for seed in far for f in seed)
    return {
        "kl_after_20pct": {"td3": kl_base.tolist(), "refer": kl_ref.tolist()},
        "seeds_with_lower_kl": lower_kl, "a_kl_passed": lower_kl >= 4,
        "refer_far_fraction_after_20pct": {"min": min(min(s) for s in far), "max": max(max(s) for s in far)},
        "b_far_passed": far_ok,
        "final_normalised": {"td3": final_base.tolist(), "refer": final_ref.tolist()},
        "final_return": {"td3": [m["eval_return"][-1] for m in base], "refer": [m["eval_return"][-1] for m in ref]},
        "final_normalised_mean_sd": {arm: [float(v.mean()), float(v.std(ddof=1))]
                                     for arm, v in (("td3", final_base), ("refer", final_ref))},
        "difference_mean": float(diff.mean()), "difference_ci95": [float(ci.low), float(ci.high)],
        "c_return_passed": bool(final_ref.mean() >= final_base.mean() - 0.1),
        "normalise": [low, high],
    }


def plot(data: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    colors = {"td3": "tab:gray", "refer": "tab:red"}
    for arm, run in data["runs"].items():
        for i, m in enumerate(run["members"]):
            label = {"td3": "TD3", "refer": "ReF-ER-TD3"}[arm] if i == 0 else None
            for ax, key in zip(axes, ("eval_return", "kl", "far_fraction", "beta"), strict=True):
                ax.plot(m["env_steps"], [np.nan if v is None else v for v in m[key]], color=colors[arm], lw=1,
                        alpha=0.7, label=label)
    axes[0].set(title="evaluation return", xlabel="env steps")
    axes[1].set(title="replay-averaged KL(mu || pi)", xlabel="env steps", yscale="log")
    axes[2].axhline(0.1, color="k", ls="--", lw=0.8)
    axes[2].set(title="far fraction (dashed: D = 0.1)", xlabel="env steps")
    axes[3].set(title="beta", xlabel="env steps")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"F2: TD3 vs ReF-ER-TD3 on {data['env']} ({data['seeds']} seeds per arm, paired)")
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="probe:pendulum")  # or gym:Hopper-v5, gym:HalfCheetah-v5
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("runs/refer_learning"))
    args = parser.parse_args()
    name = args.env.split(":")[1].lower()
    results = HERE / "results" / f"refer_learning_{name}.json"
    data = json.loads(results.read_text()) if results.exists() else {}
    if data.get("steps") != args.steps or data.get("seeds") != args.seeds:
        data = {"env": args.env, "steps": args.steps, "seeds": args.seeds, "eval_episodes": args.eval_episodes,
                "runs": {}}
    for arm in ("td3", "refer"):
        if arm not in data["runs"]:  # a killed study goes on with the arm it had not finished
            data["runs"][arm] = run_arm(arm, args.env, args.steps, args.seeds, args.out / name,
                                        args.eval_episodes)
            results.parent.mkdir(parents=True, exist_ok=True)
            results.write_text(json.dumps(data, indent=1) + "\n")
            print(json.dumps({"arm": arm, "wall_s": data["runs"][arm]["wall_s"],
                              "final_returns": data["runs"][arm]["final_returns"]}), flush=True)
    data["summary"] = summarize(data["runs"], args.env, args.steps)
    results.write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps(data["summary"], indent=1))
    plot(data, HERE / "plots" / f"refer_learning_{name}.png")


if __name__ == "__main__":
    main()
