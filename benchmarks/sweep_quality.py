"""Quality of TPE in batches, and the worth of pruning, over study seeds (issue 47).

The runs are ``sweep_walltime``'s (TD3 (64, 64) on probe:pendulum, 5k env steps per trial, the td3 search space,
objective: the final return of one evaluation episode); a study seed s seeds both the TPE sampler and training.

``--study quality`` (``sweep_quality.json``): for each study seed, 32 trials of TPE asked 8 at a time
(``popjax sweep``, pop 8, 4 generations) and 32 trials of the same TPE asked one at a time (Optuna in-process,
``popjax.train`` pop 1: ``sweep_walltime``'s in-process arm). Measure: each study's best objective (its best
COMPLETE trial's value); d_s = batched - sequential, paired by study seed.

``--study pruning`` (``sweep_pruning.json``): for each study seed, ``popjax sweep`` (pop 8, 32 trials) with the
median pruner and without pruning, both evaluated every 1,000 env steps (5 evaluations per trial, so the pruner has
intermediate values); the two arms' order alternates with the seed (the machine's load drifts). Measures: the best
objective, and finished trials (COMPLETE + PRUNED) per hour of wall clock (1-minute load written beside each arm).

Rules, fixed before any of these data (committed with this docstring before the first run):

- The margin M is the project's one margin (``experiments/margins.py``): 0.1 of probe:pendulum's
  random-to-solved range, M = 0.1 x (-150 - (-1258.36)) = 110.8 return units.
- Quality: the claim "batching costs at most M" (mean(batched - sequential) > -M) is decided by
  ``popjax.stats.paired_verdict(batched, sequential, margin=-M)``: **held** when the 95 % t-interval of the mean
  paired difference and the 95 % percentile paired bootstrap (10,000 replicates, seed 0) both lie above -M,
  **refuted at this scale** when both lie below, else **not resolved**.
- Pruning, best objective: "pruning costs at most M", ``paired_verdict(median, none, margin=-M)``, same words.
- Pruning, throughput: "pruning finishes more trials per hour", ``paired_verdict(median, none, margin=1,
  kind="ratio")`` on trials per hour (Fieller's t-interval and the paired bootstrap of the ratio of means both above
  1: held). Wall clock on a shared machine: a cost there, not a speed result.
- 5 study seeds (0-4) per study; every seed run is reported, none dropped.

    PYTHONPATH=. python benchmarks/sweep_quality.py --study quality --out benchmarks/results/sweep_quality.json
    PYTHONPATH=. python benchmarks/sweep_quality.py --study pruning --out benchmarks/results/sweep_pruning.json

``--steps 300`` is a smoke test of the code (tiny batches), not a result.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

from sweep_walltime import RUN, arm_in_process, arm_popjax, load, smoke, warm_cache

ROOT = Path(__file__).resolve().parents[1]
PRUNING_EVAL_INTERVAL = 1_000


def margin() -> float:
    """The project's one margin for probe:pendulum (``experiments/margins.py``)."""
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        import margins
    finally:
        sys.path.remove(str(ROOT / "experiments"))
    return margins.margin(RUN["env"])


def quality_seed(work: Path, seed: int, trials: int, pop: int, cache: str, run: dict) -> dict:
    work.mkdir(parents=True)
    out = {}
    for arm in ("batched", "sequential"):
        before = load()
        seeded = {**run, "seed": seed}
        out[arm] = arm_popjax(work, trials, pop, cache, seeded) if arm == "batched" else \
            arm_in_process(work, trials, cache, seeded)
        out[arm].update(load_1min_before=before, load_1min_after=load())
    return out


def pruning_seed(work: Path, seed: int, trials: int, pop: int, cache: str, run: dict) -> dict:
    work.mkdir(parents=True)
    out = {}
    for arm in (("median", "none") if seed % 2 == 0 else ("none", "median")):
        before = load()
        out[arm] = arm_popjax(work, trials, pop, cache, {**run, "seed": seed}, name=f"sweep-{arm}", pruner=arm)
        out[arm].update(load_1min_before=before, load_1min_after=load(),
                        trials_per_hour=3600 * (out[arm]["completed"] + out[arm]["pruned"]) / out[arm]["wall_s"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", choices=("quality", "pruning"), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--pop", type=int, default=8)
    parser.add_argument("--steps", type=int, default=RUN["total_env_steps"], help="per trial (a smoke test: 300)")
    args = parser.parse_args()
    full = args.steps == RUN["total_env_steps"]
    run = dict(RUN) if full else smoke(args.steps)
    if args.study == "pruning":  # intermediate values for the pruner (a smoke test: 3 evaluations)
        run["eval_interval"] = PRUNING_EVAL_INTERVAL if full else args.steps // 3
    result = {"study": f"sweep_{args.study}", "run": run, "trials": args.trials, "pop": args.pop,
              "margin": margin(), "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
              "shared_machine": True, "seeds": []}
    per_seed = quality_seed if args.study == "quality" else pruning_seed
    work = Path(tempfile.mkdtemp(prefix=f"sweep-{args.study}-"))
    cache = str(work / "xla-cache")
    try:
        warm_cache(work, cache, args.pop, run, **({"pruner": "median"} if args.study == "pruning" else {}))
        for seed in range(args.seeds):
            arms = per_seed(work / str(seed), seed, args.trials, args.pop, cache, run)
            shutil.rmtree(work / str(seed), ignore_errors=True)
            result["seeds"].append({"seed": seed, **arms})
            print(json.dumps(result["seeds"][-1]), flush=True)
            args.out.write_text(json.dumps(result, indent=2) + "\n")  # each seed as it ends: a kill keeps the rest
    finally:
        shutil.rmtree(work, ignore_errors=True)
    from popjax_bench import report_sweeps

    print("\n".join(report_sweeps.SECTIONS[result["study"]](result)))


if __name__ == "__main__":
    main()
