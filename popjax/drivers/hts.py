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

import functools
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from pydantic import Field, PrivateAttr, ValidationInfo, model_validator

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
    OwnInteraction,
    run_config,
    train_unless,
)
from popjax.drivers.hts_executors import Executors, Storage
from popjax.drivers.independent import init_members, member_policy
from popjax.drivers.pbt_options import PBTConfig
from popjax.drivers.pbt_round import PBTRecord
from popjax.drivers.replay import make_source, random_actions, refresh_replaced, replay_updates, uses_random_warmup
from popjax.learners.base import ReplayStep, RolloutStep
from popjax.population.tree import member
from popjax.schema import Bool, Float, Int, OneOf, problem
from popjax.types import Key, Trajectory, Transition, dummy_transition

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
    _pbt: PBTConfig | None = PrivateAttr(default=None)

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

    def couples_members(self) -> bool:
        return self._pbt is not None


@struct.dataclass
class HtsState:
    """Learner states, their behaviour copies, hparams, replay buffers (off-policy), the staged segment
    (on-policy, ``[pop, alpha, envs, ...]``), whether it awaits its update, and the counters."""

    learner: Any
    behaviour: Any
    hparams: Any
    buffer: Any  # each member's uniform replay source state; None for rollout steps
    pending: Trajectory | None
    has_pending: jax.Array
    counters: Counters
    pbt: PBTRecord | None = None  # population: pbt


MEMBER_AXES = HtsState(learner=True, behaviour=True, hparams=True, buffer=True, pending=True, has_pending=False,
                       counters=False, pbt=False)
# What a PBT loser copies from its parent at a barrier: its behaviour state and staged segment go with the
# learner state, so the copy's next update is exactly the parent's (with the loser's new hparams).
PBT_CARRIED = ("learner", "behaviour", "pending")


def acting_view(state: HtsState) -> HtsState:
    """What ``act`` reads: the published parameters (no buffers, no staged data)."""
    return state.replace(behaviour=None, buffer=None, pending=None)


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
        # Replaces the compiled act (experiments' negative controls): (programs, key, acting state, obs, t, valid)
        # -> (actions, extras); ``programs`` holds the driver's functions (``act_rows``, ``row_keys``, ...).
        self.act_override: Callable | None = None

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
        arrays = jax.tree.map(np.array, store.arrays())  # copies: executors reuse the storage
        stage = compiler("hts_stage", self.programs["stage"], state, arrays, store.behaviour)
        return stage(state, arrays, store.behaviour)

    def _acting_call(self, act, key, acting):
        def call(obs, t, valid):
            if self.on_act is not None:
                self.on_act(acting, obs, t, valid)
            if self.act_override is not None:
                return self.act_override(self.programs, key, acting, obs, t, valid)
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
    """The hts driver; with ``population: pbt`` transformed by PBT (exploits at barriers, ``PBT_CARRIED``)."""
    build_hts = functools.partial(build_independent, options=options, env_factory=env_factory)
    if options._pbt is None:
        return build_hts(ctx)
    return pbt.with_pbt(build_hts, options._pbt, carried=PBT_CARRIED)(ctx)


class SegmentLearning(NamedTuple):
    """What the hts driver does with segments, for one kind of learner step (``SEGMENTS``).

    ``init(learner states) -> {behaviour, buffer, pending}`` (the state fields the kind keeps); ``stage(state,
    transitions, ended, behaviour) -> state`` takes a finished segment (``[n, alpha, envs, ...]``) in at the
    barrier; ``train(key, state) -> ((learner states, buffers), metrics)`` is one update call, which makes
    ``updates`` gradient steps per member (buffers: what a replay source wrote back); ``warmup``: env steps per
    member with no updates (and random actions, unless the learner records its behaviour); ``on_replace``: the
    ``Driver.on_replace`` of the kind (None: nothing derived from the learner state)."""

    init: Callable[[Any], dict[str, Any]]
    stage: Callable[[Any, Transition, jax.Array, Any], Any]
    train: Callable[[Key, Any], tuple[Any, Any]]
    updates: int
    warmup: int
    on_replace: Callable | None = None


def rollout_segments(ctx: BuildContext, options: HtsOptions) -> SegmentLearning:
    """On-policy: the segment is staged as the next update's trajectory, with the behaviour state that collected
    it (the update corrects for the one-segment lag; ``delayed_gradient: none`` passes the current state)."""
    learner, members, cfg, n, alpha = ctx.learner, ctx.members, ctx.config, ctx.members.local, options.alpha
    shape = (n, alpha, cfg.envs_per_member)

    def init(learner_state):
        zero = jax.tree.map(lambda x: jnp.zeros(shape + x.shape, x.dtype), dummy_transition(ctx.spec))
        return {"behaviour": learner_state, "buffer": None, "pending": Trajectory(zero, jnp.zeros(shape, bool))}

    def stage(state, transitions, ended, behaviour):
        return state.replace(pending=Trajectory(transitions, ended), behaviour=behaviour.learner)

    def train(key, state):
        behaviour = state.behaviour if options.delayed_gradient == "eq6" else state.learner
        learner_state, metrics = jax.vmap(learner.step.update)(members.keys(key), state.learner, state.pending,
                                                               state.hparams, behaviour)
        return (learner_state, state.buffer), metrics

    return SegmentLearning(init, stage, train, updates=learner.step.updates, warmup=0)


def replay_segments(ctx: BuildContext, options: HtsOptions) -> SegmentLearning:
    """Off-policy: the segment goes into each member's replay source at the barrier, in (t, env) order as a
    synchronous rollout adds it, and each update call makes ``K = alpha x envs x update_ratio`` updates."""
    learner, members, cfg, n = ctx.learner, ctx.members, ctx.config, ctx.members.local
    k, chunk = max(1, round(options.alpha * cfg.envs_per_member * cfg.update_ratio)), learner.step.chunk
    if k % chunk:
        raise ConfigError(f"hts.alpha: {k} updates per segment is not a multiple of the learner's chunk {chunk}")
    source = make_source(ctx)

    def init(learner_state):
        return {"behaviour": None, "buffer": jax.vmap(lambda _: source.init())(jnp.arange(n)), "pending": None}

    def stage(state, transitions, ended, behaviour):
        del behaviour
        flat = jax.tree.map(lambda x: x.reshape((n, -1) + x.shape[3:]), (transitions, ended))
        return state.replace(buffer=jax.vmap(source.add)(state.buffer, *flat))

    def train(key, state):
        learner_state, replay, metrics = replay_updates(learner, source, members, k, key, state.learner,
                                                        state.buffer, state.hparams)
        return (learner_state, state.buffer if replay is None else replay), metrics  # replay: values written back

    on_replace = None
    if learner.step.refresh is not None:
        on_replace = lambda state, replaced: refresh_replaced(learner, source, state, replaced)  # noqa: E731
    return SegmentLearning(init, stage, train, updates=k, warmup=cfg.warmup_steps, on_replace=on_replace)


SEGMENTS = {RolloutStep: rollout_segments, ReplayStep: replay_segments}


def build_independent(ctx: BuildContext, options: HtsOptions, env_factory: Callable[[int], Any] | None = None
                      ) -> Driver:
    """Independent members on the HTS schedule."""
    cfg, spec, learner, members = ctx.config, ctx.spec, ctx.learner, ctx.members
    n, envs, alpha = members.local, cfg.envs_per_member, options.alpha
    if members.local != cfg.pop_size:
        raise ConfigError("parallel: the hts driver runs one program for the whole population (not pmap)")
    segments = SEGMENTS[type(learner.step)](ctx, options)
    warmup = segments.warmup

    def init(key: Key, pbt: PBTRecord | None = None) -> HtsState:
        learner_state, hparams = init_members(ctx, key)
        return HtsState(learner=learner_state, hparams=hparams, has_pending=jnp.zeros((), bool),
                        counters=Counters.zeros(), pbt=pbt, **segments.init(learner_state))

    def row_keys(key: Key, t: jax.Array) -> jax.Array:
        """``[n, envs]`` keys: ``fold_in(fold_in(key, member * envs + env), t)`` (global member ids)."""
        ids = members.ids()[:, None] * envs + jnp.arange(envs)[None, :]
        return jax.vmap(jax.vmap(lambda i, s: jax.random.fold_in(jax.random.fold_in(key, i), s)))(ids, t)

    def act_rows(keys, learner_state, hparams, obs, warm):
        """Each row alone (keys/obs ``[rows, ...]`` of one member), so no row depends on another."""
        def one(k_, o):
            k_act, k_rand = jax.random.split(k_)
            action, extras = member(learner.act(k_act, learner_state, o[None], hparams), 0)
            if not warmup or not uses_random_warmup(learner):  # a learner that records its behaviour acts itself
                return action, extras
            return jnp.where(warm, random_actions(spec, k_rand, o[None])[0], action), extras

        return jax.vmap(one)(keys, obs)

    def act(key: Key, acting: HtsState, obs: jax.Array, t: jax.Array) -> jax.Array:
        warm = acting.counters.env_steps < warmup
        return jax.vmap(act_rows, in_axes=(0, 0, 0, 0, None))(row_keys(key, t), acting.learner, acting.hparams,
                                                              obs, warm)

    def update(key: Key, state: HtsState):
        """The update of the staged segment (on-policy) or ``K`` replay updates (off-policy); skipped when no
        segment awaits its update (the first segment) or during warm-up."""
        skip = ~state.has_pending | (state.counters.env_steps < warmup)
        (learner_state, buffer), metrics = train_unless(skip, segments.train, key, state,
                                                        kept=(state.learner, state.buffer))
        done = jnp.where(skip, 0, segments.updates)
        return state.replace(learner=learner_state, buffer=buffer, has_pending=jnp.zeros((), bool),
                             counters=state.counters.advance(updates=done)), metrics

    def stage(state: HtsState, arrays: dict, behaviour: HtsState) -> HtsState:
        """The barrier: the finished segment ``[alpha, n, envs, ...]`` into the state."""
        per_member = jax.tree.map(lambda x: jnp.swapaxes(jnp.asarray(x), 0, 1), arrays)  # [n, alpha, envs]
        transitions = Transition(obs=per_member["obs"], action=per_member["action"], reward=per_member["reward"],
                                 next_obs=per_member["next_obs"], terminated=per_member["terminated"],
                                 extras=per_member.get("extras"))
        state = segments.stage(state, transitions, per_member["ended"], behaviour)
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
    programs = {"act": act, "update": update, "stage": stage, "acting_view": acting_view, "act_rows": act_rows,
                "row_keys": row_keys, "learner_act": learner.act}
    interaction = HtsInteraction(executors, programs, alpha * envs, cfg.total_env_steps)
    # With PBT, the loop calls after_eval between two iterations: always at a barrier.
    return Driver(init=init, interaction=interaction, evaluation=Episodes(cfg.eval_episodes),
                  policy=member_policy(learner), member_axes=MEMBER_AXES,
                  host=HtsHost(DriverHost(lambda s: s.hparams), interaction), on_replace=segments.on_replace)


def hts_run_plots(run_dir) -> list:
    """PBT's plots when the run's population was ``pbt``."""
    population = run_dir.read_config().get("hts", {}).get("population", "independent")
    return pbt.pbt_run_plots(run_dir) if population == "pbt" else []


DEFINITION = DriverDef(name="hts", build=build, options=HtsOptions, plots=hts_run_plots, pmap=False,
                       steps=(ReplayStep, RolloutStep), learner_hooks=False, independent_members=True)
