"""``popjax.train`` and ``popjax.resume``: a configuration in, a run directory out.

A configuration is resolved into a checked ``popjax.resolve.Plan`` (every check of the run, before anything is
written or compiled), ``build`` makes the env runner and the loop from it, and the training itself is
``popjax.loop.Loop``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from popjax import compile_cache, distributed, planning
from popjax.checkpoint import Checkpointer, CheckpointMismatch
from popjax.config import ConfigError, RunConfig, make_config, saved_options
from popjax.drivers import DRIVERS
from popjax.drivers.base import OwnInteraction
from popjax.envs import registry
from popjax.envs.base import make_vec_env
from popjax.envs.runner import HostRunner, JaxRunner
from popjax.loggers import check_installed, close_loggers, open_loggers
from popjax.loop import Loop
from popjax.plots import learning_curves
from popjax.presets import apply_preset
from popjax.resolve import Plan, resolve
from popjax.rundir import RunDir, RunLock, check_new_run


@dataclasses.dataclass
class Run:
    """What ``train`` returns: the run directory, its summary and the final driver state."""

    out_dir: Path
    summary: dict[str, Any]
    state: Any
    config: RunConfig | None = None


def build(plan: Plan | RunConfig, *, instrument: Callable[[str, Any], Callable] | None = None) -> Loop:
    """The env runner and the loop of a checked ``Plan`` (a RunConfig is resolved first); checks nothing itself
    and compiles nothing.

    ``instrument``: optional ``(name, compiled) -> callable`` wrapping every compiled program the loop
    runs (``popjax.loop.Compiler``), for Python callers that observe the loop (the benchmarks time it)."""
    if isinstance(plan, RunConfig):
        plan = resolve(plan)
    config, placement = plan.config, plan.placement
    members = placement.members(config.pop_size)
    if registry.is_jax_env(config.env):
        runner = JaxRunner(make_vec_env(registry.make_jax_env(config.env)), members, config.envs_per_member,
                           common_starts=config.eval_starts == "common")
    else:
        first, count = placement.local_members(config.pop_size)
        runner = HostRunner(lambda n, seed, first_env: registry.make_host_env(config.env, n, seed, first_env), count,
                            config.envs_per_member, config.seed, first, common_starts=config.eval_starts == "common")
    return Loop(config, plan.driver, plan.local, runner, placement, instrument=instrument, plan=plan)


@compile_cache.restoring  # JAX's cache settings are the run's while it runs, the caller's after
def train(config: RunConfig | Mapping[str, Any] | None = None, *, out_dir: str | Path = "runs/latest",
          overwrite: bool = False, instrument: Callable[[str, Any], Callable] | None = None,
          compile_cache: str | Path | None = None, **options: Any) -> Run:
    """Trains a population and writes its run directory.

    Args:
      config: a RunConfig, or a mapping of options as in a config file (checked like one; keyword options
        override it); or pass the fields as keyword options
        (``learner="td3", env="gym:Pendulum-v1", pop_size=8, total_env_steps=200_000, ...``).
      out_dir: the run directory (config.yaml, metrics.csv, summary.json, plots/): a new or
        empty directory, or with ``overwrite`` a run directory popjax created.
      overwrite: replace the run in ``out_dir`` (only popjax's own files are removed).
      instrument: optional ``(name, compiled) -> callable`` wrapping every compiled program of the run
        (``popjax.loop.Compiler``), to observe the loop from Python (e.g. time each call); not a run option.
      compile_cache: JAX's persistent compilation cache: a folder, or ``"off"``; default
        ``$POPJAX_COMPILE_CACHE``, else ``~/.cache/popjax/jax`` (``popjax.compile_cache``); not a run option.
      options: RunConfig fields, and ``preset`` (``"auto"``: fill the options not given from the
        tuned table of ``popjax.presets`` for known (learner, env) pairs; ``"none"``: bare defaults).
        A RunConfig passed as ``config`` is used as it is.

    Returns:
      A ``Run`` with ``summary`` (as in summary.json), ``out_dir`` and the final ``state``.

    Raises:
      ConfigError: invalid options or an unusable ``out_dir``, raised before anything is written
        or compiled.
    """
    if isinstance(config, RunConfig):
        config = make_config(**{**config.to_dict(), **options})  # a RunConfig built directly is validated too
    else:
        config = make_config(**apply_preset({**_options_mapping(config), **options}))
    out_dir = _directory(out_dir)
    check_new_run(out_dir, overwrite)
    check_installed(config.logger)
    _use_compile_cache(compile_cache, out_dir)
    loop = build(resolve(config), instrument=instrument)
    distributed.barrier("popjax-checked")  # every process has checked out_dir before process 0 writes
    run_dir = RunDir(out_dir, writes=distributed.is_writer())
    with _writer_lock(out_dir):
        run_dir.start()
        run_dir.write_config(config.to_dict())
        loop.run_dir, loop.checkpointer = run_dir, _checkpointer(run_dir)
        return _finish(loop, *loop.initial_state())


def plan(config: RunConfig | Mapping[str, Any] | None = None, *, peak_flops: float | str | None = None,
         **options: Any) -> planning.RunPlan:
    """The memory and work of a run at its real shapes (``popjax.planning``), with XLA's analysis of its update
    program compiled at those shapes; nothing is allocated, trained or written (``popjax train --plan``).

    Args:
      config, options: as for ``train`` (``device_memory`` plans against another device's memory).
      peak_flops: FLOP/s for the predicted update time (a number, or ``"989T"``); default: measured here.

    Raises:
      ConfigError: invalid options; ``popjax.planning.DoesNotFit`` (its ``plan`` attached) when the run cannot fit
        in the device's memory, naming the option to lower and about the largest value that fits.
    """
    if isinstance(config, RunConfig):
        config = make_config(**{**config.to_dict(), **options})
    else:
        config = make_config(**apply_preset({**_options_mapping(config), **options}))
    resolved = resolve(config)  # every check of the run; the state alone that cannot fit is refused here
    return planning.check_fits(planning.plan_run(config, resolved.spec, resolved.driver, resolved.local,
                                                 resolved.placement, compile=True, peak_flops=peak_flops))


def _options_mapping(config: Any) -> dict[str, Any]:
    """``train``'s first argument when it is not a RunConfig: None or a mapping of options named by strings."""
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise ConfigError(f"config: expected a RunConfig or a mapping of options (as in a config file), got "
                          f"{type(config).__name__}")
    for key in config:
        if not isinstance(key, str):
            raise ConfigError(f"config: option names are strings, got {key!r}")
    return dict(config)


def _directory(path: Any) -> Path:
    """A run directory argument as a Path; anything but a str or os.PathLike is a one-line ConfigError."""
    if not isinstance(path, str | os.PathLike):
        raise ConfigError(f"out_dir: expected a directory path (a str or os.PathLike), got {type(path).__name__} "
                          f"{path!r}")
    return Path(path)


@compile_cache.restoring
def resume(run_dir: str | Path, *, compile_cache: str | Path | None = None, **overrides: Any) -> Run:
    """Continues a run (killed at any moment, or finished) from its newest usable checkpoint.

    The result equals an uninterrupted run with the same config: every random key is derived
    from (seed, purpose, iteration), and a checkpoint holds the driver state (learner states,
    replay buffers, hparams, driver variables such as PBT's fitness window, counters), the JAX
    env state, the driver's host records (PBT lineage) and the loop's evaluation history. On
    the JAX env path (``probe:``, ``brax:``) the final parameters and summary are bit-identical.
    On the gymnasium path the vector env cannot be snapshotted: after a resume it starts new
    episodes, reset from its construction seed, so the transitions collected from then on (and
    hence the parameters) differ from an uninterrupted run; evaluation episodes use fixed seeds
    either way.

    Rows of metrics.csv logged after the checkpoint are dropped and logged again, so none is
    lost or duplicated. A damaged checkpoint is skipped with a warning and set aside (renamed
    ``damaged-<step>``). Nothing is changed, and a ``ConfigError`` says why, when the config
    cannot be read, when the checkpoints do not fit the config, or when every checkpoint is
    damaged. A finished run is left as it is unless ``total_env_steps`` extends it. One process
    at a time: a run that is being written is refused.

    Args:
      run_dir: a run directory written by ``train``.
      compile_cache: as for ``train``.
      overrides: RunConfig fields to change (e.g. ``total_env_steps`` to extend a run,
        ``progress``).
    """
    rd = RunDir(run_dir)
    config = make_config(**{**rd.read_config(), **overrides})
    rd.check_layout()
    check_installed(config.logger)
    unreadable = rd.scan_metrics()[1]
    if unreadable:  # rows popjax did not write that way: never dropped or rewritten silently
        more = f" (and {len(unreadable) - 1} more)" if len(unreadable) > 1 else ""
        raise ConfigError(f"resume: {rd.metrics_path} {unreadable[0]}{more} cannot be read; repair or remove "
                          "those lines, then resume; nothing was changed")
    _use_compile_cache(compile_cache, rd.path)
    loop = build(config)
    distributed.barrier("popjax-read")  # every process has read the run before process 0 changes it
    rd.writes = distributed.is_writer()
    with _writer_lock(rd.path):
        loop.run_dir, loop.checkpointer = rd, _checkpointer(rd)
        meta = loop.checkpointer.latest_meta()
        if meta is not None and "config" in meta:
            _check_fits(config, meta["config"], rd.path, loop.checkpointer)
            _check_same_processes(meta, rd.path, loop.checkpointer)
        try:
            restored = loop.restore_checkpoint()
        except CheckpointMismatch as err:
            loop.checkpointer.close()
            raise ConfigError(_why_no_fit(rd.path, err, config, (meta or {}).get("config", {}))) from None
        damaged = loop.checkpointer.damaged()
        if restored is None and damaged:
            loop.checkpointer.close()
            raise ConfigError(f"resume: no usable checkpoint in {rd.path} ({len(damaged)} damaged, set aside as "
                              "damaged-<step>); start again with `popjax train --overwrite`")
        if restored is None:  # killed before the first checkpoint: start over (rows without a checkpoint go)
            rd.truncate_metrics(-1)
            restored = loop.initial_state()
        elif (steps := loop.counters(restored[0])[0]) >= config.total_env_steps and (rd.path / "summary.json").exists():
            loop.checkpointer.close()
            _check_finished_metrics(rd, steps, config)
            return Run(rd.path, rd.read_summary(), restored[0])  # finished: nothing to do, nothing written
        else:
            if not rd.metrics_path.exists() and loop.history:  # rows were logged at evaluations
                warnings.warn(f"resume: {rd.metrics_path} is missing: the rows up to {steps} env steps are lost; "
                              "the run continues and logs the rows from there", RuntimeWarning, stacklevel=2)
            rd.drop_partial_metrics_row()
            rd.truncate_metrics(loop.counters(restored[0])[0])
        if overrides:
            rd.write_config(config.to_dict())
        return _finish(loop, *restored)


def _check_finished_metrics(rd: RunDir, env_steps: int, config: RunConfig) -> None:
    """A finished run whose metrics.csv lost rows of its final evaluation (cut, or the file deleted): a one-line
    ConfigError saying what is missing and that resume changed nothing (retraining would be needed to log the rows
    again, and on the gymnasium path it would not reproduce them)."""
    missing = rd.missing_final_rows(env_steps, config.pop_size)
    if missing is not None:
        raise ConfigError(f"resume: {rd.path} is finished ({env_steps} of {config.total_env_steps} env steps) but "
                          f"{missing}; resume trained nothing and changed nothing (summary.json holds the final "
                          f"returns); to log the rows again, rerun it: popjax train --config {rd.path / 'config.yaml'} "
                          f"--out {rd.path} --overwrite")


def load(run_dir: str | Path) -> Run:
    """A run's config, summary and newest checkpointed state, read only (nothing trained or written)."""
    rd = RunDir(run_dir)
    config = make_config(**rd.read_config())
    loop = build(config)
    loop.run_dir, loop.checkpointer = rd, _checkpointer(rd)
    try:
        restored = loop.restore_checkpoint()
    finally:
        loop.checkpointer.close()
        if not loop.runner.jax_path:
            loop.runner.close()
    if restored is None:
        raise ConfigError(f"no usable checkpoint in {rd.path}")
    summary = rd.read_summary() if (rd.path / "summary.json").exists() else {}
    return Run(rd.path, summary, restored[0], config)


# RunConfig fields a resume may change: they set the budget, cadence and placement, not what the
# checkpointed state means.
CHANGEABLE_ON_RESUME = ("total_env_steps", "eval_interval", "eval_episodes", "checkpoint_interval", "progress",
                        "logger", "devices", "parallel", "device_memory")  # not overlap: it changes which params act


def _check_fits(config: RunConfig, saved: dict[str, Any], path: Path, checkpointer: Checkpointer) -> None:
    """A one-line ConfigError naming every field (besides ``CHANGEABLE_ON_RESUME``) that differs from the
    config the checkpoints were written with (config.yaml edited, cut, or overridden)."""
    current = config.to_dict()
    saved = make_config(**saved_options(saved)).to_dict()  # the same normal form
    names = sorted(set(current) | set(saved))
    differ = [n for n in names if n not in CHANGEABLE_ON_RESUME and current.get(n, {}) != saved.get(n, {})]
    if differ:
        checkpointer.close()
        detail = "; ".join(f"{n}: {current.get(n)!r} vs {saved.get(n)!r} in the checkpoints" for n in differ)
        raise ConfigError(f"resume: the configuration of {path} differs from the run's checkpoints ({detail}); "
                          f"only {', '.join(CHANGEABLE_ON_RESUME)} may change; nothing was changed")


def _use_compile_cache(setting: str | Path | None, run_dir: Path) -> None:
    try:
        compile_cache.enable(setting, run_dir)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _why_no_fit(path: Path, err: CheckpointMismatch, config: RunConfig, saved: dict[str, Any]) -> str:
    """One line: checkpoints whose shapes the resumed configuration changed, naming the extended budget when that is
    the cause (a learner may size its state by the run's length: MEMR's model buffer)."""
    before = saved.get("total_env_steps")
    if before is not None and before != config.total_env_steps:
        return (f"resume: total_env_steps: extending {path} from {before} to {config.total_env_steps} env steps "
                f"changes the shapes of its {config.learner} state, sized by the run's length ({err}); nothing was "
                f"changed (allowed: total_env_steps {before} for this run; train a new run for a longer budget)")
    return f"resume: the checkpoints of {path} do not fit this configuration ({err}); nothing was changed"


def _check_same_processes(meta: dict[str, Any], path: Path, checkpointer: Checkpointer) -> None:
    """A run resumes with the number of processes that wrote its checkpoints."""
    saved, now = int(meta.get("processes", 1)), distributed.processes()
    if saved != now:
        checkpointer.close()
        raise ConfigError(f"resume: the checkpoints of {path} were written by {saved} process(es); resume it with "
                          f"{saved}, not {now}; nothing was changed")


def _writer_lock(path: Path):
    """The run's lock, held by the process that writes (process 0); nothing on the others."""
    return RunLock(path) if distributed.is_writer() else contextlib.nullcontext()


def pbt_schedule(run_dir, out: str | Path | None = None) -> Path:
    """Writes the best final member's hparam schedule of a PBT run (its lineage followed back through every copy,
    from lineage.csv) as YAML, by default ``<run_dir>/schedule.yaml``; ``popjax train --schedule`` replays it.
    Raises a one-line ConfigError when the run has no lineage or no summary (it has not finished)."""
    import csv

    import yaml

    from popjax.drivers.schedule import best_schedule

    rd = RunDir(run_dir)
    cfg = rd.read_config()
    lineage = rd.path / "lineage.csv"
    if not lineage.is_file():
        raise ConfigError(f"run_dir: {rd.path} has no lineage.csv (a pbt run writes it when it finishes)")
    with lineage.open(newline="") as f:
        rows = list(csv.DictReader(f))
    summary = rd.read_summary()
    names = [n for n in (rows[0] if rows else {}) if n not in ("round", "member", "parent", "fitness", "env_steps")]
    member, schedule = best_schedule(rows, summary.get("final_returns", []), names)
    data = {"learner": cfg["learner"], "env": cfg["env"], "source": str(rd.path), "member": member,
            "final_return": summary["final_returns"][member], "schedule": schedule}
    path = Path(out) if out is not None else rd.path / "schedule.yaml"
    if path.is_dir():
        raise ConfigError(f"out: {path} is a folder, not a file")
    if path.exists() and not _is_schedule(path):  # a schedule this command wrote may be rewritten; nothing else
        raise ConfigError(f"out: {path} exists and is not a schedule popjax wrote; popjax never overwrites it "
                          "(choose another --out)")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _is_schedule(path: Path) -> bool:
    """A YAML file ``pbt_schedule`` wrote (a mapping with its keys)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(data, dict) and {"learner", "env", "source", "member", "schedule"} <= set(data)


def plot_run(run_dir) -> list[Path]:
    """Regenerates every plot of a run directory (learning curves, then the driver's); returns the paths.

    Raises a one-line ConfigError naming the path and the problem when the run cannot be read or a plot
    cannot be written; when some plots could still be drawn (from the readable rows of a damaged
    metrics.csv, or before a write failed), the message names them.
    """
    rd = RunDir(run_dir)
    cfg = rd.read_config()
    rd.check_layout()
    rows, unreadable = rd.scan_metrics()
    if not rows:
        why = f" ({len(unreadable)} unreadable: {unreadable[0]})" if unreadable else ""
        raise ConfigError(f"run_dir: {rd.metrics_path} has no evaluations to plot yet{why}")
    missing = [name for name in ("env_steps", "member", "eval_return") if name not in rows[0]]
    if missing:
        raise ConfigError(f"run_dir: {rd.metrics_path} has no column {', '.join(missing)}")
    title = f"{cfg.get('learner')} on {cfg.get('env')} ({cfg.get('driver')}, pop {cfg.get('pop_size')})"
    definition = DRIVERS.get(cfg.get("driver"))
    drawings = [lambda: [learning_curves(rows, rd.path / "plots" / "learning_curves.png", title)],
                lambda: definition.plots(rd) if definition else []]
    written, problems = [], []
    for draw in drawings:
        try:
            written += draw()
        except OSError as err:  # the plots folder is read-only, full, or in the way
            problems.append(f"{err.filename or rd.path / 'plots'} cannot be written ({err.strerror or err})")
    if unreadable:
        more = f" and {len(unreadable) - 1} more" if len(unreadable) > 1 else ""
        problems.append(f"{rd.metrics_path} {unreadable[0]}{more} cannot be read: plotted the other rows")
    if problems:
        drawn = ", ".join(path.name for path in written) or "none"
        raise ConfigError(f"plot: {'; '.join(problems)} (plots drawn: {drawn})")
    return written


def _checkpointer(run_dir: RunDir) -> Checkpointer:
    return Checkpointer(run_dir.path / "checkpoints", max_to_keep=3)


def _finish(loop: Loop, state, env_state) -> Run:
    try:
        if loop.run_dir.writes:  # the run's loggers (``logger``), opened by the process that writes the run
            loop.run_dir.loggers = open_loggers(loop.config.logger, loop.run_dir.path, loop.config.to_dict())
        state = loop.run(state, env_state)
        steps = loop.checkpointer.steps()
        if not steps or steps[-1] != loop.iteration:
            loop.save_checkpoint(state, env_state)
        loop.checkpointer.close()
        summary = loop.summary(state)
        loop.run_dir.write_summary(summary)
        tables = loop.driver.host.tables(state)
        for name, rows in tables.items():
            loop.run_dir.write_table(name, rows)
        for logger in loop.run_dir.loggers:
            logger.finish(summary, tables)
        if loop.run_dir.writes:
            try:
                plot_run(loop.run_dir.path)
            except ConfigError as err:  # the run's data is complete; only drawing failed
                warnings.warn(f"{err}; the run's data is complete (`popjax plot {loop.run_dir.path}` redraws)",
                              RuntimeWarning, stacklevel=2)
    finally:
        close_loggers(loop.run_dir.loggers)
        loop.run_dir.loggers = []
        if isinstance(loop.driver.interaction, OwnInteraction):  # its threads and envs
            loop.driver.interaction.close()
        if not loop.runner.jax_path:
            loop.runner.close()
    return Run(loop.run_dir.path, summary, state)
