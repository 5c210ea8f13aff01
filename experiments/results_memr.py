"""The tables of RESULTS.md on MEMR (model-based experience replay) against SAC on Pendulum and Hopper: the
arms, their paired differences and the learner's logs for each run (the first setup, the issue-38 re-runs, the
whole-history model buffer), with the scoreboard's evidence. Arms share seeds: member m starts from the same keys in
every arm."""

from __future__ import annotations

import functools
from collections.abc import Callable

import margins
import numpy as np
from results_core import RESULTS, TABLES, both_evidence, load, md, mean_sd, num, paired_difference, seeds, table

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
    rows = [[f"{MEMR_ARMS[a]} − {MEMR_ARMS[b]}", paired_difference(configs[a]["final"], configs[b]["final"]),
             paired_difference(configs[a]["auc"], configs[b]["auc"])]
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


# the issue-38 re-runs: memr_<env>_issue38 (arms), ...paired_evidence and ..._logs
for _env, _path in MEMR_ISSUE38.items():
    for _suffix, _make in (("", memr_table), ("_paired", memr_paired_table), ("_logs", memr_logs_table)):
        TABLES[f"memr_{_env}_issue38{_suffix}"] = functools.partial(_make, _path)


@table
def memr_pendulum_30k() -> list[str]:
    return memr_table("memr_pendulum/results_30k.json")


@table
def memr_pendulum_30k_paired() -> list[str]:
    return memr_paired_table("memr_pendulum/results_30k.json")


@table
def memr_hopper() -> list[str]:
    return memr_table("memr_hopper/results.json")


@table
def memr_hopper_paired() -> list[str]:
    return memr_paired_table("memr_hopper/results.json")


@table
def memr_whole_history() -> list[str]:
    """MEMR with every rollout kept (``memr_full``) against the default buffer, 10 paired seeds (issue 48)."""
    path = "memr_pendulum/results_whole_history.json"
    if not (RESULTS / path).exists():
        return ["Not run yet."]
    return memr_table(path) + [""] + memr_paired_table(path)


# --- the scoreboard's evidence (results.py's EVIDENCE) -------------------------------------------------------------

def memr_evidence(path: str, a: str, b: str, env: str | None) -> Callable[[], tuple[str, str]]:
    """MEMR arm ``a`` − ``b``, final and learning speed (mean return after warm-up): "matches" against the one
    margin of ``env``; ``env`` None: "beats", against 0."""
    def evidence():
        configs = load(path)["summary"]["configs"]
        return both_evidence((configs[a]["final"], configs[b]["final"]), (configs[a]["auc"], configs[b]["auc"]),
                             -margins.margin(env) if env else 0.0, env, configs[b]["final"])
    return evidence
