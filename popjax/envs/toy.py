"""A sleep-based toy environment for the HTS-RL driver's tests and benchmarks (gymnasium API).

``SleepyToyEnv``: a 16-dim state, 4 actions, 50-step episodes (truncated). The dynamics are
``s' = tanh(A[a] s + 0.1 eps)`` with fixed matrices ``A`` and noise ``eps`` drawn from
``(seed, episode, t)`` only, and reward ``s'[a]``; so the trajectory is a function of the seed
and the actions. Each step first sleeps a random time (constant, exponential or gamma) drawn
from an **unseeded** source: timing jitter must never change results, which is what the
driver's determinism tests check.

Registered as ``gym:popjax/HtsToy-v0`` (no sleep) and ``gym:popjax/HtsToySleep-v0``
(exponential step times, mean 1 ms). ``get_state``/``set_state`` snapshot the env (JSON), so a
run on it resumes bit-identically.
"""

from __future__ import annotations

import random
import time

import gymnasium as gym
import numpy as np

OBS_DIM, NUM_ACTIONS, EPISODE_STEPS = 16, 4, 50
_MATRICES = (np.random.default_rng(12345).normal(size=(NUM_ACTIONS, OBS_DIM, OBS_DIM)) / np.sqrt(OBS_DIM))
_MATRICES = _MATRICES.astype(np.float32)
STEP_TIMES = ("constant", "exponential", "gamma")


def sample_step_time(rng: random.Random, kind: str, mean_s: float, shape: float = 2.0) -> float:
    """One step time in seconds with mean ``mean_s``; ``gamma`` has shape ``shape`` (variance mean²/shape)."""
    if mean_s <= 0:
        return 0.0
    if kind == "constant":
        return mean_s
    if kind == "exponential":
        return rng.expovariate(1.0 / mean_s)
    if kind == "gamma":
        return rng.gammavariate(shape, mean_s / shape)
    raise ValueError(f"step_time: {kind!r} unknown (allowed: {', '.join(STEP_TIMES)})")


class SleepyToyEnv(gym.Env):
    """See the module docstring. ``step_time`` in ``STEP_TIMES``, ``mean_s`` its mean in seconds."""

    metadata = {"render_modes": []}

    def __init__(self, step_time: str = "constant", mean_s: float = 0.0, shape: float = 2.0):
        if step_time not in STEP_TIMES:
            raise ValueError(f"step_time: {step_time!r} unknown (allowed: {', '.join(STEP_TIMES)})")
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (OBS_DIM,), np.float32)
        self.action_space = gym.spaces.Discrete(NUM_ACTIONS)
        self.step_time, self.mean_s, self.shape = step_time, float(mean_s), float(shape)
        self._clock = random.Random()  # unseeded on purpose: timing only, never results
        self._seed, self._episode, self._t = 0, 0, 0
        self._obs = np.zeros(OBS_DIM, np.float32)
        self._table_of, self._table = None, None

    def _noise(self) -> np.ndarray:
        if self._table_of != (self._seed, self._episode):  # one draw per episode: a step stays cheap
            rng = np.random.default_rng([self._seed, self._episode])
            self._table = rng.normal(size=(EPISODE_STEPS + 1, OBS_DIM)).astype(np.float32)
            self._table_of = (self._seed, self._episode)
        return self._table[min(self._t, EPISODE_STEPS)]

    def reset(self, *, seed: int | None = None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self._seed, self._episode = int(seed), 0
        else:
            self._episode += 1
        self._t = 0
        self._obs = np.tanh(self._noise())
        return self._obs.copy(), {}

    def step(self, action):
        pause = sample_step_time(self._clock, self.step_time, self.mean_s, self.shape)
        if pause > 0:
            time.sleep(pause)
        a = int(action)
        self._t += 1
        self._obs = np.tanh(_MATRICES[a] @ self._obs + np.float32(0.1) * self._noise()).astype(np.float32)
        reward = float(self._obs[a])
        return self._obs.copy(), reward, False, self._t >= EPISODE_STEPS, {}

    def get_state(self) -> dict:
        return {"seed": self._seed, "episode": self._episode, "t": self._t, "obs": self._obs.tolist()}

    def set_state(self, state: dict) -> None:
        self._seed, self._episode, self._t = int(state["seed"]), int(state["episode"]), int(state["t"])
        self._obs = np.asarray(state["obs"], np.float32)


def register() -> None:
    """Registers the toy ids with gymnasium (idempotent)."""
    for env_id, kwargs in (("popjax/HtsToy-v0", {}),
                           ("popjax/HtsToySleep-v0", {"step_time": "exponential", "mean_s": 0.001})):
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point="popjax.envs.toy:SleepyToyEnv", max_episode_steps=EPISODE_STEPS,
                         kwargs=kwargs)


register()
