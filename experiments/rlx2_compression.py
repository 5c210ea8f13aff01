"""RLx2's ultimate compression ratio against RigL and static sparse training (Tan et al., ICLR 2023, Table 2's metric).

    PYTHONPATH=. .venv/bin/python experiments/rlx2_compression.py [--env gym:HalfCheetah-v5] [--steps 25000]
        [--seeds 3] [--methods dense,rlx2,rigl,ss]

TD3, hidden 256 x 256, batch 256. Each sparse method is ONE population of ``4 x --seeds`` members: actor sparsity =
critic sparsity in SPARSITIES as per-member hparams, member ``m`` at level ``m % 4`` and replica ``m // 4`` (the
same member index starts from the same keys in every method, so replicas are paired across methods). ``dense`` is
dense TD3, one member per replica. Methods: ``rlx2`` (``rlx2_td3``: RigL topology, delayed 3-step target,
dynamic buffer), ``rigl`` (RigL topology, 1-step target, fixed buffer), ``ss`` (static random sparse, 1-step,
fixed buffer). RLx2's components, one removed at a time (``--methods rlx2_1step,rlx2_fixed_buffer``, not run by
default): ``rlx2_1step`` (1-step target, dynamic buffer), ``rlx2_fixed_buffer`` (3-step target, fixed buffer); their
table (``make results``) sets each against RigL, replica by replica; with rigl and rlx2 in ``--methods`` (read back
from their JSON) they are plotted to experiments/plots/rlx2_components_<env>.png. ``rlx2_floor_sample`` is RLx2
with the buffer's floor B_min raised from T/30 to the 2,048 oldest rows its policy-distance check measures
(8 x batch), so that the buffer never shrinks below the check's own sample.

The paper's step-count hparams are rescaled to a run of T env steps as its spec prescribes (T0 = T/10, B_min = T/30,
B_max = T/3, warm-up T/120), with the topology and buffer-check periods T/300 rounded up to a whole iteration
(50 env steps) so that the evaluation, every such period with one deterministic episode, logs every check: each
metrics row holds the replay size and policy distance measured that iteration, and the drop fractions.

Score per member: the mean of its last 30 evaluations (the paper's). UCR of a method: the largest sparsity whose
score, averaged over replicas, is within 3 % of dense TD3's (``score >= dense - 0.03 |dense|``); also per replica. The
JSON keeps each member's curve, its drop fractions (every 10th check), replay size and policy distance at every
check, and the shrinks counted from the replay size. Writes experiments/results/rlx2_compression_<env>/<method>.json
and experiments/plots/rlx2_compression_<env>.png; tables: ``make results``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from itertools import pairwise
from pathlib import Path

import numpy as np
from results_rlx2 import UCR_LEVELS as SPARSITIES
from results_rlx2 import UCR_TOLERANCE as TOLERANCE
from results_rlx2 import rlx2_compression_summary
from rlx2_pendulum import random_policy
from sweep_common import member_rows, plot_curves, saved_or_run

import popjax
from popjax.envs import registry
from popjax.plots import save_figure

HERE = Path(__file__).resolve().parent
HIDDEN = [256, 256]
ROLLOUT = 50
BATCH = 256
LAST_EVALS = 30
METHODS = {"dense": None, "rlx2": {}, "rigl": {"n_step": 1, "dynamic_buffer": False},
           "ss": {"topology": "static", "n_step": 1, "dynamic_buffer": False},
           # RLx2 with one component removed (issue 39), each compared with RigL, which lacks both
           "rlx2_1step": {"n_step": 1}, "rlx2_fixed_buffer": {"dynamic_buffer": False},
           # the rescaled floor raised to the rows the buffer check measures (8 x batch), issue 39
           "rlx2_floor_sample": {"buffer_min": 8 * BATCH}}
COMPARED = ("dense", "rlx2", "rigl", "ss")  # the compression ratio's methods (the default run, table and plot)
LABELS = {"dense": "dense TD3", "rlx2": "RLx2-TD3", "rigl": "RigL (1-step, fixed buffer)", "ss": "static sparse (SS)",
          "rlx2_1step": "RLx2 without the multi-step target", "rlx2_fixed_buffer": "RLx2 with a fixed buffer",
          "rlx2_floor_sample": "RLx2 with B_min = the check's 2,048-row sample"}


def tag(env: str) -> str:
    return registry.parse(env)[1].lower().replace("/", "_")


def results_dir(env: str) -> Path:
    return HERE / "results" / f"rlx2_compression_{tag(env)}"


def schedule(steps: int) -> dict:
    """The paper's step-count hparams for a run of ``steps`` env steps; periods in whole iterations."""
    period = ROLLOUT * math.ceil(steps / 300 / ROLLOUT)
    return {"period": period, "warmup": steps // 120, "n_step_start": steps // 10, "buffer_min": steps // 30,
            "buffer_size": steps // 3}


def options(method: str, env: str, steps: int, seeds: int) -> dict:
    s = schedule(steps)
    base = dict(env=env, driver="independent", seed=0, preset="none", total_env_steps=steps,
                warmup_steps=s["warmup"], rollout_len=ROLLOUT, update_ratio=1.0, batch_size=BATCH,
                buffer_size=s["buffer_size"], eval_interval=s["period"], eval_episodes=1, checkpoint_interval=0,
                progress=False)
    if METHODS[method] is None:
        return {**base, "learner": "td3", "pop_size": seeds, "learner_config": {"hidden": HIDDEN}}
    levels = list(SPARSITIES) * seeds
    config = {"hidden": HIDDEN, "dst_interval": s["period"], "n_step_start": s["n_step_start"],
              "buffer_check_interval": s["period"], "buffer_min": s["buffer_min"], **METHODS[method]}
    return {**base, "learner": "rlx2_td3", "pop_size": len(levels), "learner_config": config,
            "hparams": {"actor_sparsity": levels, "critic_sparsity": levels}}


def column(rows: list[dict], name: str) -> list[float] | None:
    """One metric of a member's rows as floats (NaN where empty); None when the run does not log it."""
    if not rows or name not in rows[0]:
        return None
    return [float(r[name]) if r[name] not in ("", None) else math.nan for r in rows]


def shrinks(sizes: list[float], added: int, capacity: int) -> int:
    """Checks at which the replay lost rows: its size fell below what the ``added`` rows since the last check
    (capped at ``capacity``) would have made it."""
    sizes = [0.0, *sizes]  # the replay is empty before the first check
    return int(sum(now < min(before + added, capacity) for before, now in pairwise(sizes)))


def member_record(rows: list[dict], period: int, capacity: int) -> dict:
    steps = [int(r["env_steps"]) for r in rows]
    returns = column(rows, "eval_return")
    record = {"curve": [list(p) for p in zip(steps, returns, strict=True)],
              "score": float(np.mean(returns[-LAST_EVALS:]))}
    drops = {k: column(rows, f"{k}_drop_fraction") for k in ("actor", "critic")}
    if drops["critic"] is not None:
        logged = zip(steps, drops["actor"], drops["critic"], strict=True)
        record["drop_fraction"] = [list(r) for r in logged][::10]  # [env steps, actor, critic]
    sizes, distances = column(rows, "replay_size"), column(rows, "policy_distance")
    if sizes is not None:
        record.update(replay_size=sizes, policy_distance=distances,
                      shrinks=shrinks(sizes, period, capacity), final_replay_size=sizes[-1])
    return record


def run(method: str, args) -> dict:
    start = time.time()
    opts, steps = options(method, args.env, args.steps, args.seeds), schedule(args.steps)
    result = popjax.train(out_dir=Path(args.out) / method, overwrite=True, **opts)
    members = [member_record(rows, steps["period"], steps["buffer_size"])
               for rows in member_rows(result.out_dir, opts["pop_size"])]
    levels = opts.get("hparams", {}).get("actor_sparsity", [0.0] * opts["pop_size"])
    for m, (record, level) in enumerate(zip(members, levels, strict=True)):
        record.update(member=m, sparsity=level, replica=m // len(SPARSITIES) if level else m)
    s = result.summary
    record = {"method": method, "env": args.env, "steps": args.steps, "seeds": args.seeds,
              # the schedule as run: a method's own buffer_min overrides T/30 (issue 48: the floor-sample record
              # first stored T/30 here although its runs used 2,048)
              "schedule": {**steps, **{k: v for k, v in (METHODS[method] or {}).items() if k in steps}},
              "members": members, "costs": s.get("costs"),
              "wall_s": s["wall_s"], "compile_s": s["compile_s"], "total_s": round(time.time() - start, 1)}
    path = results_dir(args.env) / f"{method}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record) + "\n")
    print(f"{method}: {record['total_s']:.0f} s, scores {[round(m['score']) for m in members]}", flush=True)
    return record


def plot(records: dict[str, dict], summary: dict, env: str, steps: int) -> Path:
    import matplotlib.pyplot as plt  # headless: popjax.plots selected the Agg backend

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.4))
    x = np.arange(len(SPARSITIES))
    for i, (method, row) in enumerate(summary["methods"].items()):
        rel = [np.asarray(row["scores"][level]) / summary["dense_mean"] for level in SPARSITIES]
        ax.plot(x + 0.06 * (i - 1), [r.mean() for r in rel], "o-", color=f"C{i}", label=LABELS[method])
        for j, r in enumerate(rel):
            ax.scatter(np.full(len(r), j + 0.06 * (i - 1)), r, color=f"C{i}", s=10, alpha=0.4)
    ax.axhline(1.0, color="0.3", lw=1, label="dense TD3 (mean of replicas)")
    ax.axhspan(1 - TOLERANCE, 1 + TOLERANCE, color="0.85", label="within 3 % of dense")
    ax.set(xticks=x, xticklabels=[f"{100 * s:g} %" for s in SPARSITIES], xlabel="actor = critic sparsity",
           ylabel=f"score / dense (mean of last {LAST_EVALS} evals)", title=f"{env}, {steps} steps, TD3 256 x 256")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    for m in records.get("rlx2", {}).get("members", []):
        bx.plot([p[0] for p in m["curve"]], m["replay_size"], color=f"C{SPARSITIES.index(m['sparsity'])}", lw=0.8)
    bx.set(xlabel="env steps", ylabel="replay size (rows)", title="RLx2's dynamic buffer, every member "
                                                                     "(colour: sparsity)")
    bx.grid(alpha=0.3)
    return save_figure(fig, HERE / "plots" / f"rlx2_compression_{tag(env)}.png")


COMPONENTS = ("rigl", "rlx2_fixed_buffer", "rlx2_1step", "rlx2", "rlx2_floor_sample")  # the 2 x 2 design, then B_min


def plot_components(records: dict[str, dict], env: str, steps: int) -> Path:
    """Evaluation curves at 90 % and 98 % of RigL, RLx2 and RLx2 without each component: each replica thin, the mean
    thick; and the replay size of every dynamic-buffer replica at 90 %."""
    import matplotlib.pyplot as plt  # headless: popjax.plots selected the Agg backend

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
    shown = [m for m in COMPONENTS if m in records]
    for ax, level in zip(axes[:2], (0.9, 0.98), strict=True):
        for i, method in enumerate(shown):
            curves = [m["curve"] for m in records[method]["members"] if m["sparsity"] == level]
            plot_curves(ax, curves, f"C{i}", LABELS[method])
        ax.set(xlabel="env steps", ylabel="evaluation return", title=f"{env}, actor = critic sparsity {level:.0%}")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    for i, method in enumerate(shown):
        for m in records[method]["members"]:
            if m["sparsity"] == 0.9 and "replay_size" in m:
                axes[2].plot([p[0] for p in m["curve"]], m["replay_size"], color=f"C{i}", lw=0.8)
    axes[2].set(xlabel="env steps", ylabel="replay size (rows)", title="dynamic buffers at 90 % (fixed: 8,333)")
    axes[2].grid(alpha=0.3)
    return save_figure(fig, HERE / "plots" / f"rlx2_components_{tag(env)}.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="gym:HalfCheetah-v5", help="a continuous env (probe:, brax: or gym:)")
    parser.add_argument("--steps", type=int, default=25_000, help="env steps per member")
    parser.add_argument("--seeds", type=int, default=3, help="replicas per sparsity (and dense members)")
    parser.add_argument("--methods", default=",".join(COMPARED), help=f"comma-separated, of {', '.join(METHODS)}")
    parser.add_argument("--out", default=None, help="run directories (default runs/rlx2_compression_<env>)")
    args = parser.parse_args()
    args.out = args.out or f"runs/{results_dir(args.env).name}"
    folder = results_dir(args.env)
    random_policy(folder, args.env)
    records = {method: saved_or_run(folder / f"{method}.json", {"steps": args.steps, "seeds": args.seeds},
                                    lambda method=method: run(method, args))
               for method in args.methods.split(",")}
    if set(COMPONENTS[:4]) <= set(records):
        print(plot_components(records, args.env, args.steps))
    records = {m: r for m, r in records.items() if m in COMPARED}  # the components have their own table and plot
    if "dense" in records and len(records) > 1:
        summary = rlx2_compression_summary(records)
        print(json.dumps({k: {"ucr": v["ucr"], "relative": v["relative"]} for k, v in summary["methods"].items()}))
        print(plot(records, summary, args.env, args.steps))


if __name__ == "__main__":
    main()
