"""Oracle models: a pure-JAX env's own step as a one-step model ``(obs, native action) -> (next_obs, reward,
terminated)``, for experiments that isolate a model-based learner from its model's errors (MEMR's ``model:
oracle``).

An oracle needs the env state back from the observation; a task is listed only where the observation determines
it. ``probe:pendulum``: the state ``(theta, theta_dot)`` is ``(atan2(sin, cos), obs[2])``; the env keeps theta
unwrapped, but its step depends on theta only through ``sin``, ``cos`` and the angle wrapped to ``[-pi, pi)``, so the
reconstruction gives the env's next observation and reward up to float32 rounding.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from popjax.envs.probes import pendulum

Oracle = Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array, jax.Array]]


def _pendulum() -> Oracle:
    env = pendulum()

    def one(obs, action):
        state = jnp.stack([jnp.arctan2(obs[1], obs[0]), obs[2]])
        _, next_obs, reward, terminated = env.step(state, action)
        return next_obs, reward, terminated.astype(jnp.float32)

    return jax.vmap(one)


ORACLES: dict[str, Callable[[], Oracle]] = {"probe:pendulum": _pendulum}


def oracle_model(env_name: str) -> Oracle | None:
    """The batched oracle ``(obs [B, ...], native action [B, ...]) -> (next_obs, reward, terminated)`` of the task,
    or None where popjax has none."""
    make = ORACLES.get(env_name)
    return None if make is None else make()
