"""TD3 (Fujimoto et al. 2018) as a pure single-member learner.

popjax default = the original TD3: one target y per step (one smoothing-noise draw) for
both critics, the deterministic policy gradient on ``obs`` through critic 1, and all
targets Polyak-averaged on policy steps only. The policy delay is a traced integer
hparam (``policy_delay``): under vmap a member-dependent branch is a select, so PBT may
tune the delay without recompiling, at the price of an actor step computed on every update
and discarded on ``d - 1`` of every ``d`` (about 18 % of the FLOPs at d = 2).

When the run allows it (every member has the same delay, no driver changes it, and the K
updates of a call are a multiple of it), ``specialize`` fixes the delay in the config
(``fixed_policy_delay``) and the learner does its updates in chunks of ``d``: ``d - 1``
critic-only steps, then one critic + actor + targets step. Same results, no discarded work.
The chunk's ``actor_loss`` is the policy step's (the traced gate reports the candidate
actor's loss on every step). ``td3_core`` is TD3 as an actor-critic ``Core`` (``learners/actor_critic.py``),
which ReF-ER, RLx2 and SPO wrap.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import struct
from pydantic import Field

from popjax import schema
from popjax.config import ConfigError
from popjax.learners.actor_critic import PLAIN, Behaviour, Core, Steps, exploring
from popjax.learners.base import (
    MUJOCO_V5,
    BatchSize,
    Hidden,
    Int,
    Learner,
    LearnerDef,
    PBTSupport,
    ReplayStep,
    Report,
    RunFit,
    adam_init,
    identity,
    init_actor_critic,
    polyak,
    replay_step,
    scalar,
    select,
)
from popjax.networks.mlp import DeterministicActor, TwinCritic
from popjax.population.hparams import hparam
from popjax.population.search_spaces import SEARCH_SPACES
from popjax.types import EnvSpec, Key, PyTree, Transition


@schema.dataclass
class TD3Config:
    hidden: Hidden = Field((256, 256), description="hidden layer sizes of the actor and of each critic")
    batch_size: BatchSize = Field(256, description="transitions per gradient step (the run's batch_size)")
    fixed_policy_delay: Int(ge=1, le=1_000) | None = Field(
        None, description="a policy delay every member keeps (set by popjax when the run allows it): updates run "
                          "in chunks of delay - 1 critic-only steps and one actor step, no actor work is discarded")


@struct.dataclass
class TD3HParams:
    actor_lr: jax.Array = hparam("actor Adam learning rate", gt=0, le=1)
    critic_lr: jax.Array = hparam("critic Adam learning rate", gt=0, le=1)
    discount: jax.Array = hparam("discount factor gamma", ge=0, le=1)
    tau: jax.Array = hparam("Polyak rate of the target networks", gt=0, le=1)
    exploration_noise: jax.Array = hparam("std of the Gaussian exploration noise (actions in [-1, 1])", ge=0)
    target_noise: jax.Array = hparam("std of the target policy smoothing noise", ge=0)
    noise_clip: jax.Array = hparam("clip of the target policy smoothing noise", ge=0)
    policy_delay: jax.Array = hparam("critic steps per actor and target step (int32)", ge=1, le=1_000_000,
                                     integer=True)


@struct.dataclass
class TD3State:
    actor: PyTree
    critic: PyTree
    target_actor: PyTree
    target_critic: PyTree
    actor_opt: PyTree
    critic_opt: PyTree
    steps: jax.Array  # int32, critic updates done


def default_hparams(config: TD3Config | None = None) -> TD3HParams:
    """The paper defaults (Fujimoto et al. 2018)."""
    return TD3HParams(
        actor_lr=scalar(3e-4),
        critic_lr=scalar(3e-4),
        discount=scalar(0.99),
        tau=scalar(0.005),
        exploration_noise=scalar(0.1),
        target_noise=scalar(0.2),
        noise_clip=scalar(0.5),
        policy_delay=scalar(2, jnp.int32),
    )


def critic_loss_fn(critic_params, critic_net, batch: Transition, target_q: jax.Array, weights: jax.Array | None = None):
    """Sum over the twin critics of the mean squared TD error (sample i weighted by ``weights[i]`` if given)."""
    q = critic_net.apply(critic_params, batch.obs, batch.action)  # [2, B]
    squared = (q - target_q) ** 2
    if weights is not None:
        squared = weights * squared
    return jnp.sum(jnp.mean(squared, axis=-1)), q


def target_q(key: Key, actor_net, critic_net, target_actor: PyTree, target_critic: PyTree, batch: Transition,
             hp: TD3HParams) -> jax.Array:
    """The TD3 target (no gradient): clipped-noise target action, min over the twin target critics,
    no bootstrap past a true termination."""
    noise = hp.target_noise * jax.random.normal(key, batch.action.shape)
    noise = jnp.clip(noise, -hp.noise_clip, hp.noise_clip)
    next_action = jnp.clip(actor_net.apply(target_actor, batch.next_obs) + noise, -1.0, 1.0)
    next_q = critic_net.apply(target_critic, batch.next_obs, next_action).min(axis=0)
    return jax.lax.stop_gradient(batch.reward + hp.discount * (1.0 - batch.terminated) * next_q)


def dpg_loss(actor_net, critic_net, actor: PyTree, critic: PyTree, obs: jax.Array) -> jax.Array:
    """The deterministic policy gradient loss: ``-Q_1(s, pi(s))`` averaged over the batch."""
    return -dpg_values(actor_net, critic_net, actor, critic, obs).mean()


def dpg_values(actor_net, critic_net, actor: PyTree, critic: PyTree, obs: jax.Array) -> jax.Array:
    """``Q_1(s, pi(s))`` per sample ``[B]``: minus the per-sample DPG loss (what ReF-ER masks per sample)."""
    return critic_net.apply(critic, obs, actor_net.apply(actor, obs))[0]


def td3_core(config: TD3Config, spec: EnvSpec, module: Callable = identity) -> Core:
    """TD3 as an actor-critic ``Core``; its update takes the wrapper's ``Steps``. ``module`` wraps each network
    (the shared critic's ``precision.network_module``: its network passes, not the whole update, are marked)."""
    actor_net = module(DeterministicActor(config.hidden, spec.action_dim))
    critic_net = module(TwinCritic(config.hidden))

    def init(key: Key, hparams: TD3HParams) -> TD3State:
        del hparams
        actor, critic = init_actor_critic(key, actor_net, critic_net, spec)
        return TD3State(
            actor=actor,
            critic=critic,
            target_actor=actor,
            target_critic=critic,
            actor_opt=adam_init(actor),
            critic_opt=adam_init(critic),
            steps=jnp.zeros((), jnp.int32),
        )

    def one_step_target(key: Key, state: TD3State, batch: Transition, hp: TD3HParams) -> jax.Array:
        return target_q(key, actor_net, critic_net, state.target_actor, state.target_critic, batch, hp)

    def critic_grads(key: Key, state: TD3State, batch: Transition, weights, hp: TD3HParams, steps: Steps = PLAIN):
        """The TD loss over ``steps.sample(batch)`` against ``steps.target`` (default: the one-step target) and its
        gradient at ``state.critic``: ``((loss, q [2, B], y [B]), grads)``."""
        y = (steps.target or one_step_target)(key, state, batch, hp)
        loss = lambda critic: critic_loss_fn(critic, critic_net, steps.sample(batch), y, weights)  # noqa: E731
        (value, q), grads = jax.value_and_grad(loss, has_aux=True)(state.critic)
        return (value, q, y), grads

    def actor_grads(key, state: TD3State, critic: PyTree, obs: jax.Array, hp: TD3HParams, steps: Steps = PLAIN):
        """``steps.actor_objective`` over the per-sample DPG losses ``-Q_1(s, pi(s))`` through ``critic``, and its
        gradient at ``state.actor`` (TD3's actor draws nothing: ``key`` is unused)."""
        del key, hp
        loss = lambda actor: (steps.actor_objective(actor, -dpg_values(actor_net, critic_net, actor, critic, obs)),  # noqa: E731
                              None)
        return jax.value_and_grad(loss, has_aux=True)(state.actor)

    def critic_update(key: Key, state: TD3State, batch: Transition, hp: TD3HParams, steps: Steps, weights=None):
        """Also returns ``|TD error|`` per sample, the larger of the twin critics' (as LAP, Fujimoto et al. 2020)."""
        (loss, q, y), grads = critic_grads(key, state, batch, weights, hp, steps)
        critic, critic_opt = steps.critic(state.critic, grads, state.critic_opt, hp.critic_lr)
        return critic, critic_opt, loss, q, jnp.abs(q - y).max(axis=0)

    def actor_update(state: TD3State, critic: PyTree, batch: Transition, hp: TD3HParams, steps: Steps):
        (actor_loss, _), grads = actor_grads(None, state, critic, steps.sample(batch).obs, hp, steps)
        actor, actor_opt = steps.actor(state.actor, grads, state.actor_opt, hp.actor_lr)
        return actor, actor_opt, actor_loss

    def targets(state: TD3State, actor: PyTree, critic: PyTree, hp: TD3HParams, steps: Steps):
        return (steps.actor_targets(polyak(state.target_actor, actor, hp.tau)),
                steps.critic_targets(polyak(state.target_critic, critic, hp.tau)))

    def update(key: Key, state: TD3State, batch: Transition, weights: jax.Array | None, hp: TD3HParams,
               steps: Steps = PLAIN):
        critic, critic_opt, critic_loss, q, td_abs = critic_update(key, state, batch, hp, steps, weights)
        actor, actor_opt, actor_loss = actor_update(state, critic, batch, hp, steps)
        is_policy_step = (state.steps + 1) % hp.policy_delay == 0
        actor, actor_opt = select(is_policy_step, (actor, actor_opt), (state.actor, state.actor_opt))
        target_actor, target_critic = select(is_policy_step, targets(state, actor, critic, hp, steps),
                                             (state.target_actor, state.target_critic))

        new_state = TD3State(
            actor=actor,
            critic=critic,
            target_actor=target_actor,
            target_critic=target_critic,
            actor_opt=actor_opt,
            critic_opt=critic_opt,
            steps=state.steps + 1,
        )
        metrics = {"critic_loss": critic_loss, "actor_loss": actor_loss, "q_mean": q.mean()}
        return new_state, metrics, td_abs

    def update_chunk(keys: Key, state: TD3State, batches: Transition, weights: jax.Array | None, hp: TD3HParams,
                     steps: Steps = PLAIN):
        """``d`` updates (``fixed_policy_delay``): ``d - 1`` critic-only steps, then the policy step. ``weights``
        ``[d, B]`` weight the critic losses (None: unweighted); also returns ``|TD error|`` ``[d, B]``."""

        def critic_only(state, xs):
            key, batch, w = xs
            critic, critic_opt, critic_loss, q, td_abs = critic_update(key, state, batch, hp, steps, w)
            return (state.replace(critic=critic, critic_opt=critic_opt, steps=state.steps + 1),
                    (critic_loss, q.mean(), td_abs))

        head = jax.tree.map(lambda x: x[:-1], (keys, batches, weights))
        # unrolled: d - 1 is small, and XLA's cost analysis then counts every step (it counts a loop body once)
        state, (critic_losses, q_means, td_head) = jax.lax.scan(critic_only, state, head, unroll=True)
        batch = jax.tree.map(lambda x: x[-1], batches)
        last_weights = None if weights is None else weights[-1]
        critic, critic_opt, critic_loss, q, td_abs = critic_update(keys[-1], state, batch, hp, steps, last_weights)
        actor, actor_opt, actor_loss = actor_update(state, critic, batch, hp, steps)
        target_actor, target_critic = targets(state, actor, critic, hp, steps)
        new_state = TD3State(actor=actor, critic=critic, target_actor=target_actor, target_critic=target_critic,
                             actor_opt=actor_opt, critic_opt=critic_opt, steps=state.steps + 1)
        metrics = {"critic_loss": jnp.append(critic_losses, critic_loss).mean(), "actor_loss": actor_loss,
                   "q_mean": jnp.append(q_means, q.mean()).mean()}
        return new_state, metrics, jnp.concatenate([td_head, td_abs[None]])

    def policy(state: TD3State, obs: jax.Array) -> jax.Array:
        return actor_net.apply(state.actor, obs)

    def gaussian(actor: PyTree, obs: jax.Array, hp: TD3HParams):
        """``N(actor(s), sigma^2)`` with ``sigma = exploration_noise``, the sigma ``act`` uses."""
        mean = actor_net.apply(actor, obs)
        return mean, jnp.broadcast_to(jnp.log(hp.exploration_noise), mean.shape)

    def act(key: Key, state: TD3State, obs: jax.Array, hp: TD3HParams) -> Behaviour:
        mean, log_std = gaussian(state.actor, obs, hp)
        u = mean + hp.exploration_noise * jax.random.normal(key, mean.shape)
        return Behaviour(jnp.clip(u, -1.0, 1.0), mean, log_std, u)

    return Core(actor_net, critic_net, init, policy, act, gaussian, critic_grads, actor_grads, update=update,
                update_chunk=update_chunk, actor_period=lambda hp: hp.policy_delay,
                targets={"target_actor": "actor", "target_critic": "critic"})


def make_td3(config: TD3Config, spec: EnvSpec) -> Learner:
    core = td3_core(config, spec)
    delay = config.fixed_policy_delay
    step = ReplayStep(core.update_chunk, chunk=delay) if delay else replay_step(core.update)
    return Learner(init=core.init, act=exploring(core), policy=core.policy, step=step)


def specialize(config: TD3Config, hparams: TD3HParams, updates_per_call: int, searched: frozenset[str],
               exact_chunks: bool = True) -> TD3Config:
    """Fixes the policy delay when every member has the same one, no driver changes it, K is a multiple and a chunk
    of updates equals the same updates one at a time (``exact_chunks``: not so when the replay source writes
    priorities back between samplings, which a chunk's batches, drawn together, would not see)."""
    delays = set(jax.device_get(hparams.policy_delay).tolist())
    if config.fixed_policy_delay is not None:
        d = config.fixed_policy_delay
        if delays != {d} or "policy_delay" in searched or updates_per_call % d:
            raise ConfigError(f"learner_config.fixed_policy_delay: {d} needs every member's hparams.policy_delay "
                              f"equal to it (got {sorted(delays)}), not searched by the driver, and the updates per "
                              f"call ({updates_per_call}) a multiple of it")
        return config
    if (exact_chunks and len(delays) == 1 and "policy_delay" not in searched
            and updates_per_call % (d := delays.pop()) == 0 and d > 1):
        return dataclasses.replace(config, fixed_policy_delay=d)
    return config


# The RL Baselines3 Zoo's tuned values, in popjax's units (see ``popjax.presets``): env -> options.
# MuJoCo v5: zoo "mujoco-defaults" (SB3 TD3: lr 1e-3, batch 256, net [400, 300]).
_MUJOCO_PRESET = {"total_env_steps": 1_000_000, "warmup_steps": 10_000, "batch_size": 256, "buffer_size": 1_000_000,
                  "hparams": {"actor_lr": 1e-3, "critic_lr": 1e-3, "exploration_noise": 0.1},
                  "learner_config": {"hidden": [400, 300]}}
PRESETS = {
    **{f"gym:{env}": _MUJOCO_PRESET for env in MUJOCO_V5},
    "gym:Pendulum-v1": {
        "total_env_steps": 20_000, "warmup_steps": 10_000, "batch_size": 256, "buffer_size": 200_000,
        "hparams": {"actor_lr": 1e-3, "critic_lr": 1e-3, "discount": 0.98, "exploration_noise": 0.1},
        "learner_config": {"hidden": [400, 300]}},
}

DEFINITION = LearnerDef(
    name="td3", presets=PRESETS,
    config_cls=TD3Config,
    hparams_cls=TD3HParams,
    make=make_td3,
    default_hparams=default_hparams,
    action_kind="continuous",
    pbt=PBTSupport(SEARCH_SPACES["td3"], policy_state=("actor", "target_actor"),
                   optimizer_state={"actor_opt": "actor", "critic_opt": "critic"}),
    report=Report(actor_params=lambda state: state.actor),
    fit=RunFit(specialize=specialize),
)
