"""The host path: ``n`` gymnasium environments stepped in a plain Python loop.

``HostVecEnv`` mirrors the JAX path's ``make_vec_env`` (see ``popjax/envs/base.py``) with numpy
arrays instead of jax arrays, so drivers treat both paths the same way:

- actions arrive in learner units ([-1, 1] for continuous envs, mapped to the native bounds
  with the same affine formula as ``base.to_native``, no clipping; integers for discrete envs);
- ``step`` returns a ``StepOutput`` whose ``next_obs`` is the true observation returned by
  the step (the terminal/last observation when the episode ends, never the reset one);
- ``terminated`` is 1.0 only for a true terminal state, ``truncated`` is 1.0 when the
  time limit (gymnasium's ``TimeLimit``, from ``gym.make``) ended the episode without a
  termination, so the TD target bootstraps from ``next_obs``;
- a finished environment is reset immediately (auto-reset), so ``obs`` after ``step`` is the
  first observation of the new episode; ``finished_return`` carries the finished episode's
  undiscounted return (0 where no episode ended).

Seeding: ``reset()`` seeds env ``i`` with ``seed * 1_000_003 + i``; the automatic resets
after an episode ends pass no seed, so each env continues its own RNG stream. Two
``HostVecEnv`` with the same ``env_id``, ``num_envs`` and ``seed`` fed the same actions
therefore produce identical trajectories.

We use our own loop rather than ``gymnasium.vector`` so the auto-reset semantics above are
explicit and do not depend on gymnasium's autoreset mode. Never call this inside ``jit``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from popjax.envs.base import StepOutput
from popjax.types import EnvSpec

SEED_STRIDE = 1_000_003


def spec_from_gym_env(env_id: str, env: gym.Env) -> EnvSpec:
    """The ``EnvSpec`` of a made gymnasium env (name ``gym:<id>``)."""
    obs_space, act_space = env.observation_space, env.action_space
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"gym:{env_id}: only Box observation spaces are supported, got {obs_space}")
    max_steps = env.spec.max_episode_steps if env.spec is not None else None
    if max_steps is None:
        raise ValueError(f"gym:{env_id} has no time limit (max_episode_steps); popjax needs one")
    common = dict(name=f"gym:{env_id}", obs_shape=tuple(int(d) for d in obs_space.shape),
                  max_episode_steps=int(max_steps))
    if isinstance(act_space, gym.spaces.Discrete):
        if int(act_space.start) != 0:
            raise ValueError(f"gym:{env_id}: Discrete action spaces must start at 0, got {act_space}")
        return EnvSpec(num_actions=int(act_space.n), **common)
    if isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1:
        low, high = act_space.low.astype(np.float64), act_space.high.astype(np.float64)
        if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
            raise ValueError(f"gym:{env_id}: continuous actions need finite bounds, got {act_space}")
        return EnvSpec(action_dim=int(act_space.shape[0]), action_low=tuple(float(x) for x in low),
                       action_high=tuple(float(x) for x in high), **common)
    raise ValueError(f"gym:{env_id}: only Discrete or 1-D Box action spaces are supported, got {act_space}")


def make_env(env_id: str) -> gym.Env:
    """``gym.make(env_id)``; an optional dependency that is missing is a ValueError naming it.

    gymnasium's own message names the extra to install (e.g. ``pip install "gymnasium[box2d]"``).
    """
    import popjax.envs.toy  # noqa: F401  (registers popjax's own toy ids)

    try:
        return gym.make(env_id)
    except gym.error.DependencyNotInstalled as err:
        raise ValueError(f"gym:{env_id} needs an optional dependency: {' '.join(str(err).split())}") from None


def gym_env_spec(env_id: str) -> EnvSpec:
    """The ``EnvSpec`` of ``gym:<env_id>`` (makes one env and closes it; no stepping)."""
    env = make_env(env_id)
    try:
        return spec_from_gym_env(env_id, env)
    finally:
        env.close()


class HostVecEnv:
    """``num_envs`` copies of ``gym.make(env_id)`` with explicit auto-reset (see module doc)."""

    def __init__(self, env_id: str, num_envs: int, seed: int, first_env: int = 0):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.env_id = env_id
        self.num_envs = int(num_envs)
        self.seed = int(seed)
        self.first_env = int(first_env)  # this process's first env in the job's numbering (several processes)
        self.envs = [make_env(env_id) for _ in range(self.num_envs)]
        self.spec: EnvSpec = spec_from_gym_env(env_id, self.envs[0])
        if self.spec.discrete:
            self._low = self._scale = None
        else:
            self._low = np.asarray(self.spec.action_low, np.float32)
            self._scale = np.asarray(self.spec.action_high, np.float32) - self._low
        self._obs: np.ndarray | None = None
        self._returns = np.zeros(self.num_envs, np.float64)
        self._lengths = np.zeros(self.num_envs, np.int64)

    # ----------------------------------------------------------------------------------------
    def reset(self, seeds=None) -> np.ndarray:
        """Resets every env (env ``i`` with seed ``seed * 1_000_003 + first_env + i``, or ``seeds[i]`` when given);
        returns ``[n, *obs_shape]``."""
        if seeds is None:
            seeds = [self.seed * SEED_STRIDE + self.first_env + i for i in range(self.num_envs)]
        obs = [env.reset(seed=int(s))[0] for s, env in zip(seeds, self.envs, strict=True)]
        self._obs = np.stack(obs).astype(np.float32)
        self._returns[:] = 0.0
        self._lengths[:] = 0
        return self._obs

    @property
    def obs(self) -> np.ndarray:
        """Current observations ``[n, *obs_shape]`` float32 (a fresh array after every step)."""
        if self._obs is None:
            raise RuntimeError("HostVecEnv.reset() must be called before using obs or step()")
        return self._obs

    @property
    def episode_lengths(self) -> np.ndarray:
        """Steps taken so far in each env's current episode."""
        return self._lengths.copy()

    def to_native(self, actions: np.ndarray) -> np.ndarray:
        """Learner actions -> native units: ``low + (a + 1) / 2 * (high - low)`` (as ``base.to_native``)."""
        if self.spec.discrete:
            return np.asarray(actions).astype(np.int64)
        return self._low + 0.5 * (np.asarray(actions, np.float32) + 1.0) * self._scale

    def step(self, actions: np.ndarray) -> StepOutput:
        """Steps every env once; finished envs are reset (``obs`` is then their reset obs)."""
        if self._obs is None:
            raise RuntimeError("HostVecEnv.reset() must be called before step()")
        actions = np.asarray(actions)
        expected = (self.num_envs, *self.spec.action_shape)
        if actions.shape != expected:
            raise ValueError(f"{self.spec.name}: actions must have shape {expected}, got {actions.shape}")
        native = self.to_native(actions)
        n = self.num_envs
        next_obs = np.empty((n, *self.spec.obs_shape), np.float32)
        new_obs = np.empty_like(next_obs)
        reward = np.zeros(n, np.float32)
        terminated = np.zeros(n, np.float32)
        truncated = np.zeros(n, np.float32)
        finished_return = np.zeros(n, np.float32)
        done = np.zeros(n, bool)
        for i, env in enumerate(self.envs):
            a = int(native[i]) if self.spec.discrete else native[i]
            o, r, term, trunc, _ = env.step(a)
            next_obs[i] = o
            reward[i] = r
            self._returns[i] += float(r)
            self._lengths[i] += 1
            if term or trunc:
                terminated[i] = float(bool(term))
                truncated[i] = float(bool(trunc) and not term)
                done[i] = True
                finished_return[i] = self._returns[i]
                self._returns[i] = 0.0
                self._lengths[i] = 0
                new_obs[i] = env.reset()[0]  # no seed: continues this env's RNG stream
            else:
                new_obs[i] = o
        self._obs = new_obs
        return StepOutput(next_obs=next_obs, reward=reward, terminated=terminated, truncated=truncated,
                          finished_return=finished_return, done=done)

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs = []
        self._obs = None

    def __enter__(self) -> HostVecEnv:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"HostVecEnv({self.env_id!r}, num_envs={self.num_envs}, seed={self.seed})"
