"""Environment names: ``gym:<id>`` (host path), ``brax:<name>`` and ``probe:<name>`` (JAX path).

``gym:`` accepts the ids in ``GYM_IDS`` (the tested ones) and, beyond those, any id registered
in gymnasium whose observation space is a Box and whose action space is a Discrete or 1-D Box
with finite bounds and that has a time limit (checked when the env is made). Unregistered
ids raise ``ValueError`` listing ``GYM_IDS``.

``brax:<name>@<backend>`` picks the brax physics backend (``generalized``, ``positional``,
``spring``, ``mjx``); without it each env gets the default of ``popjax.envs.brax``.

``brax:swimmer`` is not offered: brax 0.14.2's swimmer calls ``jnp.clip(a_min=...)``, which
jax 0.10 removed, so it fails to trace.

The JAX env families of ``FAMILIES`` (``gymnax:<id>``, ...) are each one module with ``check(env_id)``,
``env_spec(env_id)`` and ``make_env(env_id)``; their packages are optional extras, and a missing one is a
one-line ``ValueError`` naming the install command (docs/environments.md).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from popjax.envs.base import JaxEnv
from popjax.envs.probes import PROBES
from popjax.types import EnvSpec

if TYPE_CHECKING:
    from popjax.envs.gymnasium import HostVecEnv

# prefix -> module of a JAX env family (an addition: a new module and one line here).
FAMILIES = {
    "gymnax": "popjax.envs.gymnax_api",
    "craftax": "popjax.envs.craftax",
    "jumanji": "popjax.envs.jumanji",
    "playground": "popjax.envs.playground",
}
PREFIXES = ("gym", "brax", "probe", *FAMILIES)
GYM_IDS = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5", "Pendulum-v1",
           "CartPole-v1", "popjax/HtsToy-v0", "popjax/HtsToySleep-v0")
BRAX_NAMES = ("halfcheetah", "hopper", "walker2d", "ant", "humanoid", "inverted_pendulum",
              "inverted_double_pendulum", "reacher", "pusher")


def _gym_registered(env_id: str) -> bool:
    import gymnasium

    import popjax.envs.toy  # noqa: F401  (registers popjax's own toy ids)

    return env_id in gymnasium.registry


def parse(name: str) -> tuple[str, str]:
    """Splits ``"prefix:id"`` and checks the prefix and id; raises ValueError naming what is allowed."""
    if not isinstance(name, str) or ":" not in name:
        forms = ", ".join(["'gym:<id>'", "'brax:<name>'", "'probe:<name>'", *(f"'{f}:<id>'" for f in FAMILIES)])
        raise ValueError(f"env must look like one of {forms}, got {name!r}")
    prefix, env_id = name.split(":", 1)
    allowed = {"gym": GYM_IDS, "brax": BRAX_NAMES, "probe": tuple(PROBES)}
    if prefix not in allowed and prefix not in FAMILIES:
        raise ValueError(f"env {name!r}: prefix {prefix!r} unknown; allowed: {', '.join(PREFIXES)}")
    if prefix in FAMILIES:
        family(prefix).check(env_id)
    elif prefix == "brax":
        from popjax.envs.brax import resolve_backend, split_backend

        base, backend = split_backend(env_id)
        if base not in BRAX_NAMES:
            raise ValueError(f"env {name!r} unknown; allowed brax names: {', '.join(BRAX_NAMES)}")
        try:
            resolve_backend(base, backend)
        except ValueError as err:
            raise ValueError(f"env {name!r}: {err}") from None
    elif prefix == "gym":
        if env_id not in GYM_IDS and not _gym_registered(env_id):
            raise ValueError(f"env {name!r} unknown; supported gym ids: {', '.join(GYM_IDS)} "
                             "(other gymnasium-registered ids with Box observations also work)")
    elif env_id not in allowed[prefix]:
        raise ValueError(f"env {name!r} unknown; allowed {prefix} names: {', '.join(allowed[prefix])}")
    return prefix, env_id


def family(prefix: str):
    """The module of the JAX env family ``prefix`` (imported now; its package is imported when first needed)."""
    return importlib.import_module(FAMILIES[prefix])


def is_jax_env(name: str) -> bool:
    return parse(name)[0] != "gym"


def env_spec(name: str) -> EnvSpec:
    """The ``EnvSpec`` of ``name`` without stepping (gym: makes one env and closes it;
    brax: abstract evaluation of reset, nothing compiled)."""
    prefix, env_id = parse(name)
    if prefix == "probe":
        return PROBES[env_id]().spec
    if prefix in FAMILIES:
        return family(prefix).env_spec(env_id)
    if prefix == "brax":
        from popjax.envs.brax import brax_env_spec

        return brax_env_spec(env_id)
    from popjax.envs.gymnasium import gym_env_spec

    return gym_env_spec(env_id)


def make_jax_env(name: str) -> JaxEnv:
    prefix, env_id = parse(name)
    if prefix == "probe":
        return PROBES[env_id]()
    if prefix in FAMILIES:
        return family(prefix).make_env(env_id)
    if prefix == "brax":
        from popjax.envs.brax import make_brax_env

        return make_brax_env(env_id)
    raise ValueError(f"{name!r} is a host (gymnasium) env, not a JAX env; use make_host_env")


def make_host_env(name: str, num_envs: int, seed: int, first_env: int = 0) -> HostVecEnv:
    """``gym:<id>`` as a ``HostVecEnv`` of ``num_envs`` gymnasium envs (not yet reset), the job's envs
    ``first_env, first_env + 1, ...`` (their seeds follow the index)."""
    prefix, env_id = parse(name)
    if prefix != "gym":
        raise ValueError(f"{name!r} is a JAX env, not a host (gymnasium) env; use make_jax_env")
    from popjax.envs.gymnasium import HostVecEnv

    return HostVecEnv(env_id, num_envs, seed, first_env)
