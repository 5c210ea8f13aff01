"""Small pure-JAX environments: fast, fully jitted, for tests and quick experiments.

- ``probe:pendulum``: a port of gymnasium's Pendulum-v1 dynamics (200-step episodes).
- ``probe:cartpole``: a port of gymnasium's CartPole-v1 dynamics (500-step episodes).
- ``probe:bandit``: one-step continuous bandit, reward -||a - 0.5||^2 (optimum 0).
- ``probe:chain``: one-step discrete bandit over 3 actions, reward 1 for action 2.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from popjax.envs.base import JaxEnv
from popjax.types import EnvSpec


def pendulum() -> JaxEnv:
    max_speed, max_torque, dt, g, m, length = 8.0, 2.0, 0.05, 10.0, 1.0, 1.0
    spec = EnvSpec("probe:pendulum", (3,), action_dim=1, action_low=(-2.0,), action_high=(2.0,),
                   max_episode_steps=200)

    def obs_of(th, thdot):
        return jnp.stack([jnp.cos(th), jnp.sin(th), thdot]).astype(jnp.float32)

    def reset(key):
        high = jnp.array([jnp.pi, 1.0])
        th, thdot = jax.random.uniform(key, (2,), minval=-high, maxval=high)
        state = jnp.stack([th, thdot])
        return state, obs_of(th, thdot)

    def step(state, action):
        th, thdot = state[0], state[1]
        u = jnp.clip(action[0], -max_torque, max_torque)
        angle = ((th + jnp.pi) % (2 * jnp.pi)) - jnp.pi
        cost = angle**2 + 0.1 * thdot**2 + 0.001 * u**2
        thdot = jnp.clip(thdot + (3 * g / (2 * length) * jnp.sin(th) + 3.0 / (m * length**2) * u) * dt,
                         -max_speed, max_speed)
        th = th + thdot * dt
        return jnp.stack([th, thdot]), obs_of(th, thdot), -cost, jnp.zeros((), bool)

    return JaxEnv(spec, reset, step)


def cartpole() -> JaxEnv:
    gravity, masscart, masspole, half_len, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    total_mass, polemass_length = masscart + masspole, masspole * half_len
    theta_limit, x_limit = 12 * 2 * jnp.pi / 360, 2.4
    spec = EnvSpec("probe:cartpole", (4,), num_actions=2, max_episode_steps=500)

    def reset(key):
        state = jax.random.uniform(key, (4,), minval=-0.05, maxval=0.05)
        return state, state.astype(jnp.float32)

    def step(state, action):
        x, x_dot, theta, theta_dot = state
        force = jnp.where(action == 1, force_mag, -force_mag)
        cos, sin = jnp.cos(theta), jnp.sin(theta)
        temp = (force + polemass_length * theta_dot**2 * sin) / total_mass
        theta_acc = (gravity * sin - cos * temp) / (half_len * (4.0 / 3.0 - masspole * cos**2 / total_mass))
        x_acc = temp - polemass_length * theta_acc * cos / total_mass
        x, x_dot = x + tau * x_dot, x_dot + tau * x_acc
        theta, theta_dot = theta + tau * theta_dot, theta_dot + tau * theta_acc
        new = jnp.stack([x, x_dot, theta, theta_dot])
        terminated = (jnp.abs(x) > x_limit) | (jnp.abs(theta) > theta_limit)
        return new, new.astype(jnp.float32), jnp.ones((), jnp.float32), terminated

    return JaxEnv(spec, reset, step)


def bandit() -> JaxEnv:
    spec = EnvSpec("probe:bandit", (1,), action_dim=1, action_low=(-1.0,), action_high=(1.0,),
                   max_episode_steps=1)
    obs = jnp.ones((1,), jnp.float32)

    def reset(key):
        return jnp.zeros(()), obs

    def step(state, action):
        return state, obs, -jnp.sum((action - 0.5) ** 2), jnp.ones((), bool)

    return JaxEnv(spec, reset, step)


def chain() -> JaxEnv:
    spec = EnvSpec("probe:chain", (1,), num_actions=3, max_episode_steps=1)
    obs = jnp.ones((1,), jnp.float32)

    def reset(key):
        return jnp.zeros(()), obs

    def step(state, action):
        return state, obs, (action == 2).astype(jnp.float32), jnp.ones((), bool)

    return JaxEnv(spec, reset, step)


PROBES = {"pendulum": pendulum, "cartpole": cartpole, "bandit": bandit, "chain": chain}
