"""Craftax on the JAX path (``craftax:<name>``), through the gymnax-API adapter of ``popjax.envs.gymnax_api``.

Offered: the symbolic variants, ``Craftax-Symbolic-v1`` (observation of 8,268 features) and
``Craftax-Classic-Symbolic-v1`` (1,345), 43 and 17 discrete actions. The pixel variants are not offered: their
frames are smaller than the Nature CNN torso's 36 x 36 minimum after its strides only for Classic, and the
issue asks for the symbolic ones; they would be flattened like the rest.

craftax ships its own copy of gymnax's base classes, whose ``done`` folds the time limit in
(``timestep >= params.max_timesteps`` or death or, in Craftax, beating the final boss). The adapter steps with
the limit lifted (``max_timesteps`` is read nowhere else), so ``done`` is the natural termination, and reports
the limit as truncation: ``max_episode_steps`` is the env's ``max_timesteps`` (100,000 and 10,000).
"""

from __future__ import annotations

from popjax.envs.base import JaxEnv
from popjax.envs.gymnax_api import api_spec, gymnax_api_env
from popjax.types import EnvSpec

INSTALL = 'pip install "popjax[craftax]"'
NAMES = ("Craftax-Symbolic-v1", "Craftax-Classic-Symbolic-v1")
_NO_LIMIT = 2**31 - 1


def _craftax_env(env_id: str):
    try:
        from craftax.craftax_env import make_craftax_env_from_name
    except ImportError:
        raise ValueError(f"the craftax package is not installed: {INSTALL}") from None
    # The auto-reset class: its step_env/reset_env are those of the no-auto-reset one, and its own
    # step(key, ...) is what the adapter's batched step equals (tests).
    return make_craftax_env_from_name(env_id, auto_reset=True)


def check(env_id: str) -> None:
    if env_id not in NAMES:
        raise ValueError(f"env 'craftax:{env_id}' unknown; allowed craftax names: {', '.join(NAMES)}")
    _craftax_env(env_id)


def env_spec(env_id: str) -> EnvSpec:
    check(env_id)
    env = _craftax_env(env_id)
    params = env.default_params
    return api_spec(f"craftax:{env_id}", env, params, params.max_timesteps)


def make_env(env_id: str, max_timesteps: int | None = None) -> JaxEnv:
    """``craftax:<env_id>`` as a keyed ``JaxEnv``: default env params, or a shorter time limit ``max_timesteps``."""
    check(env_id)
    env = _craftax_env(env_id)
    params = env.default_params
    if max_timesteps is not None:
        params = params.replace(max_timesteps=max_timesteps)
    spec = api_spec(f"craftax:{env_id}", env, params, params.max_timesteps)
    return gymnax_api_env(spec, env, params, step_params=params.replace(max_timesteps=_NO_LIMIT),
                          truncated=lambda state: state.timestep >= params.max_timesteps)
