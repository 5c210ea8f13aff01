"""Core types shared by learners, buffers, environments and drivers."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

Key = jax.Array
Metrics = dict[str, jax.Array]
PyTree = Any


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """Static description of an environment, identical for the gym and JAX paths.

    Continuous actions are always exposed to learners in ``[-1, 1]^action_dim``; the
    environment adapter rescales them to the native bounds (``action_low``/``action_high``).
    """

    name: str
    obs_shape: tuple[int, ...]
    action_dim: int = 0  # continuous envs
    num_actions: int = 0  # discrete envs
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()
    max_episode_steps: int = 1000

    @property
    def discrete(self) -> bool:
        return self.num_actions > 0

    @property
    def action_shape(self) -> tuple[int, ...]:
        return () if self.discrete else (self.action_dim,)

    @property
    def action_dtype(self):
        return jnp.int32 if self.discrete else jnp.float32

    def describe_actions(self) -> str:
        if self.discrete:
            return f"{self.num_actions} discrete actions"
        return f"continuous actions of dimension {self.action_dim}"


@struct.dataclass
class Transition:
    """One environment transition (any leading batch axes).

    ``terminated`` is 1.0 only for a true terminal state (no bootstrap); a time-limit
    truncation keeps ``terminated = 0`` and ``next_obs`` is the real last observation,
    so the TD target still bootstraps from it.

    ``extras``: what the acting learner recorded about the action beside it (``ReplayStep.extras``: ReF-ER's
    behaviour mean, log-std, pre-squash action and last importance ratio); None (an empty subtree) for every learner
    that records nothing, so their transitions and replay keep their layout.
    """

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    next_obs: jax.Array
    terminated: jax.Array
    extras: Any = None


def dummy_transition(spec: EnvSpec, extras: Any = None) -> Transition:
    """A zero transition with the shapes and dtypes of ``spec`` (no batch axis); ``extras``: an example of the
    learner's per-transition record (``ReplayStep.extras``), stored as zeros of its shapes."""
    return Transition(
        obs=jnp.zeros(spec.obs_shape, jnp.float32),
        action=jnp.zeros(spec.action_shape, spec.action_dtype),
        reward=jnp.zeros((), jnp.float32),
        next_obs=jnp.zeros(spec.obs_shape, jnp.float32),
        terminated=jnp.zeros((), jnp.float32),
        extras=jax.tree.map(lambda x: jnp.zeros(jnp.shape(x), jnp.asarray(x).dtype), extras),
    )


@struct.dataclass
class Replayed:
    """A batch from a replay that keeps a refreshed per-transition value (``ReplayStep.refresh``): the sampled
    ``transitions [B, ...]`` plus that value for every row of the replay (``stored [N]``, ``valid [N]``), so the
    learner can compute replay-wide statistics (ReF-ER's far-policy fraction from the stored ratios)."""

    transitions: Transition
    stored: jax.Array
    valid: jax.Array


@struct.dataclass
class Trajectory:
    """A time-major rollout of one member's envs, for on-policy learners.

    ``transitions`` are ``[T, envs, ...]`` in the order the envs were stepped; ``ended[t, e]`` is
    True when env ``e``'s episode ended at step ``t`` (terminated *or* truncated: the env was reset,
    so step ``t + 1`` starts a new episode). A truncation keeps ``terminated = 0``, so a return
    estimate bootstraps from ``next_obs`` there and cuts the recursion.
    """

    transitions: Transition
    ended: jax.Array


@struct.dataclass
class Windows:
    """``n`` consecutive transitions of one env per sample (multi-step targets): leaves ``[B, n, ...]``, and
    ``ended[b, k]`` True when that env's episode ended at step ``k`` of the window (as in ``Trajectory``)."""

    transitions: Transition
    ended: jax.Array

    def first(self) -> Transition:
        """The first transition of every window, ``[B, ...]``: the sample the losses are about."""
        return jax.tree.map(lambda x: x[:, 0], self.transitions)
