"""The independent driver: members never interact (seeds and hyperparameter sweeps).

Every member has its own learner state, replay, hyperparameters and envs. ``make_population`` builds the
population's functions for the learner's step kind (one builder per kind, ``POPULATIONS``):

- A ``ReplayStep`` (TD3, SAC, DQN, SPO, RLx2): one iteration is ``rollout_len`` steps of each member's
  ``envs_per_member`` envs (uniform random actions during warm-up), the transitions into the member's own replay
  source (the run's ``buffer``: uniform, prioritized, or one registered later), then ``K = updates_per_iter``
  updates for every member in the canonical ``[K, pop, B]`` layout through ``popjax.drivers.replay`` (one scan
  over chunks, whatever the source). Warm-up is decided inside the compiled iteration from the state's counters
  (a ``cond`` outside the member ``vmap``), so a run compiles one iteration, warm-up or not. The learner's hooks
  run as they are declared: a ``ReplayShrink`` inside ``learn`` when its period is crossed, a ``Periodic`` hook as
  the driver's ``Maintenance`` call.
- A ``RolloutStep`` (PPO, A2C): no replay (``buffer`` is None) and no warm-up (random actions are not the
  policy's data). ``learn`` reshapes the iteration's experience ``[pop, T * envs, ...]`` (time-major within a
  member) into a ``Trajectory [pop, T, envs, ...]`` and runs the vmapped step once, with the state itself as the
  behaviour state; the update counter advances by the step's ``updates``.

``make_population`` builds these functions for any state with the fields of ``PopState``; PBT reuses them.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from pydantic import Field, ValidationInfo, model_validator

from popjax.config import ConfigError
from popjax.drivers.base import (
    BuildContext,
    Counters,
    Driver,
    DriverDef,
    DriverHost,
    DriverOptions,
    Episodes,
    Rollout,
    train_unless,
)
from popjax.drivers.replay import (
    maintenance,
    make_source,
    random_actions,
    refresh_replaced,
    replay_updates,
    shrink_replay,
    uses_random_warmup,
    writes_back,
)
from popjax.drivers.schedule import Schedule, with_schedule
from popjax.envs.runner import Experience
from popjax.learners.base import ReplayStep, RolloutStep
from popjax.schema import validate
from popjax.types import Key, Trajectory, dummy_transition


@struct.dataclass
class PopState:
    """Per-member learner states, replay buffers and hparams (member axis 0), and the counters."""

    learner: Any
    buffer: Any  # each member's replay source state; None for rollout steps (no replay)
    hparams: Any
    counters: Counters


MEMBER_AXES = PopState(learner=True, buffer=True, hparams=True, counters=False)


def init_members(ctx: BuildContext, key: Key) -> tuple[Any, Any]:
    """``(learner states, hparams)`` of the members this program holds.

    One member after the other (``lax.map``), not vmapped: a batched LAPACK call (the QR of an orthogonal
    initialiser) fans out on XLA's CPU thread pool, and two of them running at once on a 2-thread pool
    deadlock in jaxlib 0.10 (PPO on HalfCheetah hung at init). Unbatched, they cannot; init runs once."""
    hparams = ctx.members.take(ctx.hparams)
    keys = ctx.members.keys(key)
    return jax.lax.map(lambda member: ctx.learner.init(*member), (keys, hparams)), hparams


def member_policy(learner) -> Any:
    """The population's deterministic policy ``(state, obs [pop, ...]) -> actions`` for a state with ``learner``."""
    return lambda state, obs: jax.vmap(learner.policy)(state.learner, obs)


def make_population(ctx: BuildContext, state_cls=PopState, member_axes=MEMBER_AXES) -> Driver:
    """The independent population's functions, for ``state_cls`` (``PopState`` or one extending its fields)."""
    return POPULATIONS[type(ctx.learner.step)](ctx, state_cls, member_axes)


def _replay_population(ctx: BuildContext, state_cls, member_axes) -> Driver:
    """Members trained from their own replay sources by the learner's ``ReplayStep``."""
    learner, spec, members, cfg = ctx.learner, ctx.spec, ctx.members, ctx.config
    source = make_source(ctx)
    rollout = Rollout(cfg.rollout_len, cfg.envs_per_member)
    k = cfg.updates_per_iter

    def warming_up(state) -> jax.Array:
        return state.counters.env_steps < cfg.warmup_steps

    def init(key: Key, **extra) -> Any:
        learner_state, hparams = init_members(ctx, key)
        replay = jax.vmap(lambda _: source.init())(jnp.arange(members.local))
        return state_cls(learner=learner_state, buffer=replay, hparams=hparams, counters=Counters.zeros(), **extra)

    def act(key: Key, state, obs: jax.Array):
        """``(actions, extras)`` for obs ``[pop, envs, ...]``: uniform random during warm-up, unless the learner
        records its behaviour (then its own ``act`` throughout)."""
        keys = members.keys(key)
        if not uses_random_warmup(learner):
            return jax.vmap(learner.act)(keys, state.learner, obs, state.hparams)
        return jax.lax.cond(warming_up(state),
                            lambda: (jax.vmap(lambda k_, o: random_actions(spec, k_, o))(keys, obs), None),
                            lambda: jax.vmap(learner.act)(keys, state.learner, obs, state.hparams))

    def train(key: Key, state):
        learner_state, replay, metrics = replay_updates(learner, source, members, k, key, state.learner, state.buffer,
                                                        state.hparams)
        return (learner_state, replay), metrics

    def learn(key: Key, state, experience: Experience):
        """Adds the rollout to each member's replay (and shows it to the learner's ``observe``), then trains (after
        warm-up)."""
        warm = warming_up(state)
        state = state.replace(buffer=jax.vmap(source.add)(state.buffer, experience.transitions, experience.ended))
        if learner.observe is not None:  # its own key: the update keys of learners without the hook stay as they were
            key, observe_key = jax.random.split(key)
            observed = jax.vmap(learner.observe)(members.keys(observe_key), state.learner, experience.transitions,
                                                 experience.ended, state.hparams)
            state = state.replace(learner=observed)
        replay_metrics = {}
        if learner.shrink is not None:
            state, replay_metrics = shrink_replay(learner, source, members, rollout.steps_per_member, state)
        kept = (state.learner, state.buffer if writes_back(source) else None)
        (learner_state, replay), metrics = train_unless(warm, train, key, state, kept=kept)
        counters = state.counters.advance(rollout.steps_per_member, jnp.where(warm, 0, k))
        state = state.replace(learner=learner_state, counters=counters,
                              buffer=state.buffer if replay is None else replay)
        return state, {**metrics, **replay_metrics}

    return Driver(init=init, interaction=rollout, act=act, learn=learn, evaluation=Episodes(cfg.eval_episodes),
                  policy=member_policy(learner), member_axes=member_axes, host=DriverHost(lambda state: state.hparams),
                  acting_view=lambda state: state.replace(buffer=None),
                  maintenance=maintenance(learner, source, members),
                  on_replace=(lambda state, replaced: refresh_replaced(learner, source, state, replaced))
                  if learner.step.refresh is not None else None)


def _trajectory(experience: Experience, rollout: Rollout) -> Trajectory:
    """``Experience [pop, T * envs, ...]`` (time-major within a member) as a ``Trajectory [pop, T, envs, ...]``."""
    split = lambda x: x.reshape((x.shape[0], rollout.steps, rollout.envs_per_member) + x.shape[2:])
    return Trajectory(jax.tree.map(split, experience.transitions), split(experience.ended))


def _rollout_population(ctx: BuildContext, state_cls, member_axes) -> Driver:
    """Members trained on their own rollouts by the learner's ``RolloutStep``: no replay, no warm-up."""
    learner, members, cfg = ctx.learner, ctx.members, ctx.config
    rollout = Rollout(cfg.rollout_len, cfg.envs_per_member)
    _check_rollout_shape(ctx, rollout)

    def init(key: Key, **extra) -> Any:
        learner_state, hparams = init_members(ctx, key)
        return state_cls(learner=learner_state, buffer=None, hparams=hparams, counters=Counters.zeros(), **extra)

    def act(key: Key, state, obs: jax.Array):
        return jax.vmap(learner.act)(members.keys(key), state.learner, obs, state.hparams)

    def learn(key: Key, state, experience: Experience):
        """One on-policy update per member on this iteration's rollout, acted by the state itself."""
        trajectory = _trajectory(experience, rollout)
        learner_state, metrics = jax.vmap(learner.step.update)(members.keys(key), state.learner, trajectory,
                                                               state.hparams, state.learner)
        counters = state.counters.advance(rollout.steps_per_member, learner.step.updates)
        return state.replace(learner=learner_state, counters=counters), metrics

    return Driver(init=init, interaction=rollout, act=act, learn=learn, evaluation=Episodes(cfg.eval_episodes),
                  policy=member_policy(learner), member_axes=member_axes, host=DriverHost(lambda state: state.hparams))


def _check_rollout_shape(ctx: BuildContext, rollout: Rollout) -> None:
    """Traces one member's rollout step on the rollout's shapes (nothing is computed), so a shape the
    learner refuses (PPO: minibatches that do not divide the rollout) is a ``ConfigError`` before the run starts."""
    learner, spec = ctx.learner, ctx.spec
    key = jax.random.key(0)
    hparams = jax.tree.map(lambda x: x[0], ctx.hparams)
    state = jax.eval_shape(learner.init, key, hparams)
    steps = lambda x: jnp.zeros((rollout.steps, rollout.envs_per_member) + x.shape, x.dtype)
    trajectory = Trajectory(jax.tree.map(steps, dummy_transition(spec)),
                            jnp.zeros((rollout.steps, rollout.envs_per_member), bool))
    try:
        jax.eval_shape(learner.step.update, key, state, trajectory, hparams, state)
    except ValueError as err:
        raise ConfigError(str(err)) from None


POPULATIONS = {ReplayStep: _replay_population, RolloutStep: _rollout_population}

class IndependentOptions(DriverOptions):
    """``independent`` options."""

    schedule: Any = Field(
        None, description="replay a PBT winner's hparam schedule: the file popjax pbt-schedule writes (popjax train "
        "--schedule FILE sets it); every member starts from its first hparams and switches where PBT switched",
        json_schema_extra={"allowed": "{learner, env, schedule: [{env_steps, hparams}], ...}"})

    @model_validator(mode="after")
    def _schedule(self, info: ValidationInfo):
        if self.schedule is not None and not isinstance(self.schedule, Schedule):
            self.schedule = validate(Schedule, self.schedule, at=("schedule",), context=info.context, nested=True)
        return self

    def given(self, raw):
        return {**super().given(raw), **({"schedule": self.schedule.model_dump()} if "schedule" in raw else {})}

    def searched_hparams(self) -> frozenset[str]:
        return frozenset() if self.schedule is None else self.schedule.hparams()


def build(ctx: BuildContext, options: IndependentOptions) -> Driver:
    """Members trained apart; with a ``schedule``, their hparams follow it."""
    if options.schedule is None:
        return make_population(ctx)
    return with_schedule(ctx, make_population, options.schedule)


DEFINITION = DriverDef(name="independent", build=build, options=IndependentOptions, steps=(ReplayStep, RolloutStep),
                       sources=None, independent_members=True)
