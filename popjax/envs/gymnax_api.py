"""The gymnax API on the JAX path: ``gymnax:<id>``, and the adapter that ``craftax:`` reuses.

A gymnax-API env is an object with ``reset_env(key, params) -> (obs, state)`` and
``step_env(key, state, action, params) -> (obs, state, reward, done, info)`` (gymnax, craftax, kinetix).
``gymnax_api_env`` turns one into a keyed ``JaxEnv``: popjax's ``make_vec_env`` vmaps it, keeps the
episode clock, auto-resets with the keys the package's own auto-resetting ``step(key, ...)`` would use,
and returns the true last observation of an episode for the TD target.

Termination vs truncation: gymnax 1.0.1 already tells them apart (``step_env`` returns the natural
``terminated``; ``is_truncated(state, params)`` is the time limit ``state.time >= max_steps_in_episode``),
so both flags reach the learner as gymnax computes them, and ``max_episode_steps`` is the env's
``max_steps_in_episode``.

Observations are flattened to float32 vectors (MinAtar's [10, 10, C] boolean frames, bsuite's grids, the
scalar state of FrozenLake): the Nature CNN torso needs frames of at least 36 x 36, which no gymnax env has.
Actions: ``Discrete(n)`` -> ``n`` discrete actions; a 1-D ``Box`` -> continuous actions rescaled from [-1, 1]
to its bounds. Anything else is refused in one line.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from popjax.envs.base import JaxEnv, keys_as_data
from popjax.types import EnvSpec

INSTALL = 'pip install "popjax[gymnax]" && pip install --no-deps gymnax==1.0.1'
# Registered in gymnax but not offered, and why.
UNAVAILABLE = {"MNISTBandit-bsuite": "gymnax downloads MNIST when it makes this env, and popjax runs offline"}


def import_gymnax():
    try:
        import gymnax
    except ImportError:
        raise ValueError(f"the gymnax package is not installed: {INSTALL}") from None
    return gymnax


def names() -> tuple[str, ...]:
    """The gymnax ids popjax offers: every id registered in the installed gymnax except ``UNAVAILABLE``."""
    return tuple(n for n in import_gymnax().registered_envs if n not in UNAVAILABLE)


def check(env_id: str) -> None:
    """Raises ValueError (one line) if ``gymnax:<env_id>`` cannot be made here."""
    if env_id in UNAVAILABLE:
        import_gymnax()
        raise ValueError(f"gymnax:{env_id} is not offered: {UNAVAILABLE[env_id]}")
    if env_id not in names():
        raise ValueError(f"env 'gymnax:{env_id}' unknown; allowed gymnax ids: {', '.join(names())}")


def flat_obs(obs) -> jax.Array:
    return jnp.reshape(obs, (-1,)).astype(jnp.float32)


def action_fields(name: str, space) -> dict[str, Any]:
    """The ``EnvSpec`` fields of a gymnax-API action space (``Discrete`` or 1-D ``Box``); one line otherwise."""
    kind = type(space).__name__
    if kind == "Discrete":
        return {"num_actions": int(space.n)}
    if kind == "Box" and len(space.shape) == 1:
        low = np.broadcast_to(np.asarray(space.low, np.float32), space.shape)
        high = np.broadcast_to(np.asarray(space.high, np.float32), space.shape)
        if not (np.isfinite(low).all() and np.isfinite(high).all()):
            raise ValueError(f"{name}: unbounded continuous actions are not supported (allowed: finite Box bounds)")
        return {"action_dim": int(space.shape[0]), "action_low": tuple(float(x) for x in low),
                "action_high": tuple(float(x) for x in high)}
    raise ValueError(f"{name}: action space {kind}{tuple(getattr(space, 'shape', ()))} is not supported "
                     "(allowed: Discrete, 1-D Box)")


def api_spec(name: str, env, params, max_episode_steps: int) -> EnvSpec:
    """The ``EnvSpec`` of a gymnax-API env (abstract evaluation of ``reset_env``: nothing is run)."""
    obs = jax.eval_shape(lambda key: env.reset_env(key, params)[0], jax.random.key(0))
    if not isinstance(obs, jax.ShapeDtypeStruct):
        raise ValueError(f"{name}: structured observations are not supported (allowed: one array)")
    return EnvSpec(name, (max(1, math.prod(obs.shape)),), max_episode_steps=int(max_episode_steps),
                   **action_fields(name, env.action_space(params)))


def gymnax_api_env(spec: EnvSpec, env, params, step_params=None,
                   truncated: Callable[[Any], jax.Array] | None = None) -> JaxEnv:
    """A keyed ``JaxEnv`` over ``env.reset_env`` / ``env.step_env``.

    ``step_params``: the params ``step_env`` gets (default ``params``); a family whose ``done`` includes the
    time limit steps with the limit lifted here, so ``done`` is the natural termination. ``truncated(state)``:
    the env's own time limit on the stepped state (default: gymnax's ``env.is_truncated``).
    """
    step_params = params if step_params is None else step_params
    truncated = truncated or (lambda state: env.is_truncated(state, params))

    def reset(key):
        obs, state = env.reset_env(key, params)
        return state, flat_obs(obs)

    def step(state, action, key):
        obs, new_state, reward, terminated, _ = env.step_env(key, state, action, step_params)
        # The stepped state in the dtypes of the reset one, so make_vec_env can select between them.
        new_state = jax.tree.map(lambda new, old: jnp.asarray(new, old.dtype), new_state, state)
        return (new_state, flat_obs(obs), jnp.asarray(reward, jnp.float32), jnp.asarray(terminated, bool),
                jnp.asarray(truncated(new_state), bool))

    return keys_as_data(JaxEnv(spec, reset, step, keyed=True))


def _make(env_id: str):
    check(env_id)
    env, params = import_gymnax().make(env_id)
    return env, params


def env_spec(env_id: str) -> EnvSpec:
    env, params = _make(env_id)
    return api_spec(f"gymnax:{env_id}", env, params, params.max_steps_in_episode)


def make_env(env_id: str) -> JaxEnv:
    """``gymnax:<env_id>`` as a keyed ``JaxEnv`` (default env params)."""
    env, params = _make(env_id)
    return gymnax_api_env(api_spec(f"gymnax:{env_id}", env, params, params.max_steps_in_episode), env, params)
