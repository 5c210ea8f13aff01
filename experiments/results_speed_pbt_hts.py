"""The tables of RESULTS.md on speed (the shared critic, fast-PBT R1 on the H200), `make run`'s default PBT run,
HTS-RL (determinism, throughput, learning, the Table A1 analogue), PBT with PPO on HalfCheetah, the PBT strategies
and PBT against random search and the defaults (fast-PBT R2), with the scoreboard's evidence for R1, R2 and HTS's
lag."""

from __future__ import annotations

from collections.abc import Callable

import margins
import numpy as np
from results_core import (
    BENCH,
    REPS,
    RESULTS,
    both_evidence,
    load,
    md,
    mean_sd,
    num,
    paired_difference,
    paired_evidence,
    runs,
    seeds,
    t_beside,
    table,
    verdict_text,
)

from popjax import stats

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
        diff = "-" if name == "lockstep" else paired_difference(values, base)
        rows.append([label, seeds(values), f"**{mean_sd(values, 1)}**", diff, seeds(r["final_per_seed"])])
    return md(["configuration (n = 8)", "mean eval return over training, per seed", "mean ± SD",
               "Δ vs lock-step, paired by seed [95 % CI]", "final returns"], rows)


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
            diff = "-" if arm == "eq6" or eq6 is None else paired_difference(eq6["auc"], r["auc"])
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
        paired = (paired_difference(raw[a], raw[b]) if len(seed_ids) >= stats.MIN_BOOTSTRAP_SEEDS
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


# --- the scoreboard's evidence (results.py's EVIDENCE) -------------------------------------------------------------

def r1_evidence() -> tuple[str, str]:
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


def pbt_rs_evidence(env: str, a: str, b: str) -> Callable[[], tuple[str, str]]:
    def evidence():
        records = runs(f"pbt_random_search_{env}", lambda r: (r["arm"], r["seed"]), "*_s*.json")
        ids = sorted({s for _, s in records})
        return paired_evidence([records[(a, s)]["final_best"] for s in ids],
                               [records[(b, s)]["final_best"] for s in ids])
    return evidence


def pbt_paper_evidence(b: str) -> Callable[[], tuple[str, str]]:
    def evidence():
        seed_ids, rescored = pbt_paper_scores()
        if len(seed_ids) < 2:
            return "not resolved", f"{len(seed_ids)} seed(s) finished"
        return paired_evidence(rescored["pbt"], rescored[b])
    return evidence


def hts_lag_evidence() -> tuple[str, str]:
    """HTS (Eq. 6) − lock-step on probe:cartpole (A2C), final and mean return over training, the one margin."""
    runs_ = load("hts_learning.json")["runs"]
    a, b = runs_["eq6"], runs_["lockstep"]
    return both_evidence((a["final_per_seed"], b["final_per_seed"]),
                         (a["mean_return_per_seed"], b["mean_return_per_seed"]),
                         -margins.margin("probe:cartpole"), "probe:cartpole", b["final_per_seed"])
