"""MuJoCo Playground on the JAX path (``playground:<name>``): MJX envs of the ``playground`` package (0.2.x).

Offered: the DeepMind Control Suite ports (``CheetahRun``, ``HopperHop``, ``WalkerWalk``, ``HumanoidWalk``, ...),
whose models ship inside the package. Playground's locomotion and manipulation envs (Go1, G1, Spot, Panda,
Leap, ...) load their robots from MuJoCo Menagerie, which playground clones from GitHub the first time; popjax
runs offline, so they are not offered.

The env runs MJX's JAX implementation (``impl='jax'``; playground 0.2.0 defaults to ``'warp'``, whose kernels
target GPUs). ``reset(key)`` / ``step(state, action)`` return playground's ``State`` (brax-like: ``obs``,
``reward``, ``done``, the key inside ``info``); no playground wrapper is applied: ``make_vec_env`` vmaps, keeps
the episode clock and resets. ``done`` is a true termination (the suite's tasks never end early except where the
physics diverge), ``max_episode_steps`` is the env config's ``episode_length`` (1,000), and actions are in
[-1, 1] as the env takes them. A dict observation would be read at its ``'state'`` entry (the actor's); the
suite's are flat vectors.
"""

from __future__ import annotations

import contextlib
import io

import jax
import jax.numpy as jnp

from popjax.envs.base import JaxEnv, keys_as_data
from popjax.types import EnvSpec

INSTALL = 'pip install "popjax[playground]"'


def _suite():
    try:
        # mujoco.mjx prints "Failed to import warp ..." on import when warp is absent: harmless, hidden.
        with contextlib.redirect_stdout(io.StringIO()):
            from mujoco_playground import registry
            from mujoco_playground._src import dm_control_suite
    except ImportError:
        raise ValueError(f"the playground package is not installed: {INSTALL}") from None
    return registry, dm_control_suite


def names() -> tuple[str, ...]:
    return tuple(_suite()[1].ALL_ENVS)


def check(env_id: str) -> None:
    if env_id not in names():
        raise ValueError(f"env 'playground:{env_id}' unknown; allowed playground names (DM Control Suite ports): "
                         f"{', '.join(names())}")


def _load(env_id: str):
    check(env_id)
    registry = _suite()[0]
    config = registry.get_default_config(env_id)
    with contextlib.redirect_stdout(io.StringIO()):
        env = registry.load(env_id, config_overrides={"impl": "jax"})
    return env, int(config.episode_length)


def _obs(obs) -> jax.Array:
    obs = obs["state"] if isinstance(obs, dict) else obs
    return jnp.asarray(obs, jnp.float32).reshape(-1)


def _spec(env_id: str, env, episode_length: int) -> EnvSpec:
    obs = jax.eval_shape(lambda key: _obs(env.reset(key).obs), jax.random.key(0))
    n = int(env.action_size)
    return EnvSpec(f"playground:{env_id}", obs.shape, action_dim=n, action_low=(-1.0,) * n,
                   action_high=(1.0,) * n, max_episode_steps=episode_length)


def env_spec(env_id: str) -> EnvSpec:
    return _spec(env_id, *_load(env_id))


def make_env(env_id: str) -> JaxEnv:
    """``playground:<env_id>`` as a ``JaxEnv``; the env state is playground's ``State``."""
    env, episode_length = _load(env_id)
    spec = _spec(env_id, env, episode_length)

    def reset(key):
        state = env.reset(key)
        return state, _obs(state.obs)

    def step(state, action):
        new = env.step(state, action)
        new = jax.tree.map(lambda a, b: jnp.asarray(a, b.dtype), new, state)  # the reset state's dtypes
        return new, _obs(new.obs), new.reward, new.done > 0.5

    return keys_as_data(JaxEnv(spec, reset, step))  # playground keeps its key in info['rng']
