"""The tables of RESULTS.md on RLx2 (sparse TD3): the Pendulum and Hopper sweeps, the ultimate compression
ratio and the dynamic buffer on HalfCheetah, and the 2 x 2 design of its components, with the scoreboard's
evidence for S1 and each component's main effect."""

from __future__ import annotations

from collections.abc import Callable

import margins
import numpy as np
from results_core import RESULTS, load, md, num, paired_evidence, seeds, t_beside, table

from popjax import stats

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


# --- the scoreboard's evidence (results.py's EVIDENCE) -------------------------------------------------------------

def rlx2_s1_evidence() -> tuple[str, str]:
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


def rlx2_component_evidence(component: str) -> Callable[[], tuple[str, str]]:
    """The component's main effect at 90 % (the one sparsity where the methods learn), against 0."""
    def evidence():
        with_, without = rlx2_effects(rlx2_component_scores(0.9))[component]
        return paired_evidence(with_, without, digits=0)
    return evidence
