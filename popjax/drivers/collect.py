"""Acting in environments for a whole population: the JAX path and the host path.

Both produce transitions in the population layout ``[pop, rollout_len * envs, ...]`` and
evaluate every member with its deterministic policy, so drivers do not care which path
is used.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from popjax.drivers.population import PopState, Population
from popjax.envs.base import VecEnv, VecEnvState
from popjax.types import Key, Transition


def _to_population_layout(x: jax.Array, pop_size: int) -> jax.Array:
    """``[T, pop * envs, ...]`` (time-major, member-major envs) -> ``[pop, T * envs, ...]``."""
    xp = np if isinstance(x, np.ndarray) else jnp  # host arrays stay on the host until the jitted call
    t, n = x.shape[:2]
    envs = n // pop_size
    x = x.reshape((t, pop_size, envs) + x.shape[2:])
    return xp.swapaxes(x, 0, 1).reshape((pop_size, t * envs) + x.shape[3:])


class JaxCollector:
    """Collects with a jitted ``VecEnv`` of ``pop * envs_per_member`` copies (member-major)."""

    def __init__(self, population: Population, vec_env: VecEnv, envs_per_member: int, rollout_len: int):
        self.population = population
        self.vec_env = vec_env
        self.envs_per_member = envs_per_member
        self.rollout_len = rollout_len
        self.num_envs = population.pop_size * envs_per_member
        # Jitted: run op by op, a brax reset takes tens of seconds.
        self._reset = jax.jit(lambda key: vec_env.reset(key, self.num_envs))

    def reset(self, key: Key) -> VecEnvState:
        return self._reset(key)

    def collect(self, key: Key, state: PopState, env_state: VecEnvState, explore: bool):
        """Steps all envs ``rollout_len`` times and adds the transitions to the members' buffers.

        ``explore`` is static: False = uniform random actions (warm-up).
        Returns ``(state, env_state, (finished_return_sum [pop], finished_count [pop]))``.
        """
        pop = self.population
        spec = self.vec_env.spec
        shape = (pop.pop_size, self.envs_per_member)

        def env_step(env_state, step_key):
            key_act, key_env = jax.random.split(step_key)
            obs = env_state.obs.reshape(shape + spec.obs_shape)
            action = pop.act(key_act, state, obs) if explore else pop.random_act(key_act, obs)
            action = action.reshape((self.num_envs,) + spec.action_shape)
            new_env_state, out = self.vec_env.step(key_env, env_state, action)
            transition = Transition(env_state.obs, action, out.reward, out.next_obs, out.terminated)
            return new_env_state, (transition, out.finished_return, out.done.astype(jnp.float32))

        env_state, (transitions, returns, dones) = jax.lax.scan(
            env_step, env_state, jax.random.split(key, self.rollout_len)
        )
        transitions = jax.tree.map(lambda x: _to_population_layout(x, pop.pop_size), transitions)
        per_member = lambda x: _to_population_layout(x, pop.pop_size).sum(axis=1)
        return pop.add(state, transitions), env_state, (per_member(returns), per_member(dones))

    def evaluate(self, key: Key, state: PopState, episodes: int) -> jax.Array:
        """Mean return of ``episodes`` deterministic episodes per member, ``[pop]`` (jit-able)."""
        pop, spec = self.population, self.vec_env.spec
        n = pop.pop_size * episodes
        key_reset, key_steps = jax.random.split(key)
        env_state = self.vec_env.reset(key_reset, n)

        def env_step(carry, step_key):
            env_state, total, alive = carry
            obs = env_state.obs.reshape((pop.pop_size, episodes) + spec.obs_shape)
            action = pop.policy(state, obs).reshape((n,) + spec.action_shape)
            env_state, out = self.vec_env.step(step_key, env_state, action)
            total = total + alive * out.reward
            alive = alive * (1.0 - out.done.astype(jnp.float32))
            return (env_state, total, alive), None

        init = (env_state, jnp.zeros(n), jnp.ones(n))
        (_, total, _), _ = jax.lax.scan(env_step, init, jax.random.split(key_steps, spec.max_episode_steps))
        return total.reshape(pop.pop_size, episodes).mean(axis=1)


class HostCollector:
    """Collects from a host (gymnasium) vector env; actions from one jitted population call."""

    def __init__(self, population: Population, env, eval_env_factory, envs_per_member: int, rollout_len: int):
        self.population = population
        self.env = env
        self.eval_env_factory = eval_env_factory
        self._eval_envs = {}
        self.envs_per_member = envs_per_member
        self.rollout_len = rollout_len
        # Step keys are folded in inside the jitted call: indexing a device array of keys on
        # the host would cost one extra dispatch per env step.
        self._act = jax.jit(lambda key, t, state, obs: population.act(jax.random.fold_in(key, t), state, obs))
        self._random_act = jax.jit(lambda key, t, obs: population.random_act(jax.random.fold_in(key, t), obs))
        self._policy = jax.jit(population.policy)

    def reset(self, key: Key) -> None:
        del key  # gymnasium envs are seeded from the run seed at construction
        self.env.reset()

    def collect(self, key: Key, state: PopState, explore: bool):
        """Steps the host envs ``rollout_len`` times; returns ``(transitions [pop, T*envs], stats)``."""
        pop, spec = self.population, self.env.spec
        shape = (pop.pop_size, self.envs_per_member)
        n = pop.pop_size * self.envs_per_member
        steps = []
        returns = np.zeros(n, np.float64)
        dones = np.zeros(n, np.float64)
        for t in range(self.rollout_len):
            obs = self.env.obs
            batched = obs.reshape(shape + spec.obs_shape)
            t = np.int32(t)
            action = self._act(key, t, state, batched) if explore else self._random_act(key, t, batched)
            action = np.asarray(action).reshape((n,) + spec.action_shape)
            out = self.env.step(action)
            steps.append(Transition(obs, action, out.reward, out.next_obs, out.terminated))
            returns += out.finished_return
            dones += out.done
        transitions = jax.tree.map(lambda *xs: np.stack(xs), *steps)
        transitions = jax.tree.map(lambda x: _to_population_layout(x, pop.pop_size), transitions)
        stats = (returns.reshape(shape).sum(1), dones.reshape(shape).sum(1))
        return transitions, stats

    def evaluate(self, state: PopState, episodes: int) -> np.ndarray:
        """Mean return of ``episodes`` deterministic episodes per member, ``[pop]``.

        The evaluation envs are reset with the same seeds every time, so evaluations of
        the same policy are identical (and comparable across members).
        """
        pop, spec = self.population, self.env.spec
        if episodes not in self._eval_envs:
            self._eval_envs[episodes] = self.eval_env_factory(pop.pop_size * episodes)
        env = self._eval_envs[episodes]
        obs = env.reset()
        n = pop.pop_size * episodes
        total, alive = np.zeros(n), np.ones(n)
        while alive.any():
            action = self._policy(state, obs.reshape((pop.pop_size, episodes) + spec.obs_shape))
            out = env.step(np.asarray(action).reshape((n,) + spec.action_shape))
            total += alive * out.reward
            alive *= 1.0 - out.done
            obs = env.obs
        return total.reshape(pop.pop_size, episodes).mean(axis=1)

    def close(self):
        self.env.close()
        for env in self._eval_envs.values():
            env.close()
