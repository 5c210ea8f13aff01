"""The independent driver: members never interact (seeds and hyperparameter sweeps).

Every member has its own learner state, replay buffer, hyperparameters and envs. One
iteration: ``rollout_len`` steps of each member's ``envs_per_member`` envs (uniform random
actions during warm-up), the transitions into the member's own buffer, then
``K = updates_per_iter`` gradient steps for every member in the canonical ``[K, pop, B]``
layout (``scan`` over K outside, ``vmap`` over members inside). Warm-up is decided inside the
compiled iteration from the state's counters (a ``cond`` outside the member ``vmap``), so a
run compiles one iteration, warm-up or not.

With ``buffer: prioritized`` each member's buffer is a prioritized one (``popjax.buffers.prioritized``,
``learner.banks`` banks, the member's own alpha/beta/eps in its state). A learner with ``update_weighted`` is
driven by single steps: each of the K steps samples by priority, calls ``update_weighted`` with the importance
weights and writes the returned ``|TD error|`` back as the sampled rows' priorities (a TD3 ``update_chunk`` is not
used). A learner with ``update_chunk_weighted`` (SPO) is driven by chunks: per chunk of H steps it samples H
batches (each bank its own B / banks rows, so replica r reads bank r), runs the chunk, then writes the H steps'
priorities in step order. All H batches are drawn before the chunk, so within a chunk priorities lag by up to
H - 1 samplings (the thesis's SPO learners, Zhang 2022 Alg. 7/8, write before each next sample): the same
relaxation as the write delay. Writes go through the buffer's delay FIFO
(``per_delay`` D: step t's write lands just before step t + D samples; pending writes are carried across
iterations in the buffer state).

On-policy learners (``LearnerDef.on_policy``: PPO, A2C) keep no buffer (``buffer`` is None) and take no
warm-up (``warmup_steps`` is ignored: random actions are not their policy's data). ``learn`` reshapes the
iteration's experience ``[pop, T * envs, ...]`` (time-major within a member) into a
``Trajectory [pop, T, envs, ...]`` and calls the vmapped ``update_rollout`` once, with the state itself as
the behaviour state (the policy that acted in this iteration is the current one); the update counter
advances by the learner's ``rollout_updates``.

``make_population`` builds these functions for any state with the fields of ``PopState``;
PBT reuses them.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from popjax.buffers import (
    BufferState,
    drop_oldest,
    make_prioritized_buffer,
    make_uniform_buffer,
    oldest_items,
    per_hyperparams,
    sample_windows,
)
from popjax.config import ConfigError
from popjax.drivers.base import (
    BuildContext,
    Counters,
    Driver,
    DriverDef,
    DriverHost,
    Episodes,
    Maintenance,
    Rollout,
    train_unless,
)
from popjax.envs.runner import Experience
from popjax.learners.base import chunk_update
from popjax.types import EnvSpec, Key, Trajectory, Windows, dummy_transition


@struct.dataclass
class PopState:
    """Per-member learner states, replay buffers and hparams (member axis 0), and the counters."""

    learner: Any
    buffer: BufferState | None  # or a PrioritizedBufferState; None for on-policy learners
    hparams: Any
    counters: Counters


MEMBER_AXES = PopState(learner=True, buffer=True, hparams=True, counters=False)


def random_actions(spec: EnvSpec, key: Key, obs: jax.Array) -> jax.Array:
    """Uniform random actions (warm-up) for one member's obs ``[envs, ...]``."""
    if spec.discrete:
        return jax.random.randint(key, obs.shape[:1], 0, spec.num_actions, jnp.int32)
    return jax.random.uniform(key, obs.shape[:1] + (spec.action_dim,), minval=-1.0, maxval=1.0)


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


def replay_updates(learner, members, v_sample, k: int, key: Key, learner_state, buffers, hparams):
    """K gradient steps for every member, in chunks of the learner's ``chunk`` (1: one update per scan step);
    step ``i`` samples (``v_sample(member keys, buffers)``) and updates with the keys of ``split(key, K)[i]``
    either way. Returns the learner states and the metrics, means over the K steps, ``[pop]``."""
    chunk = learner.chunk
    # A chunk of consecutive updates per member (keys [chunk], batches [chunk, B, ...]): vmapped over members.
    v_chunk = jax.vmap(chunk_update(learner), in_axes=(1, 0, 1, 0))

    def one_chunk(learner_state, chunk_keys):
        sample_keys, update_keys = jnp.moveaxis(jax.vmap(jax.random.split)(chunk_keys), 1, 0)
        batches = jax.vmap(lambda k_: v_sample(members.keys(k_), buffers))(sample_keys)  # [chunk, pop, ...]
        return v_chunk(jax.vmap(members.keys)(update_keys), learner_state, batches, hparams)

    step_keys = jax.random.split(key, k).reshape(k // chunk, chunk)
    learner_state, metrics = jax.lax.scan(one_chunk, learner_state, step_keys)
    return learner_state, jax.tree.map(lambda m: m.mean(axis=0), metrics)


def make_population(ctx: BuildContext, state_cls=PopState, member_axes=MEMBER_AXES) -> Driver:
    """The independent population's functions, for ``state_cls`` (``PopState`` or one extending its fields)."""
    learner, spec, members, cfg = ctx.learner, ctx.spec, ctx.members, ctx.config
    if ctx.learner_def.on_policy:
        return _on_policy_population(ctx, state_cls, member_axes)
    prioritized = cfg.buffer == "prioritized"
    chunked_per = prioritized and learner.update_chunk_weighted is not None
    if prioritized and learner.update_weighted is None and not chunked_per:
        raise ConfigError(f"buffer: the {cfg.learner} learner has no prioritized update (allowed: uniform)")
    banks = learner.banks if prioritized else 1
    if cfg.buffer_size % banks:
        raise ConfigError(f"buffer_size: must be a multiple of the {banks} replay banks (one per replica) with "
                          f"buffer: prioritized, got {cfg.buffer_size}")
    if cfg.steps_per_iter % banks:
        raise ConfigError(f"rollout_len: rollout_len x envs_per_member ({cfg.steps_per_iter}) must be a multiple of "
                          f"the {banks} replay banks (one per replica) with buffer: prioritized")
    buffer = (make_prioritized_buffer(cfg.buffer_size, cfg.batch_size, banks=banks, delay=cfg.per_delay)
              if prioritized
              else make_uniform_buffer(cfg.buffer_size, cfg.batch_size))
    window = learner.window
    if window > 1 and (prioritized or cfg.buffer_size % cfg.envs_per_member):
        raise ConfigError(f"buffer_size: multi-step windows need a uniform buffer whose size is a multiple of "
                          f"envs_per_member ({cfg.envs_per_member}), got {cfg.buffer_size} ({cfg.buffer})")
    # Multi-step learners read windows of one env's consecutive rows, so rows keep their episode-end flags.
    row = (dummy_transition(spec), jnp.zeros((), bool)) if window > 1 else dummy_transition(spec)
    new_buffer = ((lambda: buffer.init(row, per_hyperparams(cfg.per_alpha, cfg.per_beta, cfg.per_eps)))
                  if prioritized else (lambda: buffer.init(row)))
    rollout = Rollout(cfg.rollout_len, cfg.envs_per_member)
    k, chunk = cfg.updates_per_iter, learner.chunk
    if window > 1:
        v_sample = jax.vmap(lambda k_, b: Windows(*sample_windows(k_, b, cfg.batch_size, window, cfg.envs_per_member)))
    else:
        v_sample = jax.vmap(buffer.sample)
    def warming_up(state) -> jax.Array:
        return state.counters.env_steps < cfg.warmup_steps

    def init(key: Key, **extra) -> Any:
        learner_state, hparams = init_members(ctx, key)
        buffers = jax.vmap(lambda _: new_buffer())(jnp.arange(members.local))
        return state_cls(learner=learner_state, buffer=buffers, hparams=hparams, counters=Counters.zeros(), **extra)

    def act(key: Key, state, obs: jax.Array) -> jax.Array:
        """Exploration actions for obs ``[pop, envs, ...]`` (uniform random during warm-up)."""
        keys = members.keys(key)
        return jax.lax.cond(warming_up(state),
                            lambda: jax.vmap(lambda k_, o: random_actions(spec, k_, o))(keys, obs),
                            lambda: jax.vmap(learner.act)(keys, state.learner, obs, state.hparams))

    def train(key: Key, state):
        return replay_updates(learner, members, v_sample, k, key, state.learner, state.buffer, state.hparams)

    def train_prioritized(key: Key, state):
        """K single steps, each: sample by priority, weighted update, write the new priorities. Returns
        ``((learner states, buffers), metrics)``; the metrics add ``td_abs``, the mean |TD error| of the batch."""
        v_update = jax.vmap(learner.update_weighted)

        def one_step(carry, step_key):
            learner_state, buffers = carry
            sample_key, update_key = jax.random.split(step_key)
            batches, info = jax.vmap(buffer.sample)(members.keys(sample_key), buffers)
            weights = info.weights.reshape(info.weights.shape[0], -1)  # [pop, B] (one bank)
            learner_state, metrics, td_abs = v_update(members.keys(update_key), learner_state, batches, weights,
                                                      state.hparams)
            buffers = jax.vmap(buffer.update)(buffers, info.indices, td_abs)
            return (learner_state, buffers), {**metrics, "td_abs": td_abs.mean(axis=-1)}

        carry, metrics = jax.lax.scan(one_step, (state.learner, state.buffer), jax.random.split(key, k))
        return carry, jax.tree.map(lambda m: m.mean(axis=0), metrics)

    def train_prioritized_chunks(key: Key, state):
        """K steps in chunks of the learner's ``chunk`` H: sample H batches by priority from the chunk's buffers,
        one weighted chunk update, then the H steps' priority writes in step order. Step ``i`` uses the keys of
        ``split(key, K)[i]`` as in ``train_prioritized`` (so H = 1 samples and updates what single steps do)."""
        v_chunk_weighted = jax.vmap(learner.update_chunk_weighted, in_axes=(1, 0, 1, 1, 0))
        v_write = jax.vmap(buffer.update)

        def one_chunk(carry, chunk_keys):
            learner_state, buffers = carry
            sample_keys, update_keys = jnp.moveaxis(jax.vmap(jax.random.split)(chunk_keys), 1, 0)
            batches, info = jax.vmap(lambda k_: jax.vmap(buffer.sample)(members.keys(k_), buffers))(sample_keys)
            weights = info.weights.reshape(info.weights.shape[:2] + (-1,))  # [H, pop, B], bank-major
            learner_state, metrics, td_abs = v_chunk_weighted(jax.vmap(members.keys)(update_keys), learner_state,
                                                              batches, weights, state.hparams)
            td_abs = jnp.moveaxis(td_abs, 1, 0)  # [H, pop, B]
            buffers, _ = jax.lax.scan(lambda b, x: (v_write(b, *x), None), buffers, (info.indices, td_abs))
            return (learner_state, buffers), {**metrics, "td_abs": td_abs.mean(axis=(0, 2))}

        step_keys = jax.random.split(key, k).reshape(k // chunk, chunk)
        carry, metrics = jax.lax.scan(one_chunk, (state.learner, state.buffer), step_keys)
        return carry, jax.tree.map(lambda m: m.mean(axis=0), metrics)

    def shrink_replay(state):
        """The learner's dynamic replay capacity: when the env steps cross a multiple of its check interval (a
        ``cond`` outside the member vmap), each member forgets the oldest rows its ``replay_shrink`` asks for."""
        every, before = learner.replay_check_every, state.counters.env_steps
        due = (before + rollout.steps_per_member) // every > before // every

        def shrink(buffers):
            def one(learner_state, buf, hp):
                rows, valid = oldest_items(buf, learner.replay_oldest)
                count, distance = learner.replay_shrink(learner_state, rows[0] if window > 1 else rows, valid,
                                                        buf.size, hp)
                return drop_oldest(buf, count), distance

            return jax.vmap(one)(state.learner, buffers, state.hparams)

        buffers, distance = jax.lax.cond(
            due, shrink, lambda b: (b, jnp.full((members.local,), jnp.nan)), state.buffer)
        return state.replace(buffer=buffers), {"replay_size": buffers.size.astype(jnp.float32),
                                               "policy_distance": distance}

    def learn(key: Key, state, experience: Experience):
        """Adds the rollout to each member's buffer, then trains (after warm-up)."""
        warm = warming_up(state)
        rows = (experience.transitions, experience.ended) if window > 1 else experience.transitions
        state = state.replace(buffer=jax.vmap(buffer.add)(state.buffer, rows))
        replay_metrics = {}
        if learner.replay_shrink is not None:
            state, replay_metrics = shrink_replay(state)
        if prioritized:
            (learner_state, buffers), metrics = train_unless(
                warm, train_prioritized_chunks if chunked_per else train_prioritized, key, state,
                kept=(state.learner, state.buffer))
            state = state.replace(buffer=buffers)
        else:
            learner_state, metrics = train_unless(warm, train, key, state, kept=state.learner)
        counters = state.counters.advance(rollout.steps_per_member, jnp.where(warm, 0, k))
        return state.replace(learner=learner_state, counters=counters), {**metrics, **replay_metrics}

    def maintain(key: Key, state):
        """The learner's ``maintain`` for every member on a fresh batch (after warm-up: the updates counted)."""
        sample_key, update_key = jax.random.split(key)
        batches = v_sample(members.keys(sample_key), state.buffer)
        if prioritized:
            batches = batches[0]
        learner_state, metrics = jax.vmap(learner.maintain)(members.keys(update_key), state.learner, batches,
                                                            state.hparams)
        return state.replace(learner=learner_state), metrics

    maintenance = Maintenance(learner.maintain_every, maintain) if learner.maintain is not None else None
    return Driver(init=init, interaction=rollout, act=act, learn=learn, evaluation=Episodes(cfg.eval_episodes),
                  policy=member_policy(learner), member_axes=member_axes, host=DriverHost(lambda state: state.hparams),
                  acting_view=lambda state: state.replace(buffer=None), maintenance=maintenance)


def _trajectory(experience: Experience, rollout: Rollout) -> Trajectory:
    """``Experience [pop, T * envs, ...]`` (time-major within a member) as a ``Trajectory [pop, T, envs, ...]``."""
    split = lambda x: x.reshape((x.shape[0], rollout.steps, rollout.envs_per_member) + x.shape[2:])
    return Trajectory(jax.tree.map(split, experience.transitions), split(experience.ended))


def _on_policy_population(ctx: BuildContext, state_cls, member_axes) -> Driver:
    """The independent population of an on-policy learner: no buffer, no warm-up, one ``update_rollout``."""
    learner, members, cfg = ctx.learner, ctx.members, ctx.config
    rollout = Rollout(cfg.rollout_len, cfg.envs_per_member)
    _check_rollout_shape(ctx, rollout)

    def init(key: Key, **extra) -> Any:
        learner_state, hparams = init_members(ctx, key)
        return state_cls(learner=learner_state, buffer=None, hparams=hparams, counters=Counters.zeros(), **extra)

    def act(key: Key, state, obs: jax.Array) -> jax.Array:
        return jax.vmap(learner.act)(members.keys(key), state.learner, obs, state.hparams)

    def learn(key: Key, state, experience: Experience):
        """One on-policy update per member on this iteration's rollout, acted by the state itself."""
        trajectory = _trajectory(experience, rollout)
        learner_state, metrics = jax.vmap(learner.update_rollout)(members.keys(key), state.learner, trajectory,
                                                                  state.hparams, state.learner)
        counters = state.counters.advance(rollout.steps_per_member, learner.rollout_updates)
        return state.replace(learner=learner_state, counters=counters), metrics

    return Driver(init=init, interaction=rollout, act=act, learn=learn, evaluation=Episodes(cfg.eval_episodes),
                  policy=member_policy(learner), member_axes=member_axes, host=DriverHost(lambda state: state.hparams))


def _check_rollout_shape(ctx: BuildContext, rollout: Rollout) -> None:
    """Traces one member's ``update_rollout`` on the rollout's shapes (nothing is computed), so a shape the
    learner refuses (PPO: minibatches that do not divide the rollout) is a ``ConfigError`` before the run starts."""
    learner, spec = ctx.learner, ctx.spec
    key = jax.random.key(0)
    hparams = jax.tree.map(lambda x: x[0], ctx.hparams)
    state = jax.eval_shape(learner.init, key, hparams)
    steps = lambda x: jnp.zeros((rollout.steps, rollout.envs_per_member) + x.shape, x.dtype)
    trajectory = Trajectory(jax.tree.map(steps, dummy_transition(spec)),
                            jnp.zeros((rollout.steps, rollout.envs_per_member), bool))
    try:
        jax.eval_shape(learner.update_rollout, key, state, trajectory, hparams, state)
    except ValueError as err:
        raise ConfigError(str(err)) from None


DEFINITION = DriverDef(name="independent", build=lambda ctx, options: make_population(ctx), prioritized_replay=True,
                       on_policy=True)
