"""The known termination rules against gymnasium's own ``terminated`` on recorded states."""

import gymnasium as gym
import jax.numpy as jnp
import numpy as np
import pytest

from popjax.envs.terminations import KNOWN_TERMINATIONS, known_termination

MUJOCO = ["Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5", "HalfCheetah-v5"]


def recorded(env_id, steps=400, seed=0):
    """(next_obs, terminated) over random-action episodes, plus one step from each of a few forced heights."""
    env = gym.make(env_id)
    rng = np.random.default_rng(seed)
    obs_rows, done_rows = [], []
    env.reset(seed=seed)
    for _ in range(steps):
        next_obs, _, terminated, truncated, _ = env.step(rng.uniform(-1, 1, env.action_space.shape))
        obs_rows.append(next_obs)
        done_rows.append(terminated)
        if terminated or truncated:
            env.reset()
    base = env.unwrapped
    height = 1 if env_id in ("Hopper-v5", "Walker2d-v5", "HalfCheetah-v5") else 2  # qpos index of the height
    for z in (0.05, 0.15, 0.5, 0.75, 0.9, 1.1, 1.5, 2.5, 3.0):
        env.reset(seed=seed)
        qpos, qvel = base.data.qpos.copy(), base.data.qvel.copy()
        qpos[height] = z
        base.set_state(qpos, qvel)
        next_obs, _, terminated, _, _ = env.step(np.zeros(env.action_space.shape))
        obs_rows.append(next_obs)
        done_rows.append(terminated)
    env.close()
    return np.asarray(obs_rows), np.asarray(done_rows)


@pytest.mark.long
@pytest.mark.parametrize("env_id", MUJOCO)
def test_rule_matches_gymnasium_on_every_recorded_state(env_id):
    next_obs, terminated = recorded(env_id)
    predicted = np.asarray(known_termination(f"gym:{env_id}")(jnp.asarray(next_obs)))
    assert predicted.shape == terminated.shape
    np.testing.assert_array_equal(predicted, terminated)
    if env_id != "HalfCheetah-v5":  # the forced heights put every other task on both sides of its rule
        assert 0 < terminated.sum() < len(terminated)


def test_probes_and_unknown_tasks():
    obs = jnp.zeros((3, 2))
    assert not known_termination("probe:pendulum")(obs).any()
    assert known_termination("probe:bandit")(jnp.zeros((3, 1))).all()
    assert known_termination("gym:Swimmer-v5") is None
    assert all(name.startswith(("gym:", "probe:")) for name in KNOWN_TERMINATIONS)
