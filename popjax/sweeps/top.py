"""The top trials of a sweep retrained as run directories, and ``popjax compare`` over them.

A trial is one member of a population that no longer exists: it leaves an evaluation curve in the study, not a run
directory, and one seed. ``popjax compare`` reads run directories (config.yaml, metrics.csv, summary.json) and
needs several seeds per group to give an interval. So the ``k`` best completed trials are each trained again by
``popjax train`` with the sweep's run config and the trial's hparams over ``seeds`` independent members, into
``<sweep>/top/trial<N>``, and compared grouped by directory name into ``<sweep>/compare`` (the best trial is the
baseline). Every retrain uses the sweep's seed, so member m of each trial draws the same seed stream: the groups
are paired by seed. The retrained scores are fresh draws, free of the selection that made a trial the best of the
study (its sweep objective is the maximum of many noisy ones).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from popjax.comparison import Comparison, compare
from popjax.config import ConfigError, make_config
from popjax.experiment import train
from popjax.sweeps.outputs import trial_options

TOP_DIR, COMPARE_DIR = "top", "compare"


@dataclasses.dataclass
class TopResult:
    """The retrained trials' run directories (best first), their trial numbers, and the comparison."""

    runs: list[Path]
    trials: list[int]
    comparison: Comparison


def check_top(out: Path, top: Any, seeds: Any, least: int = 0) -> None:
    """``top`` (0: no retraining) and ``seeds`` are integers >= 1, and ``out`` holds no top/ or compare/ yet."""
    for name, value, low in (("top", top, least), ("top_seeds", seeds, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{name}: expected an integer >= {low}, got {value!r}")
    for folder in (TOP_DIR, COMPARE_DIR) if top else ():
        if (out / folder).exists():
            raise ConfigError(f"top: {out / folder} exists (the top trials were retrained already: compare them with "
                              f"popjax compare {out / TOP_DIR}/* --label name, or remove {out / folder})")


def best_trials(study, k: int) -> list:
    """The study's ``k`` best completed trials (highest objective first; ties: the earlier trial)."""
    from optuna.trial import TrialState

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return sorted(complete, key=lambda t: (-t.value, t.number))[:k]


def retrain_top(study, config: Mapping[str, Any], out: Path, k: int, seeds: int,
                compile_cache: str | Path | None = None) -> TopResult:
    """Retrains the ``k`` best completed trials over ``seeds`` members each and compares them (module docstring).
    Everything is checked before anything is written: the trials exist, the folders are new, the configs valid."""
    check_top(out, k, seeds, least=1)
    trials = best_trials(study, k)
    if not trials:
        raise ConfigError("top: the study has no completed trial to retrain")
    options = {t.number: trial_options(config, t.params, pop_size=seeds) for t in trials}
    for opts in options.values():
        make_config(**opts)  # one line, before any training
    runs = []
    for t in trials:
        run = train(options[t.number], out_dir=out / TOP_DIR / f"trial{t.number}", compile_cache=compile_cache,
                    progress=False)
        runs.append(Path(run.out_dir))
    comparison = compare(runs, label="name", out=out / COMPARE_DIR)
    return TopResult(runs, [t.number for t in trials], comparison)
