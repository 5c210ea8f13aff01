"""CEM-RL (Pourchot & Sigaud 2019) with the fast-PBT vectorized shared critic (reference §5).

One generation (``CEMRLTrainer.step``):

1. ``ask``: ``pop`` actors sampled from the diagonal CEM over the flattened actor parameters
   (``popjax.drivers.cem``, mirrored sampling, the release's noise schedule).
2. After warm-up, the first ``n_trained`` (default ``pop // 2``) samples are loaded into the
   shared-critic TD3 learner (target actor := actor, fresh Adam state, as in the release)
   and trained for ``G`` gradient steps, ``G = round(update_ratio * env steps of the previous
   generation)`` (all members' steps summed, as CEM-RL's ``actor_steps``), in compiled calls
   of ``updates_per_call`` (K = 50) vectorized steps: each step updates the shared critic
   once on all trained members' sub-batches with the loss averaged over them, and every
   trained actor once (``popjax.learners.shared_critic``). ``G`` is rounded to a multiple
   of K (at least one call once ``G > 0``); the number of calls is a traced loop bound, so
   a changing ``G`` never recompiles. The trained actors replace their samples.
3. Every actor runs ``envs_per_member`` noise-free episodes (1 by default, the release's
   fitness episodes); the mean return is its fitness and all these transitions go into one
   shared replay buffer (``buffer_size`` rows in total). Only real steps are stored (a
   masked add drops the padding after an episode ends), so episode lengths may differ.
4. ``tell``: the CEM moves to the weighted elites (top ``n_elites`` by fitness).

The reported metric is the return of the **CEM mean actor** (``eval_episodes`` deterministic
episodes) at every ``eval_interval`` env steps per member and at the end (the paper's
metric); it is ``best_return`` / ``final_return`` in summary.json and ``cem_mean_return``
in metrics.csv, whose rows are one per (generation, member) with ``eval_return`` = that
member's fitness. ``env_steps`` is per member (the generation's total / ``pop``), as for
every popjax driver; ``env_steps_total`` is the sum over members.

Keys are derived from ``(seed, purpose, generation)`` (``Trainer.key_for``) and the whole
driver state (CEM mean/variance/noise, learner, shared buffer, counters) is one pytree
(``CEMRLState``), so checkpoints and exact resume on the JAX env path come from the base
``Trainer``. On the gymnasium path, fitness episodes continue each env's RNG stream;
after a resume the envs are re-seeded from the run seed (as for the other drivers).

Options (``RunConfig.cemrl``): ``n_trained``, ``n_elites``, ``init_var``, ``cov_noise_init``,
``cov_noise_final``, ``cov_noise_decay``, ``mirrored``, ``weighting``, ``var_div_elites``
(see ``popjax.drivers.cem``), ``updates_per_call`` and ``critic_order``: ``"vectorized"`` (default,
the fast-PBT modification) or ``"sequential"`` (the original CEM-RL order within each call of K
steps: member by member, its K / n_trained critic updates then its K actor updates; set
``updates_per_call`` to the generation's G to reproduce CEM-RL exactly, e.g. 2000 for 10
Pendulum actors) or ``"sequential_interleaved"`` (member by member, its critic updates spread
between its actor updates). TD3 hparams are the learner's, with
``policy_delay = 1`` (CEM-RL) unless set in ``hparams``.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.flatten_util import ravel_pytree

from popjax.buffers import Buffer, BufferState, make_uniform_buffer
from popjax.config import ConfigError
from popjax.drivers import cem
from popjax.drivers.collect import HostCollector, JaxCollector
from popjax.experiment import Trainer
from popjax.learners.shared_critic import SharedCriticState, SharedCriticTD3, make_shared_critic_td3
from popjax.population.hparams import hparams_table
from popjax.progress import TrainProgress
from popjax.types import Key, Transition, dummy_transition

TRAIN_METRICS = ("critic_loss", "member_critic_loss", "actor_loss", "q_mean")
CRITIC_ORDERS = ("vectorized", "sequential", "sequential_interleaved")
# Key purposes (Trainer.key_for) used by this driver; the base Trainer uses 0-6.
KEY_GENERATION, KEY_EVAL = 10, 11


# --- options ------------------------------------------------------------------------------------
def parse_options(section: str, given: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``defaults`` updated with ``given``; unknown keys and wrong types raise ConfigError."""
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ConfigError(f"{section}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(defaults)}")
    out = dict(defaults)
    for name, value in given.items():
        default = defaults[name]
        kind = type(default)
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, int | float) and not isinstance(default, bool):
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            if ok and isinstance(default, int):
                ok = float(value).is_integer()
        elif isinstance(default, tuple):
            ok = isinstance(value, list | tuple)
            value = tuple(value) if ok else value
        else:
            ok = isinstance(value, kind)
        if not ok:
            raise ConfigError(f"{section}.{name}: expected {kind.__name__}, got {value!r}")
        out[name] = kind(value) if isinstance(default, int | float) and not isinstance(default, bool) else value
    return out


@dataclasses.dataclass(frozen=True)
class CEMRLSettings:
    cem: cem.CEMConfig
    n_trained: int
    updates_per_call: int
    critic_order: str
    update_ratio: float
    warmup_total: int  # env steps summed over members before any gradient step
    fitness_episodes: int


def settings_from_config(config) -> CEMRLSettings:
    pop = config.pop_size
    defaults = {"n_trained": pop // 2, "n_elites": pop // 2, "init_var": 1e-2, "cov_noise_init": 1e-2,
                "cov_noise_final": 1e-5, "cov_noise_decay": 0.95, "mirrored": True, "weighting": "log",
                "var_div_elites": True, "updates_per_call": 50, "critic_order": "vectorized"}
    opts = parse_options("cemrl", config.cemrl, defaults)
    if pop < 2:
        raise ConfigError(f"pop_size: cemrl needs at least 2 members, got {pop}")
    if not 1 <= opts["n_trained"] <= pop:
        raise ConfigError(f"cemrl.n_trained: must be in [1, pop_size={pop}], got {opts['n_trained']}")
    if opts["critic_order"] not in CRITIC_ORDERS:
        raise ConfigError(f"cemrl.critic_order: must be one of {', '.join(CRITIC_ORDERS)}, "
                          f"got {opts['critic_order']!r}")
    if opts["updates_per_call"] < 1:
        raise ConfigError(f"cemrl.updates_per_call: must be >= 1, got {opts['updates_per_call']}")
    try:
        cem_config = cem.CEMConfig(pop_size=pop, **{k: opts[k] for k in (
            "n_elites", "init_var", "cov_noise_init", "cov_noise_final", "cov_noise_decay", "mirrored", "weighting",
            "var_div_elites")})
    except ValueError as err:
        raise ConfigError(f"cemrl: {err}") from None
    return CEMRLSettings(cem=cem_config, n_trained=opts["n_trained"], updates_per_call=opts["updates_per_call"],
                         critic_order=opts["critic_order"],
                         update_ratio=config.update_ratio, warmup_total=config.warmup_steps * pop,
                         fitness_episodes=config.envs_per_member)


# --- replay: masked add into the shared buffer ----------------------------------------------------
def add_masked(buffer: Buffer, state: BufferState, items, mask: jax.Array) -> BufferState:
    """Adds the rows of ``items`` (leading axis n) where ``mask``, in order; the others are dropped.

    Keeps shapes static whatever the number of valid rows (episodes of different lengths).
    Needs ``n <= capacity``.
    """
    capacity = buffer.capacity
    valid = mask.astype(jnp.int32)
    offsets = jnp.cumsum(valid) - valid
    rows = jnp.where(valid > 0, (state.insert_pos + offsets) % capacity, capacity)  # capacity = dropped
    data = jax.tree.map(lambda buf, x: buf.at[rows].set(x.astype(buf.dtype), mode="drop"), state.data, items)
    count = valid.sum()
    return BufferState(data=data, insert_pos=(state.insert_pos + count) % capacity,
                       size=jnp.minimum(state.size + count, capacity))


# --- state and pure functions -----------------------------------------------------------------
@struct.dataclass
class CEMRLState:
    cem: cem.CEMState
    learner: SharedCriticState  # actors [n_trained], shared critic
    buffer: BufferState  # one buffer fed by all members
    hparams: Any  # TD3HParams [pop]; the first n_trained are used for training
    env_steps: jax.Array  # int32, env steps so far, summed over members
    last_env_steps: jax.Array  # int32, env steps of the previous generation (sets G)


class CEMRLFunctions(NamedTuple):
    init: Any  # (key, hparams) -> CEMRLState
    ask_and_train: Any  # (key, state) -> (state, samples [pop, dim], n_calls, metrics [n_trained])
    finish: Any  # (state, samples, fitness, transitions [n], mask [n]) -> state
    actors: Any  # samples [m, dim] -> stacked actor pytrees
    policy: Any  # (samples [m, dim], obs [m, e, ...]) -> actions [m, e, A]
    shared: SharedCriticTD3
    settings: CEMRLSettings
    pop_size: int


def make_cemrl(shared: SharedCriticTD3, buffer: Buffer, spec, pop_size: int,
               settings: CEMRLSettings) -> CEMRLFunctions:
    """The pure CEM-RL functions (both env paths); ``shared`` has ``n_trained`` actor slots."""
    n_t, k = settings.n_trained, settings.updates_per_call
    example_actor = jax.eval_shape(shared.init_actor, jax.random.key(0))
    _, unravel = ravel_pytree(jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), example_actor))
    unravel_many = jax.vmap(unravel)
    ravel_many = jax.vmap(lambda p: ravel_pytree(p)[0])
    v_sample = jax.vmap(buffer.sample, in_axes=(0, None))
    train = {"vectorized": shared.train, "sequential": shared.sequential_update,
             "sequential_interleaved": functools.partial(shared.sequential_update, interleave=True)}[
        settings.critic_order]

    def init(key: Key, hparams) -> CEMRLState:
        key_mean, key_learner = jax.random.split(key)
        mean, _ = ravel_pytree(shared.init_actor(key_mean))
        learner = shared.init(key_learner, jax.tree.map(lambda x: x[:n_t], hparams))
        return CEMRLState(cem=cem.init(mean, settings.cem), learner=learner,
                          buffer=buffer.init(dummy_transition(spec)), hparams=hparams,
                          env_steps=jnp.zeros((), jnp.int32), last_env_steps=jnp.zeros((), jnp.int32))

    def ask_and_train(key: Key, state: CEMRLState):
        key_ask, key_train = jax.random.split(key)
        samples = cem.ask(key_ask, state.cem, settings.cem)
        learner = shared.load_actors(state.learner, unravel_many(samples[:n_t]))
        hp = jax.tree.map(lambda x: x[:n_t], state.hparams)
        grad_steps = jnp.round(state.last_env_steps * settings.update_ratio)
        trained = (state.env_steps >= settings.warmup_total) & (grad_steps > 0)
        n_calls = jnp.where(trained, jnp.maximum(1, jnp.round(grad_steps / k)), 0).astype(jnp.int32)

        def call(c, carry):
            learner, sums = carry
            key_sample, key_update = jax.random.split(jax.random.fold_in(key_train, c))
            sample_keys = jax.random.split(key_sample, k * n_t).reshape(k, n_t)
            batches = jax.vmap(lambda keys: v_sample(keys, state.buffer))(sample_keys)  # [K, n_t, B, ...]
            update_keys = jax.random.split(key_update, k * n_t).reshape(k, n_t)
            learner, metrics = train(update_keys, learner, batches, hp)
            metrics = {name: metrics.get(name, jnp.full((n_t,), jnp.nan)) for name in TRAIN_METRICS}
            return learner, {name: sums[name] + metrics[name] for name in TRAIN_METRICS}

        zeros = {name: jnp.zeros((n_t,), jnp.float32) for name in TRAIN_METRICS}
        learner, sums = jax.lax.fori_loop(0, n_calls, call, (learner, zeros))
        metrics = {name: jnp.where(n_calls > 0, v / jnp.maximum(n_calls, 1), jnp.nan) for name, v in sums.items()}
        trained_flat = jnp.where(n_calls > 0, ravel_many(learner.actor), samples[:n_t])
        samples = samples.at[:n_t].set(trained_flat)
        return state.replace(learner=learner), samples, n_calls, metrics

    def finish(state: CEMRLState, samples, fitness, transitions: Transition, mask) -> CEMRLState:
        count = mask.astype(jnp.int32).sum()
        return state.replace(buffer=add_masked(buffer, state.buffer, transitions, mask),
                             cem=cem.tell(state.cem, samples, fitness, settings.cem),
                             env_steps=state.env_steps + count, last_env_steps=count)

    def policy(samples, obs):
        return jax.vmap(shared.actor_apply)(unravel_many(samples), obs)

    return CEMRLFunctions(init, ask_and_train, finish, unravel_many, policy, shared, settings, pop_size)


# --- episodes on both env paths -------------------------------------------------------------------
class JaxEpisodes:
    """Whole episodes of ``m`` actors x ``e`` envs on the JAX path (jit-able, fixed shapes)."""

    def __init__(self, vec_env):
        self.vec_env = vec_env
        self.spec = vec_env.spec

    def run(self, key: Key, policy, samples, episodes: int):
        """``(returns [m], transitions [T*m*e], mask [T*m*e])`` with T = max episode length."""
        spec, m = self.spec, samples.shape[0]
        n = m * episodes
        key_reset, key_steps = jax.random.split(key)
        env_state = self.vec_env.reset(key_reset, n)

        def env_step(carry, step_key):
            env_state, total, alive = carry
            obs = env_state.obs.reshape((m, episodes) + spec.obs_shape)
            action = policy(samples, obs).reshape((n,) + spec.action_shape)
            new_state, out = self.vec_env.step(step_key, env_state, action)
            transition = Transition(env_state.obs, action, out.reward, out.next_obs, out.terminated)
            total = total + alive * out.reward
            return (new_state, total, alive * (1.0 - out.done.astype(jnp.float32))), (transition, alive)

        init = (env_state, jnp.zeros(n), jnp.ones(n))
        (_, total, _), (transitions, mask) = jax.lax.scan(
            env_step, init, jax.random.split(key_steps, spec.max_episode_steps))
        flat = lambda x: x.reshape((-1,) + x.shape[2:])
        return total.reshape(m, episodes).mean(axis=1), jax.tree.map(flat, transitions), flat(mask) > 0

    def reset(self, key):
        del key  # every generation resets its envs from its own key

    def close(self):
        pass


class HostEpisodes:
    """Whole episodes on the gymnasium path: each env steps until its own episode ends.

    Fitness envs are seeded once (``HostVecEnv.reset``); later episodes start with an
    unseeded ``reset`` so each env continues its RNG stream. Evaluation envs are re-seeded
    every time, so successive evaluations of the mean actor are comparable.
    """

    def __init__(self, env, eval_env_factory):
        self.env = env
        self.spec = env.spec
        self.eval_env_factory = eval_env_factory
        self._eval_envs: dict[int, Any] = {}
        self._seeded = False

    def reset(self, key):
        del key
        self._seeded = False

    def run(self, policy, samples, episodes: int, evaluation: bool = False):
        """``(returns [m], transitions [T*n] numpy, mask [T*n])``, padded to T = max episode length."""
        spec, m = self.spec, samples.shape[0]
        n = m * episodes
        if evaluation:
            if n not in self._eval_envs:
                self._eval_envs[n] = self.eval_env_factory(n)
            vec = self._eval_envs[n]
            obs = vec.reset()
        else:
            vec = self.env
            if vec.num_envs != n:
                raise ValueError(f"fitness envs: {vec.num_envs} host envs for {m} actors x {episodes} episodes")
            obs = vec.reset() if not self._seeded else np.stack([e.reset()[0] for e in vec.envs]).astype(np.float32)
            self._seeded = True
        t_max = spec.max_episode_steps
        buf = {"obs": np.zeros((t_max, n) + spec.obs_shape, np.float32),
               "action": np.zeros((t_max, n) + spec.action_shape, np.float32),
               "reward": np.zeros((t_max, n), np.float32),
               "next_obs": np.zeros((t_max, n) + spec.obs_shape, np.float32),
               "terminated": np.zeros((t_max, n), np.float32)}
        mask = np.zeros((t_max, n), bool)
        total, alive = np.zeros(n), np.ones(n, bool)
        obs = np.asarray(obs, np.float32)
        for t in range(t_max):
            if not alive.any():
                break
            action = np.asarray(policy(samples, obs.reshape((m, episodes) + spec.obs_shape)))
            action = action.reshape((n,) + spec.action_shape)
            native = vec.to_native(action)
            for i in np.flatnonzero(alive):
                o, r, term, trunc, _ = vec.envs[i].step(native[i])
                buf["obs"][t, i], buf["action"][t, i], buf["reward"][t, i] = obs[i], action[i], r
                buf["next_obs"][t, i], buf["terminated"][t, i] = o, float(bool(term))
                mask[t, i] = True
                total[i] += float(r)
                obs[i] = o
                if term or trunc:
                    alive[i] = False
        flat = lambda x: x.reshape((-1,) + x.shape[2:])
        transitions = Transition(**{k: flat(v) for k, v in buf.items()})
        return total.reshape(m, episodes).mean(axis=1), transitions, flat(mask)

    def close(self):
        self.env.close()
        for env in self._eval_envs.values():
            env.close()


# --- setup, driver hooks and the loop ------------------------------------------------------------
def adapt_setup(setup):
    """Replaces the independent population of ``experiment.build`` by the CEM-RL functions."""
    config = setup.config
    if config.learner != "td3":
        raise ConfigError(f"learner: the cemrl driver trains TD3 actors with a shared critic; got {config.learner!r}")
    if config.devices != 1:
        raise ConfigError("devices: the cemrl driver runs on one device (its shared critic is not sharded yet)")
    settings = settings_from_config(config)
    t_max = setup.spec.max_episode_steps
    per_generation = config.pop_size * settings.fitness_episodes * t_max
    if per_generation > config.buffer_size:
        raise ConfigError(f"buffer_size: {config.buffer_size} is smaller than one generation's worst case "
                          f"{per_generation} transitions (pop x envs_per_member x {t_max} steps)")
    hparams = setup.hparams
    if "policy_delay" not in config.hparams and "policy_delay" not in config.search_space:
        hparams = hparams.replace(policy_delay=jnp.ones_like(hparams.policy_delay))  # CEM-RL: TD3 delay 1
    shared = make_shared_critic_td3(setup.learner_config, setup.spec, settings.n_trained)
    buffer = make_uniform_buffer(config.buffer_size, config.batch_size)
    functions = make_cemrl(shared, buffer, setup.spec, config.pop_size, settings)
    old = setup.collector
    if isinstance(old, JaxCollector):
        episodes = JaxEpisodes(old.vec_env)
    elif isinstance(old, HostCollector):
        episodes = HostEpisodes(old.env, old.eval_env_factory)
    else:
        raise TypeError(f"unexpected collector {type(old).__name__}")
    return dataclasses.replace(setup, learner=shared, population=functions, collector=episodes, hparams=hparams)


class CEMRLDriver:
    """Host-side record of the mean-actor evaluations (checkpointed through ``state_dict``)."""

    name = "cemrl"

    def __init__(self):
        self.mean_returns: list[list[float]] = []  # [env_steps per member, return]

    def after_eval(self, key, state, returns, env_steps):
        del key, returns, env_steps
        return state

    def state_dict(self) -> dict[str, Any]:
        return {"cem_mean_returns": [list(r) for r in self.mean_returns]}

    def load_state_dict(self, data: dict[str, Any]) -> None:
        self.mean_returns = [list(r) for r in data.get("cem_mean_returns", [])]


class CEMRLTrainer(Trainer):
    """The CEM-RL generation loop on top of the base Trainer's keys, compile, logs and checkpoints."""

    def __init__(self, setup, run_dir, driver=None):
        super().__init__(setup, run_dir, driver or CEMRLDriver())
        self.fns: CEMRLFunctions = setup.population
        self.jax_path = isinstance(setup.collector, JaxEpisodes)
        self._env_steps_total = 0
        self._policy = jax.jit(self.fns.policy)

    # env steps are counted, not derived from the iteration (episodes may end early)
    @property
    def env_steps(self) -> int:
        return self._env_steps_total // self.config.pop_size

    def initial_state(self):
        state = jax.jit(self.fns.init)(self.key_for(0, 0), self.setup.hparams)
        self.setup.collector.reset(self.key_for(2, 0))
        return state, None

    def restore_checkpoint(self):
        restored = super().restore_checkpoint()
        if restored is not None:
            self._env_steps_total = int(restored[0].env_steps)
        return restored

    def _evaluates(self, before_total, after_total):
        """Whether the generation that moved the summed env steps from ``before`` to ``after`` ends
        with an evaluation: at every ``eval_interval`` env steps per member and at the end (jnp or int)."""
        cfg, pop = self.config, self.config.pop_size
        before, after = before_total // pop, after_total // pop
        return (after >= cfg.total_env_steps) | (after // cfg.eval_interval > before // cfg.eval_interval)

    def step(self, state, env_state):
        """One CEM-RL generation (and the mean actor's evaluation when due).

        Returns ``(state, None, (fitness [pop], n_calls, metrics, mean_return or nan))``. On the JAX
        path the whole generation, evaluation included (a ``lax.cond``), is one compiled call.
        """
        fns, eps, it = self.fns, self.config.envs_per_member, self.iteration
        key, key_eval = self.key_for(KEY_GENERATION, it), self.key_for(KEY_EVAL, it + 1)
        if self.jax_path:
            episodes, n_eval = self.setup.collector, self.config.eval_episodes

            def generation(key, key_eval, state):
                key_train, key_roll = jax.random.split(key)
                before = state.env_steps
                state, samples, n_calls, metrics = fns.ask_and_train(key_train, state)
                fitness, transitions, mask = episodes.run(key_roll, fns.policy, samples, eps)
                state = fns.finish(state, samples, fitness, transitions, mask)
                mean_return = jax.lax.cond(
                    self._evaluates(before, state.env_steps),
                    lambda: episodes.run(key_eval, fns.policy, state.cem.mean[None], n_eval)[0][0],
                    lambda: jnp.full((), jnp.nan, jnp.float32))
                return state, fitness, n_calls, metrics, mean_return

            compiled = self._compile("generation", generation, key, key_eval, state, donate=(2,))
            state, fitness, n_calls, metrics, mean_return = compiled(key, key_eval, state)
            mean_return = float(mean_return)
        else:
            key_train, _ = jax.random.split(key)
            before = self._env_steps_total
            ask_train = self._compile("ask_train", fns.ask_and_train, key_train, state, donate=(1,))
            state, samples, n_calls, metrics = ask_train(key_train, state)
            fitness, transitions, mask = self.setup.collector.run(self._policy, samples, eps)
            fitness = jnp.asarray(fitness, jnp.float32)
            transitions = jax.tree.map(jnp.asarray, transitions)
            finish = self._compile("finish", fns.finish, state, samples, fitness, transitions, mask,
                                   donate=(0,))
            state = finish(state, samples, fitness, transitions, jnp.asarray(mask))
            evaluated = self._evaluates(before, int(state.env_steps))
            mean_return = self.evaluate(state) if evaluated else float("nan")
        n_calls = int(n_calls)
        self.updates += n_calls * fns.settings.updates_per_call
        self._env_steps_total = int(state.env_steps)
        self.iteration += 1
        metrics = {k: np.asarray(v) for k, v in metrics.items()}
        return state, None, (np.asarray(fitness), n_calls, metrics, mean_return)

    def evaluate(self, state) -> float:
        """Mean return of the CEM mean actor over ``eval_episodes`` deterministic episodes."""
        fns, n = self.fns, self.config.eval_episodes
        mean = state.cem.mean[None]
        if self.jax_path:
            episodes = self.setup.collector
            fn = lambda key, mean: episodes.run(key, fns.policy, mean, n)[0]
            compiled = self._compile("eval_mean", fn, self.key_for(KEY_EVAL, 0), mean)
            return float(compiled(self.key_for(KEY_EVAL, self.iteration), mean)[0])
        return float(self.setup.collector.run(self._policy, mean, n, evaluation=True)[0][0])

    def run(self, state, env_state):
        cfg = self.config
        with TrainProgress(cfg.total_env_steps, enabled=cfg.progress, start=self.env_steps) as progress:
            while self.env_steps < cfg.total_env_steps:
                start = time.perf_counter()
                compile_before = self.compile_s
                before = self._env_steps_total
                state, env_state, (fitness, n_calls, metrics, mean_return) = self.step(state, env_state)
                evaluated = bool(self._evaluates(before, self._env_steps_total))
                if evaluated:
                    self.driver.mean_returns.append([self.env_steps, mean_return])
                    progress.update_returns(np.array([mean_return]))
                self.wall_s += time.perf_counter() - start - (self.compile_s - compile_before)
                self._log_generation(state, fitness, n_calls, metrics, mean_return)
                every = self.checkpoint_every
                if self.checkpointer is not None and (evaluated or (every and self.iteration % every == 0)):
                    self.save_checkpoint(state, env_state)
                progress.advance_to(min(self.env_steps, cfg.total_env_steps))
        return state

    def _log_generation(self, state, fitness, n_calls, metrics, mean_return):
        self.history.append(fitness)
        table = hparams_table(state.hparams)
        n_t = self.fns.settings.n_trained
        var = np.asarray(state.cem.var)
        common = {"generation": self.iteration, "env_steps_total": self._env_steps_total,
                  "cem_mean_return": mean_return, "fitness_mean": float(np.mean(fitness)),
                  "fitness_std": float(np.std(fitness)), "cem_std_mean": float(np.mean(np.sqrt(var))),
                  "cov_noise": float(state.cem.cov_noise),
                  "grad_steps": n_calls * self.fns.settings.updates_per_call}
        rows = []
        for m, value in enumerate(fitness.tolist()):
            row = {"env_steps": self.env_steps, "updates": self.updates, "wall_s": round(self.wall_s, 3),
                   "member": m, "eval_return": value}
            row.update({name: values[m] for name, values in table.items()})
            row.update(common)
            row["trained"] = int(m < n_t and n_calls > 0)
            row.update({name: float(metrics[name][m]) if m < n_t else float("nan") for name in TRAIN_METRICS})
            rows.append(row)
        self.run_dir.append_metrics(rows)

    def summary(self, state):
        out = super().summary(state)
        evals = [r for _, r in self.driver.mean_returns if np.isfinite(r)]
        out["best_return"] = max(evals) if evals else float("nan")
        out["final_return"] = self.driver.mean_returns[-1][1] if self.driver.mean_returns else float("nan")
        out["env_steps_total"] = self._env_steps_total
        out["metric"] = "return of the CEM mean actor (best_return, final_return); final_returns = last fitness"
        return out
