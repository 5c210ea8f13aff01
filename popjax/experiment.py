"""``popjax.train``: a configuration in, a run directory out.

The host loop here only decides when to collect, train, evaluate, log and checkpoint; all
numerical work happens in a few compiled population-wide calls per iteration.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from popjax.buffers import make_uniform_buffer
from popjax.config import ConfigError, RunConfig, make_config
from popjax.drivers.collect import HostCollector, JaxCollector
from popjax.drivers.independent import IndependentDriver
from popjax.drivers.population import PopState, make_population
from popjax.envs import registry
from popjax.envs.base import make_vec_env
from popjax.learners import LEARNERS
from popjax.population.hparams import Range, check_hparams, hparams_table, population_hparams
from popjax.population.sharding import member_sharding, shard_members
from popjax.progress import TrainProgress
from popjax.rundir import RunDir


@dataclasses.dataclass
class Run:
    """What ``train`` returns: the run directory, its summary and the final population state."""

    out_dir: Path
    summary: dict[str, Any]
    state: PopState


@dataclasses.dataclass
class Setup:
    """Everything built from a RunConfig before the first compilation."""

    config: RunConfig
    spec: Any
    learner_config: Any
    learner: Any
    population: Any
    collector: Any
    hparams: Any
    sharding: Any

    @property
    def jax_env(self) -> bool:
        return isinstance(self.collector, JaxCollector)


def build_learner_config(config: RunConfig, definition):
    fields = {f.name for f in dataclasses.fields(definition.config_cls)}
    unknown = sorted(set(config.learner_config) - fields)
    if unknown:
        raise ConfigError(f"learner_config: unknown key(s) {', '.join(unknown)} for {config.learner}; "
                          f"allowed: {', '.join(sorted(fields))}")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in config.learner_config.items()}
    if "batch_size" in fields:
        values["batch_size"] = config.batch_size
    try:
        return definition.config_cls(**values)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"learner_config: {err}") from None


def build(config: RunConfig) -> Setup:
    """Resolves names into learner, env and population functions (no compilation)."""
    definition = LEARNERS[config.learner]
    try:
        spec = registry.env_spec(config.env)
    except ValueError as err:
        raise ConfigError(f"env: {err}") from None
    if (definition.action_kind == "discrete") != spec.discrete:
        raise ConfigError(f"env: {config.learner} needs {definition.action_kind} actions but {config.env} has "
                          f"{spec.describe_actions()}")
    learner_config = build_learner_config(config, definition)
    learner = definition.make(learner_config, spec)
    try:
        sharding = member_sharding(config.devices)
        space = {name: Range.from_dict(r) for name, r in config.search_space.items()}
        hparams = population_hparams(definition.default_hparams(learner_config), config.pop_size,
                                     config.hparams, space, jax.random.fold_in(jax.random.key(config.seed), 1))
        if config.driver == "pbt":
            from popjax.drivers.pbt import pbt_initial_hparams

            hparams = pbt_initial_hparams(config, definition, learner_config, hparams)
        check_hparams(hparams)
    except ValueError as err:
        raise ConfigError(str(err)) from None

    buffer = make_uniform_buffer(config.buffer_size, config.batch_size)
    population = make_population(learner, buffer, spec, config.pop_size, config.updates_per_iter)
    if registry.is_jax_env(config.env):
        vec_env = make_vec_env(registry.make_jax_env(config.env))
        collector = JaxCollector(population, vec_env, config.envs_per_member, config.rollout_len)
    else:
        env = registry.make_host_env(config.env, config.pop_size * config.envs_per_member, config.seed)
        eval_factory = lambda n: registry.make_host_env(config.env, n, config.seed + 10_000)
        collector = HostCollector(population, env, eval_factory, config.envs_per_member, config.rollout_len)
    setup = Setup(config, spec, learner_config, learner, population, collector, hparams, sharding)
    if config.driver in ("cemrl", "dvd"):  # shared-critic drivers bring their own population functions
        import importlib

        setup = importlib.import_module(f"popjax.drivers.{config.driver}").adapt_setup(setup)
    return setup


class Trainer:
    """Runs the training loop of one Setup; owns the compiled steps and the loop counters."""

    #: Optional ``staticmethod((name, compiled) -> callable)`` wrapped around every compiled step
    #: that ``_compile`` hands out; ``popjax.bench.train`` uses it to time the compiled calls.
    call_wrapper = None

    def __init__(self, setup: Setup, run_dir: RunDir, driver=None):
        self.setup = setup
        self.config = setup.config
        self.run_dir = run_dir
        self.driver = driver or IndependentDriver()
        self.root_key = jax.random.key(self.config.seed)
        self.iteration = 0
        self.updates = 0
        self.wall_s = 0.0
        self.compile_s = 0.0
        self.history: list[np.ndarray] = []  # eval returns [pop] per evaluation
        self.checkpointer = None  # a popjax.checkpoint.Checkpointer, set by train/resume
        self._compiled: dict[str, Any] = {}

    # --- counters -----------------------------------------------------------------------------
    @property
    def env_steps(self) -> int:
        return self.iteration * self.config.steps_per_iter

    @property
    def total_iterations(self) -> int:
        return math.ceil(self.config.total_env_steps / self.config.steps_per_iter)

    @property
    def warmup_iterations(self) -> int:
        return math.ceil(self.config.warmup_steps / self.config.steps_per_iter)

    @property
    def eval_every(self) -> int:
        return max(1, self.config.eval_interval // self.config.steps_per_iter)

    @property
    def checkpoint_every(self) -> int:
        """Iterations between checkpoints (0 = only at evaluations and at the end)."""
        interval = self.config.checkpoint_interval
        return max(1, interval // self.config.steps_per_iter) if interval else 0

    def key_for(self, purpose: int, iteration: int) -> jax.Array:
        # Keys are derived from (seed, purpose, iteration): nothing random is carried between
        # iterations, so a resumed run draws exactly the keys an uninterrupted one would.
        return jax.random.fold_in(jax.random.fold_in(self.root_key, purpose), iteration)

    # --- state --------------------------------------------------------------------------------
    def initial_state(self):
        s = self.setup
        # Jitted so that every leaf is its own buffer (eager init aliases targets to params,
        # which buffer donation rejects).
        state = jax.jit(s.population.init)(self.key_for(0, 0), s.hparams)
        state = shard_members(state, s.sharding)
        if self.setup.jax_env:
            # Jitted too: an eager brax reset returns the same obs buffer in two leaves (donation rejects it).
            env_state = shard_members(jax.jit(s.collector.reset)(self.key_for(2, 0)), s.sharding)
        else:
            env_state = s.collector.reset(self.key_for(2, 0))
        return state, env_state

    # --- compiled steps -----------------------------------------------------------------------
    def _compile(self, name: str, fn, *args, donate=()):
        """AOT-compiles ``fn`` once for ``args`` (compile time recorded separately from run time)."""
        if name not in self._compiled:
            start = time.perf_counter()
            self._compiled[name] = jax.jit(fn, donate_argnums=donate).lower(*args).compile()
            self.compile_s += time.perf_counter() - start
        compiled = self._compiled[name]
        return compiled if self.call_wrapper is None else self.call_wrapper(name, compiled)

    def step(self, state: PopState, env_state):
        """One iteration: collect ``rollout_len`` steps per env, then K updates (after warm-up)."""
        s, it = self.setup, self.iteration
        explore = it >= self.warmup_iterations
        key_collect, key_train = self.key_for(3, it), self.key_for(4, it)
        metrics = None
        if s.jax_env:
            collector, pop = s.collector, s.population

            def jax_iteration(kc, kt, state, env_state, explore=explore):
                state, env_state, stats = collector.collect(kc, state, env_state, explore)
                if not explore:
                    return state, env_state, stats, {}
                state, metrics = pop.train(kt, state)
                return state, env_state, stats, metrics

            step = self._compile(f"jax_{explore}", jax_iteration, key_collect, key_train, state, env_state,
                                 donate=(2, 3))
            state, env_state, _, metrics = step(key_collect, key_train, state, env_state)
        else:
            transitions, _ = s.collector.collect(key_collect, state, explore)
            if explore:
                learn = lambda kt, state, tr: s.population.train(kt, s.population.add(state, tr))
                step = self._compile("learn", learn, key_train, state, transitions, donate=(1,))
                state, metrics = step(key_train, state, transitions)
            else:
                add = self._compile("add", s.population.add, state, transitions, donate=(0,))
                state = add(state, transitions)
        if explore:
            self.updates += self.config.updates_per_iter
        self.iteration += 1
        return state, env_state, metrics or None

    def evaluate(self, state: PopState) -> np.ndarray:
        s = self.setup
        if s.jax_env:
            evaluate = lambda key, state: s.collector.evaluate(key, state, self.config.eval_episodes)
            fn = self._compile("eval", evaluate, self.key_for(5, 0), state)
            return np.asarray(fn(self.key_for(5, self.iteration), state))
        return np.asarray(s.collector.evaluate(state, self.config.eval_episodes))

    # --- the loop -----------------------------------------------------------------------------
    def run(self, state: PopState, env_state) -> PopState:
        cfg = self.config
        last_metrics: dict[str, np.ndarray] = {}
        with TrainProgress(cfg.total_env_steps, enabled=cfg.progress, start=self.env_steps) as progress:
            while self.iteration < self.total_iterations:
                start = time.perf_counter()
                compile_before = self.compile_s
                state, env_state, metrics = self.step(state, env_state)
                if metrics:
                    last_metrics = {k: np.asarray(v) for k, v in metrics.items()}
                evaluated = self.iteration % self.eval_every == 0 or self.iteration == self.total_iterations
                if evaluated:
                    returns = self.evaluate(state)
                    self._log_eval(state, returns, last_metrics)
                    driver_compile = getattr(self.driver, "compile_s", 0.0)
                    state = self.driver.after_eval(self.key_for(6, self.iteration), state, jnp.asarray(returns),
                                                   self.env_steps)
                    self.compile_s += getattr(self.driver, "compile_s", 0.0) - driver_compile
                    progress.update_returns(returns)
                every = self.checkpoint_every
                if self.checkpointer is not None and (evaluated or (every and self.iteration % every == 0)):
                    self.save_checkpoint(state, env_state)
                self.wall_s += time.perf_counter() - start - (self.compile_s - compile_before)
                progress.advance_to(self.env_steps)
        return state

    # --- checkpoints (exact resume) ----------------------------------------------------------
    def save_checkpoint(self, state: PopState, env_state) -> None:
        """Everything needed to continue after this iteration (keys are re-derived from the seed)."""
        meta = {"iteration": self.iteration, "env_steps": self.env_steps, "updates": self.updates,
                "wall_s": self.wall_s, "compile_s": self.compile_s,
                "history": [[_json_float(v) for v in r.tolist()] for r in self.history],
                "driver": self.driver.state_dict()}
        tree = {"state": state, "env_state": env_state if self.setup.jax_env else None}
        self.checkpointer.save(self.iteration, tree, meta)

    def restore_checkpoint(self):
        """Loads the newest usable checkpoint into the counters; returns ``(state, env_state)`` or None."""
        s = self.setup
        template = {"state": jax.eval_shape(s.population.init, self.key_for(0, 0), s.hparams),
                    "env_state": jax.eval_shape(s.collector.reset, self.key_for(2, 0)) if s.jax_env else None}
        found = self.checkpointer.restore_latest(template)
        if found is None:
            return None
        _, tree, meta = found
        self.iteration, self.updates = int(meta["iteration"]), int(meta["updates"])
        self.wall_s, self.compile_s = float(meta["wall_s"]), float(meta["compile_s"])
        self.history = [np.array([np.nan if v is None else v for v in r], np.float64)
                        for r in meta["history"]]
        self.driver.load_state_dict(meta["driver"])
        state = shard_members(jax.tree.map(jnp.asarray, tree["state"]), s.sharding)
        if s.jax_env:
            env_state = shard_members(jax.tree.map(jnp.asarray, tree["env_state"]), s.sharding)
        else:
            # Host envs cannot be snapshotted: they start new episodes (see ``resume``).
            env_state = s.collector.reset(self.key_for(2, self.iteration))
        return state, env_state

    def _log_eval(self, state: PopState, returns: np.ndarray, metrics: dict[str, np.ndarray]) -> None:
        newly_diverged = ~np.isfinite(returns) & (np.isfinite(self.history[-1]) if self.history else True)
        for m in np.flatnonzero(newly_diverged):
            # The run goes on: other members are unaffected (vmap keeps them independent), the
            # diverged member logs NaN from here, and PBT replaces it at its next exploit.
            warnings.warn(f"member {m} diverged (non-finite eval return) at {self.env_steps} env steps; "
                          "it is logged as nan from here", RuntimeWarning, stacklevel=2)
        self.history.append(returns)
        table = hparams_table(state.hparams)
        rows = []
        for m, ret in enumerate(returns.tolist()):
            row = {"env_steps": self.env_steps, "updates": self.updates, "wall_s": round(self.wall_s, 3),
                   "member": m, "eval_return": ret}
            row.update({name: values[m] for name, values in table.items()})
            row.update({name: float(values[m]) for name, values in sorted(metrics.items())})
            rows.append(row)
        self.run_dir.append_metrics(rows)

    def summary(self, state: PopState) -> dict[str, Any]:
        cfg = self.config
        final = self.history[-1] if self.history else np.full(cfg.pop_size, np.nan)
        best = max((float(np.nanmax(r)) for r in self.history if np.isfinite(r).any()), default=float("nan"))
        return {
            "learner": cfg.learner, "env": cfg.env, "driver": cfg.driver, "pop_size": cfg.pop_size,
            "seed": cfg.seed, "env_steps": self.env_steps, "updates": self.updates,
            "wall_s": round(self.wall_s, 3), "compile_s": round(self.compile_s, 3),
            "best_return": best, "final_returns": [float(r) for r in final],
            "hparams": hparams_table(state.hparams), **self.driver.state_dict(),
        }


def train(config: RunConfig | None = None, *, out_dir: str | Path = "runs/latest", **options: Any) -> Run:
    """Trains a population and writes its run directory.

    Args:
      config: a RunConfig; or pass its fields as keyword options
        (``learner="td3", env="gym:Pendulum-v1", pop_size=8, total_env_steps=200_000, ...``).
      out_dir: the run directory (config.yaml, metrics.csv, summary.json, plots/).

    Returns:
      A ``Run`` with ``summary`` (as in summary.json), ``out_dir`` and the final ``state``.

    Raises:
      ConfigError: invalid options, raised before anything is compiled.
    """
    if config is None:
        config = make_config(**options)
    elif options:
        config = make_config(**{**config.to_dict(), **options})
    setup = build(config)
    run_dir = RunDir(out_dir, tensorboard=config.tensorboard)
    run_dir.write_config(config.to_dict())
    trainer = trainer_class(setup)(setup, run_dir, make_driver(setup))
    _clear_run_outputs(run_dir)
    state, env_state = trainer.initial_state()
    return _finish(trainer, state, env_state)


def resume(run_dir: str | Path, **overrides: Any) -> Run:
    """Continues a run (killed at any moment, or finished) from its newest usable checkpoint.

    The result equals an uninterrupted run with the same config: every random key is derived
    from (seed, purpose, iteration), and a checkpoint holds the population state (learner,
    replay buffers, hparams), the JAX env state, the driver state (PBT lineage, fitness
    window) and the loop counters and evaluation history. On the JAX env path (``probe:``,
    ``brax:``) the final parameters and summary are bit-identical. On the gymnasium path the
    vector env cannot be snapshotted: after a resume it starts new episodes, reset from its
    construction seed, so the transitions collected from then on (and hence the parameters)
    differ from an uninterrupted run; evaluation episodes use fixed seeds either way.

    Rows of metrics.csv logged after the checkpoint are dropped and logged again, so none is
    lost or duplicated. A damaged newest checkpoint is skipped with a warning.

    Args:
      run_dir: a run directory written by ``train``.
      overrides: RunConfig fields to change (e.g. ``total_env_steps`` to extend a run,
        ``progress``); fields that change array shapes make the checkpoint unusable.
    """
    run_dir = RunDir(run_dir)
    if not (run_dir.path / "config.yaml").exists():
        raise ConfigError(f"resume: {run_dir.path} is not a run directory (no config.yaml)")
    config = make_config(**{**run_dir.read_config(), **overrides})
    run_dir = RunDir(run_dir.path, tensorboard=config.tensorboard)
    setup = build(config)
    if overrides:
        run_dir.write_config(config.to_dict())
    trainer = trainer_class(setup)(setup, run_dir, make_driver(setup))
    trainer.checkpointer = _checkpointer(run_dir)
    restored = trainer.restore_checkpoint()
    if restored is None:
        warnings.warn(f"{run_dir.path}: no usable checkpoint; training from the start", stacklevel=2)
        _clear_run_outputs(run_dir)
        restored = trainer.initial_state()
    else:
        trainer.checkpointer.delete_after(trainer.iteration)
        _drop_partial_metrics_row(run_dir)
        run_dir.truncate_metrics(trainer.env_steps)
    return _finish(trainer, *restored)


def _checkpointer(run_dir: RunDir):
    from popjax.checkpoint import Checkpointer

    return Checkpointer(run_dir.path / "checkpoints", max_to_keep=3)


def _clear_run_outputs(run_dir: RunDir) -> None:
    """A fresh start: no metrics rows or checkpoints of an earlier run in the same directory."""
    import shutil

    run_dir.metrics_path.unlink(missing_ok=True)
    shutil.rmtree(run_dir.path / "checkpoints", ignore_errors=True)


def _drop_partial_metrics_row(run_dir: RunDir) -> None:
    """Cuts a last line left incomplete by a kill in the middle of an append."""
    path = run_dir.metrics_path
    if path.exists() and path.stat().st_size:
        data = path.read_bytes()
        if not data.endswith(b"\n"):
            data = data[: data.rfind(b"\n") + 1]
            if data:
                path.write_bytes(data)
            else:  # not even a complete header
                path.unlink()


def _finish(trainer: Trainer, state: PopState, env_state) -> Run:
    if trainer.checkpointer is None:
        trainer.checkpointer = _checkpointer(trainer.run_dir)
    state = trainer.run(state, env_state)
    if not trainer.checkpointer.steps() or trainer.checkpointer.steps()[-1] != trainer.iteration:
        trainer.save_checkpoint(state, env_state)
    trainer.checkpointer.close()
    summary = trainer.summary(state)
    trainer.run_dir.write_summary(summary)
    from popjax.plots import plot_run

    plot_run(trainer.run_dir.path)
    if not trainer.setup.jax_env:
        trainer.setup.collector.close()
    return Run(trainer.run_dir.path, summary, state)


def _json_float(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def make_driver(setup: Setup):
    name = setup.config.driver
    if name == "independent":
        return IndependentDriver()
    if name == "pbt":
        from popjax.drivers.pbt import make_pbt_driver

        cfg = setup.config
        return make_pbt_driver(cfg, LEARNERS[cfg.learner], setup.learner_config, setup.sharding)
    if name == "cemrl":
        from popjax.drivers.cemrl import CEMRLDriver

        return CEMRLDriver()
    if name == "dvd":
        from popjax.drivers.dvd import DvDDriver, settings_from_config

        return DvDDriver(settings_from_config(setup.config))
    raise ConfigError(f"driver: {name!r} is not available yet")


def trainer_class(setup: Setup) -> type[Trainer]:
    """The loop for the driver: CEM-RL runs generations, DvD the base loop (subclassed for its logs)."""
    if setup.config.driver == "cemrl":
        from popjax.drivers.cemrl import CEMRLTrainer

        return CEMRLTrainer
    if setup.config.driver == "dvd":
        from popjax.drivers.dvd import DvDTrainer

        return DvDTrainer
    return Trainer
