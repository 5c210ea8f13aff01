"""F2: TD3 vs ReF-ER-TD3 (spec refer.md §10), 5 seeds as one population per arm, paired by member.

    PYTHONPATH=. .venv/bin/python experiments/refer_learning.py [--env probe:pendulum] [--steps 50000]
        [--seeds 5] [--out runs/refer_learning]
        [--buffer-size 16384] [--arms td3 refer] [--refer-d 0.1] [--tag TAG]

Arms (same run seed, so member i starts from the same parameters and acts with the same keys in both):

- ``td3``: ``refer_td3`` with C = 1e30 and beta0 = 1: nothing is ever far (log rho is clipped at +-7) and beta
  stays exactly 1, so every update is TD3's bit for bit (tests/test_refer.py, E3); the learner still records the
  behaviour, which is how the baseline's replay-averaged KL(mu || pi) is measured.
- ``refer``: ``refer_td3`` with sigma 0.2, C 4, D 0.1, A = 5 / T (the paper's A T = 5 of a 1e7-step run), beta step
  1e-3, beta0 = 0. Each other ``--refer-d`` value adds an arm ``refer_d<D>`` (the same with that D).
- ``ddpg`` (``--arms``): the paper's baseline, DDPG-style replay: the ``td3`` arm with policy delay 1 and no
  target-policy smoothing (target noise 0; TD3's twin critics and their minimum kept).

All: exploration sigma 0.2 (the sigma of rho and KL), hidden (128, 128), B 128, N = 2^14 rows (``--buffer-size``;
the memory turns over T / N times), N_start = 2^12
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
re-plots the arms already in the JSON; an arm not yet in it is run (a killed study goes on with the arm it had not
finished). Writes experiments/results/refer_learning_<env>.json and experiments/plots/refer_learning_<env>.png, or
refer_learning_<tag>_<env>.* with ``--tag``; with more arms than ``td3`` and ``refer`` the summary holds every
ReF-ER arm against every baseline (``pairs``, ``"refer - ddpg"``: each as above).
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
BUFFER_SIZE = 2 ** 14
BASELINES = ("td3", "ddpg")  # ReF-ER off (C = 1e30, beta = 1); ddpg: policy delay 1 and no target smoothing
DEFAULT_D = 0.1


def refer_arm(d: float) -> str:
    """The arm name of ReF-ER at far fraction ``d``: ``refer`` at the spec's D = 0.1."""
    return "refer" if d == DEFAULT_D else f"refer_d{d:g}"


def arm_hparams(arm: str, steps: int) -> dict:
    common = {"exploration_noise": 0.2, "beta_lr": 1e-3}
    off = {**common, "refer_c": 1e30, "refer_a": 0.0, "beta_init": 1.0}
    if arm == "td3":
        return off
    if arm == "ddpg":
        return {**off, "policy_delay": 1, "target_noise": 0.0}
    d = float(arm.removeprefix("refer_d")) if arm.startswith("refer_d") else DEFAULT_D
    return {**common, "refer_c": 4.0, "refer_d": d, "refer_a": 5.0 / steps, "beta_init": 0.0}


def run_arm(arm: str, env: str, steps: int, seeds: int, out: Path, eval_episodes: int,
            buffer_size: int = BUFFER_SIZE) -> dict:
    started = time.time()
    hparams = arm_hparams(arm, steps)
    if env in DISCOUNT:
        hparams["discount"] = DISCOUNT[env]
    run = popjax.train(learner="refer_td3", env=env, driver="independent", pop_size=seeds, seed=0, preset="none",
                       total_env_steps=steps, warmup_steps=2 ** 12, rollout_len=50, update_ratio=1.0, batch_size=128,
                       buffer_size=buffer_size, eval_interval=5_000, eval_episodes=eval_episodes, checkpoint_interval=0,
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


def summarize(runs: dict, env: str, steps: int, refer: str = "refer", baseline: str = "td3") -> dict:
    """Arm ``refer`` against arm ``baseline`` (written under the keys "refer" and "td3")."""
    low, high = NORMALISE[env]
    norm = lambda r: (np.asarray(r, float) - low) / (high - low)  # noqa: E731
    base, ref = runs[baseline]["members"], runs[refer]["members"]
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


def summarize_pairs(runs: dict, env: str, steps: int) -> dict:
    """Every arm's final returns (raw and normalised, per seed) and every ReF-ER arm against every baseline arm
    present (``pairs``: ``{"refer - ddpg": summarize(...)}``)."""
    low, high = NORMALISE[env]
    final = {arm: [m["eval_return"][-1] for m in run["members"]] for arm, run in runs.items()}
    refers = [a for a in runs if a not in BASELINES]
    return {"final_return": final,
            "final_normalised": {arm: ((np.asarray(v, float) - low) / (high - low)).tolist()
                                 for arm, v in final.items()},
            "normalise": [low, high],
            "pairs": {f"{r} - {b}": summarize(runs, env, steps, r, b) for r in refers for b in BASELINES if b in runs}}


def label(arm: str) -> str:
    return {"td3": "TD3", "ddpg": "DDPG-style (delay 1, no smoothing)", "refer": "ReF-ER-TD3"}.get(
        arm, f"ReF-ER-TD3, D = {arm.removeprefix('refer_d')}")


def plot(data: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    colors = {"td3": "tab:gray", "refer": "tab:red", "ddpg": "tab:blue"}
    for k, (arm, run) in enumerate(data["runs"].items()):
        for i, m in enumerate(run["members"]):
            color = colors.get(arm, f"C{k + 3}")
            label_ = label(arm) if i == 0 else None
            for ax, key in zip(axes, ("eval_return", "kl", "far_fraction", "beta"), strict=True):
                ax.plot(m["env_steps"], [np.nan if v is None else v for v in m[key]], color=color, lw=1,
                        alpha=0.7, label=label_)
    axes[0].set(title="evaluation return", xlabel="env steps")
    axes[1].set(title="replay-averaged KL(mu || pi)", xlabel="env steps", yscale="log")
    axes[2].axhline(0.1, color="k", ls="--", lw=0.8)
    axes[2].set(title="far fraction (dashed: D = 0.1)", xlabel="env steps")
    axes[3].set(title="beta", xlabel="env steps")
    axes[0].legend(fontsize=8)
    memory = "" if data.get("buffer_size", BUFFER_SIZE) == BUFFER_SIZE else f", N = {data['buffer_size']}"
    fig.suptitle(f"F2: TD3 vs ReF-ER-TD3 on {data['env']} ({data['seeds']} seeds per arm, paired{memory})")
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="probe:pendulum")  # or gym:Hopper-v5, gym:HalfCheetah-v5
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--buffer-size", type=int, default=BUFFER_SIZE, help="replay rows N")
    parser.add_argument("--arms", nargs="+", default=["td3", "refer"], choices=[*BASELINES, "refer"],
                        help="refer: one arm per --refer-d")
    parser.add_argument("--refer-d", type=float, nargs="+", default=[DEFAULT_D], help="ReF-ER's D, one arm each")
    parser.add_argument("--tag", default="", help="results refer_learning_<tag>_<env>.json (default: no tag)")
    parser.add_argument("--out", type=Path, default=Path("runs/refer_learning"))
    args = parser.parse_args()
    if not all(0 < d < 1 for d in args.refer_d):
        parser.exit(2, f"--refer-d: {args.refer_d} (allowed: each in (0, 1))\n")
    name = args.env.split(":")[1].lower()
    stem = f"refer_learning_{args.tag}_{name}" if args.tag else f"refer_learning_{name}"
    results = HERE / "results" / f"{stem}.json"
    arms = [a for arm in args.arms for a in ([refer_arm(d) for d in args.refer_d] if arm == "refer" else [arm])]
    settings = {"env": args.env, "steps": args.steps, "seeds": args.seeds, "eval_episodes": args.eval_episodes}
    if args.buffer_size != BUFFER_SIZE:  # the N = 2^14 runs' JSON names no buffer size
        settings["buffer_size"] = args.buffer_size
    data = json.loads(results.read_text()) if results.exists() else {**settings, "runs": {}}
    if any(data.get(k, BUFFER_SIZE if k == "buffer_size" else None) != v for k, v in settings.items()):
        parser.exit(2, f"--tag: {results} holds other settings ({ {k: data.get(k) for k in settings} }); "
                       f"allowed: the same settings, or another tag\n")
    for arm in arms:
        if arm not in data["runs"]:  # a killed study goes on with the arm it had not finished
            data["runs"][arm] = run_arm(arm, args.env, args.steps, args.seeds,
                                        args.out / stem.removeprefix("refer_learning_"), args.eval_episodes,
                                        args.buffer_size)
            results.parent.mkdir(parents=True, exist_ok=True)
            results.write_text(json.dumps(data, indent=1) + "\n")
            print(json.dumps({"arm": arm, "wall_s": data["runs"][arm]["wall_s"],
                              "final_returns": data["runs"][arm]["final_returns"]}), flush=True)
    if set(data["runs"]) == {"td3", "refer"}:
        data["summary"] = summarize(data["runs"], args.env, args.steps)
    else:
        data["summary"] = summarize_pairs(data["runs"], args.env, args.steps)
    results.write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps(data["summary"], indent=1))
    plot(data, HERE / "plots" / f"{stem}.png")


if __name__ == "__main__":
    main()
