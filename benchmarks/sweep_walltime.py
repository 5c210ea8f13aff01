"""Wall time of 32 TD3 trials on probe:pendulum at equal per-trial budget (issue 47).

Three ways of running the same study (TPE, seed 0, the td3 search space, 5k env steps per trial, hidden (64, 64)):

- ``popjax``: ``popjax.sweep`` with pop 8 (4 generations of 8 trials, each generation one population);
- ``in_process``: Optuna's ``study.optimize`` one trial at a time, ``popjax.train`` with pop 1 in the objective
  (compile cache warm: a trial's programs are loaded from JAX's persistent cache after the first of its shape);
- ``per_process``: one ``popjax train`` process per trial (what tuner.py-style scripts do), cache warm.

Each arm's wall time includes everything a user waits for (compilation, the study's database). The 1-minute load
average before and after each arm is written beside it: this 2-core machine is shared, so the figures are
indicative only.

    PYTHONPATH=. .venv/bin/python benchmarks/sweep_walltime.py --out benchmarks/results/sweep_walltime.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUN = dict(learner="td3", env="probe:pendulum", total_env_steps=5_000, warmup_steps=1_000, rollout_len=50,
           eval_interval=5_000, eval_episodes=1, batch_size=256, buffer_size=5_000, learner_config={"hidden": [64, 64]},
           progress=False, seed=0)


def load() -> float:
    return os.getloadavg()[0]


def smoke(steps: int) -> dict:
    """``RUN`` cut to ``steps`` env steps per trial, with a small warm-up and batch: a test of the code only."""
    return {**RUN, "total_env_steps": steps, "eval_interval": steps, "warmup_steps": 100, "batch_size": 16}


def arm_popjax(work: Path, trials: int, pop: int, cache: str, run: dict | None = None, name: str = "sweep",
               **sweep_options) -> dict:
    """``popjax.sweep`` of ``trials`` trials, ``pop`` at a time (TPE seeded with ``run["seed"]``, the study seed)."""
    from optuna.trial import TrialState

    import popjax

    start = time.perf_counter()
    result = popjax.sweep(out_dir=work / name, n_trials=trials, pop_size=pop, search_space="td3",
                          compile_cache=cache, **(run or RUN), **sweep_options)
    wall = time.perf_counter() - start
    finished = [t for t in result.study.get_trials() if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    complete = [t for t in finished if t.state == TrialState.COMPLETE]
    return {"wall_s": wall, "best": max(t.value for t in complete), "completed": len(complete),
            "pruned": len(finished) - len(complete),
            "trial_env_steps": sum(t.user_attrs["env_steps"] for t in finished)}


def _study(storage: str, seed: int = 0):
    import optuna

    from popjax.learners import LEARNERS
    from popjax.population.search_spaces import SEARCH_SPACES
    from popjax.sweeps.options import make_sampler
    from popjax.sweeps.space import distributions, resolve_space

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=storage, direction="maximize", sampler=make_sampler("tpe", seed))
    space = distributions(resolve_space(SEARCH_SPACES["td3"], "td3", LEARNERS["td3"]))
    return study, space


def arm_in_process(work: Path, trials: int, cache: str, run: dict | None = None) -> dict:
    """Optuna asking one trial at a time (the same TPE, seeded with ``run["seed"]``), ``popjax.train`` pop 1."""
    import popjax

    run = run or RUN
    study, space = _study(f"sqlite:///{work / 'in_process.db'}", run["seed"])
    start = time.perf_counter()
    for _ in range(trials):
        trial = study.ask(space)
        result = popjax.train(out_dir=work / "in_process" / str(trial.number), pop_size=1, hparams=trial.params,
                              compile_cache=cache, **run)
        study.tell(trial, result.summary["final_returns"][0])
    return {"wall_s": time.perf_counter() - start, "best": study.best_value, "completed": len(study.trials)}


def warm_cache(work: Path, cache: str, pop: int, run: dict | None = None, **sweep_options) -> None:
    """Fills the compile cache outside the timed arms: pop 1 for every policy delay (TD3 fixes a delay all its
    members share, one program each), and one generation of the sweep."""
    import popjax

    run = run or RUN
    for delay in range(1, 6):
        popjax.train(out_dir=work / f"warm{delay}", pop_size=1, hparams={"policy_delay": delay},
                     compile_cache=cache, **run)
    popjax.sweep(out_dir=work / "warm_sweep", n_trials=pop, pop_size=pop, search_space="td3", compile_cache=cache,
                 **run, **sweep_options)


def arm_per_process(work: Path, trials: int, cache: str) -> dict:
    import yaml

    study, space = _study(f"sqlite:///{work / 'per_process.db'}")
    start = time.perf_counter()
    for _ in range(trials):
        trial = study.ask(space)
        out = work / "per_process" / str(trial.number)
        config = work / f"trial{trial.number}.yaml"
        config.write_text(yaml.safe_dump({**RUN, "pop_size": 1, "hparams": trial.params}))
        subprocess.run([sys.executable, "-m", "popjax", "train", "--config", str(config), "--out", str(out),
                        "--compile-cache", cache, "--no-progress"], check=True, capture_output=True)
        study.tell(trial, json.loads((out / "summary.json").read_text())["final_returns"][0])
    return {"wall_s": time.perf_counter() - start, "best": study.best_value, "completed": len(study.trials)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--pop", type=int, default=8)
    parser.add_argument("--arms", default="popjax,in_process,per_process")
    parser.add_argument("--steps", type=int, default=RUN["total_env_steps"], help="per trial (a smoke test: 300)")
    args = parser.parse_args()
    if args.steps != RUN["total_env_steps"]:
        RUN.update(smoke(args.steps))
    work = Path(tempfile.mkdtemp(prefix="sweep-walltime-"))
    cache = str(work / "xla-cache")
    result = {"study": "sweep_walltime", "run": RUN, "trials": args.trials, "pop": args.pop,
              "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()}, "shared_machine": True,
              "arms": {}}
    try:
        warm_cache(work, cache, args.pop)
        for arm in args.arms.split(","):
            before = load()
            if arm == "popjax":
                out = arm_popjax(work, args.trials, args.pop, cache)
            elif arm == "in_process":
                out = arm_in_process(work, args.trials, cache)
            else:
                out = arm_per_process(work, args.trials, cache)
            result["arms"][arm] = {**out, "load_1min_before": before, "load_1min_after": load()}
            print(arm, result["arms"][arm], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
