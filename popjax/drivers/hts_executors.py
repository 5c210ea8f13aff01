"""HTS-RL's threads: executors stepping gymnasium env replicas and actor threads answering them, with a barrier
every ``alpha`` steps per env (see ``popjax.drivers.hts`` for the schedule and its determinism).

``Executors`` knows nothing of learners: it steps envs with whatever ``act(obs, t, valid)`` it is given, writes
each transition by (t, member, env) into a ``Storage``, and raises ``InteractionFailed`` when an env raises or a
thread makes no progress for ``timeout_s``. Env snapshots (``snapshot_env``/``restore_env``) make resume exact on
envs that offer ``get_state``/``set_state``.
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
import numpy as np

from popjax.drivers.base import InteractionFailed
from popjax.envs.gymnasium import SEED_STRIDE
from popjax.types import EnvSpec


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
        self.extras = None  # what the learner records per transition (``act`` returned (actions, extras)), if any
        self.behaviour = None  # the acting parameters that filled it

    def arrays(self) -> dict[str, np.ndarray]:
        arrays = {"obs": self.obs, "action": self.action, "reward": self.reward, "next_obs": self.next_obs,
                  "terminated": self.terminated, "ended": self.ended}
        return arrays if self.extras is None else {**arrays, "extras": self.extras}

    def record(self, t: int, m: int, e: int, extras) -> None:
        """The learner's per-transition record of step ``t`` of env ``(m, e)`` (arrays allocated at the first)."""
        if self.extras is None:
            lead = self.reward.shape
            self.extras = jax.tree.map(lambda x: np.zeros(lead + np.shape(x), np.asarray(x).dtype), extras)
        for stored, value in zip(jax.tree.leaves(self.extras), jax.tree.leaves(extras), strict=True):
            stored[t, m, e] = value


def split_rows(acted):
    """The ``(actions, extras | None)`` of an act call, as numpy (extras: what the learner records)."""
    action, extras = acted
    return np.asarray(action), jax.tree.map(np.asarray, extras)


def row_of(extras, index):
    """Row ``index`` of every extras leaf (None stays None)."""
    return None if extras is None else jax.tree.map(lambda x: x[index], extras)


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
            actions, extras = split_rows(self.act(obs, np.full(shape, t, np.int32), valid))
            actions = actions.reshape((total,) + self.spec.action_shape)
            extras = jax.tree.map(lambda x: x.reshape((total,) + x.shape[2:]), extras)
            for g in range(total):
                self._step_env(store, g, t, actions[g], row_of(extras, g))

    def _step_env(self, store: Storage, g: int, t: int, action, extras=None) -> None:
        spec, env = self.spec, self.envs_[g]
        m, e = divmod(g, self.envs)
        if extras is not None:
            store.record(t, m, e, extras)
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
                    reply = self._get(self._replies[e])
                    if reply is None:
                        return
                    actions, extras = reply
                    for i, g in enumerate(mine):
                        self._step_env(store, g, t, actions[i], row_of(extras, i))
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
                actions, extras = split_rows(self.act(obs, t, valid))
                for e, rows, _, _ in requests:
                    m, env = np.divmod(np.asarray(rows), self.envs)
                    self._replies[e].put((actions[m, env], row_of(extras, (m, env))))
            except BaseException as err:  # noqa: BLE001
                self._done.put((-1, f"actor {a} raised {type(err).__name__}: {err}"))
                return


# --- the driver's programs -----------------------------------------------------------------------
