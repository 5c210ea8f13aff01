"""Population-level functions built from one single-member learner.

Everything here is pure and jit-able; the member axis is axis 0 of every pytree and is
only ever handled by ``jax.vmap`` (no Python loop over members). Update batches use the
canonical ``[K, pop, B, ...]`` layout: ``scan`` over K outside, ``vmap`` over members inside.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from popjax.buffers import Buffer, BufferState
from popjax.learners.base import Learner
from popjax.types import EnvSpec, Key, Metrics, Transition, dummy_transition


@struct.dataclass
class PopState:
    """Everything that evolves during training, per member (axis 0)."""

    learner: Any
    buffer: BufferState
    hparams: Any


class Population(NamedTuple):
    """Pure population functions (see ``make_population``)."""

    init: Any
    act: Any
    random_act: Any
    policy: Any
    add: Any
    train: Any
    pop_size: int


def make_population(learner: Learner, buffer: Buffer, spec: EnvSpec, pop_size: int,
                    updates_per_iter: int) -> Population:
    """Builds the population functions.

    Args:
      learner: single-member learner.
      buffer: single-member replay buffer (vmapped here: one buffer per member).
      spec: environment spec (action shapes for random warm-up actions).
      pop_size: number of members.
      updates_per_iter: K, gradient steps per member per ``train`` call (static).
    """
    v_update = jax.vmap(learner.update)
    v_sample = jax.vmap(buffer.sample)

    def init(key: Key, hparams) -> PopState:
        learner_state = jax.vmap(learner.init)(jax.random.split(key, pop_size), hparams)
        example = dummy_transition(spec)
        buffers = jax.vmap(lambda _: buffer.init(example))(jnp.arange(pop_size))
        return PopState(learner=learner_state, buffer=buffers, hparams=hparams)

    def act(key: Key, state: PopState, obs: jax.Array) -> jax.Array:
        """Exploration actions for obs ``[pop, envs, ...]``."""
        keys = jax.random.split(key, pop_size)
        return jax.vmap(learner.act)(keys, state.learner, obs, state.hparams)

    def random_act(key: Key, obs: jax.Array) -> jax.Array:
        """Uniform random actions (warm-up) for obs ``[pop, envs, ...]``."""
        batch = obs.shape[:2]
        if spec.discrete:
            return jax.random.randint(key, batch, 0, spec.num_actions, jnp.int32)
        return jax.random.uniform(key, batch + (spec.action_dim,), minval=-1.0, maxval=1.0)

    def policy(state: PopState, obs: jax.Array) -> jax.Array:
        return jax.vmap(learner.policy)(state.learner, obs)

    def add(state: PopState, transitions: Transition) -> PopState:
        """Adds ``[pop, n, ...]`` transitions, member i's into buffer i."""
        return state.replace(buffer=jax.vmap(buffer.add)(state.buffer, transitions))

    def train(key: Key, state: PopState) -> tuple[PopState, Metrics]:
        """K gradient steps for every member; metrics are means over the K steps, ``[pop]``."""

        def one_step(learner_state, step_key):
            key_sample, key_update = jax.random.split(step_key)
            batch = v_sample(jax.random.split(key_sample, pop_size), state.buffer)
            return v_update(jax.random.split(key_update, pop_size), learner_state, batch, state.hparams)

        learner_state, metrics = jax.lax.scan(one_step, state.learner, jax.random.split(key, updates_per_iter))
        return state.replace(learner=learner_state), jax.tree.map(lambda m: m.mean(axis=0), metrics)

    return Population(init, act, random_act, policy, add, train, pop_size)
