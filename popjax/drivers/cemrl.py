"""CEM-RL (Pourchot & Sigaud 2019) with the fast-PBT vectorized shared critic.

One iteration is one generation:

1. ``prepare``: ``ask``: ``pop`` actors sampled from the diagonal CEM over the flattened
   actor parameters (``popjax.drivers.cem``, mirrored sampling, the release's noise schedule).
   After warm-up, the first ``n_trained`` (default ``pop // 2``) samples are loaded into the
   shared-critic TD3 learner (target actor := actor, fresh Adam state, as in the release)
   and trained for ``G`` gradient steps, ``G = round(update_ratio * env steps of the previous
   generation)`` (all members' steps summed, as CEM-RL's ``actor_steps``), in calls of
   ``updates_per_call`` (K = 50) vectorized steps: each step updates the shared critic once
   on all trained members' sub-batches with the loss averaged over them, and every trained
   actor once (``popjax.learners.shared_critic``). ``G`` is rounded to a multiple of K (at
   least one call once ``G > 0``); the number of calls is a traced loop bound, so a changing
   ``G`` never recompiles. The trained actors replace their samples.
2. Interaction: every actor runs ``envs_per_member`` noise-free episodes (1 by default, the
   release's fitness episodes); the mean return is its fitness.
3. ``learn``: all these transitions go into one shared replay buffer (``buffer_size`` rows in
   total; only real steps are stored, a masked add drops the padding after an episode ends,
   so episodes may differ in length), and ``tell`` moves the CEM to the weighted elites.

The reported metric is the return of the **CEM mean actor** (the driver's evaluation:
``eval_episodes`` deterministic episodes) at every ``eval_interval`` env steps per member and
at the end (the paper's metric); it is ``best_return`` / ``final_return`` in summary.json and
``cem_mean_return`` in metrics.csv, whose rows are one per (generation, member) with
``eval_return`` = that member's fitness. ``env_steps`` is per member (the generation's total /
``pop``), as for every popjax driver; ``env_steps_total`` is the sum over members.

Options (``RunConfig.cemrl``): ``n_trained``, ``n_elites``, ``init_var``, ``cov_noise_init``,
``cov_noise_final``, ``cov_noise_decay``, ``mirrored``, ``weighting``, ``var_div_elites`` (see
``popjax.drivers.cem``) and ``updates_per_call``. TD3 hparams are the learner's, with
``policy_delay = 1`` (CEM-RL) unless set in ``hparams``. The original sequential CEM-RL order
is a benchmark reference (``popjax_bench.cemrl_order``), not a training option.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.flatten_util import ravel_pytree
from pydantic import Field, ValidationInfo, model_validator

from popjax import plots
from popjax.buffers import Buffer, BufferState, make_uniform_buffer
from popjax.config import ConfigError
from popjax.distributed import fetch
from popjax.drivers import cem
from popjax.drivers.base import (
    BuildContext,
    Counters,
    Driver,
    DriverDef,
    DriverHost,
    DriverOptions,
    Episodes,
    run_config,
)
from popjax.envs.runner import EpisodeBatch
from popjax.learners.shared_critic import SharedCriticState
from popjax.population.hparams import hparams_table
from popjax.schema import INT32_MAX, Bool, Float, Int, OneOf, problem
from popjax.types import Key, dummy_transition

TRAIN_METRICS = ("critic_loss", "member_critic_loss", "actor_loss", "q_mean")


@dataclasses.dataclass(frozen=True)
class CEMRLSettings:
    cem: cem.CEMConfig
    n_trained: int
    updates_per_call: int


class CEMRLOptions(DriverOptions):
    """``cemrl`` options (see ``popjax.drivers.cem`` for the CEM ones)."""

    n_trained: Int(ge=1, le=65_536) | None = Field(
        None, description="samples trained by TD3 with the shared critic each generation (the first ones)",
        json_schema_extra={"default": "pop_size // 2"})
    n_elites: Int(ge=1, le=65_536) | None = Field(
        None, description="elites the CEM moves to", json_schema_extra={"default": "pop_size // 2"})
    init_var: Float(gt=0) = Field(1e-2, description="initial variance of every actor parameter")
    cov_noise_init: Float(ge=0) = Field(1e-2, description="noise added to the variance, initial value")
    cov_noise_final: Float(ge=0) = Field(1e-5, description="noise added to the variance, final value")
    cov_noise_decay: Float(ge=0, le=1) = Field(0.95, description="decay of the noise toward its final value")
    mirrored: Bool = Field(True, description="antithetic sampling (needs an even pop_size)")
    weighting: OneOf(cem.WEIGHTINGS) = Field("log", description="elite weights")
    var_div_elites: Bool = Field(True, description="the release's extra 1/n_elites in the variance")
    updates_per_call: Int(ge=1, le=100_000) = Field(
        50, description="vectorized shared-critic steps per compiled call (K)")

    @model_validator(mode="after")
    def _resolve(self, info: ValidationInfo):
        config = run_config(info)
        pop = config.pop_size
        if pop < 2:
            raise problem(f"cemrl needs at least 2 members, got {pop}", at=("pop_size",), absolute=True)
        if self.mirrored and pop % 2:
            raise problem(f"mirrored (antithetic) sampling needs an even pop_size, got {pop} "
                          "(or set cemrl.mirrored: false)", at=("pop_size",), absolute=True)
        if pop * config.total_env_steps > INT32_MAX:
            raise problem(f"pop_size x total_env_steps = {pop * config.total_env_steps} env steps in total, more "
                          f"than the int32 counter holds ({INT32_MAX})", at=("total_env_steps",), absolute=True)
        for name in ("n_trained", "n_elites"):
            value = getattr(self, name)
            if value is None:
                setattr(self, name, pop // 2)
            elif value > pop:
                raise problem(f"must lie in [1, pop_size={pop}], got {value}", at=(name,))
        return self

    def settings(self, pop_size: int) -> CEMRLSettings:
        cem_config = cem.CEMConfig(pop_size=pop_size, **{k: getattr(self, k) for k in (
            "n_elites", "init_var", "cov_noise_init", "cov_noise_final", "cov_noise_decay", "mirrored", "weighting",
            "var_div_elites")})
        return CEMRLSettings(cem=cem_config, n_trained=self.n_trained, updates_per_call=self.updates_per_call)


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


# --- the driver -------------------------------------------------------------------------------
@struct.dataclass
class CEMRLState:
    cem: cem.CEMState
    learner: SharedCriticState  # actors [n_trained], shared critic
    buffer: BufferState  # one buffer fed by all members
    hparams: Any  # TD3HParams [pop]; the first n_trained are used for training
    samples: jax.Array  # [pop, dim] this generation's actors (flat parameters)
    fitness: jax.Array  # [pop] their fitness (NaN before the first generation)
    env_steps_total: jax.Array  # int32, env steps so far, summed over members
    last_env_steps: jax.Array  # int32, env steps of the previous generation (sets G)
    counters: Counters


class CEMRLHost(DriverHost):
    """One row per (generation, member); the CEM mean actor's evaluations in the summary."""

    def __init__(self, settings: CEMRLSettings):
        super().__init__(lambda state: state.hparams)
        self.settings = settings
        self.mean_returns: list[list[float]] = []  # [env steps per member, return of the mean actor]

    def record(self, state, env_steps, returns, info) -> None:
        self.mean_returns.append([int(env_steps), float(returns[0])])

    def rows(self, state, metrics, returns) -> list[dict[str, Any]]:
        s = fetch((state.fitness, state.cem.var, state.cem.cov_noise, state.cem.generation,
                            state.env_steps_total))
        fitness, var, cov_noise, generation, total = s
        common = {"generation": int(generation), "env_steps_total": int(total),
                  "cem_mean_return": float("nan") if returns is None else float(returns[0]),
                  "fitness_mean": float(np.mean(fitness)), "fitness_std": float(np.std(fitness)),
                  "cem_std_mean": float(np.mean(np.sqrt(var))), "cov_noise": float(cov_noise)}
        table = hparams_table(state.hparams)
        metrics = fetch(dict(metrics))
        rows = []
        for m, value in enumerate(np.asarray(fitness).tolist()):
            row = {"member": m, "eval_return": value, **{n: v[m] for n, v in table.items()}, **common}
            row.update({name: float(values[m]) for name, values in metrics.items()})
            row["trained"] = int(row["trained"])
            row["grad_steps"] = int(row["grad_steps"])
            rows.append(row)
        return rows

    def summary(self, state) -> dict[str, Any]:
        evals = self.mean_returns
        return {**super().summary(state), "cem_mean_returns": [list(r) for r in evals],
                "final_return": evals[-1][1] if evals else float("nan"),
                "final_returns": fetch(state.fitness).tolist(),
                "env_steps_total": int(fetch(state.env_steps_total)),
                "metric": "return of the CEM mean actor (best_return, final_return); final_returns = last fitness"}

    def state_dict(self) -> dict[str, Any]:
        return {"cem_mean_returns": [list(r) for r in self.mean_returns]}

    def load_state_dict(self, data) -> None:
        self.mean_returns = [list(r) for r in data.get("cem_mean_returns", [])]


def build(ctx: BuildContext, options: CEMRLOptions | CEMRLSettings, train: Callable | None = None) -> Driver:
    """The CEM-RL driver; ``train(keys [K, n], state, batches [K, n, B], hparams) -> (state, metrics)``
    replaces the vectorized shared-critic step (e.g. by the sequential CEM-RL order of
    ``popjax_bench.cemrl_order``, as ``experiments/cemrl_common.py`` does)."""
    cfg, spec = ctx.config, ctx.spec
    settings = options.settings(cfg.pop_size) if isinstance(options, CEMRLOptions) else options
    pop, episodes, t_max = cfg.pop_size, cfg.envs_per_member, spec.max_episode_steps
    if pop * episodes * t_max > cfg.buffer_size:
        raise ConfigError(f"buffer_size: {cfg.buffer_size} is smaller than one generation's worst case "
                          f"{pop * episodes * t_max} transitions (pop x envs_per_member x {t_max} steps)")
    hparams = ctx.hparams
    if "policy_delay" not in cfg.hparams and "policy_delay" not in cfg.search_space:
        hparams = hparams.replace(policy_delay=jnp.ones_like(hparams.policy_delay))  # CEM-RL: TD3 delay 1
    n_t, k = settings.n_trained, settings.updates_per_call
    shared = ctx.learner_def.shared_critic(ctx.learner_config, spec, n_t)
    train = train or shared.train
    buffer = make_uniform_buffer(cfg.buffer_size, cfg.batch_size)
    v_sample = jax.vmap(buffer.sample, in_axes=(0, None))
    _, unravel = ravel_pytree(jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                                           jax.eval_shape(shared.init_actor, jax.random.key(0))))
    unravel_many = jax.vmap(unravel)
    ravel_many = jax.vmap(lambda p: ravel_pytree(p)[0])
    warmup_total = cfg.warmup_steps * pop

    def init(key: Key) -> CEMRLState:
        key_mean, key_learner = jax.random.split(key)
        mean, _ = ravel_pytree(shared.init_actor(key_mean))
        samples = jnp.broadcast_to(mean, (pop,) + mean.shape)
        return CEMRLState(cem=cem.init(mean, settings.cem), learner=shared.init(key_learner, None),
                          buffer=buffer.init(dummy_transition(spec)), hparams=hparams, samples=samples,
                          fitness=jnp.full((pop,), jnp.nan, jnp.float32), env_steps_total=jnp.zeros((), jnp.int32),
                          last_env_steps=jnp.zeros((), jnp.int32), counters=Counters.zeros())

    def prepare(key: Key, state: CEMRLState):
        """Ask, then train the first ``n_trained`` samples for G steps (after warm-up)."""
        key_ask, key_train = jax.random.split(key)
        samples = cem.ask(key_ask, state.cem, settings.cem)
        learner = shared.load_actors(state.learner, unravel_many(samples[:n_t]))
        hp = jax.tree.map(lambda x: x[:n_t], state.hparams)
        grad_steps = jnp.round(state.last_env_steps * cfg.update_ratio)
        trained = (state.env_steps_total >= warmup_total) & (grad_steps > 0)
        n_calls = jnp.where(trained, jnp.maximum(1, jnp.round(grad_steps / k)), 0).astype(jnp.int32)

        def call(c, carry):
            learner, sums = carry
            key_sample, key_update = jax.random.split(jax.random.fold_in(key_train, c))
            sample_keys = jax.random.split(key_sample, k * n_t).reshape(k, n_t)
            batches = jax.vmap(lambda keys: v_sample(keys, state.buffer))(sample_keys)  # [K, n_t, B, ...]
            update_keys = jax.random.split(key_update, k * n_t).reshape(k, n_t)
            learner, metrics = train(update_keys, learner, batches, hp)
            return learner, {name: sums[name] + metrics.get(name, jnp.nan) for name in TRAIN_METRICS}

        zeros = {name: jnp.zeros((n_t,), jnp.float32) for name in TRAIN_METRICS}
        learner, sums = jax.lax.fori_loop(0, n_calls, call, (learner, zeros))
        pad = lambda x: jnp.concatenate([x, jnp.full((pop - n_t,), jnp.nan, x.dtype)])
        metrics = {name: pad(jnp.where(n_calls > 0, v / jnp.maximum(n_calls, 1), jnp.nan)) for name, v in sums.items()}
        metrics["trained"] = ((jnp.arange(pop) < n_t) & (n_calls > 0)).astype(jnp.float32)
        metrics["grad_steps"] = jnp.full((pop,), n_calls * k, jnp.float32)
        samples = samples.at[:n_t].set(jnp.where(n_calls > 0, ravel_many(learner.actor), samples[:n_t]))
        counters = state.counters.advance(updates=n_calls * k)
        return state.replace(learner=learner, samples=samples, counters=counters), metrics

    def act(key: Key, state: CEMRLState, obs: jax.Array):
        """The samples' deterministic actions (fitness episodes are noise-free), no extras."""
        del key
        return jax.vmap(shared.actor_apply)(unravel_many(state.samples), obs), None

    def learn(key: Key, state: CEMRLState, batch: EpisodeBatch):
        """The episodes into the shared buffer, then ``tell`` with their returns as fitness."""
        del key
        count = batch.mask.astype(jnp.int32).sum()
        total = state.env_steps_total + count
        fitness = jnp.asarray(batch.returns, jnp.float32)
        counters = Counters(env_steps=total // pop, updates=state.counters.updates)
        return state.replace(buffer=add_masked(buffer, state.buffer, batch.transitions, batch.mask),
                             cem=cem.tell(state.cem, state.samples, fitness, settings.cem), fitness=fitness,
                             env_steps_total=total, last_env_steps=count, counters=counters), {}

    def policy(state: CEMRLState, obs: jax.Array) -> jax.Array:
        """The CEM mean actor (``obs [1, episodes, ...]``)."""
        return jax.vmap(shared.actor_apply)(unravel_many(state.cem.mean[None]), obs)

    member_axes = CEMRLState(cem=False, learner=shared.member_axes, buffer=False, hparams=True, samples=True,
                             fitness=True, env_steps_total=False, last_env_steps=False, counters=False)
    return Driver(init=init, interaction=Episodes(episodes), act=act, learn=learn,
                  evaluation=Episodes(cfg.eval_episodes, actors=1), policy=policy, member_axes=member_axes,
                  host=CEMRLHost(settings), prepare=prepare)


def cemrl_run_plots(run_dir) -> list:
    """``plots/cemrl_fitness.png``: fitness per generation, the mean actor's return, the CEM's spread."""
    rows = run_dir.read_metrics()
    if not rows:
        return []
    cfg = run_dir.read_config()
    title = f"cemrl: {cfg.get('learner')} on {cfg.get('env')}, pop {cfg.get('pop_size')}"
    return [plots.cemrl_plot(rows, run_dir.path / "plots" / "cemrl_fitness.png", title)]


# One generation samples, trains and ranks the whole population together (ask, the shared
# critic of the first n_trained samples, tell): no per-device program fits it; it runs on the
# sharding path, where the compiler splits the member axis.
DEFINITION = DriverDef(name="cemrl", build=build, options=CEMRLOptions, plots=cemrl_run_plots, pmap=False,
                       replay_transitions=lambda config: config.buffer_size, shared_critic=True)
