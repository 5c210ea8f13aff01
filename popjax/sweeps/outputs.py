"""What a finished sweep leaves in its directory: trials.csv, best.yaml (a runnable ``popjax train`` config),
importances.json (Optuna's hparam importances) and plots/ (optimisation history, parallel coordinates)."""

from __future__ import annotations

import csv
import io
import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from popjax.learners import LEARNERS
from popjax.population.hparams import hparam_bounds
from popjax.sweeps.scheduler import OWNER
from popjax.sweeps.space import decode

TRAINING_ONLY = ("search_space", "progress")  # options of the sweep's config that the best trial's config drops


def write_outputs(study, out: Path, config: Mapping[str, Any], sweep_id: str) -> list[Path]:
    """Writes the sweep's outputs; returns their paths. Plots and importances need two completed trials."""
    from optuna.trial import TrialState

    mine = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get(OWNER) == sweep_id]
    written = [_trials_csv(mine, out / "trials.csv")]
    complete = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    if complete:
        best = max(complete, key=lambda t: t.value)
        written.append(_best_yaml(best, config, study, out / "best.yaml"))
    if len(complete) >= 2:
        written += _importances_and_plots(study, out)
    return written


def _trials_csv(trials, path: Path) -> Path:
    names = sorted({name for t in trials for name in t.params})
    columns = ["number", "state", "value", *names, "env_steps", "updates", "slot", "generation", "refilled"]
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for t in trials:
        writer.writerow({"number": t.number, "state": t.state.name, "value": "" if t.value is None else t.value,
                         **t.params, **{k: t.user_attrs.get(k, "") for k in columns[3 + len(names):]}})
    _write(path, text.getvalue())
    return path


def trial_options(config: Mapping[str, Any], params: Mapping[str, Any], pop_size: int = 1) -> dict[str, Any]:
    """The ``popjax train`` options of a trial: the sweep's run config with the trial's hparams over ``pop_size``
    members (each its own seed stream); its static options (params that are no hparam) go to ``learner_config``."""
    traced = set(hparam_bounds(LEARNERS[config["learner"]].hparams_cls))
    options = {k: v for k, v in config.items() if k not in TRAINING_ONLY}
    options["pop_size"] = pop_size
    options["hparams"] = {**dict(options.get("hparams") or {}), **{k: v for k, v in params.items() if k in traced}}
    static = {k: decode(v) for k, v in params.items() if k not in traced}
    if static:
        options["learner_config"] = {**dict(options.get("learner_config") or {}), **static}
    return options


def _best_yaml(best, config: Mapping[str, Any], study, path: Path) -> Path:
    options = trial_options(config, best.params)
    header = (f"# popjax sweep: the best completed trial of study {study.study_name!r}: trial {best.number}, "
              f"objective {best.value:.6g}\n# retrain it: popjax train --config {path.name} "
              "(pop_size: N retrains it over N members, each its own seed stream)\n")
    _write(path, header + yaml.safe_dump(options, sort_keys=False))
    return path


def _importances_and_plots(study, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna

    written = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", "Attempting to set identical", UserWarning)  # a param with one value
        try:
            importances = optuna.importance.get_param_importances(study)
        except (RuntimeError, ValueError) as err:  # e.g. every completed trial has the same params
            importances = {"unavailable": str(err).splitlines()[0]}
        path = out / "importances.json"
        _write(path, json.dumps(importances, indent=2) + "\n")
        written.append(path)
        (out / "plots").mkdir(exist_ok=True)
        for name, draw in (("optimization_history.png", optuna.visualization.matplotlib.plot_optimization_history),
                           ("parallel_coordinates.png", optuna.visualization.matplotlib.plot_parallel_coordinate)):
            axes = draw(study)
            figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
            figure.savefig(out / "plots" / name, dpi=100, bbox_inches="tight")
            plt.close(figure)
            written.append(out / "plots" / name)
    return written


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
