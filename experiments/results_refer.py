"""The tables of RESULTS.md on ReF-ER (Remember and Forget Experience Replay): the controller, learning on
Pendulum and Hopper against the spec's criteria, and ReF-ER at its pace (replay size 2^12 against 2^14), with the
scoreboard's evidence on both measures under the one margin, on ReF-ER's normalised scale."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import margins
import numpy as np
from results_core import REPS, RESULTS, both_evidence, load, md, mean_sd, num, seeds, table, verdict_text

from popjax import stats

# --- ReF-ER (issue 24) -----------------------------------------------------------------------------------------

@table
def refer_controller() -> list[str]:
    data = load("refer_controller.json")
    rows = []
    for arm in data["arms"]:
        ss = arm["seeds"]
        verdict = {True: "**held**", False: "**not held**", None: "(reference)"}[arm["passed"]]
        rows.append([f"{arm['name']} (n = {len(ss)})",
                     f"{num(min(s['far_min'] for s in ss), 3)} - {num(max(s['far_max'] for s in ss), 3)}",
                     mean_sd([s["far_mean"] for s in ss], 3),
                     f"{num(min(s['beta_min'] for s in ss), 3)} - {num(max(s['beta_max'] for s in ss), 3)}",
                     mean_sd([s["beta_mean"] for s in ss], 3), mean_sd([s["drift_per_1k_steps"] for s in ss], 3),
                     verdict])
    return md(["arm", "far fraction after 20 % (min - max, all seeds)", "mean far fraction", "beta after 20 % "
               "(min - max)", "mean beta", "drift of m per 1k steps", "pass"], rows)


def refer_seed_rows(name: str) -> list[str]:
    data = load(f"refer_learning_{name}.json")
    s = data["summary"]
    kl, ret, norm = s["kl_after_20pct"], s["final_return"], s["final_normalised"]
    rows = [[i, num(kl["td3"][i], 2), num(kl["refer"][i], 3), num(ret["td3"][i]), num(ret["refer"][i]),
             num(norm["td3"][i], 2), num(norm["refer"][i], 2)] for i in range(data["seeds"])]
    rows.append([f"mean ± SD (n = {data['seeds']})", mean_sd(kl["td3"], 2), mean_sd(kl["refer"], 3),
                 mean_sd(ret["td3"]), mean_sd(ret["refer"]), mean_sd(norm["td3"], 2), mean_sd(norm["refer"], 2)])
    return md(["seed", "KL after 20 %, TD3", "KL after 20 %, ReF-ER", "final return TD3", "final return ReF-ER",
               "normalised TD3", "normalised ReF-ER"], rows)


def refer_curve_rows(name: str, every: int = 1) -> list[str]:
    """Means over the seeds at every ``every``-th evaluation (and the last)."""
    data = load(f"refer_learning_{name}.json")
    steps = data["runs"]["td3"]["members"][0]["env_steps"]
    shown = sorted({*range(every - 1, len(steps), every), len(steps) - 1})
    rows = []
    for arm, key, label, digits in (("td3", "kl", "TD3 KL", 2), ("refer", "kl", "ReF-ER KL", 3),
                                    ("refer", "far_fraction", "ReF-ER far fraction", 3),
                                    ("refer", "beta", "ReF-ER beta", 2), ("td3", "eval_return", "TD3 return", 0),
                                    ("refer", "eval_return", "ReF-ER return", 0)):
        members = data["runs"][arm]["members"]
        rows.append([label] + [num(float(np.mean([m[key][i] for m in members])), digits) for i in shown])
    return md(["env steps (means of the seeds)"] + [f"{steps[i] // 1000}k" for i in shown], rows)


REFER_MARGIN = -0.1  # spec §10 (c): ReF-ER's final normalised return >= the baseline's - 0.1


def refer_criteria_rows(name: str) -> list[str]:
    data = load(f"refer_learning_{name}.json")
    s, n = data["summary"], data["seeds"]
    held = {True: "**held**", False: "**not held**"}
    far = s["refer_far_fraction_after_20pct"]
    base, ref = s["final_normalised"]["td3"], s["final_normalised"]["refer"]
    v = stats.paired_verdict(ref, base, margin=REFER_MARGIN, reps=REPS)
    kl_ratio = float(np.mean(s["kl_after_20pct"]["td3"]) / np.mean(s["kl_after_20pct"]["refer"]))
    rows = [["(a) replay-averaged KL lower with ReF-ER in >= 4 of 5 seeds",
             f"lower in {s['seeds_with_lower_kl']} of {n} (mean {num(kl_ratio)}x lower)", held[s["a_kl_passed"]]],
            ["(b) ReF-ER's far fraction in [0.05, 0.2] after the first 20 %",
             f"{num(far['min'], 3)} - {num(far['max'], 3)} over every evaluation and seed", held[s["b_far_passed"]]],
            ["(c) final normalised return >= baseline - 0.1",
             f"{mean_sd(ref, 2)} vs {mean_sd(base, 2)}; ReF-ER - TD3 = {num(v['point'], 2)}, paired bootstrap 95 % "
             f"CI [{num(v['percentile'][0], 2)}, {num(v['percentile'][1], 2)}], t [{num(v['t'][0], 2)}, "
             f"{num(v['t'][1], 2)}]", f"**{v['verdict']}**"]]
    return md(["criterion (spec §10)", "result", "verdict"], rows)


@table
def refer_pendulum() -> list[str]:
    return refer_seed_rows("pendulum")


@table
def refer_pendulum_curve() -> list[str]:
    return refer_curve_rows("pendulum")


@table
def refer_pendulum_criteria() -> list[str]:
    return refer_criteria_rows("pendulum")


@table
def refer_hopper() -> list[str]:
    return refer_seed_rows("hopper-v5")


@table
def refer_hopper_curve() -> list[str]:
    return refer_curve_rows("hopper-v5", every=3)


@table
def refer_hopper_criteria() -> list[str]:
    return refer_criteria_rows("hopper-v5")


@table
def refer_pendulum_td3_kl() -> list[str]:
    """The TD3 replay KL's range quoted in the Pendulum reading (every evaluation of every seed, and the seed means)."""
    kl = np.array([m["kl"] for m in load("refer_learning_pendulum.json")["runs"]["td3"]["members"]])
    return [f"TD3's replay KL ranges {num(kl.min(), 2)}-{num(kl.max(), 1)} over every evaluation and seed "
            f"(seed means {num(kl.mean(1).min(), 1)}-{num(kl.mean(1).max(), 1)})."]


@table
def refer_hopper_early() -> list[str]:
    """ReF-ER's mean return relative to TD3's at each evaluation up to 60k steps on Hopper (means over the seeds)."""
    runs_ = load("refer_learning_hopper-v5.json")["runs"]
    steps = runs_["td3"]["members"][0]["env_steps"]
    td3, refer = (np.array([m["eval_return"] for m in runs_[a]["members"]]).mean(0) for a in ("td3", "refer"))
    cells = [f"{x // 1000}k {100 * (r / t - 1):+.0f} %" for x, t, r in zip(steps, td3, refer, strict=True)
             if x <= 60_000]
    return ["ReF-ER's mean return relative to TD3's, (ReF-ER − TD3) / TD3 at each evaluation up to 60k: "
            + ", ".join(cells) + "."]


# --- ReF-ER at its pace (issue 39): N = 2^12 against the N = 2^14 runs -----------------------------------------

REFER_PACE = {16384: ("refer_learning_pendulum.json", "refer_learning_pace_n16384_pendulum.json"),
              4096: ("refer_learning_pace_pendulum.json",)}
PACE_LABEL = {"td3": "TD3", "ddpg": "DDPG-style", "refer": "ReF-ER, D = 0.1", "refer_d0.2": "ReF-ER, D = 0.2"}
PACE_BASELINES = ("td3", "ddpg")


def refer_pace_runs() -> dict[int, dict[str, dict]]:
    """``{N: {arm: run}}`` of the Pendulum ReF-ER runs at each replay size N (5 seeds, 50k steps, the same run seed:
    seed i of every arm and every N starts from the same parameters), from the files that exist."""
    out = {}
    for n, files in REFER_PACE.items():
        arms = {}
        for f in files:
            if (RESULTS / f).exists():
                arms.update(load(f)["runs"])
        out[n] = arms
    return out


def pace_normalised(run: dict) -> np.ndarray:
    low, high = load("refer_learning_pendulum.json")["summary"]["normalise"]
    return (np.array([m["eval_return"][-1] for m in run["members"]], dtype=float) - low) / (high - low)


def pace_turnover(n: int) -> str:
    steps = load("refer_learning_pendulum.json")["steps"]
    return f"N = 2^{int(np.log2(n))} (T/N ≈ {steps / n:.0f})"


def pace_after(member: dict, key: str) -> list[float]:
    """``member[key]`` at the evaluations after the first 20 % of the 50k steps."""
    return [v for s, v in zip(member["env_steps"], member[key], strict=True) if s > 0.2 * member["env_steps"][-1]]


@table
def refer_pace_seeds() -> list[str]:
    """Per replay size and arm: each seed's final return, the mean ± SD (ddof 1) raw and normalised, the
    replay-averaged KL after 20 % (mean ± SD of the seed means) and ReF-ER's far-fraction range after 20 %."""
    rows = []
    for n, arms in refer_pace_runs().items():
        for arm, run in arms.items():
            final = [m["eval_return"][-1] for m in run["members"]]
            kl = [float(np.mean(pace_after(m, "kl"))) for m in run["members"]]
            far = [f for m in run["members"] for f in pace_after(m, "far_fraction")] if arm.startswith("refer") else []
            rows.append([pace_turnover(n), PACE_LABEL[arm], seeds(final), mean_sd(final),
                         mean_sd(pace_normalised(run), 2), mean_sd(kl, 3 if arm.startswith("refer") else 2),
                         f"{num(min(far), 3)} - {num(max(far), 3)}" if far else "—"])
    return md(["replay", "arm", "final return, seeds 0-4", "mean ± SD (n = 5)", "normalised", "KL after 20 %",
               "far fraction after 20 %"], rows)


@table
def refer_pace_curve() -> list[str]:
    """Means over the seeds at every evaluation at N = 2^12: each arm's return, each ReF-ER arm's far fraction and
    beta."""
    arms = refer_pace_runs()[4096]
    steps = next(iter(arms.values()))["members"][0]["env_steps"]
    shown = [(arm, "eval_return", "return", 0) for arm in arms] + \
        [(arm, key, what, 3) for arm in arms if arm not in PACE_BASELINES
         for key, what in (("far_fraction", "far fraction"), ("beta", "beta"))]
    rows = [[f"{PACE_LABEL[arm]} {what}"] + [num(float(np.mean([m[key][i] for m in arms[arm]["members"]])), digits)
                                             for i in range(len(steps))] for arm, key, what, digits in shown]
    return md(["N = 2^12, means of the seeds"] + [f"{s // 1000}k" for s in steps], rows)


def pace_gap(n: int, refer: str, base: str) -> np.ndarray:
    """ReF-ER arm ``refer`` − ``base``, final normalised return per seed, at replay size ``n``."""
    arms = refer_pace_runs()[n]
    return pace_normalised(arms[refer]) - pace_normalised(arms[base])


def pace_pairs() -> list[tuple[int, str, str]]:
    return [(n, r, b) for n, arms in refer_pace_runs().items() for r in arms if r not in PACE_BASELINES
            for b in PACE_BASELINES if b in arms]


@table
def refer_pace_gaps() -> list[str]:
    """Each ReF-ER arm − each baseline at each replay size: final normalised return paired by seed, against the
    spec's −0.1 margin (``stats.paired_verdict``: the more conservative of the percentile bootstrap and the
    t-interval)."""
    rows = []
    for n, r, b in pace_pairs():
        arms = refer_pace_runs()[n]
        v = stats.paired_verdict(pace_normalised(arms[r]), pace_normalised(arms[b]), REFER_MARGIN, reps=REPS)
        rows.append([pace_turnover(n), f"{PACE_LABEL[r]} − {PACE_LABEL[b]}", seeds(pace_gap(n, r, b), 2),
                     verdict_text(v, 2)])
    return md(["replay", "difference", "per seed", "mean (95 % intervals) against −0.1: verdict"], rows)


def pace_shrink(base: str) -> dict | None:
    """Does ReF-ER's (D = 0.1) gap to ``base`` shrink from T/N ≈ 3 to T/N ≈ 12? ``stats.paired_verdict`` of the
    gap at N = 2^12 against the gap at N = 2^14, paired by seed (same run seed at both sizes), margin 0: held
    means the gap at T/N ≈ 12 is larger (less negative); None until both sizes have the arms."""
    runs_ = refer_pace_runs()
    if not all({"refer", base} <= set(runs_[n]) for n in runs_):
        return None
    return stats.paired_verdict(pace_gap(4096, "refer", base), pace_gap(16384, "refer", base), 0.0, reps=REPS)


@table
def refer_pace_shrink() -> list[str]:
    """The change of ReF-ER's (D = 0.1) gap to each baseline from N = 2^14 to N = 2^12, paired by seed."""
    rows = []
    for base in PACE_BASELINES:
        v = pace_shrink(base)
        if v is not None:
            rows.append([f"ReF-ER − {PACE_LABEL[base]}", num(pace_gap(16384, "refer", base).mean(), 2),
                         num(pace_gap(4096, "refer", base).mean(), 2),
                         seeds(pace_gap(4096, "refer", base) - pace_gap(16384, "refer", base), 2),
                         verdict_text(v, 2)])
    return md(["gap (normalised)", "T/N ≈ 3", "T/N ≈ 12", "change per seed", "change (95 % intervals) against 0: "
               "the gap shrinks"], rows)


@table
def refer_pace_reading() -> list[str]:
    """The answer to "does the gap shrink as T/N grows?", worded from ``pace_shrink``'s verdict."""
    answer = {"held": "ReF-ER gains on it (the gap shrinks)", "refuted at this scale": "the gap grows",
              "not resolved": "the percentile and t-intervals do not both exclude 0"}
    lines = []
    for base in PACE_BASELINES:
        v = pace_shrink(base)
        if v is not None:
            change = pace_gap(4096, "refer", base) - pace_gap(16384, "refer", base)
            lines.append(f"Against {PACE_LABEL[base]}: ReF-ER's gap is {num(pace_gap(16384, 'refer', base).mean(), 2)} "
                         f"at T/N ≈ 3 and {num(pace_gap(4096, 'refer', base).mean(), 2)} at T/N ≈ 12; the paired "
                         f"change {num(v['point'], 2)} (t [{num(v['t'][0], 2)}, {num(v['t'][1], 2)}]), positive in "
                         f"{int(np.sum(change > 0))} of {len(change)} seeds: {answer[v['verdict']]}, "
                         f"**{v['verdict']}**.")
    return [" ".join(lines) or "The ReF-ER arms have not finished at both replay sizes."]


# --- the scoreboard's evidence (results.py's EVIDENCE) -------------------------------------------------------------

def refer_margin(name: str) -> float:
    """The one margin of ReF-ER's env on its normalised scale: margin(env) / (R_high − R_low)."""
    summary = load(f"refer_learning_{name}.json")
    low, high = summary["summary"]["normalise"]
    return -margins.margin(summary["env"]) / (high - low)


def refer_speed(run: dict, normalise: Sequence[float]) -> np.ndarray:
    """Each member's mean normalised return over its evaluations (the learning speed)."""
    low, high = normalise
    return (np.array([np.mean(m["eval_return"]) for m in run["members"]], dtype=float) - low) / (high - low)


def refer_evidence(name: str) -> Callable[[], tuple[str, str]]:
    def evidence():
        data = load(f"refer_learning_{name}.json")
        summary, runs_ = data["summary"], data["runs"]
        norm = summary["final_normalised"]
        return both_evidence((norm["refer"], norm["td3"]), (refer_speed(runs_["refer"], summary["normalise"]),
                                                            refer_speed(runs_["td3"], summary["normalise"])),
                             refer_margin(name), data["env"], summary["final_return"]["td3"], digits=2)
    return evidence


def refer_pace_evidence(refer: str, base: str) -> Callable[[], tuple[str, str]]:
    """ReF-ER arm ``refer`` − ``base`` at N = 2^12 (T/N ≈ 12), final and speed normalised, the one margin."""
    def evidence():
        arms = refer_pace_runs()[4096]
        normalise = load("refer_learning_pendulum.json")["summary"]["normalise"]
        base_raw = [m["eval_return"][-1] for m in arms[base]["members"]]
        return both_evidence((pace_normalised(arms[refer]), pace_normalised(arms[base])),
                             (refer_speed(arms[refer], normalise), refer_speed(arms[base], normalise)),
                             refer_margin("pendulum"), "probe:pendulum", base_raw, digits=2)
    return evidence
