"""The JAX-path environment interface and its batched auto-reset wrapper.

A ``JaxEnv`` is a pair of pure single-environment functions. ``VecEnv`` runs ``n`` of them
vmapped, tracks episode time for truncation and resets finished episodes, returning the
true ``next_obs`` of the finished episode for the TD target (truncation bootstraps,
termination does not).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from popjax.population.members import indexed_keys
from popjax.types import EnvSpec, Key


class JaxEnv(NamedTuple):
    """reset(key) -> (env_state, obs); step(env_state, action) -> (env_state, obs, reward, terminated).

    ``action`` is already in the env's native units: ``to_native`` maps the learner's
    [-1, 1] actions to them (identity for discrete envs).

    ``keyed``: the env draws randomness as it steps (the gymnax API): ``step(env_state, action, key)``.
    ``step`` may return a fifth flag, ``truncated``, where the env keeps a time limit of its own
    (``make_vec_env`` ends the episode there too, bootstrapping as at its own limit).
    """

    spec: EnvSpec
    reset: Callable[[Key], tuple[Any, jax.Array]]
    step: Callable[..., tuple]
    keyed: bool = False


def keys_as_data(env: JaxEnv) -> JaxEnv:
    """``env`` with the PRNG keys its own state keeps (jumanji's, craftax's) held as raw key data (uint32), and
    rewrapped for the env's step: a checkpoint refuses typed keys, and the env state is checkpointed with the run."""
    template = jax.eval_shape(env.reset, jax.random.key(0))[0]
    is_key = jax.tree.map(lambda x: jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key), template)
    if not any(jax.tree.leaves(is_key)):
        return env
    as_data = lambda state: jax.tree.map(lambda x, k: jax.random.key_data(x) if k else x, state, is_key)
    as_keys = lambda state: jax.tree.map(lambda x, k: jax.random.wrap_key_data(x) if k else x, state, is_key)

    def reset(key):
        state, obs = env.reset(key)
        return as_data(state), obs

    def step(state, *args):
        out = env.step(as_keys(state), *args)
        return (as_data(out[0]),) + tuple(out[1:])

    return env._replace(reset=reset, step=step)


def to_native(spec: EnvSpec, action: jax.Array):
    """Maps a learner action in [-1, 1] to the env's native bounds (identity if discrete)."""
    if spec.discrete:
        return action
    low = jnp.asarray(spec.action_low, jnp.float32)
    high = jnp.asarray(spec.action_high, jnp.float32)
    return low + 0.5 * (action + 1.0) * (high - low)


@struct.dataclass
class VecEnvState:
    inner: Any  # [n, ...] env states
    obs: jax.Array  # [n, *obs_shape]
    t: jax.Array  # [n] int32 steps in the current episode
    episode_return: jax.Array  # [n] float32 return so far
    ids: jax.Array  # [n] int32 global env indices: env i resets with fold_in(key, i)


class StepOutput(NamedTuple):
    next_obs: jax.Array  # true observation after the action (before any reset)
    reward: jax.Array
    terminated: jax.Array  # float32, 1.0 = no bootstrap
    truncated: jax.Array  # float32, time limit hit
    finished_return: jax.Array  # episode return where an episode ended, else 0
    done: jax.Array  # bool, terminated or truncated


class VecEnv(NamedTuple):
    spec: EnvSpec
    reset: Callable[[Key, int | jax.Array], VecEnvState]
    step: Callable[[Key, VecEnvState, jax.Array], tuple[VecEnvState, StepOutput]]


def make_vec_env(env: JaxEnv) -> VecEnv:
    """Batched, auto-resetting version of ``env`` (batch size fixed by ``reset``).

    Env ``i`` draws its resets from ``fold_in(key, i)`` (= ``split(key, n)[i]``) with ``i`` its
    global index, so a program that holds a slice of the envs (one device of several) resets
    them exactly as a program holding all of them would. A ``keyed`` env splits that key as the
    gymnax API's auto-resetting ``step(key, ...)`` does: ``key_step, key_reset = split(fold_in(key, i))``,
    so one batched step equals the package's own ``step`` called with the same per-env keys.
    """
    spec = env.spec
    v_reset = jax.vmap(env.reset)
    v_step = jax.vmap(env.step)

    def reset(key: Key, ids: int | jax.Array) -> VecEnvState:
        """``ids``: the envs' global indices ``[n]``, or ``n`` for ``0 .. n-1``."""
        ids = jnp.arange(ids, dtype=jnp.int32) if isinstance(ids, int) else jnp.asarray(ids, jnp.int32)
        n = ids.shape[0]
        inner, obs = v_reset(indexed_keys(key, ids))
        return VecEnvState(inner, obs, jnp.zeros(n, jnp.int32), jnp.zeros(n, jnp.float32), ids)

    def step(key: Key, state: VecEnvState, action: jax.Array) -> tuple[VecEnvState, StepOutput]:
        reset_keys = indexed_keys(key, state.ids)
        if env.keyed:
            pairs = jax.vmap(jax.random.split)(reset_keys)
            step_keys, reset_keys = pairs[:, 0], pairs[:, 1]
            stepped = v_step(state.inner, to_native(spec, action), step_keys)
        else:
            stepped = v_step(state.inner, to_native(spec, action))
        inner, next_obs, reward, terminated = stepped[:4]
        reward = reward.astype(jnp.float32)
        terminated = terminated.astype(bool)
        t = state.t + 1
        limit = t >= spec.max_episode_steps
        if len(stepped) == 5:  # the env's own time limit
            limit = limit | stepped[4].astype(bool)
        truncated = limit & ~terminated
        done = terminated | truncated
        episode_return = state.episode_return + reward

        def reset_done(_):
            fresh_inner, fresh_obs = v_reset(reset_keys)
            mask = lambda a, b: jnp.where(done.reshape(done.shape + (1,) * (a.ndim - 1)), a, b)
            return jax.tree.map(mask, fresh_inner, inner), mask(fresh_obs, next_obs)

        # The cond is on the whole batch, so resets cost nothing on steps where no episode ends.
        inner, obs = jax.lax.cond(done.any(), reset_done, lambda _: (inner, next_obs), None)
        new_state = VecEnvState(
            inner=inner,
            obs=obs,
            t=jnp.where(done, 0, t),
            episode_return=jnp.where(done, 0.0, episode_return),
            ids=state.ids,
        )
        out = StepOutput(
            next_obs=next_obs,
            reward=reward,
            terminated=terminated.astype(jnp.float32),
            truncated=truncated.astype(jnp.float32),
            finished_return=jnp.where(done, episode_return, 0.0),
            done=done,
        )
        return new_state, out

    return VecEnv(spec, reset, step)
