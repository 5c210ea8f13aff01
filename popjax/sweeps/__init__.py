"""``popjax.sweep`` and ``popjax.resume_sweep``: Optuna studies whose trials train as one vmapped population.

Trials are asked in batches of ``pop_size`` and trained by one compiled ``independent`` population
(``popjax.sweeps.slots``); a pruned trial's slot is refilled in place (``popjax.sweeps.scheduler``). The study
lives in Optuna's RDB storage: ``<dir>/study.db`` (SQLite) unless ``storage`` names another SQLAlchemy URL, which
several processes may share. The sweep directory holds ``sweep.yaml`` (what ``resume_sweep`` reads), the study,
and at the end trials.csv, best.yaml, importances.json and plots/ (``popjax.sweeps.outputs``); with ``top``, the
best trials retrained as run directories in top/ and ``popjax compare`` over them in compare/
(``popjax.sweeps.top``). A static option searched over a list of values (``popjax.sweeps.space``) gives one
population per combination of values, each compiled once and run in turn, ``n_trials`` shared out between them.

Resume after a kill: the trials that were running are told FAIL and their params re-queued (``enqueue_trial``),
so each is trained again from its start. They cannot continue: a member's state lives only in the population
(no per-member checkpoint), and a trial that was told nothing must not count; failing it keeps the study's record
true (it ran and did not finish), re-queueing keeps the sampler's proposal. Completed and pruned trials are never
touched, so none is counted twice.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from popjax import compile_cache
from popjax.config import ConfigError, RunConfig, make_config
from popjax.drivers.independent import DEFINITION as INDEPENDENT
from popjax.learners import LEARNERS
from popjax.presets import apply_preset
from popjax.rundir import RunLock
from popjax.sweeps.options import SweepOptions, make_pruner, make_sampler, require_optuna
from popjax.sweeps.scheduler import OWNER, finished_here, run_trials
from popjax.sweeps.space import (
    as_plain,
    combinations,
    distributions,
    encode,
    resolve_space,
    split_static,
    static_distributions,
)
from popjax.sweeps.top import TopResult, check_top, retrain_top

SWEEP_FILE = "sweep.yaml"  # marks a sweep directory popjax created


@dataclasses.dataclass
class SweepResult:
    """What ``sweep`` returns: the directory, the study, and the compiled programs' trace counts."""

    out_dir: Path
    study: Any
    traces: dict[str, int]
    written: list[Path]
    top: TopResult | None = None

    @property
    def best(self):
        """The study's best completed trial (an Optuna ``FrozenTrial``)."""
        return self.study.best_trial


def sweep(config: RunConfig | Mapping[str, Any] | None = None, *, out_dir: str | Path = "sweeps/latest",
          n_trials: int | None = None, search_space: str | Mapping[str, Any] | None = None, sampler: Any = "tpe",
          pruner: Any = "none", objective: str = "final", last_k: int = 3, storage: str | None = None,
          study: str | None = None, instrument: Callable[[str, Any], Callable] | None = None,
          compile_cache: str | Path | None = None, on_trial: Callable[[Any, str, float], None] | None = None,
          top: int = 0, top_seeds: int = 4, **options: Any) -> SweepResult:
    """Runs an Optuna study over the learner's traced hparams, ``pop_size`` trials at a time in one population.

    Args:
      config, options: the run's options as for ``popjax.train`` (``pop_size`` is the batch of trials trained
        together; ``total_env_steps`` each trial's budget; ``eval_interval`` where intermediate values are
        reported). The driver is ``independent``.
      out_dir: a new (or empty) sweep directory.
      n_trials: trials this sweep finishes (default ``pop_size``).
      search_space: a name of ``SEARCH_SPACES``, or ``{hparam: range}`` (``popjax.sweeps.space``); default the
        config's ``search_space``, else the learner's named space.
      sampler: ``tpe``, ``cmaes``, ``random``, ``qmc``, ``gp``, or an Optuna sampler object.
      pruner: ``none``, ``median``, ``successive_halving``, ``hyperband``, or an Optuna pruner object.
      objective: ``final``, ``last_k`` (mean of the last ``last_k`` evaluations) or ``auc``.
      storage: an SQLAlchemy URL (default ``sqlite:///<out_dir>/study.db``); study: the study's name.
      instrument: as for ``popjax.train``; on_trial: ``(trial, state name, value)`` after each finished trial.
      top, top_seeds: after the study, retrain its ``top`` best completed trials over ``top_seeds`` seeds each
        (``popjax train`` runs in ``<out_dir>/top/``) and compare them (``<out_dir>/compare/``); 0: none.

    Raises:
      ConfigError: one line, before anything is written.
    """
    require_optuna()
    raw = {**_mapping(config), **options}
    given_space = raw.pop("search_space", None) or None
    space_arg = search_space if search_space is not None else given_space
    if raw.get("driver", INDEPENDENT.name) != INDEPENDENT.name:  # the population whose slots it refills
        raise ConfigError(f"driver: a sweep trains its trials with the {INDEPENDENT.name} driver (allowed: "
                          f"{INDEPENDENT.name}), got {raw['driver']!r}")
    learner = raw.get("learner", "td3")
    if learner not in LEARNERS:
        make_config(**raw)  # the usual one-line refusal of an unknown learner
    space_arg, static = split_static(space_arg, learner, LEARNERS[learner], _config_fields(learner))
    plain = as_plain(resolve_space(space_arg, learner, LEARNERS[learner], static_fields=_static_fields(learner)))
    preset = apply_preset({**raw, "search_space": plain})  # preset hparams leave the searched ones alone
    preset.pop("search_space")
    run_config = make_config(**preset)
    space = resolve_space(plain, learner, LEARNERS[learner], fixed=tuple(run_config.hparams))
    opts = _sweep_options(n_trials or run_config.pop_size, sampler, pruner, objective, last_k, storage, study,
                          run_config)
    _check_cadence(run_config)
    groups = _groups(run_config, static)  # every combination's config checked before anything is written
    out = Path(out_dir)
    _check_new_sweep(out)
    check_top(out, top, top_seeds)
    _use_compile_cache(compile_cache, out)
    sweep_id = uuid.uuid4().hex
    external = _open_storage(opts.storage) if opts.storage is not None else None  # before anything is written
    from popjax.sweeps.slots import SlotPopulation

    population = SlotPopulation(groups[0][1], instrument)  # builds and checks the run; writes nothing
    with RunLock(out):
        saved = {"sweep_id": sweep_id, "config": run_config.to_dict(),
                 "sweep": {**dataclasses.asdict(opts), "sampler": _name(sampler), "pruner": _name(pruner)},
                 "search_space": as_plain(space), "static": {k: list(v) for k, v in static.items()}}
        _write_yaml(out / SWEEP_FILE, saved)
        storage_ = external if external is not None else _open_storage(_default_storage(out))
        return _run(storage_, _Groups(run_config, groups, population, instrument), opts, space, static, sweep_id,
                    out, sampler, pruner, on_trial, top=(top, top_seeds, compile_cache))


def resume_sweep(out_dir: str | Path, *, sampler: Any = None, pruner: Any = None,
                 instrument: Callable[[str, Any], Callable] | None = None, compile_cache: str | Path | None = None,
                 on_trial: Callable[[Any, str, float], None] | None = None, top: int = 0,
                 top_seeds: int = 4) -> SweepResult:
    """Continues a killed (or finished) sweep: its running trials are failed and re-queued (module docstring),
    then trials run until ``n_trials`` of this sweep are finished. ``sampler``/``pruner``: the objects a sweep
    started with them must be given again (their names are in sweep.yaml otherwise). ``top``/``top_seeds`` as
    for ``sweep`` (a finished sweep resumed with ``top`` only retrains and compares its best trials)."""
    require_optuna()
    out = Path(out_dir)
    saved = _read_sweep(out)
    check_top(out, top, top_seeds)
    run_config = make_config(**saved["config"])
    learner_def = LEARNERS[run_config.learner]
    space = resolve_space(saved["search_space"], run_config.learner, learner_def, fixed=tuple(run_config.hparams))
    static = {k: tuple(v) for k, v in (saved.get("static") or {}).items()}
    groups = _groups(run_config, static)
    stored = dict(saved["sweep"])
    for name, given in (("sampler", sampler), ("pruner", pruner)):
        if given is None and stored[name].startswith("object:"):
            raise ConfigError(f"{name}: this sweep ran with an Optuna {name} object ({stored[name][7:]}); pass it "
                              f"again: popjax.resume_sweep(..., {name}=...)")
    sampler = sampler if sampler is not None else stored["sampler"]
    pruner = pruner if pruner is not None else stored["pruner"]
    opts = _sweep_options(stored["n_trials"], sampler, pruner, stored["objective"], stored["last_k"],
                          stored["storage"], stored["study"], run_config)
    _use_compile_cache(compile_cache, out)
    from popjax.sweeps.slots import SlotPopulation

    with RunLock(out):  # a sweep still writing this directory is refused here
        storage_ = _open_storage(opts.storage if opts.storage is not None else _default_storage(out))
        population = SlotPopulation(groups[0][1], instrument)  # checks the run before the study is touched
        study_ = _study(storage_, opts, sampler, pruner, run_config)
        requeue_interrupted(study_, saved["sweep_id"])
        return _run(storage_, _Groups(run_config, groups, population, instrument), opts, space, static,
                    saved["sweep_id"], out, sampler, pruner, on_trial, study_=study_,
                    top=(top, top_seeds, compile_cache))


def requeue_interrupted(study, sweep_id: str) -> list[int]:
    """Tells FAIL to this sweep's trials left RUNNING by a kill and enqueues their params again; returns their
    numbers. Other sweeps' running trials (a shared study) are theirs and left alone."""
    from optuna.trial import TrialState

    stale = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
             if t.user_attrs.get(OWNER) == sweep_id]
    for t in stale:
        study.tell(t.number, state=TrialState.FAIL)
        study.enqueue_trial(t.params, user_attrs={"requeued_from": t.number})
    return [t.number for t in stale]


@dataclasses.dataclass
class _Groups:
    """The sweep's run config; one ``(static values, run config)`` per combination of static options
    (``[({}, config)]`` without any); the first group's population when it was built already (to check the run)."""

    base: RunConfig
    members: list[tuple[dict[str, Any], RunConfig]]
    first: Any
    instrument: Any


def _groups(config: RunConfig, static: Mapping[str, tuple]) -> list[tuple[dict[str, Any], RunConfig]]:
    """Each combination of static values with the run config that trains it (checked by ``make_config``)."""
    if not static:
        return [({}, config)]
    base = config.to_dict()
    return [(combo, make_config(**{**base, "learner_config": {**(base.get("learner_config") or {}), **combo}}))
            for combo in combinations(static)]


def _targets(n_trials: int, groups: int) -> list[int]:
    """The finished trials this sweep counts once each group is done: ``n_trials`` shared out, the first groups
    taking the remainder (group g runs until the sweep has finished ``targets[g]``)."""
    shares = [n_trials // groups + (g < n_trials % groups) for g in range(groups)]
    return [sum(shares[:g + 1]) for g in range(groups)]


def _run(storage, groups: _Groups, opts: SweepOptions, space, static, sweep_id: str, out: Path, sampler, pruner,
         on_trial, study_=None, top: tuple = (0, 4, None)) -> SweepResult:
    """Runs the groups one after another, each in a population of its own (compiled once), trials asked with the
    group's static values fixed (Optuna's ``PartialFixedSampler`` around the sweep's sampler)."""
    from popjax.sweeps.outputs import write_outputs
    from popjax.sweeps.slots import SlotPopulation

    optuna = require_optuna()
    config = groups.base
    traces: dict[str, int] = {}
    try:
        if study_ is None:
            study_ = _study(storage, opts, sampler, pruner, config)
        base_sampler, dists = study_.sampler, {**distributions(space), **static_distributions(static)}
        targets = _targets(opts.n_trials, len(groups.members))
        for index, ((combo, group_config), target) in enumerate(zip(groups.members, targets, strict=True)):
            if finished_here(study_, sweep_id) >= target:  # a resumed sweep: this group is done
                if index == 0 and groups.first is not None:
                    groups.first.close()
                    groups.first = None
                continue
            if index == 0 and groups.first is not None:  # built to check the run: group 0's
                population, groups.first = groups.first, None
            else:
                population = SlotPopulation(group_config, groups.instrument)
            fixed = {name: encode(value) for name, value in combo.items()}
            with warnings.catch_warnings():  # experimental since Optuna 2.4, unchanged since
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study_.sampler = optuna.samplers.PartialFixedSampler(fixed, base_sampler) if fixed else base_sampler
            try:
                run_trials(study_, population, dataclasses.replace(opts, n_trials=target), dists, sweep_id,
                           on_trial, fixed)
            finally:
                population.close()
                study_.sampler = base_sampler
            traces.update({name if not static else f"{name}@{index}": n for name, n in population.traces.items()})
    finally:
        if groups.first is not None:  # built to check the run, never used (an error came first)
            groups.first.close()
    written = write_outputs(study_, out, config.to_dict(), sweep_id)
    k, seeds, cache = top
    retrained = retrain_top(study_, config.to_dict(), out, k, seeds, cache) if k else None
    return SweepResult(out, study_, traces, written, retrained)


def _study(storage, opts: SweepOptions, sampler, pruner, config: RunConfig):
    optuna = require_optuna()
    name = opts.study or f"popjax-{config.learner}-{config.env}"
    try:
        return optuna.create_study(storage=storage, study_name=name, direction="maximize", load_if_exists=True,
                                   sampler=make_sampler(sampler, config.seed),
                                   pruner=make_pruner(pruner, config.eval_interval, config.total_env_steps))
    except ValueError as err:  # e.g. an existing study of that name minimises
        raise ConfigError(f"study: {name!r} cannot be used ({str(err).splitlines()[0]})") from None


def _sweep_options(n_trials, sampler, pruner, objective, last_k, storage, study, config) -> SweepOptions:
    del config
    return SweepOptions(n_trials=n_trials, sampler=sampler if isinstance(sampler, str) else "tpe",
                        pruner=pruner if isinstance(pruner, str) else "none", objective=objective, last_k=last_k,
                        storage=storage, study=study)


def _name(obj: Any) -> str:
    return obj if isinstance(obj, str) else f"object:{type(obj).__name__}"


def _run_fields() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(RunConfig))


def _config_fields(learner: str) -> tuple[str, ...]:
    """The learner config's own options (those the run sets, such as batch_size, are run options)."""
    return tuple(f.name for f in dataclasses.fields(LEARNERS[learner].config_cls) if f.name not in _run_fields())


def _static_fields(learner: str) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(LEARNERS[learner].config_cls)) + _run_fields()


def _check_cadence(config: RunConfig) -> None:
    """A trial's evaluations and budget fall on whole iterations (refills happen at evaluations)."""
    per_iteration = config.rollout_len * config.envs_per_member
    for field in ("total_env_steps", "eval_interval"):
        value = getattr(config, field)
        if value % per_iteration:
            raise ConfigError(f"{field}: a sweep needs a multiple of the env steps per iteration (rollout_len x "
                              f"envs_per_member = {per_iteration}), got {value}")


def _check_new_sweep(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out_dir: {out} is a file, not a directory")
    if out.is_dir() and any(out.iterdir()):
        if (out / SWEEP_FILE).is_file():
            raise ConfigError(f"out_dir: {out} holds a sweep; continue it with `popjax sweep --resume {out}` or "
                              "choose another --out")
        raise ConfigError(f"out_dir: {out} is not empty and popjax did not create it; choose another --out")


def _read_sweep(out: Path) -> dict[str, Any]:
    path = out / SWEEP_FILE
    if not path.is_file():
        raise ConfigError(f"resume: {out} is not a sweep directory (no {SWEEP_FILE})")
    try:
        saved = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise ConfigError(f"resume: {path} cannot be read ({str(err).splitlines()[0]})") from None
    if not isinstance(saved, dict) or not {"sweep_id", "config", "sweep", "search_space"} <= set(saved):
        raise ConfigError(f"resume: {path} is not a sweep file popjax wrote (cut or edited?)")
    return saved


def _default_storage(out: Path) -> str:
    return f"sqlite:///{(out / 'study.db').absolute()}"


def _open_storage(url: str, attempts: int = 10):
    """Optuna's RDB storage for ``url`` (SQLite waits up to a minute for another process's write).

    Two processes opening a new database both create its tables, and the slower one fails on what the
    other just made ("table ... already exists", a duplicate schema version); once the schema is whole,
    opening it again succeeds, so that race is retried.
    """
    optuna = require_optuna()
    from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError

    engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    for attempt in range(attempts):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=engine)
        except (SQLAlchemyError, OSError, ValueError) as err:
            lost_schema_race = isinstance(err, IntegrityError) or (
                isinstance(err, OperationalError) and "already exists" in str(err))
            if not lost_schema_race or attempt == attempts - 1:
                raise ConfigError(f"storage: {url!r} cannot be opened ({str(err).splitlines()[0]})") from None
            time.sleep(0.2 * (attempt + 1))


def _use_compile_cache(setting, out: Path) -> None:
    try:
        compile_cache.enable(setting, out)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _write_yaml(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(yaml.safe_dump(dict(data), sort_keys=False))
    tmp.replace(path)


def _mapping(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if isinstance(config, RunConfig):
        return config.to_dict()
    if not isinstance(config, Mapping):
        raise ConfigError(f"config: expected a RunConfig or a mapping of options, got {type(config).__name__}")
    return dict(config)


__all__ = ["SweepOptions", "SweepResult", "finished_here", "requeue_interrupted", "resume_sweep", "sweep"]
