"""Brax environments on the JAX path (``brax:<name>``).

``make_brax_env(name)`` wraps ``brax.envs.get_environment(name, backend=...)`` as a ``JaxEnv``
of pure single-environment functions. No brax training wrapper is applied: popjax's
``make_vec_env`` does the vmapping, the time limit (``max_episode_steps = 1000``) and the
auto-reset. Without brax's ``EpisodeWrapper`` a brax env's ``done`` flag is a true
termination (e.g. hopper/walker2d/ant/humanoid falling, inverted pendulum tipping over), so
it is reported as ``terminated``.

Actions: brax envs take actions in [-1, 1] (they map them to actuator ranges internally), so
the spec's native bounds are -1..1 and ``to_native`` is the identity.

Backend: brax 0.14.2's envs default to ``'generalized'``; ``DEFAULT_BACKEND`` is ``'spring'``, the fastest to
compile and run on a CPU (the measurement is in docs/environments.md). Swimmer only supports ``'generalized'``,
and fails to trace under jax 0.10, so the registry leaves it out.
``inverted_pendulum`` defaults to ``'generalized'``: its spring model cannot be balanced by
the linear controllers that balance the rigid one (see ``_PREFERRED_BACKENDS``). Any env takes
another backend with a suffix: ``brax:halfcheetah@generalized``.
Spring uses a smaller physics timestep with more substeps (same env ``dt``) and different
actuator gears than ``'generalized'``, so its dynamics and returns are *not* those of MuJoCo; pass
``backend='generalized'`` for the most faithful brax physics. Published MuJoCo numbers come
from the host path (``gym:<id>``), not from here.
"""

from __future__ import annotations

import contextlib
import io
import warnings

import jax
import jax.numpy as jnp

from popjax.envs.base import JaxEnv
from popjax.types import EnvSpec

DEFAULT_BACKEND = "spring"
BACKENDS = ("generalized", "positional", "spring", "mjx")
MAX_EPISODE_STEPS = 1000


def _brax_envs():
    # mujoco.mjx prints "Failed to import warp ..." to stdout on import when the optional
    # warp package is absent; it is harmless (we do not use the warp backend), so hide it.
    with contextlib.redirect_stdout(io.StringIO()):
        import brax.envs
    return brax.envs


# brax envs that do not accept every backend (brax 0.14.2).
_ONLY_BACKENDS = {"swimmer": ("generalized",)}
# Envs whose spring dynamics are too far from the rigid model to learn on: under spring the
# inverted pendulum's hinge is soft, no linear state-feedback controller in a 144-gain grid
# balances it for 1000 steps (best 703), while under 'generalized' many do.
_PREFERRED_BACKENDS = {"inverted_pendulum": "generalized"}


def split_backend(env_id: str) -> tuple[str, str | None]:
    """``"halfcheetah@generalized"`` -> ``("halfcheetah", "generalized")``; no ``@`` -> backend None."""
    name, _, backend = env_id.partition("@")
    return name, backend or None


def resolve_backend(name: str, backend: str | None = None) -> str:
    """``backend``, or the default for ``name`` (``DEFAULT_BACKEND`` unless the env lacks it)."""
    supported = _ONLY_BACKENDS.get(name, BACKENDS)
    if backend is None:
        preferred = _PREFERRED_BACKENDS.get(name, DEFAULT_BACKEND)
        return preferred if preferred in supported else supported[0]
    if backend not in supported:
        raise ValueError(f"brax backend {backend!r} not available for {name!r}; "
                         f"allowed: {', '.join(supported)}")
    return backend


def _get_environment(name: str, backend: str | None):
    name, suffix = split_backend(name)  # an explicit ``backend`` argument wins over the suffix
    backend = resolve_backend(name, backend or suffix)
    envs = _brax_envs()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Brax System", category=UserWarning)
        return envs.get_environment(name, backend=backend)


def _spec(name: str, env) -> EnvSpec:
    obs = jax.eval_shape(env.reset, jax.random.PRNGKey(0)).obs  # abstract: no physics is run
    if len(obs.shape) != 1:
        raise ValueError(f"brax:{name}: expected a flat observation, got shape {obs.shape}")
    n = int(env.action_size)
    return EnvSpec(f"brax:{name}", tuple(int(d) for d in obs.shape), action_dim=n,
                   action_low=(-1.0,) * n, action_high=(1.0,) * n, max_episode_steps=MAX_EPISODE_STEPS)


def brax_env_spec(name: str, backend: str | None = None) -> EnvSpec:
    """The ``EnvSpec`` of ``brax:<name>`` without compiling or stepping anything."""
    return _spec(name, _get_environment(name, backend))


def make_brax_env(name: str, backend: str | None = None) -> JaxEnv:
    """``brax:<name>`` as a ``JaxEnv``; the env state is the brax ``State``.

    ``reset(key) -> (state, obs)``, ``step(state, action) -> (state, obs, reward, terminated)``
    with ``obs`` float32, ``reward`` float32 and ``terminated = done > 0.5`` (bool).
    """
    env = _get_environment(name, backend)
    spec = _spec(name, env)

    def _normalise(state):
        # brax mixes python floats / weakly typed scalars (step) with float32 arrays (reset) in
        # reward, done, metrics and info; make every leaf a strongly typed array so reset and
        # step states are interchangeable in make_vec_env's jnp.where / lax.cond.
        state = jax.tree.map(lambda x: jnp.asarray(x, jnp.asarray(x).dtype), state)
        return state.replace(obs=state.obs.astype(jnp.float32), reward=state.reward.astype(jnp.float32),
                             done=state.done.astype(jnp.float32))

    def reset(key):
        state = _normalise(env.reset(key))
        return state, state.obs

    def step(state, action):
        state = _normalise(env.step(state, action))
        return state, state.obs, state.reward, state.done > 0.5

    return JaxEnv(spec, reset, step)
