"""Evaluation with common random numbers (issue 48): with ``eval_starts: common`` every member's episode e starts
from the same state at one evaluation, fresh at the next; ``member`` keeps each member's own start states."""

import jax
import jax.numpy as jnp
import numpy as np

from popjax.config import RunConfig
from popjax.envs import registry
from popjax.envs.base import make_vec_env
from popjax.envs.runner import HostRunner, JaxRunner
from popjax.population.members import Members

EPISODES = 3


def first_obs_policy(record):
    """A policy that records the observations it is shown and acts 0."""
    def policy(actor, obs):
        record.append(np.asarray(obs))
        return np.zeros(obs.shape[:2] + (1,), np.float32)
    return policy


def test_the_default_is_common_starts():
    assert RunConfig().eval_starts == "common"
    assert RunConfig(eval_starts="member").eval_starts == "member"


def test_jax_path_members_share_start_states_at_one_evaluation_and_not_across_evaluations():
    def start_states(common, key):
        runner = JaxRunner(make_vec_env(registry.make_jax_env("probe:pendulum")), Members(2), 1,
                           common_starts=common)

        def policy(actor, obs):
            return jnp.zeros(obs.shape[:2] + (1,), jnp.float32)

        key_reset = jax.random.split(key, 3)[0]
        ids = jnp.tile(jnp.arange(EPISODES, dtype=jnp.int32), 2) if common else \
            jnp.arange(2 * EPISODES, dtype=jnp.int32)
        obs = runner.vec_env.reset(key_reset, ids).obs.reshape(2, EPISODES, -1)
        returns = runner.evaluate(key, policy, None, jnp.arange(2, dtype=jnp.int32), EPISODES)
        return np.asarray(obs), np.asarray(returns)

    obs, returns = start_states(True, jax.random.key(0))
    np.testing.assert_array_equal(obs[0], obs[1])
    assert returns[0] == returns[1]  # the same (zero-action) policy on the same episodes
    obs_next, _ = start_states(True, jax.random.key(1))
    assert not np.allclose(obs_next[0], obs[0])  # fresh at the next evaluation's key
    obs_member, returns_member = start_states(False, jax.random.key(0))
    assert not np.allclose(obs_member[0], obs_member[1])
    assert returns_member[0] != returns_member[1]


def test_host_path_seeds_every_member_alike_and_fresh_at_each_evaluation():
    def runner(common):
        return HostRunner(lambda n, seed, first: registry.make_host_env("gym:Pendulum-v1", n, seed, first), 2, 1, 7,
                          common_starts=common)

    host, seen = runner(True), []
    policy = first_obs_policy(seen)
    first = host.evaluate(jax.random.key(0), policy, None, np.arange(2), EPISODES)
    second = host.evaluate(jax.random.key(1), policy, None, np.arange(2), EPISODES)
    start_1, start_2 = seen[0], seen[200]  # Pendulum: 200 steps per episode, one call per step
    np.testing.assert_array_equal(start_1[0], start_1[1])
    assert first[0] == first[1] and second[0] == second[1]
    assert not np.allclose(start_1[0], start_2[0])
    seeds = host.eval_seeds(jax.random.key(1), EPISODES)
    assert seeds == host.eval_seeds(jax.random.key(1), EPISODES) != host.eval_seeds(jax.random.key(0), EPISODES)
    again = host.evaluate(jax.random.key(1), policy, None, np.arange(2), EPISODES)  # a resumed run's evaluation
    np.testing.assert_array_equal(again, second)
    host.close()

    host, seen = runner(False), []
    policy = first_obs_policy(seen)
    again = [host.evaluate(jax.random.key(k), policy, None, np.arange(2), EPISODES) for k in range(2)]
    assert not np.allclose(seen[0][0], seen[0][1])  # member m: its own seeds
    np.testing.assert_array_equal(again[0], again[1])  # and the same ones at every evaluation
    host.close()
