"""HTS-RL: high-throughput synchronous RL (Liu, Yeh & Schwing 2020) as a driver.

HTS-RL is a schedule, not a learner: executors step env replicas in host threads, a few actor
threads answer their observations with one compiled population ``act``, and the learner
updates on the previous segment while the executors fill the next one. Every ``alpha`` steps
per env all executors meet at a **barrier**; only there are new parameters published, so

- segment ``s`` acts with ``theta_{s-1}`` (``theta_0`` for segments 0 and 1), and
- the update producing ``theta_s`` runs during segment ``s`` on ``D_{s-1}`` with the behaviour
  state ``theta_{s-2}`` that collected it (``Learner.update_rollout(..., behaviour)``: A2C applies the
  gradient at the behaviour parameters to the current ones, Eq. 6 of the paper; PPO takes its old
  log-probabilities from it); one last update after the last barrier: #updates = #segments.

Off-policy learners (DQN, TD3): the finished segment goes into each member's replay buffer at the
barrier, in (t, env) order, and the next segment's ``K`` updates sample the buffer as of that barrier.

Determinism: the result never depends on thread timing. Storage is written by (t, member, env),
never by arrival order; an action's key is ``fold_in(fold_in(key, member * envs + env), t)`` from the
metadata the executor sends; actors run one fixed-shape ``act`` on a padded ``[members, envs, ...]``
batch (a row's result does not depend on the other rows); parameters change only at barriers.

``lockstep: true`` is the synchronous baseline (A2C-style): a barrier after every env step and a
blocking update after the segment with the parameters that collected it (no lag). The loop sees one
iteration per segment (``OwnInteraction``): evaluations and checkpoints fall on barriers.

Populations change only at barriers: ``population: pbt`` runs PBT's exploit/explore (the run's ``pbt``
block) as this driver's ``after_eval``, which the loop calls between two iterations, i.e. at a barrier
while no executor steps, so member selection never depends on timing. A loser copies its parent's
learner state, behaviour state and staged segment (``PBT_CARRIED``). CEM-RL and DvD do not compose:
they train one shared critic from a replay buffer, not independent members.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from pydantic import Field, PrivateAttr, ValidationInfo, model_validator

from popjax.buffers import BufferState, make_uniform_buffer
from popjax.config import ConfigError
from popjax.drivers import pbt
from popjax.drivers.base import (
    BuildContext,
    Counters,
    Driver,
    DriverDef,
    DriverHost,
    DriverOptions,
    Episodes,
    InteractionFailed,
    OwnInteraction,
    run_config,
    train_unless,
)
from popjax.drivers.independent import init_members, member_policy, random_actions, replay_updates
from popjax.envs.gymnasium import SEED_STRIDE
from popjax.schema import Bool, Float, Int, OneOf, problem
from popjax.types import EnvSpec, Key, Trajectory, Transition, dummy_transition

DELAYED_GRADIENT = ("eq6", "none")
POPULATIONS = ("independent", "pbt")


class HtsOptions(DriverOptions):
    """``hts`` options."""

    alpha: Int(ge=1, le=1_000_000) = Field(
        16, description="sync interval: env steps per env between two barriers (= the unroll length)")
    executors: Int(ge=1, le=4096) | None = Field(
        None, description="executor threads; they share the pop * envs_per_member envs",
        json_schema_extra={"default": "one per env, at most 8"})
    actors: Int(ge=1, le=64) = Field(1, description="actor threads answering the executors (at most executors)")
    lockstep: Bool = Field(False, description="the synchronous baseline: a barrier every step, a blocking update")
    delayed_gradient: OneOf(DELAYED_GRADIENT) = Field(
        "eq6", description="eq6: the update gets the behaviour state that collected the data; none: the current one")
    timeout_s: Float(gt=0, le=86_400) = Field(
        60.0, description="seconds without progress after which a hung executor or actor stops the run")
    serial: Bool = Field(False, description="run the same schedule in one thread (the determinism reference)")
    population: OneOf(POPULATIONS) = Field(
        "independent", description="independent members, or pbt: exploit/explore at barriers with the options of "
                                   "the run's pbt block (interval, quantile, search_space, ...)")
    _pbt: pbt.PBTConfig | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo):
        config = run_config(info)
        if self.population == "pbt":  # validated now, so a bad pbt block is refused before anything is written
            self._pbt = pbt.DEFINITION.parse_options(config, nested=True).pbt_config()
        envs = config.pop_size * config.envs_per_member
        if self.executors is None:
            self.executors = min(8, envs)
        elif self.executors > envs:
            raise problem(f"{self.executors} executors for {envs} envs (pop_size * envs_per_member); "
                          f"use at most {envs}", at=("executors",))
        if self.actors > self.executors:
            raise problem(f"{self.actors} actors for {self.executors} executors; use at most {self.executors}",
                          at=("actors",))
        return self

    def searched_hparams(self) -> frozenset[str]:
        return frozenset() if self._pbt is None else frozenset(self._pbt.space)


@struct.dataclass
class HtsState:
    """Learner states, their behaviour copies, hparams, replay buffers (off-policy), the staged segment
    (on-policy, ``[pop, alpha, envs, ...]``), whether it awaits its update, and the counters."""

    learner: Any
    behaviour: Any
    hparams: Any
    buffer: BufferState | None
    pending: Trajectory | None
    has_pending: jax.Array
    counters: Counters
    pbt: pbt.PBTRecord | None = None  # population: pbt


MEMBER_AXES = HtsState(learner=True, behaviour=True, hparams=True, buffer=True, pending=True, has_pending=False,
                       counters=False, pbt=False)
# What a PBT loser copies from its parent at a barrier: its behaviour state and staged segment go with the
# learner state, so the copy's next update is exactly the parent's (with the loser's new hparams).
PBT_CARRIED = ("learner", "behaviour", "pending")


def acting_view(state: HtsState) -> HtsState:
    """What ``act`` reads: the published parameters (no buffers, no staged data)."""
    return state.replace(behaviour=None, buffer=None, pending=None)


# --- env snapshots (exact resume on envs that offer get_state/set_state) ---------------------------
def _time_limits(env):
    while isinstance(env, gym.Wrapper):
        if isinstance(env, gym.wrappers.TimeLimit):
            yield env
        env = env.env


def snapshot_env(env) -> dict | None:
    """A JSON snapshot of a gymnasium env whose base env has ``get_state`` (else None)."""
    if not hasattr(env.unwrapped, "get_state"):
        return None
    return {"env": env.unwrapped.get_state(), "elapsed": [w._elapsed_steps for w in _time_limits(env)]}


def restore_env(env, snapshot: dict, seed: int) -> None:
    env.reset(seed=seed)  # the wrappers' own flags (order enforcing, time limit) as after any reset
    env.unwrapped.set_state(snapshot["env"])
    for wrapper, elapsed in zip(_time_limits(env), snapshot["elapsed"], strict=True):
        wrapper._elapsed_steps = elapsed


# --- the threads ---------------------------------------------------------------------------------
class Storage:
    """One segment's data, ``[alpha, members, envs, ...]`` numpy arrays written by (t, member, env)."""

    def __init__(self, spec: EnvSpec, alpha: int, members: int, envs: int):
        lead = (alpha, members, envs)
        self.obs = np.zeros(lead + spec.obs_shape, np.float32)
        self.action = np.zeros(lead + spec.action_shape, np.dtype(spec.action_dtype))
        self.reward = np.zeros(lead, np.float32)
        self.next_obs = np.zeros(lead + spec.obs_shape, np.float32)
        self.terminated = np.zeros(lead, np.float32)
        self.ended = np.zeros(lead, bool)
        self.behaviour = None  # the acting parameters that filled it

    def arrays(self) -> dict[str, np.ndarray]:
        return {"obs": self.obs, "action": self.action, "reward": self.reward, "next_obs": self.next_obs,
                "terminated": self.terminated, "ended": self.ended}


class Executors:
    """Executor threads owning env replicas, actor threads answering them, double storage S[0]/S[1].

    Env ``g = member * envs + env`` belongs to executor ``g % executors``. ``segment`` runs one
    segment of ``alpha`` steps per env into ``S[index % 2]``; ``act(obs [members, envs, ...], t
    [members, envs], valid [members, envs]) -> actions`` is called by the actor threads on the padded
    batch. Every wait is bounded: no progress for ``timeout_s`` raises ``InteractionFailed``.
    """

    def __init__(self, env_factory: Callable[[int], Any], spec: EnvSpec, members: int, envs: int, alpha: int,
                 executors: int, actors: int, seed: int, lockstep: bool = False, serial: bool = False,
                 timeout_s: float = 60.0):
        self.spec, self.members, self.envs, self.alpha = spec, members, envs, alpha
        self.n_exec, self.n_actors = executors, actors
        self.seed, self.lockstep, self.serial, self.timeout_s = seed, lockstep, serial, timeout_s
        self.env_factory = env_factory
        self.storage = [Storage(spec, alpha, members, envs), Storage(spec, alpha, members, envs)]
        self.envs_: list | None = None
        self.obs = np.zeros((members * envs,) + spec.obs_shape, np.float32)
        self.returns = np.zeros(members * envs)  # running episode returns
        self.finished = []  # (member, return) of episodes that ended in the last segment
        self.snapshot: dict | None = None  # envs at the last barrier
        self.restore_from: dict | None = None
        self.act = None
        self.variable_batch = None  # negative controls of the determinism study: None | "shape" | "keys"
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self.failed: str | None = None

    # --- set-up and teardown ---
    def start(self) -> None:
        """Makes the envs (reset from the seed, or restored from ``restore_from``) and starts the threads."""
        total = self.members * self.envs
        self.envs_ = [self.env_factory(g) for g in range(total)]
        saved = self.restore_from
        for g, env in enumerate(self.envs_):
            if saved is not None and saved["envs"][g] is not None:
                restore_env(env, saved["envs"][g], self.seed * SEED_STRIDE + g)
            else:
                self.obs[g] = env.reset(seed=self.seed * SEED_STRIDE + g)[0]
        if saved is not None and all(s is not None for s in saved["envs"]):
            self.obs[:] = np.asarray(saved["obs"], np.float32).reshape(self.obs.shape)
            self.returns[:] = saved["returns"]
        self._take_snapshot()
        if self.serial:
            return
        self._jobs = [queue.Queue() for _ in range(self.n_exec)]
        self._replies = [queue.Queue() for _ in range(self.n_exec)]
        self._requests: queue.Queue = queue.Queue()
        self._done: queue.Queue = queue.Queue()
        self._progress = np.zeros(self.n_exec, np.int64)  # steps done in the current segment
        self._last_progress = time.monotonic()
        self._threads = [threading.Thread(target=self._executor, args=(e,), daemon=True, name=f"hts-executor-{e}")
                         for e in range(self.n_exec)]
        self._threads += [threading.Thread(target=self._actor, args=(a,), daemon=True, name=f"hts-actor-{a}")
                          for a in range(self.n_actors)]
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=0.5)  # a hung env's thread is a daemon: it cannot block the exit
        if self.envs_ is not None and self.failed is None:
            for env in self.envs_:
                env.close()

    def _take_snapshot(self) -> None:
        envs = [snapshot_env(env) for env in self.envs_]
        self.snapshot = {"envs": envs, "obs": self.obs.reshape(-1).tolist() if all(envs) else None,
                         "returns": self.returns.tolist()}

    # --- one segment ---
    def segment(self, index: int, behaviour, during: Callable[[], Any] | None = None):
        """Fills ``S[index % 2]`` (tagged with ``behaviour``) while ``during()`` runs in this thread; returns
        ``(storage, during's result)``. In serial mode ``during`` runs first, then the envs step here."""
        if self.failed is not None:
            raise InteractionFailed(self.failed)
        if self.envs_ is None:
            self.start()
        store = self.storage[index % 2]
        store.behaviour = behaviour
        self.finished = []
        if self.serial:
            result = during() if during is not None else None
            self._serial_segment(store)
        else:
            self._step_barrier = threading.Barrier(self.n_exec, timeout=self.timeout_s) if self.lockstep else None
            self._progress[:] = 0
            self._last_progress = time.monotonic()
            for jobs in self._jobs:
                jobs.put(store)
            try:
                result = during() if during is not None else None
            finally:
                self._wait(index)
        self._take_snapshot()
        return store, result

    def _wait(self, index: int) -> None:
        done = 0
        while done < self.n_exec:
            try:
                executor, error = self._done.get(timeout=min(0.05, self.timeout_s))
            except queue.Empty:
                if time.monotonic() - self._last_progress > self.timeout_s:
                    stuck = np.flatnonzero(self._progress == self._progress.min()).tolist()
                    self._fail(f"hts: no env step for {self.timeout_s:g} s in segment {index} (executors {stuck} "
                               f"stuck at step {int(self._progress.min())} of {self.alpha}): an env hangs")
                continue
            if error is not None:
                self._fail(f"hts: {error} in segment {index}")
            done += 1

    def _fail(self, message: str) -> None:
        self.failed = message + "; the run stopped at its last barrier"
        self._stop.set()
        raise InteractionFailed(self.failed)

    def _serial_segment(self, store: Storage) -> None:
        total = self.members * self.envs
        shape = (self.members, self.envs)
        valid = np.ones(shape, bool)
        for t in range(self.alpha):
            obs = self.obs.reshape(shape + self.spec.obs_shape)
            actions = np.asarray(self.act(obs, np.full(shape, t, np.int32), valid))
            actions = actions.reshape((total,) + self.spec.action_shape)
            for g in range(total):
                self._step_env(store, g, t, actions[g])

    def _step_env(self, store: Storage, g: int, t: int, action) -> None:
        spec, env = self.spec, self.envs_[g]
        m, e = divmod(g, self.envs)
        native = int(action) if spec.discrete else self._native(action)
        o, r, term, trunc, _ = env.step(native)
        store.obs[t, m, e], store.action[t, m, e], store.reward[t, m, e] = self.obs[g], action, r
        store.next_obs[t, m, e], store.terminated[t, m, e] = o, float(bool(term))
        store.ended[t, m, e] = bool(term or trunc)
        self.returns[g] += float(r)
        if term or trunc:
            self.finished.append((m, self.returns[g]))
            self.returns[g] = 0.0
            o = env.reset()[0]
        self.obs[g] = o

    def _native(self, action):
        low, high = np.asarray(self.spec.action_low, np.float32), np.asarray(self.spec.action_high, np.float32)
        return low + 0.5 * (np.asarray(action, np.float32) + 1.0) * (high - low)

    def _get(self, q: queue.Queue):
        """``q.get`` that gives up when the run stops (None) or after ``timeout_s`` (TimeoutError)."""
        deadline = time.monotonic() + self.timeout_s
        while not self._stop.is_set():
            try:
                return q.get(timeout=0.05)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no answer for {self.timeout_s:g} s") from None
        return None

    def _executor(self, e: int) -> None:
        mine = list(range(e, self.members * self.envs, self.n_exec))
        while not self._stop.is_set():
            try:
                store = self._jobs[e].get(timeout=0.25)
            except queue.Empty:
                continue
            try:
                for t in range(self.alpha):
                    self._requests.put((e, mine, self.obs[mine].copy(), t))
                    actions = self._get(self._replies[e])
                    if actions is None:
                        return
                    for i, g in enumerate(mine):
                        self._step_env(store, g, t, actions[i])
                    self._progress[e] = t + 1
                    self._last_progress = time.monotonic()
                    if self._step_barrier is not None:
                        self._step_barrier.wait()
                self._done.put((e, None))
            except threading.BrokenBarrierError:
                self._done.put((e, f"executor {e}: the lock-step barrier broke (another executor hangs or failed)"))
                return
            except BaseException as err:  # noqa: BLE001  (reported to the coordinator, which stops the run)
                where = traceback.extract_tb(err.__traceback__)[-1]
                self._done.put((e, f"executor {e} raised {type(err).__name__}: {err} "
                                   f"({where.filename.rsplit('/', 1)[-1]}:{where.lineno})"))
                return

    def _actor(self, a: int) -> None:
        shape = (self.members, self.envs)
        while not self._stop.is_set():
            try:
                requests = [self._requests.get(timeout=0.25)]
            except queue.Empty:
                continue
            while True:  # everything available now: one forward pass for all of it
                try:
                    requests.append(self._requests.get_nowait())
                except queue.Empty:
                    break
            try:
                obs = np.zeros(shape + self.spec.obs_shape, np.float32)
                t = np.zeros(shape, np.int32)
                valid = np.zeros(shape, bool)
                for _, rows, o, step in requests:
                    m, env = np.divmod(np.asarray(rows), self.envs)
                    obs[m, env], t[m, env], valid[m, env] = o, step, True
                actions = np.asarray(self.act(obs, t, valid))
                for e, rows, _, _ in requests:
                    m, env = np.divmod(np.asarray(rows), self.envs)
                    self._replies[e].put(actions[m, env])
            except BaseException as err:  # noqa: BLE001
                self._done.put((-1, f"actor {a} raised {type(err).__name__}: {err}"))
                return


# --- the driver's programs -----------------------------------------------------------------------
class HtsInteraction(OwnInteraction):
    """One segment per loop iteration (see the module docstring); ``executors`` does the env stepping."""

    def __init__(self, executors: Executors, programs: dict[str, Callable], steps_per_member: int,
                 total_env_steps: int):
        self.executors = executors
        self.programs = programs
        self.steps_per_member = steps_per_member
        self.total_env_steps = total_env_steps
        self.timings: list[dict[str, float]] = []
        self.on_act: Callable | None = None  # a test hook: (acting state, obs, t, valid) on every act call

    def iterate(self, compiler, keys, state):
        ex, p = self.executors, self.programs
        key_collect, key_learn = keys[1], keys[2]
        acting = p["acting_view"](state)  # the parameters published at the last barrier
        shape = (ex.members, ex.envs)
        t0, obs0 = np.zeros(shape, np.int32), np.zeros(shape + ex.spec.obs_shape, np.float32)
        act = compiler("hts_act", p["act"], key_collect, acting, obs0, t0)  # compiled here, before any thread
        update = compiler("hts_update", p["update"], key_learn, state)
        ex.act = self._acting_call(act, key_collect, acting)
        index = int(jax.device_get(state.counters.env_steps)) // self.steps_per_member
        start = time.perf_counter()
        timing = {}

        def learn_on(state):
            begin = time.perf_counter()
            out = update(key_learn, state)
            jax.block_until_ready(out)  # "the learner exhausted the storage"
            timing["update_s"] = time.perf_counter() - begin
            return out

        def learn():
            return learn_on(state)

        if ex.lockstep:
            store, _ = ex.segment(index, acting)
            state = self._stage(compiler, state, store)
            state, metrics = learn_on(state)
        else:
            store, (state, metrics) = ex.segment(index, acting, learn)
            state = self._stage(compiler, state, store)  # the barrier: the next segment acts with this state
            if int(jax.device_get(state.counters.env_steps)) >= self.total_env_steps:
                final_key = jax.random.fold_in(key_learn, 1)
                state, metrics = update(final_key, state)  # the last segment's update: #updates = #segments
        timing["segment_s"] = time.perf_counter() - start
        self.timings.append(timing)
        return state, metrics

    def _stage(self, compiler, state, store: Storage):
        arrays = {k: np.array(v) for k, v in store.arrays().items()}  # copies: executors reuse the storage
        stage = compiler("hts_stage", self.programs["stage"], state, arrays, store.behaviour)
        return stage(state, arrays, store.behaviour)

    def _acting_call(self, act, key, acting):
        ex = self.executors

        def call(obs, t, valid):
            if self.on_act is not None:
                self.on_act(acting, obs, t, valid)
            if ex.variable_batch is not None:
                return self.programs["act_variable"](ex.variable_batch, key, acting, obs, t, valid)
            return act(key, acting, obs, t)

        return call

    def close(self) -> None:
        self.executors.close()


class HtsHost(DriverHost):
    """The population's host records (``inner``: plain rows, or PBT's lineage) plus the env snapshots of the
    last barrier in checkpoints."""

    def __init__(self, inner: DriverHost, interaction: HtsInteraction):
        super().__init__(inner.hparams)
        self.inner = inner
        self.interaction = interaction

    def record(self, state, env_steps, returns, info) -> None:
        self.inner.record(state, env_steps, returns, info)

    def rows(self, state, metrics, returns):
        return self.inner.rows(state, metrics, returns)

    def summary(self, state) -> dict[str, Any]:
        return self.inner.summary(state)

    def state_dict(self) -> dict[str, Any]:
        return {**self.inner.state_dict(), "envs": self.interaction.executors.snapshot}

    def load_state_dict(self, data) -> None:
        self.inner.load_state_dict(data)
        self.interaction.executors.restore_from = data.get("envs")


def build(ctx: BuildContext, options: HtsOptions, env_factory: Callable[[int], Any] | None = None) -> Driver:
    cfg, spec, learner, members = ctx.config, ctx.spec, ctx.learner, ctx.members
    on_policy = learner.update_rollout is not None
    if learner.window > 1 or learner.maintain is not None or learner.replay_shrink is not None:
        # Its segment replay holds single transitions and it schedules no maintenance: refuse, never skip them.
        raise ConfigError(f"learner: {cfg.learner} needs multi-step windows, topology steps or a dynamic replay, "
                          "which the hts driver does not run (allowed: independent or pbt drivers)")
    pbt_config = options._pbt
    if pbt_config is not None:
        ctx = pbt.with_prior_hparams(ctx, pbt_config)
    n, envs, alpha = members.local, cfg.envs_per_member, options.alpha
    if members.local != cfg.pop_size:
        raise ConfigError("parallel: the hts driver runs one program for the whole population (not pmap)")
    k, chunk = max(1, round(alpha * envs * cfg.update_ratio)), learner.chunk
    buffer = None if on_policy else make_uniform_buffer(cfg.buffer_size, cfg.batch_size)
    if not on_policy and k % chunk:
        raise ConfigError(f"hts.alpha: {k} updates per segment is not a multiple of the learner's chunk {chunk}")
    warmup = 0 if on_policy else cfg.warmup_steps

    def init(key: Key) -> HtsState:
        learner_state, hparams = init_members(ctx, key)
        pending = buf = None
        if on_policy:
            zero = dummy_transition(spec)
            pending = Trajectory(jax.tree.map(lambda x: jnp.zeros((n, alpha, envs) + x.shape, x.dtype), zero),
                                 jnp.zeros((n, alpha, envs), bool))
        else:
            buf = jax.vmap(lambda _: buffer.init(dummy_transition(spec)))(jnp.arange(n))
        record = None if pbt_config is None else pbt.initial_record(pbt_config.fitness_window, n)
        return HtsState(learner=learner_state, behaviour=learner_state if on_policy else None, hparams=hparams,
                        buffer=buf, pending=pending, has_pending=jnp.zeros((), bool), counters=Counters.zeros(),
                        pbt=record)

    def row_keys(key: Key, t: jax.Array) -> jax.Array:
        """``[n, envs]`` keys: ``fold_in(fold_in(key, member * envs + env), t)`` (global member ids)."""
        ids = members.ids()[:, None] * envs + jnp.arange(envs)[None, :]
        return jax.vmap(jax.vmap(lambda i, s: jax.random.fold_in(jax.random.fold_in(key, i), s)))(ids, t)

    def act_rows(keys, learner_state, hparams, obs, warm):
        """Each row alone (keys/obs ``[rows, ...]`` of one member), so no row depends on another."""
        def one(k_, o):
            k_act, k_rand = jax.random.split(k_)
            a = learner.act(k_act, learner_state, o[None], hparams)[0]
            return jnp.where(warm, random_actions(spec, k_rand, o[None])[0], a) if warmup else a

        return jax.vmap(one)(keys, obs)

    def act(key: Key, acting: HtsState, obs: jax.Array, t: jax.Array) -> jax.Array:
        warm = acting.counters.env_steps < warmup
        return jax.vmap(act_rows, in_axes=(0, 0, 0, 0, None))(row_keys(key, t), acting.learner, acting.hparams,
                                                              obs, warm)

    def act_variable(mode: str, key: Key, acting: HtsState, obs, t, valid) -> np.ndarray:
        """Negative controls: ``shape``: each member's available rows alone (a batch whose shape depends on
        timing); ``keys``: one key per member and call, whatever the rows (randomness from arrival order)."""
        out = np.zeros(valid.shape + spec.action_shape, np.dtype(spec.action_dtype))
        keys = row_keys(key, jnp.asarray(t))
        for m in np.flatnonzero(valid.any(axis=1)):
            rows = np.flatnonzero(valid[m])
            member = jax.tree.map(lambda x, m=m: x[m], (acting.learner, acting.hparams))
            if mode == "shape":
                got = _act_member(act_rows, keys[m][rows], member, obs[m][rows], acting.counters.env_steps < warmup)
            else:
                k_ = jax.random.fold_in(key, time.perf_counter_ns() % 2**31)
                got = learner.act(k_, member[0], jnp.asarray(obs[m][rows]), member[1])
            out[m, rows] = np.asarray(got)
        return out

    def train(key: Key, state: HtsState):
        if on_policy:
            behaviour = state.behaviour if options.delayed_gradient == "eq6" else state.learner
            return jax.vmap(learner.update_rollout)(members.keys(key), state.learner, state.pending, state.hparams,
                                                    behaviour)
        return replay_updates(learner, members, jax.vmap(buffer.sample), k, key, state.learner, state.buffer,
                              state.hparams)

    def update(key: Key, state: HtsState):
        """The update of the staged segment (on-policy) or ``K`` replay updates (off-policy); skipped when no
        segment awaits its update (the first segment) or during warm-up."""
        skip = ~state.has_pending | (state.counters.env_steps < warmup)
        learner_state, metrics = train_unless(skip, train, key, state, kept=state.learner)
        done = jnp.where(skip, 0, learner.rollout_updates if on_policy else k)
        return state.replace(learner=learner_state, has_pending=jnp.zeros((), bool),
                             counters=state.counters.advance(updates=done)), metrics

    def stage(state: HtsState, arrays: dict, behaviour: HtsState) -> HtsState:
        """The barrier: the finished segment ``[alpha, n, envs, ...]`` into the state."""
        per_member = {name: jnp.swapaxes(jnp.asarray(x), 0, 1) for name, x in arrays.items()}  # [n, alpha, envs]
        transitions = Transition(obs=per_member["obs"], action=per_member["action"], reward=per_member["reward"],
                                 next_obs=per_member["next_obs"], terminated=per_member["terminated"])
        if on_policy:
            state = state.replace(pending=Trajectory(transitions, per_member["ended"]), behaviour=behaviour.learner)
        else:  # (t, env) order within each member, as a synchronous rollout adds them
            flat = jax.tree.map(lambda x: x.reshape((n, alpha * envs) + x.shape[3:]), transitions)
            state = state.replace(buffer=jax.vmap(buffer.add)(state.buffer, flat))
        return state.replace(has_pending=jnp.ones((), bool), counters=state.counters.advance(env_steps=alpha * envs))

    if env_factory is None:
        from popjax.envs.gymnasium import make_env
        from popjax.envs.registry import parse

        prefix, env_id = parse(cfg.env)
        if prefix != "gym":
            raise ConfigError(f"env: the hts driver steps gymnasium envs in host threads; {cfg.env} is a JAX env")
        env_factory = lambda g: make_env(env_id)  # noqa: E731
    executors = Executors(env_factory, spec, n, envs, alpha, options.executors, options.actors, cfg.seed,
                          lockstep=options.lockstep, serial=options.serial, timeout_s=options.timeout_s)
    programs = {"act": act, "update": update, "stage": stage, "acting_view": acting_view,
                "act_variable": act_variable}
    interaction = HtsInteraction(executors, programs, alpha * envs, cfg.total_env_steps)
    after_eval, host = None, DriverHost(lambda s: s.hparams)
    if pbt_config is not None:  # the loop calls after_eval between two iterations: always at a barrier
        def after_eval(key, state, returns):
            return pbt.pbt_after_eval(key, state, returns, pbt_config, cfg.total_env_steps, carried=PBT_CARRIED)

        host = pbt.PBTHost()
    return Driver(init=init, interaction=interaction, act=None, learn=None, evaluation=Episodes(cfg.eval_episodes),
                  policy=member_policy(learner), member_axes=MEMBER_AXES, after_eval=after_eval,
                  host=HtsHost(host, interaction))


def hts_run_plots(run_dir) -> list:
    """PBT's plots when the run's population was ``pbt``."""
    population = run_dir.read_config().get("hts", {}).get("population", "independent")
    return pbt.pbt_run_plots(run_dir) if population == "pbt" else []


def _act_member(act_rows, keys, member, obs, warm):
    """``act_rows`` for one member's rows, compiled per number of rows (the shape varies with timing)."""
    return _ACT_MEMBER(act_rows, keys, member[0], member[1], jnp.asarray(obs), warm)


_ACT_MEMBER = jax.jit(lambda f, *a: f(*a), static_argnums=0)

DEFINITION = DriverDef(name="hts", build=build, options=HtsOptions, plots=hts_run_plots, pmap=False, on_policy=True)
