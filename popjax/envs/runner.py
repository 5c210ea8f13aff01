"""Acting in environments for a population: one runner per env path, the same interface.

Drivers never step environments themselves. They say what an iteration needs (a rollout of
the persistent envs with exploration actions, or whole episodes from a reset) and give an
acting function; the runner does the stepping:

- ``JaxRunner`` (``brax:``, ``probe:``): pure and traceable, so the training loop compiles
  acting and learning into one call per iteration.
- ``HostRunner`` (``gym:``): gymnasium envs stepped on the host; every action comes from one
  compiled population call.

Acting functions are ``act(key, t, actor, obs) -> actions`` (or ``(actions, extras)``: what the learner records
with each transition, stored in ``Transition.extras``) with ``obs`` shaped
``[actors, envs per actor, *obs_shape]`` and ``t`` the step index inside the call (the key
of step ``t`` is derived inside the compiled call, not on the host); evaluation policies are
``policy(actor, obs) -> actions``. Continuous actions are in ``[-1, 1]``.

Evaluation uses common random numbers across members (``common_starts``, the default; the run's ``eval_starts:
common``): episode e of every member starts from the same state, fresh at each evaluation, so a ranking of members
(PBT's fitness, a sweep's objective) compares policies, not start-state luck. ``eval_starts: member`` gives each
member its own start states (popjax before issue 48).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from popjax.envs.base import VecEnv, VecEnvState
from popjax.population.members import Members
from popjax.types import EnvSpec, Key, Transition


class Experience(NamedTuple):
    """A rollout of the persistent envs, in the population layout."""

    transitions: Transition  # [members, T * envs_per_member, ...]
    finished_return: Any  # [members] summed returns of the episodes that ended during the rollout
    finished_episodes: Any  # [members] number of episodes that ended
    # [members, T * envs_per_member] bool: the env's episode ended at this step (terminated or truncated, so the
    # env was reset and the next step starts a new episode); on-policy learners cut their returns there.
    ended: Any


class EpisodeBatch(NamedTuple):
    """Whole episodes of ``m`` actors x ``e`` envs, padded to the episode limit ``T``."""

    returns: Any  # [m] mean return of each actor's episodes
    transitions: Transition  # [T * m * e, ...] time-major
    mask: Any  # [T * m * e] bool: real steps (False after an env's episode ended)


def population_layout(x, members: int):
    """``[T, members * envs, ...]`` (time-major, member-major envs) -> ``[members, T * envs, ...]``."""
    xp = np if isinstance(x, np.ndarray) else jnp  # host arrays stay on the host until the compiled call
    t, n = x.shape[:2]
    envs = n // members
    x = x.reshape((t, members, envs) + x.shape[2:])
    return xp.swapaxes(x, 0, 1).reshape((members, t * envs) + x.shape[3:])


def flat_act(acted, spec: EnvSpec):
    """``(actions [n, ...], extras [n, ...] | None)`` from the ``(actions, extras)`` an acting function returned for
    ``[actors, envs]``."""
    if not isinstance(acted, tuple) or len(acted) != 2:  # an action array would unpack along its actor axis
        raise TypeError(f"an acting function must return (actions, extras), got {type(acted).__name__}")
    action, extras = acted
    flat = lambda x: x.reshape((-1,) + x.shape[2:])
    return action.reshape((-1,) + spec.action_shape), jax.tree.map(flat, extras)


def env_ids(actor_ids: jax.Array, envs_per_actor: int) -> jax.Array:
    """Global indices of the envs of ``actor_ids`` (actor-major)."""
    ids = actor_ids[:, None] * envs_per_actor + jnp.arange(envs_per_actor, dtype=jnp.int32)
    return ids.reshape(-1)


class JaxRunner:
    """The JAX path: a jitted, vmapped ``VecEnv``; every method is pure and traceable."""

    jax_path = True

    def __init__(self, vec_env: VecEnv, members: Members, envs_per_member: int, common_starts: bool = True):
        self.vec_env = vec_env
        self.common_starts = common_starts
        self.spec: EnvSpec = vec_env.spec
        self.members = members
        self.envs_per_member = envs_per_member

    def reset(self, key: Key) -> VecEnvState:
        """The persistent envs of this program's members (``members.local * envs_per_member``)."""
        return self.vec_env.reset(key, env_ids(self.members.ids(), self.envs_per_member))

    def rollout(self, key: Key, act: Callable, actor, env_state: VecEnvState, steps: int):
        """``steps`` steps of every env with ``act``; returns ``(env_state, Experience)``."""
        spec, m = self.spec, self.members.local
        key_act, key_env = jax.random.split(key)

        def env_step(env_state, t):
            obs = env_state.obs.reshape((m, self.envs_per_member) + spec.obs_shape)
            action, extras = flat_act(act(key_act, t, actor, obs), spec)
            new_env_state, out = self.vec_env.step(jax.random.fold_in(key_env, t), env_state, action)
            transition = Transition(env_state.obs, action, out.reward, out.next_obs, out.terminated, extras)
            return new_env_state, (transition, out.finished_return, out.done)

        env_state, (transitions, returns, dones) = jax.lax.scan(env_step, env_state, jnp.arange(steps))
        per_member = lambda x: population_layout(x, m).sum(axis=1)
        experience = Experience(jax.tree.map(lambda x: population_layout(x, m), transitions),
                                per_member(returns), per_member(dones.astype(jnp.float32)),
                                population_layout(dones, m))
        return env_state, experience

    def episodes(self, key: Key, act: Callable, actor, actor_ids: jax.Array, episodes: int) -> EpisodeBatch:
        """One episode in each of ``episodes`` fresh envs per actor, every transition recorded."""
        return self._episodes(key, act, actor, actor_ids, episodes, record=True)

    def evaluate(self, key: Key, policy: Callable, actor, actor_ids: jax.Array, episodes: int) -> jax.Array:
        """Mean return ``[m]`` of ``episodes`` deterministic episodes per actor (the same start states for every
        actor with ``common_starts``: env ids 0 .. episodes-1 under this evaluation's key)."""
        act = lambda key, t, actor, obs: (policy(actor, obs), None)  # an act's pair: nothing recorded
        return self._episodes(key, act, actor, actor_ids, episodes, record=False, common=self.common_starts).returns

    def _episodes(self, key, act, actor, actor_ids, episodes, record, common=False):
        spec, m = self.spec, actor_ids.shape[0]
        key_reset, key_act, key_env = jax.random.split(key, 3)
        ids = jnp.tile(jnp.arange(episodes, dtype=jnp.int32), m) if common else env_ids(actor_ids, episodes)
        env_state = self.vec_env.reset(key_reset, ids)

        def env_step(carry, t):
            env_state, total, alive = carry
            obs = env_state.obs.reshape((m, episodes) + spec.obs_shape)
            action = flat_act(act(key_act, t, actor, obs), spec)[0]  # whole episodes record no extras
            new_state, out = self.vec_env.step(jax.random.fold_in(key_env, t), env_state, action)
            total = total + alive * out.reward
            recorded = (Transition(env_state.obs, action, out.reward, out.next_obs, out.terminated), alive > 0) \
                if record else None
            return (new_state, total, alive * (1.0 - out.done.astype(jnp.float32))), recorded

        init = (env_state, jnp.zeros(m * episodes), jnp.ones(m * episodes))
        if not record:
            # Stops once every episode has ended: the returns of the full scan without stepping finished envs up
            # to the limit (craftax's is 100,000 steps).
            def running(carry):
                t, (_, _, alive) = carry
                return (t < spec.max_episode_steps) & (alive > 0).any()

            def body(carry):
                t, inner = carry
                return t + 1, env_step(inner, t)[0]

            _, (_, total, _) = jax.lax.while_loop(running, body, (jnp.zeros((), jnp.int32), init))
            return EpisodeBatch(total.reshape(m, episodes).mean(axis=1), None, None)
        (_, total, _), recorded = jax.lax.scan(env_step, init, jnp.arange(spec.max_episode_steps))
        returns = total.reshape(m, episodes).mean(axis=1)
        flat = lambda x: x.reshape((-1,) + x.shape[2:])
        transitions, mask = recorded
        return EpisodeBatch(returns, jax.tree.map(flat, transitions), flat(mask))


class HostRunner:
    """The host path: ``pop * envs_per_member`` gymnasium envs for training, fresh ones for evaluation.

    Training envs are seeded once, from the run seed, by ``reset``; after that every env
    continues its own RNG stream (rollouts auto-reset, whole episodes start with an unseeded
    reset). Evaluation envs (seed + 10_000) are re-seeded at every evaluation, so evaluations
    of the same policy are identical and comparable across members. Host envs cannot be
    snapshotted: after a resume, training envs start new episodes from their seeded reset.

    With ``common_starts`` (the default) an evaluation resets episode e of every member with seed
    ``eval_seeds(key, episodes)[e]``, drawn from the evaluation's key: the same start states for every member,
    fresh at the next evaluation, the same again after a resume. Without, member m's episode e is seeded
    ``(seed + 10_000) * 1_000_003 + m * episodes + e`` at every evaluation.

    In a run over several processes each process steps the envs of its own members
    (``num_members`` from ``first_member``), seeded as in a single-process run.
    """

    jax_path = False
    EVAL_SEED_OFFSET = 10_000

    def __init__(self, env_factory: Callable[[int, int, int], Any], num_members: int, envs_per_member: int, seed: int,
                 first_member: int = 0, common_starts: bool = True):
        self.env_factory = env_factory  # (num_envs, seed, first_env) -> HostVecEnv
        self.num_members = num_members  # this process's members (all of them in a single-process run)
        self.envs_per_member = envs_per_member
        self.seed = seed
        self.first_member = first_member
        self.env = env_factory(num_members * envs_per_member, seed, first_member * envs_per_member)
        self.spec: EnvSpec = self.env.spec
        self._eval_envs: dict[int, Any] = {}
        self._freshly_reset = False
        self.common_starts = common_starts

    @staticmethod
    def eval_seeds(key: Key, episodes: int) -> list[int]:
        """The gymnasium reset seeds of one evaluation's episodes (common to every member), from its key."""
        return [int(s) for s in np.asarray(jax.random.randint(key, (episodes,), 0, np.iinfo(np.int32).max))]

    def reset(self, key: Key) -> None:
        del key  # gymnasium envs are seeded from the run seed
        self.env.reset()
        self._freshly_reset = True

    def rollout(self, key: Key, act: Callable, actor, env_state, steps: int):
        """``steps`` host steps of every training env; returns ``(None, Experience)`` of numpy arrays."""
        del env_state
        spec, m = self.spec, self.num_members
        shape = (m, self.envs_per_member)
        n = m * self.envs_per_member
        steps_taken, ended = [], []
        returns, dones = np.zeros(n, np.float64), np.zeros(n, np.float64)
        for t in range(steps):
            obs = self.env.obs
            acted = jax.tree.map(np.asarray, act(key, np.int32(t), actor, obs.reshape(shape + spec.obs_shape)))
            action, extras = flat_act(acted, spec)
            out = self.env.step(action)
            steps_taken.append(Transition(obs, action, out.reward, out.next_obs, out.terminated, extras))
            ended.append(np.asarray(out.done, bool))
            returns += out.finished_return
            dones += out.done
        self._freshly_reset = False
        transitions = jax.tree.map(lambda *xs: population_layout(np.stack(xs), m), *steps_taken)
        return None, Experience(transitions, returns.reshape(shape).sum(1), dones.reshape(shape).sum(1),
                                population_layout(np.stack(ended), m))

    def episodes(self, key: Key, act: Callable, actor, actor_ids, episodes: int) -> EpisodeBatch:
        """One episode in each training env (``len(actor_ids) * episodes`` of them), recorded."""
        m, vec = len(actor_ids), self.env
        if vec.num_envs != m * episodes:
            raise ValueError(f"{vec.num_envs} training envs for {m} actors x {episodes} episodes")
        obs = vec.obs if self._freshly_reset else np.stack([e.reset()[0] for e in vec.envs]).astype(np.float32)
        self._freshly_reset = False
        return self._episodes(vec, lambda t, o: act(key, np.int32(t), actor, o)[0], m, episodes, obs,
                              record=True)

    def evaluate(self, key: Key, policy: Callable, actor, actor_ids, episodes: int) -> np.ndarray:
        """Mean return ``[m]`` of ``episodes`` deterministic episodes per actor, in re-seeded envs."""
        m = len(actor_ids)
        n = m * episodes
        if n not in self._eval_envs:
            self._eval_envs[n] = self.env_factory(n, self.seed + self.EVAL_SEED_OFFSET, self.first_member * episodes)
        vec = self._eval_envs[n]
        obs = vec.reset(self.eval_seeds(key, episodes) * m) if self.common_starts else vec.reset()
        return self._episodes(vec, lambda t, o: policy(actor, o), m, episodes, obs, record=False).returns

    def _episodes(self, vec, call, m: int, episodes: int, obs: np.ndarray, record: bool) -> EpisodeBatch:
        """Steps each env until its own episode ends (finished envs are not stepped again)."""
        spec, n, t_max = self.spec, m * episodes, self.spec.max_episode_steps
        if record:
            data = Transition(obs=np.zeros((t_max, n) + spec.obs_shape, np.float32),
                              action=np.zeros((t_max, n) + spec.action_shape, np.dtype(spec.action_dtype)),
                              reward=np.zeros((t_max, n), np.float32),
                              next_obs=np.zeros((t_max, n) + spec.obs_shape, np.float32),
                              terminated=np.zeros((t_max, n), np.float32))
            mask = np.zeros((t_max, n), bool)
        total, alive = np.zeros(n), np.ones(n, bool)
        obs = np.array(obs, np.float32)
        for t in range(t_max):
            if not alive.any():
                break
            action = np.asarray(call(t, obs.reshape((m, episodes) + spec.obs_shape))).reshape((n,) + spec.action_shape)
            native = vec.to_native(action)
            for i in np.flatnonzero(alive):
                o, r, term, trunc, _ = vec.envs[i].step(int(native[i]) if spec.discrete else native[i])
                if record:
                    data.obs[t, i], data.action[t, i], data.reward[t, i] = obs[i], action[i], r
                    data.next_obs[t, i], data.terminated[t, i] = o, float(bool(term))
                    mask[t, i] = True
                total[i] += float(r)
                obs[i] = o
                alive[i] = not (term or trunc)
        returns = total.reshape(m, episodes).mean(axis=1)
        if not record:
            return EpisodeBatch(returns, None, None)
        flat = lambda x: x.reshape((-1,) + x.shape[2:])
        return EpisodeBatch(returns, jax.tree.map(flat, data), flat(mask))

    def close(self) -> None:
        self.env.close()
        for env in self._eval_envs.values():
            env.close()
