"""Environment names: ``gym:<id>`` (host path), ``brax:<name>`` and ``probe:<name>`` (JAX path)."""

from __future__ import annotations

from popjax.envs.base import JaxEnv
from popjax.envs.probes import PROBES

PREFIXES = ("gym", "brax", "probe")
GYM_IDS = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5", "Pendulum-v1", "CartPole-v1")
BRAX_NAMES = ("halfcheetah", "hopper", "walker2d", "ant", "humanoid", "inverted_pendulum",
              "inverted_double_pendulum", "reacher", "pusher", "swimmer")


def parse(name: str) -> tuple[str, str]:
    """Splits ``"prefix:id"`` and checks the prefix and id; raises ValueError naming what is allowed."""
    if not isinstance(name, str) or ":" not in name:
        raise ValueError(f"env must look like 'gym:<id>', 'brax:<name>' or 'probe:<name>', got {name!r}")
    prefix, env_id = name.split(":", 1)
    allowed = {"gym": GYM_IDS, "brax": BRAX_NAMES, "probe": tuple(PROBES)}
    if prefix not in allowed:
        raise ValueError(f"env prefix {prefix!r} unknown; allowed: {', '.join(PREFIXES)}")
    if prefix != "gym" and env_id not in allowed[prefix]:
        raise ValueError(f"env {name!r} unknown; allowed {prefix} names: {', '.join(allowed[prefix])}")
    return prefix, env_id


def is_jax_env(name: str) -> bool:
    return parse(name)[0] in ("brax", "probe")


def make_jax_env(name: str) -> JaxEnv:
    prefix, env_id = parse(name)
    if prefix == "probe":
        return PROBES[env_id]()
    if prefix == "brax":
        from popjax.envs.brax import make_brax_env

        return make_brax_env(env_id)
    raise ValueError(f"{name!r} is a host (gymnasium) env, not a JAX env")
