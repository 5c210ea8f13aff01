"""Jumanji on the JAX path (``jumanji:<id>``): its ``TimeStep`` API as a ``JaxEnv``.

``reset(key) -> (state, timestep)`` and ``step(state, action) -> (state, timestep)`` are pure (jumanji keeps its
own key in its state). The adapter:

- flattens the structured observation (every leaf of ``timestep.observation`` in tree order, raveled, as
  float32: grids, positions, step counters and action masks alike; a mask is an input feature, not enforced);
- maps actions: ``DiscreteArray(n)`` -> ``n`` discrete actions; ``MultiDiscreteArray(nvec)`` -> one discrete
  action over the ``prod(nvec)`` joint choices (row-major, ``jnp.unravel_index``) when that is at most
  ``MAX_JOINT_ACTIONS``; a 1-D float ``BoundedArray`` -> continuous actions. Anything else is refused in one line.
- tells termination from truncation: jumanji marks a time-limit end with discount 1 in some envs and with
  ``termination`` (discount 0) in others (Snake folds ``step_count >= time_limit`` into ``done``). The adapter
  counts the episode's steps itself: a last step at the env's ``time_limit`` is a truncation, any other last
  step with discount 0 a termination, with discount > 0 a truncation. A natural end on exactly the limit's step
  is therefore read as truncation (the one step where the two cannot be told apart from the outside).
  ``max_episode_steps`` is the env's ``time_limit``, or ``DEFAULT_LIMIT`` where it keeps none (episodes of those
  envs end by themselves: TSP, Knapsack, CVRP, Game2048, ...).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from popjax.envs.base import JaxEnv, keys_as_data
from popjax.types import EnvSpec

INSTALL = 'pip install "popjax[jumanji]"'
MAX_JOINT_ACTIONS = 1024
DEFAULT_LIMIT = 10_000
UNAVAILABLE = {"Sokoban-v0": "jumanji downloads its Boxoban levels from a hub when it makes this env, and popjax "
                             "runs offline"}


def _jumanji():
    try:
        import jumanji
    except ImportError:
        raise ValueError(f"the jumanji package is not installed: {INSTALL}") from None
    return jumanji


def names() -> tuple[str, ...]:
    return tuple(n for n in _jumanji().registered_environments() if n not in UNAVAILABLE)


def check(env_id: str) -> None:
    if env_id in UNAVAILABLE:
        _jumanji()
        raise ValueError(f"jumanji:{env_id} is not offered: {UNAVAILABLE[env_id]}")
    if env_id not in names():
        raise ValueError(f"env 'jumanji:{env_id}' unknown; allowed jumanji ids: {', '.join(names())}")


def flat_obs(observation) -> jax.Array:
    return jnp.concatenate([jnp.ravel(x).astype(jnp.float32) for x in jax.tree.leaves(observation)])


def _actions(name: str, action_spec):
    """``(EnvSpec action fields, native(action) -> the env's action)``; one line for what cannot be served."""
    kind = type(action_spec).__name__
    if kind == "DiscreteArray":
        dtype = action_spec.dtype
        return {"num_actions": int(action_spec.num_values)}, lambda a: a.astype(dtype)
    if kind == "MultiDiscreteArray":
        nvec = tuple(int(n) for n in np.ravel(action_spec.num_values))
        joint = math.prod(nvec)
        if joint > MAX_JOINT_ACTIONS or np.shape(action_spec.num_values) != (len(nvec),):
            raise ValueError(f"{name}: multi-discrete actions {list(nvec)} ({joint} joint actions) are not supported "
                             f"(allowed: at most {MAX_JOINT_ACTIONS} joint actions, one row of choices)")
        dtype = action_spec.dtype
        return {"num_actions": joint}, lambda a: jnp.stack(jnp.unravel_index(a, nvec)).astype(dtype)
    if kind == "BoundedArray" and len(action_spec.shape) == 1 and jnp.issubdtype(action_spec.dtype, jnp.floating):
        low = np.broadcast_to(np.asarray(action_spec.minimum, np.float32), action_spec.shape)
        high = np.broadcast_to(np.asarray(action_spec.maximum, np.float32), action_spec.shape)
        return ({"action_dim": int(action_spec.shape[0]), "action_low": tuple(map(float, low)),
                 "action_high": tuple(map(float, high))}, lambda a: a)
    raise ValueError(f"{name}: action spec {kind}{tuple(action_spec.shape)} of {action_spec.dtype} is not supported "
                     "(allowed: DiscreteArray, MultiDiscreteArray, 1-D float BoundedArray)")


def _make(env_id: str):
    check(env_id)
    env = _jumanji().make(env_id)
    name = f"jumanji:{env_id}"
    fields, native = _actions(name, env.action_spec)
    obs = jax.eval_shape(lambda key: flat_obs(env.reset(key)[1].observation), jax.random.key(0))
    time_limit = getattr(env, "time_limit", None)
    spec = EnvSpec(name, obs.shape, max_episode_steps=int(time_limit or DEFAULT_LIMIT), **fields)
    return env, spec, native, time_limit


def env_spec(env_id: str) -> EnvSpec:
    return _make(env_id)[1]


def make_env(env_id: str) -> JaxEnv:
    """``jumanji:<env_id>`` as a ``JaxEnv``; its state is ``(jumanji state, steps in the episode)``."""
    env, spec, native, time_limit = _make(env_id)

    def reset(key):
        state, timestep = env.reset(key)
        return (state, jnp.zeros((), jnp.int32)), flat_obs(timestep.observation)

    def step(carry, action):
        state, t = carry
        new_state, timestep = env.step(state, native(action))
        new_state = jax.tree.map(lambda new, old: jnp.asarray(new, old.dtype), new_state, state)
        t = t + 1
        last = timestep.last()
        at_limit = (t >= time_limit) if time_limit else jnp.zeros((), bool)
        terminated = last & (timestep.discount == 0) & ~at_limit
        return ((new_state, t), flat_obs(timestep.observation), jnp.asarray(timestep.reward, jnp.float32),
                terminated, last & ~terminated)

    return keys_as_data(JaxEnv(spec, reset, step))  # jumanji keeps its key in its state
