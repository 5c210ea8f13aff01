"""The tables of RESULTS.md that issue 48 added: popjax against Stable-Baselines3 at the same settings and
evaluation episodes (the parity pairs, with their scoreboard evidence), PBT's exploit choice under common random
numbers in evaluation, and the one margin's table of random-to-solved ranges."""

from __future__ import annotations

from collections.abc import Callable

import margins
import numpy as np
import verdicts
from results_core import RESULTS, both_evidence, load, md, mean_sd, num, seeds, table, verdict_text

PARITY = {"td3_pendulum": "TD3, Pendulum-v1", "sac_pendulum": "SAC, Pendulum-v1", "dqn_cartpole": "DQN, CartPole-v1",
          "ppo_cartpole": "PPO, CartPole-v1", "td3_hopper": "TD3, Hopper-v5 (30k steps)",
          "td3_inverted_pendulum": "TD3, InvertedPendulum-v5 (SB3's defaults)"}
# one named difference changed (``parity_sb3.VARIANTS``): popjax's side against the base pair's SB3 runs, or SB3's
# side (``sb3_init``) against the base pair's popjax runs
ABLATIONS = {"ppo_cartpole_halved_value": "PPO, CartPole-v1, popjax's value term halved (vf_coef 0.5)",
             "dqn_cartpole_single_q": "DQN, CartPole-v1, no double Q, ε ending at 8k env steps",
             "dqn_cartpole_sb3_lecun_init": "DQN, CartPole-v1, SB3 initialised as popjax (LeCun normal, zero biases)",
             "td3_inverted_pendulum_sb3_lecun_init": "TD3, InvertedPendulum-v5, SB3 initialised as popjax"}


def sb3_record(d: dict) -> dict:
    """The record holding the SB3 runs ``d`` is scored against: its own, or (a popjax-side ablation) its base pair's."""
    popjax_side = "variant" in d and "sb3_init" not in d["variant"]
    return load(f"parity_sb3/{d['variant']['base']}.json") if popjax_side else d


def parity_scores(pair: str) -> dict:
    """Per seed, each side's final (mean of the last 3 evaluations) and learning speed (mean over the evaluations at
    or after the warm-up), from results/parity_sb3/<pair>.json (``parity_sb3.py``): popjax member m, SB3 seed m (an
    ablation: its base pair's SB3 runs, on the same evaluation episodes)."""
    d = load(f"parity_sb3/{pair}.json")
    base = sb3_record(d)
    pj = d["popjax"]
    if pj["eval_seeds"] != base["popjax"]["eval_seeds"]:
        raise ValueError(f"parity_sb3/{pair}.json: evaluated on other episodes than its SB3 runs")
    popjax = popjax_curves(pj)
    sb3 = np.asarray([[v for _, _, v in r["curve"]] for r in sorted(base["sb3"]["runs"], key=lambda r: r["seed"])],
                     dtype=float)
    if popjax.shape != sb3.shape:
        raise ValueError(f"parity_sb3/{pair}.json: popjax {popjax.shape} and SB3 {sb3.shape} evaluations differ")
    (pj_final, pj_speed), (sb3_final, sb3_speed) = (run_scores(c, pj) for c in (popjax, sb3))
    return {"env": f"gym:{d['env']}", "final": (pj_final, sb3_final), "speed": (pj_speed, sb3_speed),
            "wall": (pj["wall_s"], sum(r["wall_s"] for r in base["sb3"]["runs"])), "load": pj["load_1min_before"],
            "n": len(popjax)}


def popjax_curves(side: dict) -> np.ndarray:
    """A record's popjax returns, [member, evaluation]."""
    return np.asarray([[v for _, v in c] for c in side["curves"]], dtype=float)


def run_scores(curves: np.ndarray, side: dict) -> tuple[np.ndarray, np.ndarray]:
    """Per run, the final (mean of the last 3 evaluations) and the learning speed (mean over the evaluations at or
    after ``side``'s warm-up), of returns evaluated at ``side``'s evaluation steps."""
    after = np.asarray(side["eval_steps"]) >= side["preset"].get("warmup_steps", 0)
    return curves[:, -3:].mean(1), curves[:, after].mean(1)


def popjax_only_scores(pair: str) -> dict:
    """Per member, popjax's final and learning speed alone (an ablation evaluated on other episodes than SB3's runs,
    which can only be compared unpaired)."""
    pj = load(f"parity_sb3/{pair}.json")["popjax"]
    final, speed = run_scores(popjax_curves(pj), pj)
    return {"final": final, "speed": speed}


def parity_pairs(names: dict[str, str] = PARITY) -> list[str]:
    """The pairs (or ablations) whose runs are complete: as many SB3 runs as popjax members."""
    def complete(name: str) -> bool:
        d = load(f"parity_sb3/{name}.json")
        base = sb3_record(d)
        return len(base.get("sb3", {}).get("runs", [])) == len(d["popjax"]["curves"])
    return [p for p in names if (RESULTS / "parity_sb3" / f"{p}.json").exists() and complete(p)]


def parity_rows(names: dict[str, str]) -> list[list[str]]:
    rows = []
    for pair in parity_pairs(names):
        s = parity_scores(pair)
        verdict, v_final, v_speed = verdicts.both_measures(s["final"], s["speed"], -margins.margin(s["env"]), s["env"],
                                                          s["final"][1])
        rows.append([f"{names[pair]}, n = {s['n']}", f"{mean_sd(s['final'][0], 1)} / {mean_sd(s['final'][1], 1)}",
                     verdict_text(v_final).replace("**", ""), f"{mean_sd(s['speed'][0], 1)} / "
                     f"{mean_sd(s['speed'][1], 1)}", verdict_text(v_speed).replace("**", ""), f"**{verdict}**",
                     f"{num(s['wall'][0])} / {num(s['wall'][1])} (load {num(s['load'], 1)})"])
    return rows


PARITY_HEADER = ["learner, env, seeds per side", "final: popjax / SB3", "popjax − SB3, final", "speed: popjax / SB3",
                 "popjax − SB3, speed", "popjax matches SB3", "wall s: popjax (all seeds, one run) / SB3 (sum of runs)"]


@table
def parity_sb3() -> list[str]:
    """popjax − SB3 per pair: each side's final and learning speed (mean ± SD, ddof 1), the paired differences
    against the one margin, the verdict (``margins.combine``) and each side's wall time on the shared machine."""
    return md(PARITY_HEADER, parity_rows(PARITY))


@table
def parity_ablations() -> list[str]:
    """The same comparison for popjax with one named difference from SB3 changed (against the base pair's SB3
    runs; SB3's wall time is theirs)."""
    return md(PARITY_HEADER, parity_rows(ABLATIONS))


CRN_RUNS = {"eval_crn_pbt_3000.json": "still learning (3k steps)", "eval_crn_pbt.json": "near solved (8k steps)"}


@table
def eval_crn_pbt() -> list[str]:
    """PBT's exploit choice and the fitness-difference noise on 8 fixed policies, evaluated ``reps`` times under each
    evaluation protocol (``eval_crn_pbt.py``), for a population still learning and one near solved."""
    names = {"member": "own start states (`member`)", "common": "the same start states (`common`)"}
    rows, notes = [], []
    for path, population in CRN_RUNS.items():
        if not (RESULTS / path).exists():
            continue
        d = load(path)
        rows += [[population, names[k], num(v["pair_sd_mean"], 1), num(v["member_sd_mean"], 1),
                  f"{100 * v['choice_changes']:.0f} %", f"{100 * v['choice_differs_from_reference']:.0f} %",
                  f"{100 * v['replaced_differs_from_reference']:.0f} %"] for k, v in d["summary"].items()]
        ratio = d["summary"]["common"]["pair_sd_mean"] / d["summary"]["member"]["pair_sd_mean"]
        notes.append(f"{population}: common start states scale the noise of a fitness difference by {ratio:.2f}; "
                     f"reference fitness (every episode of both protocols): {seeds(d['reference_fitness'])}.")
    if not rows:
        return ["Not run yet."]
    # the header's counts from the last run read (every run evaluates the same reps x episodes)
    return md(["population", f"evaluation ({d['reps']} evaluations of {d['eval_episodes']} episodes per member)",
               "SD of f_i − f_j (mean over the 28 pairs)", "SD of f_i (mean over members)",
               "exploit choice changes between consecutive evaluations",
               "exploit choice differs from the reference ranking's", "replaced members differ from the reference's"],
              rows) + [""] + [" ".join(notes)]


@table
def margin_ranges() -> list[str]:
    """The one margin's table (``margins.RANGES``): each env's random and solved return, the range and the margin."""
    rows = [[f"`{env}`", num(low, 1), num(high, 1), num(high - low, 1), num(margins.margin(env), 1),
             SOLVED_SOURCE[env]] for env, (low, high) in margins.RANGES.items()]
    return md(["env", "random", "solved", "range", f"margin ({margins.MARGIN_FRACTION:g} of the range)",
               "solved's source"], rows)


SOLVED_SOURCE = {"probe:pendulum": "no gymnasium threshold; the ReF-ER runs' constant, within rl-zoo's trained agents",
                 "gym:Pendulum-v1": "as probe:pendulum", "probe:cartpole": "CartPole-v1's (the probe is its port)",
                 "gym:CartPole-v1": "gymnasium `reward_threshold`", "gym:Hopper-v5": "gymnasium `reward_threshold`",
                 "gym:HalfCheetah-v5": "gymnasium `reward_threshold`",
                 "gym:InvertedPendulum-v5": "gymnasium `reward_threshold`"}


# --- the scoreboard's evidence (results.py's EVIDENCE) -------------------------------------------------------------

def parity_evidence(pair: str) -> Callable[[], tuple[str, str]]:
    def evidence():
        s = parity_scores(pair)
        return both_evidence(s["final"], s["speed"], -margins.margin(s["env"]), s["env"], s["final"][1])
    return evidence
