"""A sweep's own options (trials, sampler, pruner, objective, storage), checked before anything is written.

Each bad value is one ``ConfigError`` line ``field: problem (allowed: ...)``. Samplers and pruners are Optuna's,
made from their names here; the Python API also takes an Optuna sampler or pruner object.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

from popjax.config import ConfigError

SAMPLERS = ("tpe", "cmaes", "random", "qmc", "gp")
PRUNERS = ("none", "median", "successive_halving", "hyperband")
OBJECTIVES = ("final", "last_k", "auc")
INSTALL = "pip install 'popjax[sweep]'"


def require_optuna():
    """The ``optuna`` module, or one line naming the install command."""
    try:
        import optuna
    except ModuleNotFoundError as err:
        if err.name not in ("optuna", "sqlalchemy", "alembic", "colorlog", "tqdm"):
            raise
        raise ConfigError(f"sweep: Optuna is not installed ({err.name} is missing): {INSTALL}") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # popjax reports the trials itself
    return optuna


@dataclasses.dataclass(frozen=True)
class SweepOptions:
    """What a sweep adds to a run's configuration (stored in ``sweep.yaml``; ``popjax sweep --resume`` reads it).

    ``n_trials``: the trials this sweep finishes (completed or pruned; trials of other processes sharing the study
    are theirs); ``objective``: ``final`` (the last evaluation, at the trial's budget), ``last_k`` (the mean of the
    last ``last_k`` evaluations) or ``auc`` (the mean of all its evaluations: the area under its evaluation curve
    over the budget, evaluations being equally spaced); ``storage``: an SQLAlchemy URL, default a SQLite file
    ``study.db`` in the sweep directory; ``study``: the study's name (sweeps sharing one study use the same)."""

    n_trials: int
    sampler: str = "tpe"
    pruner: str = "none"
    objective: str = "final"
    last_k: int = 3
    storage: str | None = None
    study: str | None = None

    def __post_init__(self):
        if isinstance(self.n_trials, bool) or not isinstance(self.n_trials, int) or self.n_trials < 1:
            raise ConfigError(f"n_trials: expected an integer >= 1, got {self.n_trials!r}")
        for field, allowed in (("sampler", SAMPLERS), ("pruner", PRUNERS), ("objective", OBJECTIVES)):
            value = getattr(self, field)
            if not isinstance(value, str) or value not in allowed:
                raise ConfigError(f"{field}: {value!r} unknown (allowed: {', '.join(allowed)})")
        if isinstance(self.last_k, bool) or not isinstance(self.last_k, int) or self.last_k < 1:
            raise ConfigError(f"last_k: expected an integer >= 1, got {self.last_k!r}")
        if self.study is not None and (not isinstance(self.study, str) or not self.study.strip()):
            raise ConfigError(f"study: expected a non-empty name, got {self.study!r}")
        if self.storage is not None:
            check_storage_url(self.storage)
        if self.sampler == "gp" and importlib.util.find_spec("torch") is None:
            raise ConfigError("sampler: gp (Optuna's GPSampler) needs PyTorch: pip install torch (allowed without "
                              f"it: {', '.join(s for s in SAMPLERS if s != 'gp')})")


def check_storage_url(url: Any) -> None:
    """An SQLAlchemy URL whose dialect and driver are installed (nothing is connected or written); a SQLite file's
    folder must exist."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    if not isinstance(url, str) or not url:
        raise ConfigError(f"storage: expected an SQLAlchemy URL such as sqlite:///study.db, got {url!r}")
    try:
        parsed = make_url(url)
        create_engine(parsed).dispose()  # imports the dialect and its driver; connects to nothing
    except (ArgumentError, NoSuchModuleError, ValueError) as err:
        raise ConfigError(f"storage: {url!r} is not a usable SQLAlchemy URL ({str(err).splitlines()[0]}; e.g. "
                          "sqlite:///study.db, postgresql://user@host/db)") from None
    except ModuleNotFoundError as err:
        raise ConfigError(f"storage: {url!r} needs the database driver {err.name}, which is not installed") from None
    if parsed.get_backend_name() == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            raise ConfigError(f"storage: {url!r} is an in-memory SQLite database; a sweep needs a file "
                              "(sqlite:///path/study.db)")
        folder = Path(parsed.database).absolute().parent
        if not folder.is_dir():
            raise ConfigError(f"storage: the folder of {parsed.database} does not exist ({folder})")


def make_sampler(name_or_sampler: Any, seed: int):
    """An Optuna sampler from its name (seeded), or the sampler object given."""
    optuna = require_optuna()
    if not isinstance(name_or_sampler, str):
        return name_or_sampler
    if name_or_sampler == "tpe":  # constant liar: trials asked together (one population) get distinct proposals
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
    if name_or_sampler == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed)
    if name_or_sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name_or_sampler == "qmc":
        return optuna.samplers.QMCSampler(seed=seed)
    return optuna.samplers.GPSampler(seed=seed)


def make_pruner(name_or_pruner: Any, eval_interval: int, budget: int):
    """An Optuna pruner from its name, or the pruner object given. Steps are a trial's env steps."""
    optuna = require_optuna()
    if not isinstance(name_or_pruner, str):
        return name_or_pruner
    if name_or_pruner == "median":
        return optuna.pruners.MedianPruner()
    if name_or_pruner == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=eval_interval)
    if name_or_pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=eval_interval, max_resource=budget)
    return optuna.pruners.NopPruner()


def objective_value(kind: str, last_k: int, returns: list[float]) -> float:
    """The objective of a trial's evaluation returns so far (oldest first)."""
    if not returns:
        return float("nan")
    if kind == "final":
        return float(returns[-1])
    if kind == "last_k":
        tail = returns[-last_k:]
        return float(sum(tail) / len(tail))
    return float(sum(returns) / len(returns))
