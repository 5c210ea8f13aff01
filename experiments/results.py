"""``make results``: regenerates the tables of experiments/RESULTS.md from the committed JSON in experiments/results/
(and benchmarks/results/ for the speed tables). Never edit a generated table by hand: edit this file.

A generated table sits between ``<!-- table: NAME -->`` and ``<!-- /table -->``; ``NAME`` is a function below.
Statistics (``popjax.stats``): SD with ddof 1 and n stated; arms that share seeds are compared with a **paired**
bootstrap (seeds redrawn jointly, 95 % percentile interval, 10 000 replicates, seed 0); with fewer than 4 seeds
no bootstrap interval (it would cover far less than 95 %), the per-seed values instead.

    python experiments/results.py            # rewrite experiments/RESULTS.md
    python experiments/results.py --check    # exit 1 when a committed table differs from what its JSON gives
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import margins
import numpy as np
import verdicts

from popjax import stats

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
BENCH = ROOT / "benchmarks" / "results"
DOCUMENT = ROOT / "experiments" / "RESULTS.md"
BLOCK = re.compile(r"(<!-- table: (\w+) -->\n)(.*?)(<!-- /table -->)", re.S)
REPS = 10_000

TABLES: dict[str, Callable[[], list[str]]] = {}


def table(function: Callable[[], list[str]]) -> Callable[[], list[str]]:
    TABLES[function.__name__] = function
    return function


def load(path: Path | str) -> dict:
    return json.loads((RESULTS / path if not Path(path).is_absolute() else Path(path)).read_text())


def runs(folder: str | Path, key: Callable[[dict], Any], pattern: str = "*.json") -> dict[Any, dict]:
    """``key(record) -> record`` of every one-run JSON file in ``folder`` (under results/) matching ``pattern``."""
    return {key(r): r for r in (json.loads(path.read_text()) for path in sorted((RESULTS / folder).glob(pattern)))}


def md(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + \
        ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def num(x: float | None, digits: int = 0) -> str:
    """``x`` with ``digits`` decimals ("-" for None or NaN; no "-0")."""
    if x is None or not np.isfinite(x):
        return "-"
    text = f"{x:.{digits}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def seeds(values: Sequence[float], digits: int = 0) -> str:
    return ", ".join(num(v, digits) for v in values)


def mean_sd(values: Sequence[float], digits: int = 0) -> str:
    """mean ± SD (ddof 1); one value: the value alone."""
    v = np.asarray(values, dtype=float)
    return num(v.mean(), digits) if len(v) == 1 else f"{num(v.mean(), digits)} ± {num(v.std(ddof=1), digits)}"


def paired_ratio(values: Sequence[float], base: Sequence[float], digits: int = 2) -> str:
    """The 95 % paired bootstrap interval of mean(values) / mean(base) (seed i of both arms drawn together), or
    "n<4" when there are fewer than 4 seeds; below 10 seeds Fieller's t-based interval beside it."""
    if len(values) < stats.MIN_BOOTSTRAP_SEEDS:
        return f"n<{stats.MIN_BOOTSTRAP_SEEDS}"
    ci = stats.paired_ci(values, base, "ratio", reps=REPS)
    text = f"{num(ci.low, digits)}-{num(ci.high, digits)}"
    if len(values) < stats.MIN_COVERING_SEEDS:
        low, high = stats.fieller_interval(values, base)
        text += f" (t: {num(low, digits)}-{num(high, digits)})"
    return text


def t_beside(values: Sequence[float], base: Sequence[float], digits: int = 1) -> str:
    """"; t [low, high]": the t-interval of the paired differences, for seeds too few for the bootstrap to cover."""
    if len(values) >= stats.MIN_COVERING_SEEDS:
        return ""
    low, high = stats.t_interval(np.asarray(values, dtype=float) - np.asarray(base, dtype=float))
    return f"; t [{num(low, digits)}, {num(high, digits)}]"


def at_or_before(curve: Sequence[Sequence[float]], x: float) -> float:
    """The last evaluation of a [step, value] curve at or before step x."""
    return [v for s, v in curve if s <= x][-1]



@table
def scoreboard() -> list[str]:
    """Every seed-paper claim with its verdict, the rule that decides it, the scale it was tested at and where its
    numbers are (``results/scoreboard.json``). A claim with ``evidence`` is decided here, from its JSON, by
    ``EVIDENCE``; its committed verdict must be that one."""
    rows = []
    dated = verdicts.git_history()  # a shallow clone or an export cannot date rules and data
    for c in load("scoreboard.json")["claims"]:
        if c["verdict"] not in margins.SCOREBOARD_VERDICTS:
            raise ValueError(f"scoreboard.json: {c['claim']!r}: verdict {c['verdict']!r} (allowed: "
                             f"{', '.join(margins.SCOREBOARD_VERDICTS)})")
        if c["verdict"] == margins.NOT_RUN and (c.get("evidence") or c.get("data")):
            raise ValueError(f"scoreboard.json: {c['claim']!r}: 'not run' with evidence or data")
        shown = ""
        if c.get("evidence"):
            computed, shown = EVIDENCE[c["evidence"]]()
            if computed != c["verdict"]:
                raise ValueError(f"scoreboard.json: {c['claim']!r} says {c['verdict']!r} but its rule gives "
                                 f"{computed!r} ({shown})")
        if c.get("rule_lines") and dated:
            before = verdicts.rule_precedes_data(c["rule_lines"], c["data"])
            if before == bool(c.get("post_hoc")):
                raise ValueError(f"scoreboard.json: {c['claim']!r}: its rule was fixed "
                                 f"{'before' if before else 'after'} its data, but post_hoc is {c.get('post_hoc')}")
        where = ", ".join(f"[{x['title']}](#{x['anchor']})" if x["anchor"] else x["title"] for x in c["sections"])
        verdict = f"**{c['verdict']}**" + (" (rule fixed after its data)" if c.get("post_hoc") else "") + \
            (f": {shown}" if shown else "") + (f"; {c['detail']}" if c["detail"] else "")
        rows.append([c["paper"], c["claim"], verdict, c["rule"], scale_text(c["scale"]), where or "—"])
    return md(["paper", "claim", "verdict", "rule", "scale", "section"], rows)


def scale_text(scale: dict) -> str:
    return ", ".join(str(scale[k]) for k in ("env", "steps", "seeds", "budget") if scale.get(k) not in (None, ""))


def _paired(a: Sequence[float], b: Sequence[float], margin: float = 0.0, kind: str = "difference",
            digits: int = 1) -> tuple[str, str]:
    v = stats.paired_verdict(a, b, margin, kind, reps=REPS)
    return v["verdict"], verdict_text(v, digits).rsplit(":", 1)[0]


def _r1() -> tuple[str, str]:
    """popjax's vectorized TD3 update (the K = 50 scan) over sequential PyTorch at every N > 15 measured in full
    float32 on the H200 (``speedup_vs_torch_seq``: both medians from the same run)."""
    rows = [(r["pop"], r["speedup_vs_torch_seq"], r["peak_gflops"])
            for f in ("update_gpu_nvidia-h200_fp32.json", "update_gpu_nvidia-h200_fp32_n64-256.json")
            for r in load(BENCH / f)["results"]
            if r["impl"] == "vmap_scan" and r["pop"] > 15 and r.get("speedup_vs_torch_seq") is not None]
    ratios = [x for _, x, _ in rows]
    verdict = "held" if min(ratios) >= 4 else "refuted at this scale" if max(ratios) < 4 else "not resolved"
    text = ", ".join(f"{x:.0f}× at N = {n}" for n, x, _ in rows)
    peak = min(g for _, _, g in rows) / 1000
    vec = ", ".join(f"{x:.1f}× at N = {n}" for n, x in r1_vectorisation() if n > 15)
    one = next(r["speedup_vs_torch_seq"] for r in load(BENCH / "update_gpu_nvidia-h200_fp32.json")["results"]
               if r["impl"] == "vmap_scan" and r["pop"] == 1)
    return verdict, (f"{text} (fp32 both sides; measured fp32 matmul peak {peak:.1f} TFLOP/s); of it, the "
                     f"vectorisation factor N·t(1)/t(N) is {vec}, and {one:.0f}× is there at N = 1 (the compiled "
                     f"K = 50 scan against eager PyTorch)")


def r1_vectorisation() -> list[tuple[int, float]]:
    """N · t(1) / t(N) of popjax's vectorized TD3 update (the K = 50 scan, H200, fp32): the paper's quantity."""
    rows = {r["pop"]: r["ms_per_pop_step"] for f in ("update_gpu_nvidia-h200_fp32.json",
                                                      "update_gpu_nvidia-h200_fp32_n64-256.json")
            for r in load(BENCH / f)["results"] if r["impl"] == "vmap_scan"}
    return [(n, n * rows[1] / t) for n, t in sorted(rows.items()) if n > 1]


def _pbt_rs(env: str, a: str, b: str) -> Callable[[], tuple[str, str]]:
    def evidence():
        records = runs(f"pbt_random_search_{env}", lambda r: (r["arm"], r["seed"]), "*_s*.json")
        ids = sorted({s for _, s in records})
        return _paired([records[(a, s)]["final_best"] for s in ids], [records[(b, s)]["final_best"] for s in ids])
    return evidence


def _pbt_paper(b: str) -> Callable[[], tuple[str, str]]:
    def evidence():
        seed_ids, rescored = pbt_paper_scores()
        if len(seed_ids) < 2:
            return "not resolved", f"{len(seed_ids)} seed(s) finished"
        return _paired(rescored["pbt"], rescored[b])
    return evidence


def _both(final: tuple, speed: tuple, margin: float, env: str | None = None, base_raw=None,
          digits: int = 1) -> tuple[str, str]:
    """A learning claim decided on both measures (``verdicts.both_measures``): the verdict and "final ...; speed
    ..." with each measure's own interval and verdict."""
    verdict, v_final, v_speed = verdicts.both_measures(final, speed, margin, env, base_raw)
    text = lambda v: verdict_text(v, digits).replace("**", "")
    return verdict, f"final {text(v_final)}; speed {text(v_speed)}"


def _memr(path: str, a: str, b: str, env: str | None) -> Callable[[], tuple[str, str]]:
    """MEMR arm ``a`` − ``b``, final and learning speed (mean return after warm-up): "matches" against the one
    margin of ``env``; ``env`` None: "beats", against 0."""
    def evidence():
        configs = load(path)["summary"]["configs"]
        return _both((configs[a]["final"], configs[b]["final"]), (configs[a]["auc"], configs[b]["auc"]),
                     -margins.margin(env) if env else 0.0, env, configs[b]["final"])
    return evidence


def refer_margin(name: str) -> float:
    """The one margin of ReF-ER's env on its normalised scale: margin(env) / (R_high − R_low)."""
    summary = load(f"refer_learning_{name}.json")
    low, high = summary["summary"]["normalise"]
    return -margins.margin(summary["env"]) / (high - low)


def refer_speed(run: dict, normalise: Sequence[float]) -> np.ndarray:
    """Each member's mean normalised return over its evaluations (the learning speed)."""
    low, high = normalise
    return (np.array([np.mean(m["eval_return"]) for m in run["members"]], dtype=float) - low) / (high - low)


def _refer(name: str) -> Callable[[], tuple[str, str]]:
    def evidence():
        data = load(f"refer_learning_{name}.json")
        summary, runs_ = data["summary"], data["runs"]
        norm = summary["final_normalised"]
        return _both((norm["refer"], norm["td3"]), (refer_speed(runs_["refer"], summary["normalise"]),
                                                    refer_speed(runs_["td3"], summary["normalise"])),
                     refer_margin(name), data["env"], summary["final_return"]["td3"], digits=2)
    return evidence


def _refer_pace(refer: str, base: str) -> Callable[[], tuple[str, str]]:
    """ReF-ER arm ``refer`` − ``base`` at N = 2^12 (T/N ≈ 12), final and speed normalised, the one margin."""
    def evidence():
        arms = refer_pace_runs()[4096]
        normalise = load("refer_learning_pendulum.json")["summary"]["normalise"]
        base_raw = [m["eval_return"][-1] for m in arms[base]["members"]]
        return _both((pace_normalised(arms[refer]), pace_normalised(arms[base])),
                     (refer_speed(arms[refer], normalise), refer_speed(arms[base], normalise)),
                     refer_margin("pendulum"), "probe:pendulum", base_raw, digits=2)
    return evidence


def _rlx2_component(component: str) -> Callable[[], tuple[str, str]]:
    """The component's main effect at 90 % (the one sparsity where the methods learn), against 0."""
    def evidence():
        with_, without = rlx2_effects(rlx2_component_scores(0.9))[component]
        return _paired(with_, without, digits=0)
    return evidence


def _hts_lag() -> tuple[str, str]:
    """HTS (Eq. 6) − lock-step on probe:cartpole (A2C), final and mean return over training, the one margin."""
    runs_ = load("hts_learning.json")["runs"]
    a, b = runs_["eq6"], runs_["lockstep"]
    return _both((a["final_per_seed"], b["final_per_seed"]), (a["mean_return_per_seed"], b["mean_return_per_seed"]),
                 -margins.margin("probe:cartpole"), "probe:cartpole", b["final_per_seed"])


def _rlx2_s1() -> tuple[str, str]:
    """RLx2 S1 on Pendulum: the paper's gate, normalised return (R − R_random)/(R_dense − R_random) >= 0.9 on
    the mean (n = 3: no interval), now on the final score (mean of the last 5 evaluations) and on the learning
    speed (mean over the evaluations); held (ceiling) when dense TD3 is within one margin of solved."""
    data = load("rlx2_pendulum/s1.json")
    r0, configs = data["summary"]["random_return"], data["summary"]["configs"]
    curves = {r["config"]: r["curves"] for r in data["runs"]}
    speed = {k: float(np.mean([np.mean([v for _, v in c]) for c in curves[k]])) for k in ("rlx2", "dense")}
    final = (configs["rlx2"]["last5_mean"] - r0) / (configs["dense"]["last5_mean"] - r0)
    pace = (speed["rlx2"] - r0) / (speed["dense"] - r0)
    ok = final >= 0.9 and pace >= 0.9 and configs["rlx2"]["exact_masks"]
    verdict = stats.VERDICTS[0] if ok else stats.VERDICTS[2]
    if ok and margins.at_ceiling("probe:pendulum", configs["dense"]["last5_mean"]):
        verdict = margins.CEILING
    return verdict, f"final {final:.3f} of dense, speed {pace:.3f} of dense (n = 3, on the mean)"


def _spo_banked() -> tuple[str, str]:
    """SPO-DQN R = 4 ÷ R = 1 on the banked PER at H = 10 and 100: AUC (speed) and final return, each paired
    ratio's intervals against 0.85; held when all four are."""
    configs = load("spo_cartpole/results_per_10seeds.json")["summary"]["configs"]
    parts, found = [], []
    for h in (10, 100):
        a, b = configs[f"4x{h}"], configs[f"1x{h}"]
        for key, what in (("auc", "speed"), ("final_returns", "final")):
            v = stats.paired_verdict(a[key], b[key], 0.85, "ratio", reps=REPS)
            found.append(v["verdict"])
            parts.append(f"H = {h} {what} {verdict_text(v, 2).replace('**', '')}")
    verdict = functools.reduce(margins.combine, found)
    return verdict, "; ".join(parts)


def _cemrl_order() -> tuple[str, str]:
    """R3, an equality claim: vectorized − sequential critic order inside ±margin(probe:pendulum) on both measures
    (each side a not-worse-than test, joined by ``margins.combine``); n = 3: the t-interval alone."""
    groups = by_method(load("cemrl_pendulum.json")["runs"])
    a, b = groups["cemrl_vectorized"], groups["cemrl_sequential"]
    m, found, parts = margins.margin("probe:pendulum"), [], []
    for what, score in (("final", lambda r: r["final"]), ("speed", lambda r: np.mean([v for _, v in r["curve"]]))):
        x, y = [score(r) for r in a], [score(r) for r in b]
        low, high = stats.t_interval(np.subtract(x, y))
        sides = [stats.decide(low, high, -m), stats.decide(-high, -low, -m)]
        found.append(functools.reduce(margins.combine, sides))
        parts.append(f"{what} {num(float(np.mean(np.subtract(x, y))), 1)} (t [{num(low, 1)}, {num(high, 1)}], n = "
                     f"{len(x)}) within ±{num(m, 1)}: {found[-1]}")
    return functools.reduce(margins.combine, found), "; ".join(parts)


def _spo_fails() -> tuple[str, str]:
    """SPO at H = 1000, 40 seeds per arm: the pre-registered fails-to-learn count and Fisher test."""
    recs = runs("spo_divergence_drift40", lambda r: r["config"])
    f = verdicts.fisher_fails(recs["naive-local-1000"]["final"], recs["two_phase-local-1000"]["final"])
    return f["verdict"], (f"naive fails in {f['naive']} of {f['n'][0]}, two-phase in {f['two_phase']} of "
                          f"{f['n'][1]}; one-sided Fisher p = {f['p']:.2f}")


PARITY = {"td3_pendulum": "TD3, Pendulum-v1", "sac_pendulum": "SAC, Pendulum-v1", "dqn_cartpole": "DQN, CartPole-v1",
          "ppo_cartpole": "PPO, CartPole-v1"}


EVIDENCE: dict[str, Callable[[], tuple[str, str]]] = {
    "hts_lag": _hts_lag,
    "rlx2_s1_pendulum": _rlx2_s1,
    "spo_banked_per": _spo_banked,
    "spo_fails_h1000": _spo_fails,
    "cemrl_order": _cemrl_order,
    "rlx2_multistep": _rlx2_component("the 3-step target"),
    "rlx2_dynamic_buffer": _rlx2_component("the dynamic buffer"),
    "r1_gpu": _r1,
    "r2_pendulum": _pbt_rs("pendulum", "pbt", "random"),
    "r2_halfcheetah_25k": _pbt_rs("halfcheetah-v5", "pbt", "random"),
    "r2_paper_defaults": _pbt_paper("defaults"),
    "r2_paper_random": _pbt_paper("random"),
    # MEMR: the issue-38 re-runs (the first setup's runs, results.json, stay in their sections)
    "memr_pendulum": _memr("memr_pendulum/results_issue38.json", "memr", "sac", "probe:pendulum"),
    "memr_oracle_pendulum": _memr("memr_pendulum/results_issue38.json", "memr_oracle", "sac", "probe:pendulum"),
    "memr_hopper": _memr("memr_hopper/results_40k_issue38.json", "memr", "sac", "gym:Hopper-v5"),
    "memr_prioritized_pendulum": _memr("memr_pendulum/results_issue38.json", "memr", "memr_uniform", None),
    "memr_prioritized_hopper": _memr("memr_hopper/results_40k_issue38.json", "memr", "memr_uniform", None),
    "memr_whole_history": _memr("memr_pendulum/results_whole_history.json", "memr_full", "memr", None),
    "refer_pendulum": _refer("pendulum"),
    "refer_hopper": _refer("hopper-v5"),
    "refer_pace_ddpg": _refer_pace("refer", "ddpg"),
    "refer_pace_ddpg_d0.2": _refer_pace("refer_d0.2", "ddpg"),
}

def parity_scores(pair: str) -> dict:
    """Per seed, each side's final (mean of the last 3 evaluations) and learning speed (mean over the evaluations at
    or after the warm-up), from results/parity_sb3/<pair>.json (``parity_sb3.py``): popjax member m, SB3 seed m."""
    d = load(f"parity_sb3/{pair}.json")
    pj, steps = d["popjax"], np.asarray(d["popjax"]["eval_steps"])
    after = steps >= pj["preset"].get("warmup_steps", 0)
    popjax = np.asarray([[v for _, v in c] for c in pj["curves"]], dtype=float)
    sb3 = np.asarray([[v for _, _, v in r["curve"]] for r in sorted(d["sb3"]["runs"], key=lambda r: r["seed"])],
                     dtype=float)
    if popjax.shape != sb3.shape:
        raise ValueError(f"parity_sb3/{pair}.json: popjax {popjax.shape} and SB3 {sb3.shape} evaluations differ")
    return {"env": f"gym:{d['env']}", "final": (popjax[:, -3:].mean(1), sb3[:, -3:].mean(1)),
            "speed": (popjax[:, after].mean(1), sb3[:, after].mean(1)), "wall": (pj["wall_s"],
            sum(r["wall_s"] for r in d["sb3"]["runs"])), "load": pj["load_1min_before"], "n": len(popjax)}


def _parity(pair: str) -> Callable[[], tuple[str, str]]:
    def evidence():
        s = parity_scores(pair)
        return _both(s["final"], s["speed"], -margins.margin(s["env"]), s["env"], s["final"][1])
    return evidence


EVIDENCE.update({f"parity_{pair}": _parity(pair) for pair in PARITY})


def parity_pairs() -> list[str]:
    return [p for p in PARITY if (RESULTS / "parity_sb3" / f"{p}.json").exists()
            and len(load(f"parity_sb3/{p}.json").get("sb3", {}).get("runs", [])) == len(
                load(f"parity_sb3/{p}.json")["popjax"]["curves"])]


@table
def parity_sb3() -> list[str]:
    """popjax − SB3 per pair: each side's final and learning speed (mean ± SD, ddof 1), the paired differences
    against the one margin, the verdict (``margins.combine``) and each side's wall time on the shared machine."""
    rows = []
    for pair in parity_pairs():
        s = parity_scores(pair)
        verdict, v_final, v_speed = verdicts.both_measures(s["final"], s["speed"], -margins.margin(s["env"]), s["env"],
                                                          s["final"][1])
        rows.append([PARITY[pair], f"{mean_sd(s['final'][0], 1)} / {mean_sd(s['final'][1], 1)}",
                     verdict_text(v_final).replace("**", ""), f"{mean_sd(s['speed'][0], 1)} / "
                     f"{mean_sd(s['speed'][1], 1)}", verdict_text(v_speed).replace("**", ""), f"**{verdict}**",
                     f"{num(s['wall'][0])} / {num(s['wall'][1])} (load {num(s['load'], 1)})"])
    n = parity_scores(parity_pairs()[0])["n"] if parity_pairs() else 0
    return md([f"learner, env (n = {n} seeds per side)", "final: popjax / SB3", "popjax − SB3, final",
               "speed: popjax / SB3", "popjax − SB3, speed", "popjax matches SB3",
               "wall s: popjax (all seeds, one run) / SB3 (sum of runs)"], rows)


@table
def eval_crn_pbt() -> list[str]:
    """PBT's exploit choice and the fitness-difference noise on 8 fixed policies, evaluated ``reps`` times under each
    evaluation protocol (``eval_crn_pbt.py``)."""
    if not (RESULTS / "eval_crn_pbt.json").exists():
        return ["Not run yet."]
    d = load("eval_crn_pbt.json")
    names = {"member": "each member its own start states (`eval_starts: member`)",
             "common": "the same start states for every member (`eval_starts: common`)"}
    rows = [[names[k], num(v["pair_sd_mean"], 1), num(v["member_sd_mean"], 1), f"{100 * v['choice_changes']:.0f} %",
             f"{100 * v['choice_differs_from_reference']:.0f} %", f"{100 * v['replaced_differs_from_reference']:.0f} %"]
            for k, v in d["summary"].items()]
    ratio = d["summary"]["common"]["pair_sd_mean"] / d["summary"]["member"]["pair_sd_mean"]
    return md([f"evaluation ({d['reps']} evaluations of {d['eval_episodes']} episodes per member)",
               "SD of f_i − f_j (mean over the 28 pairs)", "SD of f_i (mean over members)",
               "exploit choice changes between consecutive evaluations",
               "exploit choice differs from the reference ranking's", "replaced members differ from the reference's"],
              rows) + ["", f"Common start states scale the noise of a fitness difference by {ratio:.2f}. Reference "
                           f"fitness (every episode of both protocols): {seeds(d['reference_fitness'])}."]


@table
def memr_whole_history() -> list[str]:
    """MEMR with every rollout kept (``memr_full``) against the default buffer, 10 paired seeds (issue 48)."""
    path = "memr_pendulum/results_whole_history.json"
    if not (RESULTS / path).exists():
        return ["Not run yet."]
    return memr_table(path) + [""] + memr_paired_table(path)


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
                 "gym:HalfCheetah-v5": "gymnasium `reward_threshold`"}


# --- speed -------------------------------------------------------------------------------------------------

@table
def shared_critic() -> list[str]:
    data = load(BENCH / "shared_critic.json")
    rows = [[r["pop"], num(r["vectorized_step_s"] * 1e3, 2), num(r["sequential_step_s"] * 1e3, 2),
             num(r["sequential_loop_step_s"] * 1e3, 2), num(r["speedup_vs_sequential"], 2),
             f"{num(r['vectorized_gflop_per_step'], 2)} / {num(r['sequential_gflop_per_step'], 2)}",
             f"{num(r['vectorized_gflops_per_s'])} / {num(r['sequential_gflops_per_s'])}"] for r in data["results"]]
    params = data["params"]
    when = (f"_Measured {data['started_utc']}: pops {seeds(params['pops'])}, hidden {tuple(params['hidden'])}, "
            f"B {params['batch_size']} per member, K = {params['k']}; load average {data['load_before'][0]} before, "
            f"{data['load_after'][0]} after; {'busy' if data['busy'] else 'not busy'}. ms per step: median of at "
            f"least {min(r['vectorized_repeats'] for r in data['results'])} timed calls._")
    return [when, ""] + md(["N", "vectorized ms/step", "sequential (1 program)", "sequential (loop of jitted calls)",
                            "vectorized speed-up vs sequential", "GFLOP/step vectorized / sequential",
                            "GFLOP/s vectorized / sequential"], rows)


@table
def r1_gpu() -> list[str]:
    """fast-PBT R1 from the H200 update study: per N, popjax's K = 50 scan and sequential PyTorch (ms per population
    step, medians from the same run, full float32 on both sides) and their ratio, beside the run's measured peak."""
    rows = []
    for f in ("update_gpu_nvidia-h200_fp32.json", "update_gpu_nvidia-h200_fp32_n64-256.json"):
        results = load(BENCH / f)["results"]
        torch = {r["pop"]: r for r in results if r["impl"] == "torch_seq"}
        for r in results:
            if r["impl"] == "vmap_scan":
                t = torch.get(r["pop"], {})
                rows.append([r["pop"], num(r["ms_per_pop_step"], 3), num(t.get("ms_per_pop_step"), 1),
                             num(r.get("speedup_vs_torch_seq")) + ("×" if r.get("speedup_vs_torch_seq") else ""),
                             num(r["peak_gflops"] / 1000, 1), f"`{f}`"])
    return md(["N", "popjax K = 50 scan, ms per step (fp32)", "PyTorch sequential, ms per step (fp32)",
               "ratio", "measured fp32 matmul peak, TFLOP/s", "file"], rows)


# --- make run ------------------------------------------------------------------------------------------------

@table
def default_pbt() -> list[str]:
    """`make run` (experiments/default.yaml): the population's returns per evaluation, from the run's evaluation
    returns exported with ``popjax export-returns`` (marl-eval layout: one run key per member)."""
    from popjax.comparison import read_marl_eval

    (curves,) = read_marl_eval(RESULTS / "default_pbt.json").values()
    returns = np.stack([c[:, 2] for c in curves.values()])  # [members, evaluations]
    steps, wall = next(iter(curves.values()))[:, 0], next(iter(curves.values()))[:, 1]
    rows = [[f"{s / 1000:g}k", num(w), num(returns[:, k].mean()), num(stats.iqm(returns[:, k])),
             num(returns[:, k].max())] for k, (s, w) in enumerate(zip(steps, wall, strict=True))]
    summary = load("default_pbt_summary.json")
    final = summary["final_iqm"]
    line = (f"_{summary['learner']} on {summary['env']}, {summary['driver']}, pop {summary['pop_size']}, seed "
            f"{summary['seed']}: {num(summary['wall_s'])} s of training + {num(summary['compile_s'])} s compile, "
            f"{len(summary.get('lineage', []))} exploits; best evaluation {num(summary['best_return'], 1)}; final "
            f"IQM over the {final['n']} members {num(final['iqm'], 1)} (no interval: PBT's members copy one another, "
            f"so they are not independent samples; an interval needs independent runs)._")
    return [line, ""] + md([f"env steps / member (n = {len(returns)} members)", "wall s (excl. compile)",
                            "population mean", "IQM", "best member"], rows)


# --- CEM-RL and DvD ----------------------------------------------------------------------------------------

CEMRL_NAMES = {"cemrl_vectorized": "CEM-RL vectorized", "cemrl_sequential": "CEM-RL sequential order",
               "td3": "TD3 (3 members of one population)"}  # TD3: one population, so not paired with CEM-RL


def by_method(runs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for run in sorted(runs, key=lambda r: r["seed"]):
        out.setdefault(run["method"], []).append(run)
    return out


@table
def cemrl_pendulum() -> list[str]:
    groups = by_method(load("cemrl_pendulum.json")["runs"])
    rows = []
    for method, runs in groups.items():
        cells = [seeds([at_or_before(r["curve"], x) for r in runs]) for x in (10_000, 20_000, 30_000)]
        finals = [r["final"] for r in runs]
        rows.append([f"{CEMRL_NAMES[method]}, seeds {seeds([r['seed'] for r in runs])}", *cells,
                     f"{seeds(finals)} (**{mean_sd(finals)}**)", seeds([r["best"] for r in runs]),
                     seeds([r["s_per_update"] for r in runs], 4)])
    return md(["method (n = 3)", "return at 10k", "at 20k", "at 30k", "final (50k): per seed (mean ± SD)",
               "best eval", "s / update"], rows)


@table
def cemrl_pendulum_paired() -> list[str]:
    groups = by_method(load("cemrl_pendulum.json")["runs"])
    base = [r["final"] for r in groups["cemrl_sequential"]]
    diffs = [r["final"] - b for r, b in zip(groups["cemrl_vectorized"], base, strict=True)]
    low, high = stats.t_interval(diffs)
    rows = [["CEM-RL vectorized − sequential order", seeds(diffs), mean_sd(diffs), f"[{num(low)}, {num(high)}] (n<4)",
             f"{sum(d > 0 for d in diffs)} of {len(diffs)}"]]
    return md(["final return, paired by seed (n = 3)", "difference per seed", "mean ± SD", "95 % t-interval",
               "seeds where vectorized is ahead"], rows)


@table
def cemrl_halfcheetah() -> list[str]:
    runs = sorted(load("cemrl_halfcheetah.json")["runs"], key=lambda r: (r["method"] != "cemrl_vectorized",
                                                                        r["seed"]))
    names = {"cemrl_vectorized": "CEM-RL mean actor", "td3": "TD3"}
    rows = [[names[r["method"]], r["seed"], *(num(at_or_before(r["curve"], x)) for x in (2e4, 4e4, 6e4, 8e4)),
             f"**{num(r['final'])}**", num(r["wall_s"]), num(r["s_per_update"], 4)] for r in runs]
    return md(["method", "seed", "20k", "40k", "60k", "80k", "final (100k)", "wall_s (train)", "s / update"], rows)


@table
def dvd_halfcheetah() -> list[str]:
    runs = {r["method"]: r for r in load("dvd_halfcheetah.json")["runs"]}
    td3 = [r for r in load("cemrl_halfcheetah.json")["runs"] if r["method"] == "td3"]
    points = (2e4, 4e4, 6e4, 8e4, 1e5)
    rows = []
    for method, name in (("dvd", "DvD (schedule)"), ("weight0", "weight 0")):
        r = runs[method]
        best = " / ".join(num(at_or_before(r["curve"], x)) for x in points[:-1]) + f" / **{num(r['final'])}**"
        dist = f"{num(at_or_before(r['embedding_distance'], 2e4), 2)} -> **{num(r['embedding_distance'][-1][1], 2)}**"
        rows.append([name, best, num(r["final_mean"]), dist, num(r["diversity_loss"][-1][1], 2),
                     num(r["s_per_update"], 3)])
    td3 = sorted(td3, key=lambda r: r["seed"])
    curve = " / ".join(seeds([at_or_before(r["curve"], x) for r in td3]) for x in points[:-1])
    rows.append([f"TD3 (seeds {seeds([r['seed'] for r in td3])})",
                 f"{curve} / **{seeds([r['final'] for r in td3])}**", "(single agents)", "", "",
                 f"{num(min(r['s_per_update'] for r in td3), 3)}-{num(max(r['s_per_update'] for r in td3), 3)}"])
    return md(["method", "best member at 20k / 40k / 60k / 80k / 100k summed steps", "member mean, final",
               "RMS action distance between actors (20k -> 100k)", "-log det(K + eps I), final", "s / update"], rows)


@table
def dvd_pendulum() -> list[str]:
    runs = sorted(load("dvd_pendulum.json")["runs"], key=lambda r: (r["method"], r["seed"]))
    order = ("dvd", "weight0", "dvd_release_kernel", "dvd_bandit")
    rows = []
    for r in sorted(runs, key=lambda r: (order.index(r["method"]), r["seed"])):
        first = lambda key: next(v for _, v in r[key] if v == v)  # noqa: B023 - the first logged (not NaN)
        finite = "none" if r["all_finite"] else "yes"
        rows.append([r["method"], r["seed"], f"{num(r['final'])} / {num(r['best'])}", num(r["final_mean"]),
                     f"{num(first('embedding_distance'), 2)} -> {num(r['embedding_distance'][-1][1], 2)}",
                     f"{num(first('diversity_loss'), 2)} -> {num(r['diversity_loss'][-1][1], 2)}", finite])
    td3 = sorted((r for r in load("cemrl_pendulum.json")["runs"] if r["method"] == "td3"), key=lambda r: r["seed"])
    rows.append(["TD3 (from the CEM-RL section)", seeds([r["seed"] for r in td3]),
                 f"{seeds([r['final'] for r in td3])} / {seeds([r['best'] for r in td3])}", "(single agents)",
                 "", "", ""])
    return md(["variant", "seed", "best member: final / best eval", "member mean, final",
               "RMS action distance between actors (10k -> 50k)", "-log det(K + eps I) (10k -> 50k)", "NaN/Inf"],
              rows)


# --- SPO and prioritized replay (seeds paired across configurations: member m is the same seed) --------------

def k(updates: float | None) -> str:
    return "-" if updates is None else f"{updates / 1000:g}k"


def spo_configs(summary: dict) -> list[tuple[str, dict]]:
    return sorted(summary["configs"].items(), key=lambda kv: (kv[1]["local_steps"], kv[1]["replicas"]))


def spo_ratio_cells(c: dict, base: dict) -> list[str]:
    if c["replicas"] == 1:
        return ["-", "-", "-"]
    per_seed = c["auc_ratio_per_seed"]
    return [f"**{num(c['auc_ratio_of_means'], 2)}**", f"{num(min(per_seed), 2)}-{num(max(per_seed), 2)}",
            paired_ratio(c["auc"], base["auc"])]


def spo_base(summary: dict, c: dict) -> dict:
    return next(b for b in summary["configs"].values() if b["replicas"] == 1 and b["local_steps"] == c["local_steps"])


@table
def spo_cartpole() -> list[str]:
    return spo_cartpole_table(load("spo_cartpole/results.json")["summary"])


def spo_cartpole_table(summary: dict) -> list[str]:
    """The per-seed table of an SPO-DQN sweep (``experiments/spo_cartpole.py`` prints it too)."""
    n = len(next(iter(summary["configs"].values()))["auc"])
    rows = [[name, 256 // c["replicas"], seeds(c["auc"]), mean_sd(c["auc"]), *spo_ratio_cells(c, spo_base(summary, c)),
             ", ".join(k(u) for u in c["updates_to_threshold"])] for name, c in spo_configs(summary)]
    return md([f"R x H (n = {n})", "b", "AUC per seed", "AUC mean ± SD", "ratio to R = 1 (same H)",
               "per-seed ratio min-max", "95 % paired bootstrap of ratio", "updates to 475 (per seed)"], rows)


@table
def spo_cartpole_per() -> list[str]:
    return spo_cartpole_table(load("spo_cartpole/results_per_10seeds.json")["summary"])


@table
def spo_cartpole_10seeds() -> list[str]:
    summary = load("spo_cartpole/results_10seeds.json")["summary"]
    rows = []
    for name, c in spo_configs(summary):
        reached = [u for u in c["updates_to_threshold"] if u is not None]
        rows.append([name, mean_sd(c["auc"]), *spo_ratio_cells(c, spo_base(summary, c)),
                     f"{len(reached)} / {len(c['auc'])} ({k(float(np.median(reached)) if reached else None)})"])
    return md(["R x H (n = 10)", "AUC mean ± SD", "ratio to R = 1 (same H)", "per-seed ratio min-max",
               "95 % paired bootstrap of ratio", "seeds reaching 475 (median updates)"], rows)


def per_delay_table(summary: dict) -> list[str]:
    """The table of a priority-write-delay sweep (``experiments/per_delay_cartpole.py`` prints it too)."""
    configs = sorted(summary["configs"].values(), key=lambda c: c["delay"])
    base = configs[0]
    rows = [[c["delay"], seeds(c["final_returns"]), mean_sd(c["final_returns"]),
             "-" if c is base else num(c["final_mean"] / base["final_mean"], 2),
             "-" if c is base else paired_ratio(c["final_returns"], base["final_returns"]),
             seeds(c["late_returns"]), num(c["late_mean"]), num(c["wall_s"])] for c in configs]
    return md([f"D (n = {len(base['final_returns'])})", "final return per seed", "final mean ± SD", "ratio to D = 1",
               "95 % paired bootstrap of ratio", "mean of last 5 evals per seed", "its mean", "wall s"], rows)


@table
def per_delay_cartpole() -> list[str]:
    return per_delay_table(load("per_delay_cartpole/results.json")["summary"])


@table
def per_delay_cartpole_10seeds() -> list[str]:
    return per_delay_table(load("per_delay_cartpole/results_10seeds.json")["summary"])


SPO_PENDULUM = {"two_phase": "SPO-TD3 two-phase (R = 2, H = 10)", "naive": "SPO-TD3 naive (R = 2, H = 10)",
                "td3": "TD3 (tau 0.005, delay 2)"}


def spo_pendulum_rows(summary: dict, per_seed: bool) -> list[list[str]]:
    rows = []
    for name, label in SPO_PENDULUM.items():
        if name not in summary["configs"]:
            continue
        c = summary["configs"][name]
        n = len(c["final_returns"])
        finite = "yes" if c["all_finite"] else "no"
        finite += "" if per_seed else f" ({sum(not cols for cols in c['non_finite_columns'])} / {n})"
        q = f"{num(c['q_mean_min'])}..{num(c['q_mean_max'])}"
        seed_cells = [seeds(c["final_returns"])] if per_seed else []
        best = [num(c["best"]), seeds(c["best_per_seed"])] if per_seed else [num(c["best"])]
        rows.append([label, *seed_cells, f"**{mean_sd(c['final_returns'])}**", num(c["last5_mean"]), *best, q, finite,
                     num(c["total_s"])])
    return rows


@table
def spo_pendulum() -> list[str]:
    return spo_pendulum_table(load("spo_pendulum/results.json")["summary"])


def spo_pendulum_table(summary: dict) -> list[str]:
    """The per-seed table of the SPO-TD3 study (``experiments/spo_pendulum.py`` prints it too)."""
    n = len(next(iter(summary["configs"].values()))["final_returns"])
    return md([f"configuration (n = {n})", "final return per seed", "final mean ± SD", "mean of last 5 evals",
               "best (any seed, any eval)", "best per seed", "logged Q mean min..max", "all finite", "wall s"],
              spo_pendulum_rows(summary, True))


@table
def spo_pendulum_10seeds() -> list[str]:
    return md(["configuration (n = 10)", "final mean ± SD", "mean of last 5 evals", "best", "logged Q mean min..max",
               "all finite", "wall s"], spo_pendulum_rows(load("spo_pendulum/results_10seeds.json")["summary"], False))


@table
def spo_scaling() -> list[str]:
    """S4: the scaling factor of SPO-TD3 at R = 2 against the thesis's Eq. 5.5/5.6 (``popjax bench spo``)."""
    results = load("spo_scaling/spo_s4.json")["results"]
    terms = next(r for r in results if r["kind"] == "terms" and r["replicas"] == 2)
    one = next(r for r in results if r["kind"] == "terms" and r["replicas"] == 1)
    pick = lambda kind, h, replicas: next(r for r in results if r["kind"] == kind and r.get("local_steps") == h
                                          and r["replicas"] == replicas)
    cost = 2 * terms["t_trans_s"] + terms["t_avg_s"]
    ms = lambda r: f"{num(r['step_s'] * 1e3, 2)} ({num(r['step_iqr_s'] * 1e3, 2)})"
    rows = []
    for h in sorted({r["local_steps"] for r in results if "local_steps" in r}):
        spo, single = pick("spo", h, 2), pick("single", h, 1)
        shared = 1 / (2 * (1 + cost / (single["step_s"] * h)))
        rows.append([h, ms(single), ms(pick("sub", h, 2)), ms(spo), ms(pick("dp", h, 2)),
                     f"**{num(spo['sf_measured'], 3)}**", f"**{num(spo['sf_model'], 3)}**", num(spo["sf_eq55"], 3),
                     num(shared, 3)])
    avg_iqr = num(terms["t_avg_iqr_s"] * 1e3, 3)
    head = (f"Terms at R = 2: **T_avg = {num(terms['t_avg_s'] * 1e3, 3)} ms** (IQR {avg_iqr}), "
            f"**T_trans = {num(terms['t_trans_s'] * 1e3, 3)} ms** (IQR {num(terms['t_trans_iqr_s'] * 1e3, 3)}), so "
            f"2 T_trans + T_avg = {num(cost * 1e3, 2)} ms per round (R = 1: T_avg {num(one['t_avg_s'] * 1e3, 3)} ms, "
            "T_trans 0). ms per update: median (IQR).")
    return [head, ""] + md(["H", "T_ApeX = T_total, B = 256 (ms/update)", "T^b, b = 128 alone", "T_SPO, R = 2",
                            "dp, R = 2", "SF measured", "SF Eq. 5.6", "SF Eq. 5.5 (measured T^b)",
                            "SF shared cores (see below)"], rows)


# --- HTS-RL and PPO + PBT --------------------------------------------------------------------------------------

@table
def hts_determinism() -> list[str]:
    """H1: the HTS driver's stored values and final parameters against the serial schedule."""
    data = load("hts_determinism.json")
    checks = data["checks"]
    rows = []
    for learner in dict.fromkeys(r["learner"] for r in data["runs"]):
        runs = [r for r in data["runs"] if r["learner"] == learner]
        span = lambda r: f"{min(r['rows_per_call'])}-{max(r['rows_per_call'])}" if len(r["rows_per_call"]) > 1 \
            else str(r["rows_per_call"][0])
        serial = next(r for r in runs if r["serial"])
        threads = [r for r in runs if not r["serial"] and r["control"] is None and r["seed"] == serial["seed"]]
        other = next(r for r in runs if r["seed"] != serial["seed"])
        name = learner.upper()
        rows.append([name, "serial", serial["act_calls"], span(serial), "(reference)"])
        rows.append([name, " / ".join(str(r["actors"]) for r in threads) + " actors",
                     " / ".join(str(r["act_calls"]) for r in threads), " / ".join(span(r) for r in threads),
                     "**" + " / ".join("yes" if checks[f"{learner}: {r['actors']} actors == serial"] else "NO"
                                       for r in threads) + "**"])
        rows.append([name, f"seed {other['seed']}, {other['actors']} actors", other["act_calls"], span(other),
                     "differs (as it must)" if checks[f"{learner}: seed 1 differs"] else "EQUAL"])
        for control, what in (("keys", "one key per member and call"), ("shape", "each member's available rows alone")):
            r = next(r for r in runs if r["control"] == control)
            first = checks[f"{learner}: control {control} first differing segment"]
            verdict = f"**differs from segment {first}**" if checks[f"{learner}: control {control} breaks equality"] \
                else "equal"
            rows.append([name, f"control `{control}` ({what})", r["act_calls"], span(r), verdict])
    return md(["learner", "run", "act calls", "rows per call", "equal to serial"], rows)


@table
def hts_throughput() -> list[str]:
    """H2: env steps/s of lock-step and HTS segments with one actor thread (``popjax bench hts``)."""
    results = [r for r in load(BENCH / "hts.json")["results"] if r["actors"] == 1 and r["learner"] == "sleep"]
    rows = []
    for step_time in dict.fromkeys(r["step_time"] for r in results):
        for alpha in sorted({r["alpha"] for r in results if r["step_time"] == step_time}):
            lock, hts = (next(r for r in results if (r["step_time"], r["alpha"], r["mode"]) == (step_time, alpha, mode))
                         for mode in ("lockstep", "hts"))
            cell = lambda r: f"{num(r['steps_per_s'])} ({num(r['predicted_steps_per_s'])})"
            ratio = f"{num(hts['steps_per_s'] / lock['steps_per_s'], 2)}x " \
                    f"({num(hts['predicted_steps_per_s'] / lock['predicted_steps_per_s'], 2)}x)"
            rows.append([step_time, alpha, cell(lock), cell(hts), ratio])
    return md(["step time", "alpha", "lock-step", "HTS", "ratio"], rows)


@table
def hts_learning() -> list[str]:
    runs = load("hts_learning.json")["runs"]
    base = runs["lockstep"]["mean_return_per_seed"]
    rows = []
    for name, label in (("lockstep", "lock-step A2C"), ("eq6", "HTS, Eq. 6"), ("none", "HTS, no correction")):
        r = runs[name]
        values = r["mean_return_per_seed"]
        diff = "-" if name == "lockstep" else _paired_diff(values, base)
        rows.append([label, seeds(values), f"**{mean_sd(values, 1)}**", diff, seeds(r["final_per_seed"])])
    return md(["configuration (n = 8)", "mean eval return over training, per seed", "mean ± SD",
               "Δ vs lock-step, paired by seed [95 % CI]", "final returns"], rows)


def _paired_diff(values: Sequence[float], base: Sequence[float]) -> str:
    """Δ of means [95 % percentile paired bootstrap], and below 10 seeds the t-interval beside it."""
    ci = stats.paired_ci(values, base, reps=REPS)
    return f"{num(ci.point, 1)} [{num(ci.low, 1)}, {num(ci.high, 1)}]{t_beside(values, base)}"


PPO_ARMS = (("pbt", "PBT (synchronous loop, `driver: pbt`)"), ("baseline", "independent, popjax PPO defaults"),
            ("baseline_cleanrl_continuous", "independent, CleanRL continuous defaults"),
            ("hts_pbt", "PBT on the HTS-RL schedule (`driver: hts`, `population: pbt`, alpha 512, 8 executors, "
                        "2 actors)"),
            ("pbt_seed1", "PBT, synchronous loop, `--seed 1`"), ("hts_pbt_seed1", "PBT on the HTS-RL schedule, "
                                                                               "`--seed 1`"))


@table
def pbt_ppo_halfcheetah() -> list[str]:
    data = load("pbt_ppo_halfcheetah.json")
    rows = [[label, f"**{num(a['final_best'])}**" if key == "pbt" else num(a["final_best"]),
             num(float(np.mean(a["final_returns"]))), num(a["best_return"]), a.get("exploits", 0), num(a["wall_s"])]
            for key, label in PPO_ARMS for a in [data[key]]]
    return md(["arm (one seed each; 8 members)", "best member at 1M", "population mean at 1M", "best evaluation",
               "exploits", "wall s"], rows)


# --- RLx2 ------------------------------------------------------------------------------------------------------

RLX2 = {"rlx2": "RLx2-TD3 (RigL, 3-step from T0, dynamic buffer)", "dense": "dense TD3",
        "rigl": "RigL (1-step, fixed buffer)", "set": "SET (random growth)", "ss": "static sparse (SS)",
        "tiny": "Tiny (dense, hidden 34 x 34: the sparse actor's weight count)"}
MASKS = {True: "True", False: "False", None: "-"}


def rlx2_cells(c: dict) -> list[str]:
    return [seeds(c["last5_per_seed"]), f"**{num(c['last5_mean'])}**"]


def reduction(c: dict, key: str) -> str:
    if c.get("costs") is None:
        return "-"
    return f"{num(c['costs'][key][0], 1)}x"


@table
def rlx2_s1() -> list[str]:
    configs = load("rlx2_pendulum/s1.json")["summary"]["configs"]
    rows = [[RLX2[name], *rlx2_cells(c), num(c["normalised"], 3), MASKS[c["exact_masks"]], num(c["total_s"])]
            for name, c in configs.items()]
    return md(["configuration (n = 3)", "last-5 mean per seed", "last-5 mean", "normalised", "every mask exact",
               "wall s"], rows)


@table
def rlx2_s2() -> list[str]:
    return rlx2_table(load("rlx2_pendulum/s2.json")["summary"])


def rlx2_table(summary: dict) -> list[str]:
    """The table of an RLx2 sweep with its costs (``experiments/rlx2_pendulum.py`` prints it too)."""
    configs = summary["configs"]
    rows = [[RLX2[name], *rlx2_cells(c), num(c["normalised"], 3), MASKS[c["exact_masks"]],
             "1x" if name == "dense" else reduction(c, "size_reduction"),
             "1x" if name == "dense" else reduction(c, "train_flops_reduction"), num(c["total_s"])]
            for name, c in configs.items()]
    return md(["configuration (n = 3)", "last-5 mean per seed", "last-5 mean", "normalised", "every mask exact",
               "size /", "train FLOPs /", "wall s"], rows)


@table
def rlx2_hopper() -> list[str]:
    data = load("rlx2_hopper-v5/s1.json")
    best = {r["config"]: [max(v for _, v in curve) for curve in r["curves"]] for r in data["runs"]}
    rows = [[{"rlx2": "RLx2-TD3", "dense": "dense TD3"}[name], *rlx2_cells(c), num(c["normalised"], 2),
             seeds(best[name]), MASKS[c["exact_masks"]], "1x" if name == "dense" else reduction(c, "size_reduction"),
             "1x" if name == "dense" else reduction(c, "train_flops_reduction")]
            for name, c in data["summary"]["configs"].items()]
    return md(["configuration (n = 3)", "last-5 mean per seed", "last-5 mean", "normalised",
               "best evaluation per seed", "every mask exact", "size /", "train FLOPs /"], rows)


# --- RLx2's ultimate compression ratio (issue 27) ----------------------------------------------------------------
UCR_LEVELS = (0.9, 0.98, 0.99, 0.995)
UCR_TOLERANCE = 0.03  # "performance degradation within 3 % of the dense model"


def ucr(scores_by_level: dict[float, float], dense: float) -> float | None:
    """The largest sparsity whose score is within UCR_TOLERANCE of ``dense`` (None: no level is)."""
    within = [level for level, score in scores_by_level.items() if score >= dense - UCR_TOLERANCE * abs(dense)]
    return max(within) if within else None


def rlx2_compression_summary(records: dict[str, dict]) -> dict:
    """Per sparse method and sparsity: the replicas' scores, their mean relative to dense TD3's mean, the UCR on
    the means and per replica (``experiments/rlx2_compression.py`` prints and plots it)."""
    dense = [m["score"] for m in records["dense"]["members"]]
    dense_mean = float(np.mean(dense))
    out = {"dense_scores": dense, "dense_mean": dense_mean, "methods": {}}
    for method, record in records.items():
        if method == "dense":
            continue
        by_level = {level: [m["score"] for m in record["members"] if m["sparsity"] == level] for level in UCR_LEVELS}
        replicas = len(by_level[UCR_LEVELS[0]])
        out["methods"][method] = {
            "scores": by_level, "relative": {level: float(np.mean(v)) / dense_mean for level, v in by_level.items()},
            "ucr": ucr({level: float(np.mean(v)) for level, v in by_level.items()}, dense_mean),
            "ucr_per_replica": [ucr({level: v[r] for level, v in by_level.items()}, dense_mean)
                                for r in range(replicas)]}
    return out


def percent(level: float | None) -> str:
    return "none of the four" if level is None else f"{100 * level:g} %"


def rlx2_compression_tables(env: str) -> list[str]:
    folder = f"rlx2_compression_{env}"
    records = {m: load(f"{folder}/{m}.json") for m in ("dense", "rlx2", "rigl", "ss")}
    summary = rlx2_compression_summary(records)
    dense = summary["dense_scores"]
    rows = [["dense TD3", "0 %", "1x", seeds(dense), f"**{num(summary['dense_mean'])}**", "1.00", "-", "-"]]
    for method, row in summary["methods"].items():
        members = records[method]["members"]
        for level in UCR_LEVELS:
            scores = row["scores"][level]
            member = next(m for m in members if m["sparsity"] == level)
            vs_ss = ("-" if method == "ss" else
                     seeds(np.subtract(scores, summary["methods"]["ss"]["scores"][level])))
            within = ucr({level: float(np.mean(scores))}, summary["dense_mean"]) is not None
            rows.append([RLX2[method], f"{100 * level:g} %",
                         f"{num(records[method]['costs']['size_reduction'][member['member']], 1)}x", seeds(scores),
                         f"**{num(float(np.mean(scores)))}**", num(row["relative"][level], 2),
                         "yes" if within else "no", vs_ss])
    lines = md([f"method (n = {len(dense)} replicas)", "sparsity", "size /", "score per replica", "mean",
                "mean / dense", "within 3 %", "minus SS, per replica"], rows)
    lines += ["", *md(["method", "UCR (replica means)", "UCR per replica"],
                      [[RLX2[m], percent(r["ucr"]), ", ".join(percent(u) for u in r["ucr_per_replica"])]
                       for m, r in summary["methods"].items()])]
    lines += ["", f"Score: the mean of a member's last 30 evaluations (one deterministic episode every "
                  f"{records['dense']['schedule']['period']} env steps). Uniform random policy: "
                  f"{num(load(f'{folder}/random_policy.json')['return'])}."]
    return lines


def rlx2_buffer_rows(env: str) -> list[str]:
    """RLx2's dynamic buffer per sparsity (shrinks, final replay size, policy distance) and its logged drop
    fractions."""
    record = load(f"rlx2_compression_{env}/rlx2.json")
    rows = []
    for level in UCR_LEVELS:
        members = [m for m in record["members"] if m["sparsity"] == level]
        distance = [float(np.nanmean(m["policy_distance"])) for m in members]
        drops = members[0]["drop_fraction"]  # [env steps, actor, critic] at every 10th evaluation
        first = next(d for d in drops if d[2] is not None and np.isfinite(d[2]))
        rows.append([f"{100 * level:g} %", seeds([m["shrinks"] for m in members]),
                     seeds([m["final_replay_size"] for m in members]), seeds(distance, 3),
                     f"{num(first[2], 2)} → {num(drops[-1][2], 2)}", f"{num(first[1], 2)} → {num(drops[-1][1], 2)}"])
    schedule = record["schedule"]
    return md(["RLx2 sparsity", "buffer shrinks per replica", "final replay size per replica",
               "mean policy distance per replica", "critic drop fraction (first → last logged)",
               "actor drop fraction (first → last logged)"], rows) + [
        "", f"Capacity B_max = {schedule['buffer_size']}, floor B_min = {schedule['buffer_min']}, a check every "
            f"{schedule['period']} env steps (threshold D0 = 0.2). Drop fractions: replica 0's, at every 10th "
            f"evaluation (each row shows the latest topology step's)."]


@table
def rlx2_compression_halfcheetah() -> list[str]:
    return rlx2_compression_tables("halfcheetah-v5")


@table
def rlx2_buffer_halfcheetah() -> list[str]:
    return rlx2_buffer_rows("halfcheetah-v5")


RLX2_COMPONENTS = {"rlx2_1step": "RLx2 without the multi-step target (1-step, dynamic buffer)",
                   "rlx2_fixed_buffer": "RLx2 with a fixed buffer (3-step target)"}
RLX2_FLOOR = {"rlx2_floor_sample": "RLx2 with B_min = 2,048, the buffer check's sample (3-step, dynamic buffer)"}
RLX2_FOLDER = "rlx2_compression_halfcheetah-v5"


def rlx2_component_scores(level: float) -> dict[str, list[float]] | None:
    """Score per replica at one sparsity of RigL, RLx2, its two components and (once run) the B_min variant; None
    until both components have run. Replica r of every method is member ``4 r + level index``: the same keys."""
    methods = ("rigl", "rlx2", *RLX2_COMPONENTS, *RLX2_FLOOR)
    paths = {m: RESULTS / RLX2_FOLDER / f"{m}.json" for m in methods}
    if not all(paths[m].exists() for m in RLX2_COMPONENTS):
        return None
    return {m: [x["score"] for x in load(path)["members"] if x["sparsity"] == level]
            for m, path in paths.items() if path.exists()}


def rlx2_effects(scores: dict[str, list[float]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The 2 x 2 design (target 1-step / 3-step x buffer fixed / dynamic: RigL, RLx2 with a fixed buffer, RLx2
    without the multi-step target, RLx2) as paired arms per replica: each component's main effect is the mean over
    the other component's two settings of (with − without)."""
    s = {m: np.asarray(v, dtype=float) for m, v in scores.items()}
    return {"the 3-step target": ((s["rlx2_fixed_buffer"] + s["rlx2"]) / 2, (s["rigl"] + s["rlx2_1step"]) / 2),
            "the dynamic buffer": ((s["rlx2_1step"] + s["rlx2"]) / 2, (s["rigl"] + s["rlx2_fixed_buffer"]) / 2)}


@table
def rlx2_components_halfcheetah() -> list[str]:
    """RLx2 with one component removed, against RigL (which lacks both) and RLx2, at 90 % and 98 %: score per
    replica (member m of every method starts from the same keys, so replicas are paired) and minus RigL per replica
    with the mean's t-interval (3 replicas: no bootstrap); then each component's main effect."""
    at = {level: rlx2_component_scores(level) for level in (0.9, 0.98)}
    if at[0.9] is None:
        return ["Not run yet."]
    labels = {**RLX2, **RLX2_COMPONENTS, **RLX2_FLOOR}
    rows, effects = [], []
    for level, scores in at.items():
        for method, values in scores.items():
            diff = "-" if method == "rigl" else (f"{seeds(np.subtract(values, scores['rigl']))} (mean "
                                                 f"{num(float(np.mean(values) - np.mean(scores['rigl'])))}"
                                                 f"{t_beside(values, scores['rigl'], 0)})")
            rows.append([f"{100 * level:g} %", labels[method], seeds(values), f"**{num(float(np.mean(values)))}**",
                         diff])
        for component, (with_, without) in rlx2_effects(scores).items():
            effects.append([f"{100 * level:g} %", component, seeds(with_ - without),
                            f"**{num(float(np.mean(with_ - without)))}**{t_beside(with_, without, 0)}",
                            f"{int(np.sum(with_ > without))} of {len(with_)}"])
    n = len(scores["rigl"])
    lines = (md(["sparsity", f"method (n = {n} replicas)", "score per replica", "mean", "minus RigL, per replica"],
                rows) + [""] +
             md(["sparsity", "component", "main effect per replica (mean of with − without over the other "
                 "component's two settings)", "mean", "replicas where it adds return"], effects))
    return lines + rlx2_floor_lines(at[0.9])


def rlx2_floor_lines(scores: dict[str, list[float]]) -> list[str]:
    """The B_min = 2,048 variant at 90 % (``scores``: ``rlx2_component_scores(0.9)``) against RLx2 (B_min = T/30)
    and RLx2 with a fixed buffer, per replica."""
    if "rlx2_floor_sample" not in scores:
        return []
    floor = scores["rlx2_floor_sample"]
    parts = [f"minus {name}: {seeds(np.subtract(floor, scores[m]))} (mean "
             f"{num(float(np.mean(floor) - np.mean(scores[m])))}{t_beside(floor, scores[m], 0)})"
             for m, name in (("rlx2", "RLx2 (B_min = 833)"), ("rlx2_fixed_buffer", "RLx2 with a fixed buffer"))]
    return ["", f"B_min = 2,048 at 90 %, per replica, {parts[0]}; {parts[1]}."]


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


@table
def pbt_halfcheetah_range() -> list[str]:
    """The range of the best members and the members below 0 quoted in the HalfCheetah (25k) reading."""
    records = runs("pbt_random_search_halfcheetah-v5", lambda r: (r["arm"], r["seed"]), "*_s*.json")
    best = {arm: [r["final_best"] for (a, _), r in records.items() if a == arm] for arm in PBT_RS_ARMS}
    members = [x for r in records.values() for x in r["final_per_member"]]
    low = min(min(v) for v in best.values())
    return [f"At 25k steps the best member of a run scores {num(low)} to {num(max(max(v) for v in best.values()))} "
            f"(the defaults arm's lowest: {seeds(sorted(best['defaults'])[:2])}), and {sum(x < 0 for x in members)} "
            f"of {len(members)} members' final returns are still below 0."]


# --- the document ------------------------------------------------------------------------------------------

def render(text: str) -> str:
    """``text`` with every generated table rebuilt from its JSON; a block naming no table is a ValueError."""
    def fill(match: re.Match) -> str:
        name = match.group(2)
        if name not in TABLES:
            raise ValueError(f"table: {name!r} is not generated by experiments/results.py (allowed: "
                             f"{', '.join(TABLES)})")
        return match.group(1) + "\n".join(TABLES[name]()) + "\n" + match.group(4)

    return BLOCK.sub(fill, text)


# --- MEMR (issue 25): arms share seeds (member m starts from the same keys in every arm) ---------------------
MEMR_ARMS = {"sac": "SAC", "memr": "MEMR, prioritized start states", "memr_uniform": "MEMR, uniform start states",
             "memr_oracle": "MEMR, uniform start states, the env as model",
             "memr_oracle_real": "MEMR's update path on real rows only (env as model, real_ratio 1)",
             "memr_oracle_full": "MEMR, env as model, every rollout of the run kept",
             "memr_full": "MEMR, prioritized, every rollout of the run kept (learned model)",
             "memr_oracle_real_resampled": "as the real-rows-only arm, rows drawn with replacement (before the fix)"}
MEMR_PAIRS = (("memr", "sac"), ("memr_uniform", "sac"), ("memr", "memr_uniform"), ("memr_oracle", "sac"),
              ("memr_uniform", "memr_oracle"), ("memr_oracle_real", "sac"), ("memr_oracle_full", "sac"),
              ("memr_oracle_full", "memr_oracle"), ("memr_oracle_real_resampled", "sac"),
              ("memr_oracle_real", "memr_oracle_real_resampled"), ("memr_full", "memr"))
MEMR_LOGS = {"model_val_nll": ("held-out model NLL", 2), "model_done": ("rollout termination rate", 3),
             "real_done": ("real termination rate", 3), "is_weight": ("mean IS weight (max-normalised)", 3),
             "priority": ("mean priority", 2), "priority_std": ("priority SD", 2)}
MEMR_ISSUE38 = {"pendulum": "memr_pendulum/results_issue38.json", "hopper": "memr_hopper/results_40k_issue38.json"}


def memr_table(path: str) -> list[str]:
    """Per arm: final return (mean of the last 3 evaluations) per seed, its mean and SD, the mean return over the
    trained evaluations (area under the curve per env step), and what each member did (summary counts)."""
    configs = load(path)["summary"]["configs"]
    n = len(next(iter(configs.values()))["final"])
    rows = []
    for name, label in MEMR_ARMS.items():
        if name in configs:
            c = configs[name]
            counts = c["counts"]
            rows.append([label, seeds(c["final"]), f"**{mean_sd(c['final'])}**", mean_sd(c["auc"]),
                         counts["policy_updates"], counts.get("model_rollouts", "-"), counts.get("model_fits", "-"),
                         num(c["total_s"])])
    return md([f"arm (n = {n})", "final return per seed", "final mean ± SD", "mean return after warm-up ± SD",
               "policy updates", "model rollouts", "model fits", "wall s"], rows)


def memr_scores(curves: list, warmup: int) -> dict[str, np.ndarray]:
    """Per seed of one arm: the final return (mean of the last 3 evaluations) and the mean return over the
    evaluations after warm-up (the area under the curve per env step); ``memr_common.summarize`` stores these."""
    c = np.asarray(curves, dtype=float)  # [seeds, evals, (env steps, return, policy updates)]
    trained = c[:, :, 0] > warmup
    return {"final": c[:, -3:, 1].mean(axis=1),
            "auc": np.array([c[m, trained[m], 1].mean() for m in range(len(c))])}


def memr_paired_table(path: str) -> list[str]:
    return memr_differences(load(path)["summary"]["configs"])


def memr_differences(configs: dict) -> list[str]:
    """Each pair of ``MEMR_PAIRS`` both present in ``configs`` (arm -> per seed ``final`` and ``auc``), paired by
    seed."""
    rows = [[f"{MEMR_ARMS[a]} − {MEMR_ARMS[b]}", _paired_diff(configs[a]["final"], configs[b]["final"]),
             _paired_diff(configs[a]["auc"], configs[b]["auc"])]
            for a, b in MEMR_PAIRS if a in configs and b in configs]
    return md(["difference of means, paired by seed", "final return [95 % CI]", "mean return after warm-up [95 % CI]"],
              rows)


def memr_scores_until(path: str, steps: int) -> dict[str, dict[str, list[float]]]:
    """Each arm's scores as if its run had stopped at ``steps`` env steps: the final return (mean of the last 3
    evaluations at or before it) and the mean return over the evaluations after warm-up up to it."""
    return {r["config"]: {k: v.tolist() for k, v in memr_scores(
                [[row for row in seed if row[0] <= steps] for seed in r["curves"]], r["warmup"]).items()}
            for r in load(path)["runs"]}


@table
def memr_hopper_first_run_at_40k() -> list[str]:
    """The first Hopper run (issue 25, 60k steps) scored at 40k steps, the issue-38 re-run's budget."""
    return memr_differences(memr_scores_until("memr_hopper/results.json", 40_000))


@table
def memr_pendulum() -> list[str]:
    return memr_table("memr_pendulum/results.json")


@table
def memr_pendulum_paired() -> list[str]:
    return memr_paired_table("memr_pendulum/results.json")


def memr_logs_table(path: str) -> list[str]:
    """Per MEMR arm: the learner's logs at the last 3 evaluations (each the mean over its iteration), averaged per
    seed, mean ± SD over seeds."""
    rows = []
    for r in load(path)["runs"]:
        if not r.get("model_logs"):
            continue
        fields = r["model_log_fields"]
        per_seed = {k: [np.mean([row[fields.index(k)] for row in seed[-3:]]) for seed in r["model_logs"]]
                    for k in MEMR_LOGS}
        rows.append([MEMR_ARMS[r["config"]], *(mean_sd(per_seed[k], d) for k, (_, d) in MEMR_LOGS.items())])
    return md(["arm (last 3 evaluations, mean ± SD over seeds)", *(label for label, _ in MEMR_LOGS.values())], rows)


# the issue-38 re-runs: memr_<env>_issue38 (arms), ..._paired and ..._logs
for _env, _path in MEMR_ISSUE38.items():
    for _suffix, _make in (("", memr_table), ("_paired", memr_paired_table), ("_logs", memr_logs_table)):
        TABLES[f"memr_{_env}_issue38{_suffix}"] = functools.partial(_make, _path)


@table
def memr_pendulum_30k() -> list[str]:
    return memr_table("memr_pendulum/results_30k.json")


@table
def memr_pendulum_30k_paired() -> list[str]:
    return memr_paired_table("memr_pendulum/results_30k.json")


# --- PBT strategies (issue 28) ---------------------------------------------------------------------------------

PBT_ARMS = ("pbt", "pb2", "mfpbt", "random")
PBT_METRICS = {"final_best": "final best member", "best_return": "best member at any evaluation",
               "final_mean": "population mean final return"}


def pbt_strategy_records() -> dict[tuple[str, int], dict]:
    """``(arm, seed) -> record`` of experiments/results/pbt_strategies_pendulum/<arm>_s<seed>.json, with the
    population's mean final return added as ``final_mean``."""
    return {key: r | {"final_mean": float(np.mean(r["final_returns"]))}
            for key, r in runs("pbt_strategies_pendulum", lambda r: (r["arm"], r["seed"]), "*_s*.json").items()}


@table
def pbt_strategies_pendulum() -> list[str]:
    """Each PBT strategy against random search at equal compute, per seed, with the mean paired difference and its
    95 % paired bootstrap interval (seeds drawn jointly); one row per arm and metric."""
    records = pbt_strategy_records()
    seed_ids = sorted({seed for _, seed in records})
    rows = []
    for metric, label in PBT_METRICS.items():
        base = [records[("random", s)][metric] for s in seed_ids]
        for arm in PBT_ARMS:
            values = [records[(arm, s)][metric] for s in seed_ids]
            paired = ""
            if arm != "random":
                ci = stats.paired_ci(values, base, reps=REPS)
                wins = sum(v > b for v, b in zip(values, base, strict=True))
                paired = (f"{ci.point:+.1f} [{ci.low:+.1f}, {ci.high:+.1f}]{t_beside(values, base)}, better on "
                          f"{wins} of {len(base)}"
                          if len(base) >= stats.MIN_BOOTSTRAP_SEEDS else f"n<{stats.MIN_BOOTSTRAP_SEEDS}")
            rows.append([label, arm, *(num(v, 1) for v in values), mean_sd(values, 1), paired])
    below = {arm: sum(v < -500 for (a, _), r in records.items() if a == arm for v in r["final_returns"])
             for arm in PBT_ARMS}
    members = {arm: sum(len(r["final_returns"]) for (a, _), r in records.items() if a == arm) for arm in PBT_ARMS}
    return md(["metric", "arm", *(f"seed {s}" for s in seed_ids), "mean ± SD", "paired Δ vs random [95 % CI]"],
              rows) + ["", "Members whose final return is below -500 (hparams that never learn): " + ", ".join(
                  f"{arm} {below[arm]} of {members[arm]}" for arm in PBT_ARMS) + "."]



@table
def memr_hopper() -> list[str]:
    return memr_table("memr_hopper/results.json")


@table
def memr_hopper_paired() -> list[str]:
    return memr_paired_table("memr_hopper/results.json")


# --- HTS-RL Table A1 analogue (issue 27) ---------------------------------------------------------------------
HTS_A1_ARMS = {"lockstep": "lock-step A2C", "eq6": "HTS, delayed gradient (Eq. 6)", "truncated_is": "HTS, truncated IS",
               "none": "HTS, no correction"}


def hts_a1_records() -> dict[tuple[str, float], dict]:
    return runs("hts_table_a1", lambda r: (r["arm"], r["lr"]), "*_lr*.json")


@table
def hts_table_a1() -> list[str]:
    """Per learning rate and arm: the mean evaluation return over training (per seed mean ± SD), the final return,
    and the paired difference of Eq. 6 minus the arm (seeds shared) with its 95 % bootstrap interval."""
    records = hts_a1_records()
    rows = []
    for lr in sorted({lr for _, lr in records}):
        eq6 = records.get(("eq6", lr))
        for arm, label in HTS_A1_ARMS.items():
            r = records.get((arm, lr))
            if r is None:
                continue
            diff = "-" if arm == "eq6" or eq6 is None else _paired_diff(eq6["auc"], r["auc"])
            rows.append([f"{lr:g}", label, f"**{mean_sd(r['auc'], 1)}**", mean_sd(r["final"], 1), diff,
                         num(r["wall_s"])])
    n = next(iter(records.values()))["seeds"] if records else 0
    return md(["lr", f"arm (n = {n} seeds)", "mean eval return over training ± SD", "final return ± SD",
               "Eq. 6 − arm, mean over training, paired [95 % CI]", "wall s"], rows)


# --- PBT vs random search vs defaults (issue 27, fast-PBT R2) ------------------------------------------------
PBT_RS_ARMS = {"pbt": "PBT", "random": "random search", "defaults": "best of 8 defaults"}


def pbt_rs_table(env: str) -> list[str]:
    """Per seed and arm: the best member's final return and its R2 normalisation against the random policy and the
    same seed's best default member; IQM over seeds per arm; PBT − random search paired by seed."""
    folder = f"pbt_random_search_{env}"
    low = load(f"{folder}/random_policy.json")["return"]
    records = runs(folder, lambda r: (r["arm"], r["seed"]), "*_s*.json")
    seed_ids = sorted({s for a, s in records if all((arm, s) in records for arm in PBT_RS_ARMS)})
    raw = {arm: np.array([records[(arm, s)]["final_best"] for s in seed_ids]) for arm in PBT_RS_ARMS}
    norm = {arm: stats.normalize(raw[arm], low, raw["defaults"]) for arm in PBT_RS_ARMS}
    rows = []
    for arm, label in PBT_RS_ARMS.items():
        summary = stats.seed_summary(norm[arm])
        iqm = (f"{summary['iqm']:.2f} [{summary['ci'][0]:.2f}, {summary['ci'][1]:.2f}]" if "iqm" in summary
               else f"n<{stats.MIN_BOOTSTRAP_SEEDS}")
        rows.append([label, *(f"{r:.1f} ({v:.2f})" for r, v in zip(raw[arm], norm[arm], strict=True)),
                     mean_sd(raw[arm], 1), iqm])
    lines = md(["arm", *(f"seed {s}: best final (normalised)" for s in seed_ids), "best final, mean ± SD",
                "normalised IQM [95 % CI]"], rows)
    for a, b in (("pbt", "random"), ("pbt", "defaults"), ("random", "defaults")):
        wins = int(np.sum(raw[a] > raw[b]))
        paired = (_paired_diff(raw[a], raw[b]) if len(seed_ids) >= stats.MIN_BOOTSTRAP_SEEDS
                  else f"per seed {seeds(raw[a] - raw[b], 1)}{t_beside(raw[a], raw[b])} (n<4)")
        lines += ["", f"{PBT_RS_ARMS[a]} − {PBT_RS_ARMS[b]}, best final return paired by seed: {paired} "
                  f"(better on {wins} of {len(seed_ids)} seeds)."]
    return lines + ["", f"Random-policy return (the normaliser's low end, 100 episodes): {low:.1f}."]


PBT_PAPER = "pbt_paper_halfcheetah-v5"


def pbt_paper_scores(metric: str = "rescored") -> tuple[list[int], dict[str, np.ndarray]]:
    """Seeds whose three arms all finished, and per arm the chosen member's ``metric`` (``rescored``: its mean
    return on 20 fresh episodes; ``final_best``: its training-time fitness, the last 2 evaluations x 5 episodes;
    ``last_evaluation``: its last evaluation alone)."""
    records = runs(PBT_PAPER, lambda r: (r["arm"], r["seed"]), "*_s*.json")
    for r in records.values():
        r["last_evaluation"] = r["curves"][r["chosen_member"]][-1][1]
    seed_ids = sorted({s for a, s in records if all((arm, s) in records for arm in PBT_RS_ARMS)})
    return seed_ids, {arm: np.array([records[(arm, s)][metric] for s in seed_ids]) for arm in PBT_RS_ARMS}


def verdict_text(v: dict, digits: int = 1) -> str:
    """"Δ [percentile] / t [..], n = ..: **verdict**" of ``stats.paired_verdict``."""
    pct = v["percentile"]
    pct = f"percentile [{num(pct[0], digits)}, {num(pct[1], digits)}], " if pct else "n<4, "
    return (f"{num(v['point'], digits + (v['kind'] == 'ratio') * 2)} ({pct}t [{num(v['t'][0], digits)}, "
            f"{num(v['t'][1], digits)}], n = {v['n']}) against {num(v['margin'], digits)}: **{v['verdict']}**")


@table
def pbt_paper_halfcheetah() -> list[str]:
    """R2 as the fast-PBT paper states it: per seed and arm the chosen member's training-time fitness and its
    re-scored return; PBT − best of 8 defaults (the paper's claim) and PBT − random search (the spec's control),
    paired by seed, on the re-scored returns, each with its verdict."""
    seed_ids, fitness = pbt_paper_scores("final_best")
    if not seed_ids:
        return ["No seed has finished all three arms yet."]
    _, rescored = pbt_paper_scores("rescored")
    rows = [[label, *(f"{f:.0f} → {r:.0f}" for f, r in zip(fitness[arm], rescored[arm], strict=True)),
             mean_sd(fitness[arm]), mean_sd(rescored[arm])] for arm, label in PBT_RS_ARMS.items()]
    lines = md(["arm", *(f"seed {s}: fitness → re-scored" for s in seed_ids), "fitness, mean ± SD",
                "re-scored, mean ± SD"], rows)
    for a, b, what in (("pbt", "defaults", "the paper's claim"), ("pbt", "random", "the spec's control")):
        head = f"{PBT_RS_ARMS[a]} − {PBT_RS_ARMS[b]} ({what}), re-scored return paired by seed: "
        if len(seed_ids) >= 2:
            v = stats.paired_verdict(rescored[a], rescored[b], reps=REPS)
            lines += ["", f"{head}{verdict_text(v)}; per seed {seeds(rescored[a] - rescored[b])}."]
        else:
            lines += ["", f"{head}{seeds(rescored[a] - rescored[b])} on the one finished seed (no interval from "
                      f"one seed: **not resolved**)."]
    _, last = pbt_paper_scores("last_evaluation")
    inflation = np.concatenate([last[a] - rescored[a] for a in PBT_RS_ARMS])
    return lines + ["", f"Winner's curse: the chosen member's last evaluation (5 episodes at the end) minus its "
                    f"re-scored return (20 fresh episodes of the same actor), over all {len(inflation)} runs: mean "
                    f"{num(float(inflation.mean()))}, range {num(float(inflation.min()))} to "
                    f"{num(float(inflation.max()))}. (The fitness also averages the evaluation 5k steps earlier, so "
                    f"fitness − re-scored mixes the curse with the last 5k steps of learning.)"]


@table
def pbt_random_search_pendulum() -> list[str]:
    return pbt_rs_table("pendulum")


@table
def pbt_random_search_halfcheetah() -> list[str]:
    return pbt_rs_table("halfcheetah-v5")



# --- SPO: does naive local SGD diverge? (issue 27) -----------------------------------------------------------
def spo_divergence_records() -> dict[str, dict]:
    return runs("spo_divergence", lambda r: r["config"])


@table
def spo_divergence() -> list[str]:
    """Per (H, opt_state, variant): final return, seeds that diverged, the replicas' mean spread before each average
    (critic, actor), and naive − two-phase in final return paired by seed."""
    records = spo_divergence_records()
    rows = []
    for name, r in sorted(records.items(), key=lambda kv: (kv[1]["learner_config"]["local_steps"],
                                                            kv[1]["learner_config"]["opt_state"], kv[0])):
        c = r["learner_config"]
        spread = np.asarray([s for m in r["spreads"] for s in m], dtype=float)
        twin = records.get(name.replace("naive", "two_phase"))
        paired = "-" if name.startswith("two_phase") or twin is None else _paired_diff(r["final"], twin["final"])
        rows.append([c["local_steps"], c["opt_state"], "naive" if c["naive"] else "two-phase",
                     f"**{mean_sd(r['final'])}**", f"{sum(r['diverged'])} / {len(r['diverged'])}",
                     f"{np.nanmean(spread[:, 1]):.3g}", f"{np.nanmean(spread[:, 2]):.3g}", paired, num(r["total_s"])])
    n = next(iter(records.values()))["seeds"] if records else 0
    return md(["H", "opt_state", f"variant (n = {n})", "final return ± SD", "diverged", "critic spread",
               "actor spread", "naive − two-phase, final, paired [95 % CI]", "wall s"], rows)


@table
def spo_drift() -> list[str]:
    """SPO-TD3 at real drift (issue 39): per (H, variant) the final return and AUC (mean ± SD, ddof 1), seeds that
    diverged, the replicas' spread before each average (mean and max over rounds and seeds), and two-phase − naive
    paired by seed on each score (margin 0: held means naive is worse, the thesis's claim)."""
    return spo_drift_table("spo_divergence_drift")


@table
def spo_drift40() -> list[str]:
    """The H = 1000 pair at 40 seeds per arm (issue 48): the drift table, then the pre-registered count of seeds that
    fail to learn (``margins.spo_fails``) with its one-sided Fisher exact test."""
    records = runs("spo_divergence_drift40", lambda r: r["config"])
    f = verdicts.fisher_fails(records["naive-local-1000"]["final"], records["two_phase-local-1000"]["final"])
    low, high = margins.RANGES["probe:pendulum"]
    return spo_drift_table("spo_divergence_drift40") + [
        "", f"Fails to learn (final below {num(low + margins.SPO_FAIL_FRACTION * (high - low))}, the midpoint of "
            f"probe:pendulum's random-to-solved range): naive {f['naive']} of {f['n'][0]}, two-phase {f['two_phase']} "
            f"of {f['n'][1]}; one-sided Fisher exact p = {f['p']:.2f}: **{f['verdict']}**."]


def spo_drift_table(folder: str) -> list[str]:
    records = runs(folder, lambda r: r["config"])
    rows = []
    for name, r in sorted(records.items(), key=lambda kv: (kv[1]["learner_config"]["local_steps"], kv[0])):
        spread = np.asarray([s for m in r["spreads"] for s in m], dtype=float)
        twin = records.get(name.replace("two_phase", "naive"))
        cells = ["-", "-"]
        if name.startswith("two_phase") and twin is not None:
            cells = [verdict_text(stats.paired_verdict(r[k], twin[k], reps=REPS), 0) for k in ("final", "auc")]
        rows.append([r["learner_config"]["local_steps"], "naive" if r["learner_config"]["naive"] else "two-phase",
                     mean_sd(r["final"]), mean_sd(r["auc"]), f"{sum(r['diverged'])} / {len(r['diverged'])}",
                     f"{np.nanmean(spread[:, 1]):.3g} / {np.nanmax(spread[:, 1]):.3g}",
                     f"{np.nanmean(spread[:, 2]):.3g} / {np.nanmax(spread[:, 2]):.3g}", *cells, num(r["total_s"])])
    n = next(iter(records.values()))["seeds"]
    return md(["H", f"variant (n = {n})", "final return", "AUC (mean return over training)", "diverged",
               "critic spread mean / max", "actor spread mean / max", "two-phase − naive, final",
               "two-phase − naive, AUC", "wall s"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when a table differs")
    args = parser.parse_args(argv)
    text = DOCUMENT.read_text()
    new = render(text)
    if args.check:
        if new != text:
            print(f"{DOCUMENT}: generated tables differ from their JSON (run make results)", file=sys.stderr)
            return 1
        return 0
    if new != text:
        DOCUMENT.write_text(new)
    print(f"{DOCUMENT}: {len(BLOCK.findall(new))} tables regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
