"""Known termination functions: ``terminated(next_obs)`` for the tasks whose rule can be read off the observation.

Model-based learners (MEMR, MBPO) predict the next state with a learned model; whether that state ends the episode
is a fixed, known rule of the task, and learning it as a logit from rare falls lets the critic bootstrap through them
(MBPO uses these rules, as ``static_fns``). Each function takes ``next_obs`` of shape ``[..., obs_dim]`` in the
env's default observation layout and returns a boolean array of shape ``[...]``.

Gymnasium MuJoCo v5, default options (``exclude_current_positions_from_observation=True``, so ``obs[0]`` is the
torso height ``qpos[1]`` for the planar tasks and ``qpos[2]`` for Ant and Humanoid):

- Hopper: healthy while ``0.7 < z``, ``-0.2 < angle < 0.2`` (``obs[1]``) and every ``|obs[1:]| < 100``. The env
  tests the velocities before the observation clips them to ±10, so a velocity beyond ±100 (never seen in practice)
  is the one case this rule cannot see.
- Walker2d: healthy while ``0.8 < z < 2`` and ``-1 < angle < 1`` (``obs[1]``).
- Ant: healthy while ``0.2 <= z <= 1`` (bounds included, as in gymnasium) and the observation is finite.
- Humanoid: healthy while ``1 < z < 2``.

Pendulum and HalfCheetah never terminate; ``probe:bandit`` always does (one-step episodes). Tasks not listed have
no known rule: a learner that needs one refuses them by looking the name up here (``known_termination``).
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp

Termination = Callable[[jnp.ndarray], jnp.ndarray]


def _between(x, low, high):
    return (low < x) & (x < high)


def hopper(next_obs):
    z, angle = next_obs[..., 0], next_obs[..., 1]
    healthy = (z > 0.7) & _between(angle, -0.2, 0.2) & jnp.all(jnp.abs(next_obs[..., 1:]) < 100.0, axis=-1)
    return ~healthy


def walker2d(next_obs):
    return ~(_between(next_obs[..., 0], 0.8, 2.0) & _between(next_obs[..., 1], -1.0, 1.0))


def ant(next_obs):
    z = next_obs[..., 0]
    return ~((0.2 <= z) & (z <= 1.0) & jnp.all(jnp.isfinite(next_obs), axis=-1))


def humanoid(next_obs):
    return ~_between(next_obs[..., 0], 1.0, 2.0)


def never(next_obs):
    return jnp.zeros(next_obs.shape[:-1], bool)


def always(next_obs):
    return jnp.ones(next_obs.shape[:-1], bool)


KNOWN_TERMINATIONS: dict[str, Termination] = {
    "gym:Hopper-v5": hopper,
    "gym:Walker2d-v5": walker2d,
    "gym:Ant-v5": ant,
    "gym:Humanoid-v5": humanoid,
    "gym:HalfCheetah-v5": never,
    "gym:Pendulum-v1": never,
    "probe:pendulum": never,
    "probe:bandit": always,
}


def known_termination(env_name: str) -> Termination | None:
    """The task's termination rule on ``next_obs``, or None where popjax knows none."""
    return KNOWN_TERMINATIONS.get(env_name)
