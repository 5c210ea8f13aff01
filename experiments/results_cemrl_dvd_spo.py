"""The tables of RESULTS.md on CEM-RL and DvD (Pendulum, HalfCheetah), SPO with DQN on CartPole and with TD3 on
Pendulum, the priority-write delay of prioritized replay, SPO's scaling factor and whether naive local SGD
diverges, with the scoreboard's evidence for CEM-RL's critic order, SPO's banked replay and its fails-to-learn
count. Seeds are paired across configurations: member m is the same seed."""

from __future__ import annotations

import functools

import margins
import numpy as np
import verdicts
from results_core import (
    REPS,
    at_or_before,
    load,
    md,
    mean_sd,
    num,
    paired_difference,
    paired_ratio,
    runs,
    seeds,
    table,
    verdict_text,
)

from popjax import stats

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
    for method, group in groups.items():
        cells = [seeds([at_or_before(r["curve"], x) for r in group]) for x in (10_000, 20_000, 30_000)]
        finals = [r["final"] for r in group]
        rows.append([f"{CEMRL_NAMES[method]}, seeds {seeds([r['seed'] for r in group])}", *cells,
                     f"{seeds(finals)} (**{mean_sd(finals)}**)", seeds([r["best"] for r in group]),
                     seeds([r["s_per_update"] for r in group], 4)])
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
        paired = "-" if name.startswith("two_phase") or twin is None else paired_difference(r["final"], twin["final"])
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


# --- the scoreboard's evidence (results.py's EVIDENCE) -------------------------------------------------------------

def cemrl_order_evidence() -> tuple[str, str]:
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


def spo_banked_evidence() -> tuple[str, str]:
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


def spo_fails_evidence() -> tuple[str, str]:
    """SPO at H = 1000, 40 seeds per arm: the pre-registered fails-to-learn count and Fisher test."""
    recs = runs("spo_divergence_drift40", lambda r: r["config"])
    f = verdicts.fisher_fails(recs["naive-local-1000"]["final"], recs["two_phase-local-1000"]["final"])
    return f["verdict"], (f"naive fails in {f['naive']} of {f['n'][0]}, two-phase in {f['two_phase']} of "
                          f"{f['n'][1]}; one-sided Fisher p = {f['p']:.2f}")
