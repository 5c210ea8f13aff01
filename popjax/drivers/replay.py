"""Training from replay, shared by every driver whose members learn from their own replay source.

One scan over chunks serves every learner and every source: per chunk of the learner's H updates it samples H
batches per member from the member's source, runs the learner's ``ReplayStep`` once (vmapped over members), and,
when the source writes back (prioritized replay: |TD| as new priorities), writes the H steps' values in step
order. All H batches are drawn before the chunk, so within a chunk written values lag by up to H - 1 samplings
(SPO's rounds; the thesis writes before each next sample): the same relaxation as a priority-write delay.

Step ``i`` of the K samples and updates with the keys of ``split(key, K)[i]`` whatever H is, so a chunk of 1 and
a chunk of H draw the same batches.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from popjax.buffers import SOURCES, ReplaySource
from popjax.drivers.base import BuildContext, Maintenance
from popjax.learners.base import Learner
from popjax.population.members import Members
from popjax.schema import ConfigError
from popjax.types import EnvSpec, Key


def make_source(ctx: BuildContext) -> ReplaySource:
    """The run's replay source (``buffer``) for the learner's replay step; refuses what cannot work together."""
    cfg, learner = ctx.config, ctx.learner
    definition = SOURCES[cfg.buffer]
    source = definition.make(cfg, ctx.spec, learner.step)
    refreshes = learner.step.refresh is not None
    # A source writes back what its entry declares: priorities, or the learner's refreshed value.
    if (source.write_back is not None) != definition.writes_back_for(learner.step):
        raise TypeError(f"replay source {cfg.buffer}: SourceDef.writes_back_for({cfg.learner}'s step) is "
                        f"{definition.writes_back_for(learner.step)}, its source "
                        f"{'has' if source.write_back is not None else 'has no'} write_back")
    if refreshes and not (definition.keeps_refreshed and source.rewrite is not None):
        raise ConfigError(f"buffer: the {cfg.learner} learner keeps a refreshed value per transition, which the "
                          f"{cfg.buffer} source does not store (allowed: uniform)")
    if source.write_back is not None and not learner.step.priorities and not refreshes:
        raise ConfigError(f"buffer: the {cfg.learner} learner returns no per-sample TD magnitudes for the {cfg.buffer} "
                          "source to write back (allowed: uniform)")
    if learner.step.by_priority and not definition.prioritized:
        allowed = ", ".join(name for name, d in SOURCES.items() if d.prioritized)
        raise ConfigError(f"buffer: the {cfg.learner} learner draws its samples by priority, which the {cfg.buffer} "
                          f"source does not (allowed: {allowed})")
    if learner.shrink is not None and source.shrink is None:
        raise ConfigError(f"buffer: the {cfg.learner} learner's dynamic replay capacity needs a source it can shrink "
                          "(allowed: uniform)")
    return source


def writes_back(source: ReplaySource) -> bool:
    return source.write_back is not None


def refresh_replaced(learner: Learner, source: ReplaySource, state, replaced: jax.Array):
    """The members ``replaced`` (bool ``[pop]``; a PBT exploit copied another member's learner state into them)
    recompute the refreshed value of every row of their replay with their new learner state (one batched call per
    member), so replay-wide statistics (ReF-ER's far fraction) are right at once."""
    refresh = learner.step.refresh

    def one(learner_state, replay, hp):
        return source.rewrite(replay, lambda rows: refresh.rows(learner_state, rows, hp))

    fresh = jax.vmap(one)(state.learner, state.buffer, state.hparams)
    keep = lambda new, old: jnp.where(replaced.reshape(replaced.shape + (1,) * (old.ndim - 1)), new, old)
    return state.replace(buffer=jax.tree.map(keep, fresh, state.buffer))


def uses_random_warmup(learner: Learner) -> bool:
    """Warm-up acts with uniform random actions unless the learner records its behaviour with each transition
    (``ReplayStep.extras``): random actions have no such record, so it acts with its own policy from the start."""
    return learner.step.extras is None


def random_actions(spec: EnvSpec, key: Key, obs: jax.Array) -> jax.Array:
    """Uniform random actions (warm-up) for one member's obs ``[envs, ...]``."""
    if spec.discrete:
        return jax.random.randint(key, obs.shape[:1], 0, spec.num_actions, jnp.int32)
    return jax.random.uniform(key, obs.shape[:1] + (spec.action_dim,), minval=-1.0, maxval=1.0)


def replay_updates(learner: Learner, source: ReplaySource, members: Members, k: int, key: Key, learner_state,
                   replay, hparams) -> tuple[Any, Any, dict]:
    """K updates of every member from its source, in chunks of the learner's H (see the module docstring).

    Returns ``(learner states, replay, metrics)``: ``replay`` is None when the source writes nothing back (the
    replay is then unchanged); metrics are means over the K steps, ``[pop]``, with ``td_abs`` (the mean written
    value) for a source that writes back."""
    step = learner.step
    writes = writes_back(source)
    v_step = jax.vmap(step.update, in_axes=(1, 0, 1, 1, 0))  # [H, pop, ...] in, [pop, ...] out
    v_sample = jax.vmap(source.sample)
    v_write = jax.vmap(source.write_back) if writes else None

    def one_chunk(carry, chunk_keys):
        learner_state, replay_now = carry if writes else (carry, replay)
        sample_keys, update_keys = jnp.moveaxis(jax.vmap(jax.random.split)(chunk_keys), 1, 0)
        batches, weights, handles = jax.vmap(lambda k_: v_sample(members.keys(k_), replay_now))(sample_keys)
        learner_state, metrics, td = v_step(jax.vmap(members.keys)(update_keys), learner_state, batches, weights,
                                            hparams)
        if not writes:
            return learner_state, metrics
        td = jnp.moveaxis(td, 1, 0)  # [H, pop, B]
        replay_now, _ = jax.lax.scan(lambda r, x: (v_write(r, *x), None), replay_now, (handles, td))
        written = {"td_abs": td.mean(axis=(0, 2))} if step.refresh is None else {}  # refreshed values: the learner's
        return (learner_state, replay_now), {**metrics, **written}

    step_keys = jax.random.split(key, k).reshape(k // step.chunk, step.chunk)
    carry, metrics = jax.lax.scan(one_chunk, (learner_state, replay) if writes else learner_state, step_keys)
    learner_state, replay = carry if writes else (carry, None)
    return learner_state, replay, jax.tree.map(lambda m: m.mean(axis=0), metrics)


def shrink_replay(learner: Learner, source: ReplaySource, members: Members, steps_per_iteration: int, state):
    """The learner's dynamic replay capacity: when the env steps cross a multiple of its period (a ``cond`` outside
    the member vmap), each member forgets the oldest rows its ``shrink`` hook asks for. Returns ``(state,
    metrics)`` with each member's ``replay_size`` and ``policy_distance`` (NaN when not due)."""
    hook, view = learner.shrink, source.shrink
    before = state.counters.env_steps
    due = (before + steps_per_iteration) // hook.every > before // hook.every

    def shrink(replay):
        def one(learner_state, member_replay, hp):
            rows, valid = view.oldest(member_replay, hook.oldest)
            count, distance = hook.run(learner_state, rows, valid, view.size(member_replay), hp)
            return view.drop_oldest(member_replay, count), distance

        return jax.vmap(one)(state.learner, replay, state.hparams)

    replay, distance = jax.lax.cond(due, shrink, lambda r: (r, jnp.full((members.local,), jnp.nan)), state.buffer)
    return state.replace(buffer=replay), {"replay_size": jax.vmap(view.size)(replay).astype(jnp.float32),
                                          "policy_distance": distance}


def maintenance(learner: Learner, source: ReplaySource, members: Members) -> Maintenance | None:
    """The learner's ``maintain`` hook as the driver's ``Maintenance``: every member on a freshly sampled batch."""
    if learner.maintain is None:
        return None

    def run(key: Key, state):
        sample_key, update_key = jax.random.split(key)
        batches = jax.vmap(source.sample)(members.keys(sample_key), state.buffer)[0]
        learner_state, metrics = jax.vmap(learner.maintain.run)(members.keys(update_key), state.learner, batches,
                                                                state.hparams)
        return state.replace(learner=learner_state), metrics

    return Maintenance(learner.maintain.every, run)
