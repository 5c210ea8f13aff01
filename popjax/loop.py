"""The one training loop: it runs any driver (``popjax.drivers.base``) on either env path.

The loop owns what every driver shares: the key purposes, the compile cache, the
evaluation and checkpoint cadence, progress, metrics rows, the summary, checkpoints and
exact resume. It knows drivers only through the ``Driver`` contract and imports none.

Per iteration it runs the driver's stages (see ``popjax.drivers.base``): on the JAX env path
prepare, the env interaction and learn are one compiled call; on the host path prepare and
learn are compiled and the gymnasium envs are stepped between them, each action from one
compiled population call. A driver whose interaction is an ``OwnInteraction`` (HTS-RL's threads) runs
the iteration itself through ``iterate``. After an iteration that crossed a multiple of ``eval_interval``
env steps per member (or reached the end) it evaluates, runs ``after_eval`` and the host
records, and logs; checkpoints follow evaluations and ``checkpoint_interval``.

Every key is derived from ``(seed, purpose, iteration)``: nothing random is carried between
iterations, so a resumed run draws exactly the keys an uninterrupted one would.

On the JAX env path of a one-device ``Rollout`` driver without maintenance, the state and env state cross the
``iteration`` program as a few flat buffers (``popjax.population.packing``: one per dtype, donated, unpacked and
written back inside the program) instead of their ~100 leaves, whose handling dominated a small update's call; the
loop unpacks them at evaluations and checkpoints (so ``host.rows`` receives the ``Packed`` state between
evaluations, where the default rows read nothing).
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from collections import Counter
from collections.abc import Callable
from enum import IntEnum
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from popjax import precision, stats
from popjax.config import RunConfig, make_learner_config
from popjax.distributed import fetch, gather_rows, is_writer, processes
from popjax.drivers.base import Driver, Episodes, InteractionFailed, OwnInteraction, Rollout
from popjax.population import packing
from popjax.population.packing import Packed
from popjax.population.sharding import Placement, acting_device
from popjax.progress import TrainProgress
from popjax.registry import DRIVERS, LEARNERS
from popjax.rundir import RunDir
from popjax.types import Key


class KeyPurpose(IntEnum):
    """What a key is for: keys are ``fold_in(fold_in(key(seed), purpose), iteration)``."""

    INIT = 0  # the driver state
    HPARAMS = 1  # per-member hparams sampled from the run's search space
    ENV_RESET = 2  # the persistent JAX envs
    COLLECT = 3  # acting and env steps of an iteration
    LEARN = 4  # learn (buffer sampling, updates)
    EVALUATE = 5  # evaluation episodes
    AFTER_EVAL = 6  # after_eval (PBT exploit and explore, bandit draws)
    DRIVER_SETUP = 7  # the driver's own set-up draws (PBT's initial prior samples)
    PREPARE = 8  # prepare (CEM-RL: ask and training)
    MAINTAIN = 9  # the driver's maintenance call (RLx2 topology steps)


@functools.partial(jax.jit, static_argnums=1)
def _derive_keys(seed, purposes: tuple[int, ...], iteration) -> tuple[Key, ...]:
    base = jax.random.key(seed)
    return tuple(jax.random.fold_in(jax.random.fold_in(base, purpose), iteration) for purpose in purposes)


def keys_for(seed: int, purposes: tuple[KeyPurpose, ...], iteration: int = 0) -> tuple[Key, ...]:
    """``key_for`` of each purpose, derived in one compiled call: eagerly, each key cost three dispatches (and
    ``fold_in`` several small programs), about a millisecond per iteration on a CPU."""
    return _derive_keys(seed, tuple(int(p) for p in purposes), iteration)


def key_for(seed: int, purpose: KeyPurpose, iteration: int = 0) -> Key:
    return keys_for(seed, (purpose,), iteration)[0]


def on_packed(program, state_layout: packing.Layout, env_layout: packing.Layout):
    """``program(key_prepare, key_collect, key_learn, state, env_state)`` on packed arguments
    (``popjax.population.packing``): unpacked inside, the new state written back into the donated buffers."""

    def run(key_prepare: Key, key_collect: Key, key_learn: Key, state, env_state):
        unpacked = packing.unpack(state_layout, state), packing.unpack(env_layout, env_state)
        new_state, new_env, metrics = program(key_prepare, key_collect, key_learn, *unpacked)
        return packing.repack(state_layout, state, new_state), packing.repack(env_layout, env_state, new_env), metrics

    return run


class Compiler:
    """Ahead-of-time compile cache: one program per name, compiled once, compile time booked apart.

    ``traces`` counts how often each program was traced (a retrace would be a bug: hparams and
    counters are traced values). ``instrument``, an optional ``(name, compiled) -> callable``, wraps
    every compiled program handed out (to observe the loop, e.g. time each call); without it the
    compiled programs are handed out as they are. ``matmul_precision`` (``popjax.precision``) is the
    arithmetic of every matrix product of every program.
    """

    def __init__(self, instrument: Callable[[str, Any], Callable] | None = None, matmul_precision: str = "default"):
        self.instrument = instrument
        self.matmul_precision = precision.check(matmul_precision)
        self.compile_s = 0.0
        self.traces: Counter[str] = Counter()
        self._programs: dict[str, Any] = {}

    def __call__(self, name: str, fn, *args, donate=(), out_shardings=None):
        """``fn`` compiled for ``args`` (first call) and cached under ``name``."""
        if name not in self._programs:
            def counted(*a):
                self.traces[name] += 1  # runs only while tracing
                return fn(*a)

            start = time.perf_counter()
            jitted = jax.jit(precision.apply(counted, self.matmul_precision), donate_argnums=donate,
                             out_shardings=out_shardings)
            self._programs[name] = jitted.lower(*args).compile()
            self.compile_s += time.perf_counter() - start
        program = self._programs[name]
        return program if self.instrument is None else self.instrument(name, program)


class Loop:
    """Trains one driver; see the module docstring.

    Args:
      config: the run configuration (cadence, seed, budget).
      driver: the driver built for the whole population (init, after_eval, host part).
      local: the driver built for the programs that hold the members (the same as ``driver``
        unless ``placement`` runs one program per device).
      runner: ``JaxRunner`` or ``HostRunner`` for the programs' members.
      placement: where the arrays live and how programs are split over devices.
      run_dir: where metrics rows go (set before ``run``).
      instrument: optional ``(name, compiled) -> callable`` wrapping every compiled program the loop
        runs (``Compiler``); for callers that observe the loop, e.g. timing it.
      plan: the run's ``popjax.resolve.Plan`` (its learner config and driver options for the summary); None:
        derived from ``config``.
    """

    def __init__(self, config: RunConfig, driver: Driver, local: Driver, runner, placement: Placement,
                 run_dir: RunDir | None = None, instrument: Callable[[str, Any], Callable] | None = None,
                 plan: Any = None):
        self.config = config
        self.plan = plan
        self.driver = driver
        self.local = local
        self.runner = runner
        self.placement = placement
        self.run_dir = run_dir
        self.compiler = Compiler(instrument, config.matmul_precision)
        self.iteration = 0
        self.wall_s = 0.0
        self.history: list[np.ndarray] = []  # eval returns per evaluation
        self.checkpointer = None  # a popjax.checkpoint.Checkpointer, set by popjax.experiment
        self.members = placement.members(config.pop_size)  # as seen inside the programs
        self.local_rows = placement.local_members(config.pop_size)  # this process's members (host path)
        self.axes = driver.member_axes
        self.state_shardings = placement.shardings(jax.eval_shape(driver.init, self.key(KeyPurpose.INIT, 0)),
                                                   self.axes)
        # Overlap (host path, rollout drivers): iteration t+1 acts with a snapshot of the state taken before
        # learn t is dispatched, so the host steps envs while learn t runs (one iteration of policy lag).
        self.overlap = config.overlap and not runner.jax_path and isinstance(local.interaction, Rollout)
        self.acting = None  # the snapshot the next rollout acts with (overlap)
        self.maintained_at = 0  # updates per member at the last maintenance check (set again on resume)
        self.last_maintenance: dict[str, Any] = {}  # its metrics, shown in every row until the next one
        # A device computes one program at a time: acting runs on its own device so that it does not
        # queue behind the update (see popjax.population.sharding.acting_device).
        self.acting_device = acting_device(config.devices) if self.overlap else None

    # --- programs ------------------------------------------------------------------------------
    def key(self, purpose: KeyPurpose, iteration: int | None = None) -> Key:
        return key_for(self.config.seed, purpose, self.iteration if iteration is None else iteration)

    def _actor_ids(self, spec: Episodes):
        return self.members.ids() if spec.actors is None else jnp.arange(spec.actors, dtype=jnp.int32)

    def _step_act(self, key: Key, t, state, obs):
        """The driver's act with the key of step ``t`` (derived inside the compiled call)."""
        return self.local.act(jax.random.fold_in(key, t), state, obs)

    def _interact(self, key: Key, state, env_state):
        interaction = self.local.interaction
        if isinstance(interaction, Rollout):
            return self.runner.rollout(key, self._step_act, state, env_state, interaction.steps)
        return env_state, self.runner.episodes(key, self._step_act, state, self._actor_ids(interaction),
                                               interaction.episodes)

    def _jax_iteration(self, key_prepare: Key, key_collect: Key, key_learn: Key, state, env_state):
        metrics = {}
        if self.local.prepare is not None:
            state, metrics = self.local.prepare(key_prepare, state)
        env_state, experience = self._interact(key_collect, state, env_state)
        state, learned = self.local.learn(key_learn, state, experience)
        return state, env_state, {**metrics, **learned}

    # --- state ---------------------------------------------------------------------------------
    def initial_state(self):
        """A fresh driver state and env state, placed on the devices."""
        key = self.key(KeyPurpose.INIT, 0)
        state = self.compiler("init", self.driver.init, key, out_shardings=self.state_shardings)(key)
        key = self.key(KeyPurpose.ENV_RESET, 0)
        if not self.runner.jax_path:
            return state, self.runner.reset(key)
        reset = self._reset_program()
        env_shardings = self.placement.shardings(jax.eval_shape(reset, key), True)
        # Compiled: run op by op, a brax reset takes tens of seconds and aliases buffers.
        return state, self.compiler("reset", reset, key, out_shardings=env_shardings)(key)

    def _reset_program(self):
        return self.placement.program(self.runner.reset, (False,), True)

    def state_template(self):
        """Shapes of ``(state, env_state)`` (checkpoint restore)."""
        state = jax.eval_shape(self.driver.init, self.key(KeyPurpose.INIT, 0))
        env = None
        if self.runner.jax_path:
            env = jax.eval_shape(self._reset_program(), self.key(KeyPurpose.ENV_RESET, 0))
        return state, env

    def place(self, state, env_state):
        """Restored numpy trees onto the devices."""
        state = self.placement.put(jax.tree.map(jnp.asarray, state), self.axes)
        if env_state is not None:
            env_state = self.placement.put(jax.tree.map(jnp.asarray, env_state), True)
        return state, env_state

    # --- one iteration, one evaluation ---------------------------------------------------------
    def step(self, state, env_state):
        """One iteration; returns ``(state, env_state, metrics)`` (metrics as numpy ``[pop]``)."""
        keys = keys_for(self.config.seed, (KeyPurpose.PREPARE, KeyPurpose.COLLECT, KeyPurpose.LEARN), self.iteration)
        axes = self.axes
        if isinstance(self.local.interaction, OwnInteraction):
            state, metrics = self.local.interaction.iterate(self.compiler, keys, state)
        elif self.runner.jax_path and self._packs(state, env_state):
            state, env_state = self.packed(state, "state"), self.packed(env_state, "env_state")
            program = on_packed(self._jax_iteration, state.layout, env_state.layout)
            iteration = self.compiler("iteration", program, *keys, state.arguments, env_state.arguments, donate=(3, 4))
            arguments, env_arguments, metrics = iteration(*keys, state.arguments, env_state.arguments)
            state, env_state = (Packed(arguments, state.layout, state.name),
                                Packed(env_arguments, env_state.layout, env_state.name))
        elif self.runner.jax_path:
            program = self.placement.program(self._jax_iteration, (False, False, False, axes, True), (axes, True, True))
            env_shardings = jax.tree.map(lambda x: x.sharding, env_state)
            iteration = self.compiler("iteration", program, *keys, state, env_state, donate=(3, 4),
                                      out_shardings=(self.state_shardings, env_shardings, None))
            state, env_state, metrics = iteration(*keys, state, env_state)
        else:
            metrics = {}
            if self.local.prepare is not None:
                prepare = self.placement.program(self.local.prepare, (False, axes), (axes, True))
                prepare = self.compiler("prepare", prepare, keys[0], state, donate=(1,),
                                        out_shardings=(self.state_shardings, None))
                state, metrics = prepare(keys[0], state)
            if self.overlap:
                acting = self.acting if self.acting is not None else self.snapshot(state)
                self.acting = self.snapshot(state)  # before learn donates the state's buffers
            else:
                acting = state
            _, experience = self._host_interact(keys[1], self._host_act(), acting)
            experience = self.placement.from_local(experience)  # several processes: each stepped its members
            learn = self.placement.program(self.local.learn, (False, axes, True), (axes, True))
            learn = self.compiler("learn", learn, keys[2], state, experience, donate=(1,),
                                  out_shardings=(self.state_shardings, None))
            state, learned = learn(keys[2], state, experience)
            metrics = {**metrics, **learned}
        state, metrics = self.maintain(state, metrics)
        self.iteration += 1
        return state, env_state, metrics  # device arrays: reading them would wait for the update

    def _packs(self, state, env_state) -> bool:
        """Whether the JAX-path iteration keeps the state and env state packed (``popjax.population.packing``): on
        one device, for a ``Rollout`` driver without maintenance (both read the state between iterations only at
        evaluations and checkpoints), when every leaf is a plain array."""
        if isinstance(state, Packed) or isinstance(env_state, Packed):
            return True
        return (self.placement.mesh is None and isinstance(self.local.interaction, Rollout)
                and self.local.maintenance is None and packing.packable((state, env_state)))

    def packed(self, tree, name: str) -> Packed:
        """``tree`` as a ``Packed`` (the small leaves copied into one buffer per dtype by a compiled call)."""
        if isinstance(tree, Packed):
            return tree
        layout = packing.layout_of(tree)
        small, whole = packing.packed_leaves(layout, tree)
        buffers = self.compiler(f"pack_{name}", functools.partial(packing.buffers, layout), small)(small)
        return Packed(tuple(buffers) + tuple(whole), layout, name)

    def unpacked(self, value):
        """The pytree of a ``Packed`` (by a compiled call; the packed buffers stay valid); anything else as it is."""
        if not isinstance(value, Packed):
            return value
        n, buffers = len(value.layout.dtypes), value.arguments[:len(value.layout.dtypes)]
        small = self.compiler(f"unpack_{value.name}", functools.partial(packing.small_leaves, value.layout),
                              buffers)(buffers) if n else []
        return packing.tree_of(value.layout, small, value.arguments[n:])

    def maintain(self, state, metrics):
        """The driver's ``Maintenance`` call when this iteration's updates crossed a multiple of its period.

        Reads the update counter from the device (it waits for the update; only drivers with maintenance pay).
        Between two calls the metrics rows show the latest call's metrics."""
        maintenance = self.local.maintenance
        if maintenance is None:
            return state, metrics
        before, self.maintained_at = self.maintained_at, self.counters(state)[1]
        if not crossed(before, self.maintained_at, maintenance.every):  # its period need not meet the evaluations'
            return state, {**self.last_maintenance, **metrics}
        key = self.key(KeyPurpose.MAINTAIN)
        program = self.placement.program(maintenance.run, (False, self.axes), (self.axes, True))
        program = self.compiler("maintain", program, key, state, donate=(1,),
                                out_shardings=(self.state_shardings, None))
        state, more = program(key, state)
        self.last_maintenance = more
        return state, {**metrics, **more}

    def snapshot(self, state):
        """A copy of what ``act`` reads (``Driver.acting_view``) on the acting device: fresh buffers learn
        cannot donate, on a device whose queue the update does not block."""
        view = self.driver.acting_view(state) if self.driver.acting_view is not None else state
        return jax.device_put(view, self.acting_device, may_alias=False)

    def _host_act(self):
        """The compiled acting program of the host path (compiled at its first call, when obs are known).

        With overlap it is the whole population's act on the acting device (where the snapshot is).
        """
        if self.overlap:
            act = lambda key, t, state, obs: self.driver.act(jax.random.fold_in(key, t), state, obs)
        else:
            act = self.placement.program(self._step_act, (False, False, self.axes, True), True)
        compiler, placement, rows = self.compiler, self.placement, self.local_rows

        def call(key, t, actor, obs):
            obs = placement.from_local(obs)
            acted = compiler("act", act, key, t, actor, obs)(key, t, actor, obs)
            return jax.tree.map(lambda x: placement.to_local(x, rows), acted)  # (actions, extras)

        return call

    def _host_interact(self, key: Key, act, state):
        interaction = self.local.interaction
        if isinstance(interaction, Rollout):
            return self.runner.rollout(key, act, state, None, interaction.steps)
        ids = np.arange(self.config.pop_size if interaction.actors is None else interaction.actors)
        return None, self.runner.episodes(key, act, state, ids, interaction.episodes)

    def evaluate(self, state) -> np.ndarray:
        """The driver's evaluation: mean deterministic return per evaluated policy (numpy); ``state`` may be the
        packed one ``step`` returns."""
        state = self.unpacked(state)
        spec, key = self.local.evaluation, self.key(KeyPurpose.EVALUATE)
        out_axes = spec.actors is None
        if self.runner.jax_path:
            def evaluate(key, state):
                return self.runner.evaluate(key, self.local.policy, state, self._actor_ids(spec), spec.episodes)

            program = self.placement.program(evaluate, (False, self.axes), out_axes)
            return fetch(self.compiler("evaluate", program, key, state)(key, state))
        policy = self.placement.program(self.local.policy, (self.axes, out_axes), out_axes)
        compiler, placement, rows = self.compiler, self.placement, self.local_rows

        def compiled(actor, obs):
            obs = placement.from_local(obs)
            return placement.to_local(compiler("policy", policy, actor, obs)(actor, obs), rows)

        actors = self.local_rows[1] if spec.actors is None else spec.actors
        return gather_rows(self.runner.evaluate(key, compiled, state, np.arange(actors), spec.episodes))

    def after_eval(self, state, returns: np.ndarray):
        """The driver's compiled ``after_eval`` (global: it sees every member), then the hparams its host proposes
        (if any) written by the compiled ``set_hparams``; ``state`` may be the packed one ``step`` returns."""
        state = self.unpacked(state)
        info = None
        if self.driver.after_eval is not None:
            key = self.key(KeyPurpose.AFTER_EVAL)
            returns_device = jnp.asarray(returns, jnp.float32)
            program = self.compiler("after_eval", self.driver.after_eval, key, state, returns_device, donate=(1,),
                                    out_shardings=(self.state_shardings, None))
            state, info = program(key, state, returns_device)
            info = fetch(info)
            hparams = self.driver.host.propose(state, info)
            if hparams is not None:  # a host decision (PB2), written by a compiled call traced once
                program = self.compiler("set_hparams", self.driver.set_hparams, state, hparams, donate=(0,),
                                        out_shardings=self.state_shardings)
                state = program(state, hparams)
        return state, info

    # --- the loop ------------------------------------------------------------------------------
    def counters(self, state) -> tuple[int, int]:
        """``(env_steps, updates)`` per member, read from the state."""
        counters = fetch(self.unpacked(state).counters)
        return int(counters.env_steps), int(counters.updates)

    def run(self, state, env_state):
        cfg = self.config
        env_steps, _ = self.counters(state)
        with TrainProgress(cfg.total_env_steps, enabled=cfg.progress and is_writer(), start=env_steps) as progress:
            while env_steps < cfg.total_env_steps:
                start, compile_before = time.perf_counter(), self.compiler.compile_s
                before = env_steps
                try:
                    state, env_state, metrics = self.step(state, env_state)
                except InteractionFailed:
                    # The state of the last complete iteration, unless its checkpoint was just written.
                    if self.checkpointer is not None and self.checkpointer.steps()[-1:] != [self.iteration]:
                        self.save_checkpoint(state, env_state)
                    raise
                env_steps = self._env_steps_after(state, before)
                returns = None
                evaluated = crossed(before, env_steps, cfg.eval_interval) or env_steps >= cfg.total_env_steps
                if evaluated or crossed(before, env_steps, cfg.checkpoint_interval):  # read beyond the iteration
                    state, env_state = self.unpacked(state), self.unpacked(env_state)
                if evaluated:
                    returns = self.evaluate(state)
                    self._warn_diverged(returns, env_steps)
                    self.history.append(returns)
                    progress.update_returns(returns)
                # Rows before after_eval: they show the hparams the logged returns were earned with.
                rows = self.driver.host.rows(state, metrics, returns)
                if evaluated:
                    state, info = self.after_eval(state, returns)
                    self.driver.host.record(state, env_steps, returns, info)
                checkpoint = self.checkpointer is not None and (evaluated or crossed(before, env_steps,
                                                                                     cfg.checkpoint_interval))
                if rows or checkpoint:  # they read the state: its device time is this iteration's, not unaccounted
                    jax.block_until_ready(state)
                self.wall_s += time.perf_counter() - start - (self.compiler.compile_s - compile_before)
                if rows:
                    counted, updates = self.counters(state)
                    assert counted == env_steps, (counted, env_steps)  # the host's count (rollouts) is the state's
                    self.run_dir.append_metrics([{"env_steps": env_steps, "updates": updates,
                                                  "wall_s": round(self.wall_s, 3), **row} for row in rows])
                if checkpoint:
                    self.save_checkpoint(state, env_state)
                progress.advance_to(min(env_steps, cfg.total_env_steps))
        return self.unpacked(state)

    def _env_steps_after(self, state, before: int) -> int:
        """Env steps per member after an iteration: known on the host for a rollout (reading the state would wait
        for the iteration: the host could not dispatch the next one while it runs, nor overlap acting with the
        update), else (episodes: their lengths vary) read from the state. Rows check the host's count."""
        if isinstance(self.local.interaction, Rollout):
            return before + self.local.interaction.steps_per_member
        return self.counters(state)[0]

    def _warn_diverged(self, returns: np.ndarray, env_steps: int) -> None:
        newly = ~np.isfinite(returns) & (np.isfinite(self.history[-1]) if self.history else True)
        for m in np.flatnonzero(newly):
            # The run goes on: other members are unaffected (vmap keeps them independent), the
            # diverged member logs NaN from here, and PBT replaces it at its next exploit.
            warnings.warn(f"member {m} diverged (non-finite eval return) at {env_steps} env steps; "
                          "it is logged as nan from here", RuntimeWarning, stacklevel=3)

    # --- checkpoints (exact resume) -------------------------------------------------------------
    def save_checkpoint(self, state, env_state) -> None:
        """Everything needed to continue after this iteration (keys are re-derived from the seed)."""
        meta = {"config": self.config.to_dict(), "processes": processes(), "iteration": self.iteration,
                "wall_s": self.wall_s,
                "compile_s": self.compiler.compile_s,
                "history": [[_json_float(v) for v in r.tolist()] for r in self.history],
                "driver": self.driver.host.state_dict()}
        self.checkpointer.save(self.iteration, {"state": state, "env_state": env_state, "acting": self.acting}, meta)

    def restore_checkpoint(self):
        """Loads the newest usable checkpoint; returns ``(state, env_state)`` or None."""
        state, env = self.state_template()
        acting = jax.eval_shape(self.snapshot, state) if self.overlap else None
        found = self.checkpointer.restore_latest({"state": state, "env_state": env, "acting": acting})
        if found is None:
            return None
        _, tree, meta = found
        self.iteration, self.wall_s = int(meta["iteration"]), float(meta["wall_s"])
        self.compiler.compile_s = float(meta["compile_s"])
        self.history = [np.array([np.nan if v is None else v for v in r], np.float64) for r in meta["history"]]
        self.driver.host.load_state_dict(meta["driver"])
        state, env_state = self.place(tree["state"], tree["env_state"])
        self.maintained_at = self.counters(state)[1]
        if tree["acting"] is not None:
            self.acting = jax.device_put(tree["acting"], self.acting_device)
        if not self.runner.jax_path:
            # Host envs cannot be snapshotted: they start new episodes (see ``popjax.experiment.resume``).
            env_state = self.runner.reset(self.key(KeyPurpose.ENV_RESET, self.iteration))
        return state, env_state

    # --- summary -------------------------------------------------------------------------------
    def summary(self, state) -> dict[str, Any]:
        cfg = self.config
        env_steps, updates = self.counters(state)
        final = self.history[-1] if self.history else np.full(cfg.pop_size, np.nan)
        best = max((float(np.nanmax(r)) for r in self.history if np.isfinite(r).any()), default=float("nan"))
        summary = {
            "learner": cfg.learner, "env": cfg.env, "driver": cfg.driver, "pop_size": cfg.pop_size,
            "seed": cfg.seed, "env_steps": env_steps, "updates": updates,
            "wall_s": round(self.wall_s, 3), "compile_s": round(self.compiler.compile_s, 3),
            "matmul_precision": cfg.matmul_precision, "matmul_arithmetic": precision.arithmetic(cfg.matmul_precision),
            "best_return": best, "final_returns": [float(r) for r in final],
            "final_iqm": stats.population_iqm(final, not_independent=self._why_members_dependent()),
            **self.driver.host.summary(state),
        }
        definition = LEARNERS[cfg.learner]
        learner_config = self.plan.learner_config if self.plan is not None else make_learner_config(cfg)
        report = definition.report
        if report.costs is not None:
            hparams = fetch(self.driver.host.hparams(state))
            summary["costs"] = report.costs(learner_config, self.runner.spec, hparams)
        if report.counts is not None:
            summary["counts"] = report.counts(learner_config, updates)
        named = report.summary_metrics
        if named and is_writer():  # from metrics.csv (process 0's), so a resumed run reports the same
            summary["learner_metrics"] = last_metrics(self.run_dir.read_metrics(), named, cfg.pop_size)
        return summary

    def _why_members_dependent(self) -> str | None:
        """None when the driver's members are independent samples (``DriverDef.independent_members``), else
        why ``final_iqm`` has no interval over them."""
        if self.plan is not None:
            independent = self.plan.members_independent
        else:
            definition = DRIVERS[self.config.driver]
            independent = definition.members_independent(definition.parse_options(self.config))
        if independent:
            return None
        return (f"members of a {self.config.driver} run interact (copies, shared parts), so they are not "
                "independent samples: an interval needs independent runs (seeds), e.g. popjax compare")


def last_metrics(rows: list[dict[str, float]], names: tuple[str, ...], pop_size: int) -> dict[str, list]:
    """``{name: [each member's value in its last metrics row]}`` (None where the member has none or it is NaN)."""
    last: dict[int, dict[str, float]] = {}
    for row in rows:
        if not math.isnan(row.get("member", math.nan)):
            last[int(row["member"])] = row
    value = lambda m, name: last.get(m, {}).get(name, math.nan)  # noqa: E731
    return {name: [None if math.isnan(value(m, name)) else value(m, name) for m in range(pop_size)]
            for name in names}


def crossed(before: int, after: int, interval: int) -> bool:
    """Whether ``(before, after]`` holds a multiple of ``interval`` (never for ``interval`` 0)."""
    return bool(interval) and after // interval > before // interval


def _json_float(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None
