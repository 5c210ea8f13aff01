"""SAC with automatic entropy tuning (Haarnoja et al. 2018b) as a pure single-member learner.

One gradient step per ``update``, in the order critic -> actor -> alpha (the order of the
fast-PBT reference code):

- critic: ``0.5 * mean_batch((Q_i(s, a) - y)^2)`` **summed** over the two heads, with
  ``y = r * reward_scale + gamma * (1 - terminated) * (min_i Q'_i(s', a') - alpha * log pi(a'|s'))``,
  ``a' ~ pi(.|s')`` drawn from the *online* policy and ``Q'`` the target critic. The
  release code of the reference applies gamma twice and has no terminal mask; popjax does
  not copy that bug (tests/test_sac.py guards it).
- actor: ``mean(alpha * log pi(a|s) - min_i Q_i(s, a))`` with ``a ~ pi(.|s)`` reparameterised,
  through the critic that was just updated.
- alpha: the log-alpha form ``mean(-log_alpha * sg(log pi(a|s) + target_entropy))`` (SB3,
  CleanRL, rlkit), using the log-probabilities of the actor-step sample (drawn from the
  pre-update actor, so no extra forward pass). The reference code uses the alpha form
  ``mean(alpha * sg(-log pi - target_entropy))``, whose gradient is this one times alpha.
  ``target_entropy = -target_entropy_scale * action_dim``.
- target critic: Polyak with ``tau`` every step.

Every step uses the alpha of the incoming state (the pre-update value) for the critic
target and the actor loss. Randomness: ``key_next, key_actor = jax.random.split(key)``;
``key_next`` draws the standard-normal noise of ``a'``, ``key_actor`` that of ``a``
(shape ``[B, action_dim]`` each); the hand-computed tests rely on this.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import struct
from pydantic import Field

from popjax import schema
from popjax.learners.actor_critic import PLAIN, Behaviour, Core, Steps, exploring
from popjax.learners.base import (
    MUJOCO_V5,
    BatchSize,
    Hidden,
    Learner,
    LearnerDef,
    PBTSupport,
    Report,
    adam_init,
    adam_step,
    init_actor_critic,
    polyak,
    replay_step,
    scalar,
)
from popjax.networks.mlp import GaussianActor, TwinCritic
from popjax.population.hparams import hparam
from popjax.population.search_spaces import SEARCH_SPACES
from popjax.types import EnvSpec, Key, PyTree, Transition

_LOG2 = math.log(2.0)
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


@schema.dataclass
class SACConfig:
    hidden: Hidden = Field((256, 256), description="hidden layer sizes of the actor and of each critic")
    batch_size: BatchSize = Field(256, description="transitions per gradient step (the run's batch_size)")


@struct.dataclass
class SACHParams:
    actor_lr: jax.Array = hparam("actor Adam learning rate", gt=0, le=1)
    critic_lr: jax.Array = hparam("critic Adam learning rate", gt=0, le=1)
    alpha_lr: jax.Array = hparam("temperature Adam learning rate", gt=0, le=1)
    discount: jax.Array = hparam("discount factor gamma", ge=0, le=1)
    tau: jax.Array = hparam("Polyak rate of the target critic", gt=0, le=1)
    reward_scale: jax.Array = hparam("multiplies rewards in the critic target", gt=0)
    # target entropy = -scale * action_dim (a negative scale asks for more entropy than 0 nats)
    target_entropy_scale: jax.Array = hparam("target entropy = -scale x action_dim")


@struct.dataclass
class SACState:
    actor: PyTree
    critic: PyTree
    target_critic: PyTree
    actor_opt: PyTree
    critic_opt: PyTree
    log_alpha: jax.Array  # float32 scalar, initialised to 0 (alpha = 1)
    alpha_opt: PyTree
    steps: jax.Array  # int32, updates done


def default_hparams(config: SACConfig | None = None) -> SACHParams:
    """The reference defaults (Haarnoja et al. 2018)."""
    del config
    return SACHParams(
        actor_lr=scalar(3e-4),
        critic_lr=scalar(3e-4),
        alpha_lr=scalar(3e-4),
        discount=scalar(0.99),
        tau=scalar(0.005),
        reward_scale=scalar(1.0),
        target_entropy_scale=scalar(1.0),
    )


def squashed_gaussian(mean: jax.Array, log_std: jax.Array, noise: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Reparameterised sample of ``tanh(N(mean, std^2))`` and its log-density.

    Args:
      mean, log_std: ``[..., action_dim]`` parameters of the pre-tanh Gaussian.
      noise: standard-normal draws of the same shape.

    Returns:
      ``(action, log_prob)`` with ``action`` in ``(-1, 1)`` and ``log_prob`` summed over the
      last axis. The change of variables uses
      ``log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u))``, which stays finite where
      ``tanh(u)`` rounds to +-1 (the naive form gives ``log 0``).
    """
    u = mean + jnp.exp(log_std) * noise
    gaussian_log_prob = -0.5 * noise**2 - log_std - _HALF_LOG_2PI
    log_det = 2.0 * (_LOG2 - u - jax.nn.softplus(-2.0 * u))
    return jnp.tanh(u), jnp.sum(gaussian_log_prob - log_det, axis=-1)


def one_step_target(key: Key, sample_fn, target_critic: PyTree, critic_net, actor: PyTree, batch: Transition,
                    alpha: jax.Array, hp: SACHParams) -> jax.Array:
    """``r * reward_scale + gamma (1 - terminated) (min_i Q'_i(s', a') - alpha log pi(a'|s'))``, ``a' ~ pi(.|s')``."""
    next_action, next_log_prob = sample_fn(key, actor, batch.next_obs)
    next_q = critic_net.apply(target_critic, batch.next_obs, next_action).min(axis=0)
    y = batch.reward * hp.reward_scale + hp.discount * (1.0 - batch.terminated) * (next_q - alpha * next_log_prob)
    return jax.lax.stop_gradient(y)


def sample_action(actor_net, key: Key, actor_params: PyTree, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(action, log_prob)``: SAC's reparameterised draw from the actor's squashed Gaussian (what MEMR's rollouts
    and RLx2's multi-step target draw with, ``functools.partial(sample_action, core.actor_net)``)."""
    mean, log_std = actor_net.apply(actor_params, obs)
    return squashed_gaussian(mean, log_std, jax.random.normal(key, mean.shape))


def sac_core(config: SACConfig, spec: EnvSpec) -> Core:
    """SAC as an actor-critic ``Core``; its update takes the wrapper's ``Steps``."""
    actor_net = GaussianActor(config.hidden, spec.action_dim)
    critic_net = TwinCritic(config.hidden)

    def init(key: Key, hparams: SACHParams) -> SACState:
        del hparams
        actor, critic = init_actor_critic(key, actor_net, critic_net, spec)
        log_alpha = jnp.zeros((), jnp.float32)
        return SACState(
            actor=actor,
            critic=critic,
            target_critic=critic,
            actor_opt=adam_init(actor),
            critic_opt=adam_init(critic),
            log_alpha=log_alpha,
            alpha_opt=adam_init(log_alpha),
            steps=jnp.zeros((), jnp.int32),
        )

    sample = functools.partial(sample_action, actor_net)

    def target(key: Key, state: SACState, batch: Transition, hp: SACHParams) -> jax.Array:
        """The one-step target with the online policy at s' and the target critic."""
        return one_step_target(key, sample, state.target_critic, critic_net, state.actor, batch,
                               jnp.exp(state.log_alpha), hp)

    def critic_loss(critic_params, batch: Transition, y: jax.Array, weights: jax.Array | None = None):
        q = critic_net.apply(critic_params, batch.obs, batch.action)  # [2, B]
        squared = (q - y) ** 2
        if weights is not None:  # importance weights of prioritized replay, per sample
            squared = weights * squared
        return 0.5 * jnp.sum(jnp.mean(squared, axis=-1)), q

    def actor_terms(key, actor_params, critic_params, state: SACState, obs):
        """Per-sample ``alpha log pi(a|s) - min_i Q_i(s, a)``, ``a ~ pi(.|s)`` reparameterised; aux: log pi."""
        action, log_prob = sample(key, actor_params, obs)
        q = critic_net.apply(critic_params, obs, action).min(axis=0)
        return jnp.exp(state.log_alpha) * log_prob - q, log_prob

    def critic_grads(key: Key, state: SACState, batch, weights, hp: SACHParams, steps: Steps = PLAIN):
        """The TD loss over ``steps.sample(batch)`` against ``steps.target`` (default: the one-step target, drawn
        with the first half of ``key``) and its gradient at ``state.critic``: ``((loss, q [2, B], y [B]), grads)``."""
        key_next, _ = jax.random.split(key)
        y = (steps.target or target)(key_next, state, batch, hp)
        loss = lambda critic: critic_loss(critic, steps.sample(batch), y, weights)  # noqa: E731
        (value, q), grads = jax.value_and_grad(loss, has_aux=True)(state.critic)
        return (value, q, y), grads

    def actor_grads(key: Key, state: SACState, critic: PyTree, obs: jax.Array, hp: SACHParams,
                    steps: Steps = PLAIN):
        """``steps.actor_objective`` over the per-sample losses through ``critic`` (actions drawn with the second
        half of ``key``) and its gradient at ``state.actor``: ``((loss, log pi [B]), grads)``."""
        del hp
        _, key_actor = jax.random.split(key)

        def loss(actor):
            terms, log_prob = actor_terms(key_actor, actor, critic, state, obs)
            return steps.actor_objective(actor, terms), log_prob

        return jax.value_and_grad(loss, has_aux=True)(state.actor)

    def alpha_loss_fn(log_alpha, log_prob, target_entropy):
        return jnp.mean(-log_alpha * jax.lax.stop_gradient(log_prob + target_entropy))

    def update(key: Key, state: SACState, batch, weights: jax.Array | None, hp: SACHParams, steps: Steps = PLAIN):
        """One SAC step, the critic loss weighted per sample; also ``|TD error|`` (the larger twin's)."""
        alpha = jnp.exp(state.log_alpha)
        target_entropy = -hp.target_entropy_scale * spec.action_dim

        (critic_loss_value, q, y), critic_grads_ = critic_grads(key, state, batch, weights, hp, steps)
        critic, critic_opt = steps.critic(state.critic, critic_grads_, state.critic_opt, hp.critic_lr)

        # Actor, through the just-updated critic.
        (actor_loss_value, log_prob), actor_grads_ = actor_grads(key, state, critic, steps.sample(batch).obs, hp,
                                                                 steps)
        actor, actor_opt = steps.actor(state.actor, actor_grads_, state.actor_opt, hp.actor_lr)

        # Temperature.
        alpha_loss, alpha_grad = jax.value_and_grad(alpha_loss_fn)(state.log_alpha, log_prob, target_entropy)
        log_alpha, alpha_opt = adam_step(state.log_alpha, alpha_grad, state.alpha_opt, hp.alpha_lr)

        new_state = SACState(
            actor=actor,
            critic=critic,
            target_critic=steps.critic_targets(polyak(state.target_critic, critic, hp.tau)),
            actor_opt=actor_opt,
            critic_opt=critic_opt,
            log_alpha=log_alpha,
            alpha_opt=alpha_opt,
            steps=state.steps + 1,
        )
        metrics = {
            "critic_loss": critic_loss_value,
            "actor_loss": actor_loss_value,
            "alpha_loss": alpha_loss,
            "alpha": alpha,
            "entropy": -jnp.mean(log_prob),
            "q_mean": q.mean(),
        }
        return new_state, metrics, jnp.abs(q - y).max(axis=0)

    def policy(state: SACState, obs: jax.Array) -> jax.Array:
        mean, _ = actor_net.apply(state.actor, obs)
        return jnp.tanh(mean)

    def gaussian(actor: PyTree, obs: jax.Array, hp: SACHParams):
        """The actor's own Gaussian before the tanh."""
        del hp
        return actor_net.apply(actor, obs)

    def act(key: Key, state: SACState, obs: jax.Array, hp: SACHParams) -> Behaviour:
        """A reparameterised draw from the squashed Gaussian (the same action as ``sample_action``)."""
        mean, log_std = gaussian(state.actor, obs, hp)
        u = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)
        return Behaviour(jnp.tanh(u), mean, log_std, u)

    return Core(actor_net, critic_net, init, policy, act, gaussian, critic_grads, actor_grads, update=update,
                update_chunk=None, actor_period=lambda hp: jnp.ones((), jnp.int32), targets={"target_critic": "critic"})


def make_sac(config: SACConfig, spec: EnvSpec) -> Learner:
    core = sac_core(config, spec)
    return Learner(init=core.init, act=exploring(core), policy=core.policy, step=replay_step(core.update))


# The RL Baselines3 Zoo's tuned values, in popjax's units (see ``popjax.presets``): env -> options.
# MuJoCo v5: zoo "mujoco-defaults" (SB3 SAC: lr 3e-4, batch 256, net [256, 256]).
_MUJOCO_PRESET = {"total_env_steps": 1_000_000, "warmup_steps": 10_000, "batch_size": 256, "buffer_size": 1_000_000,
                  "learner_config": {"hidden": [256, 256]}}
PRESETS = {
    **{f"gym:{env}": _MUJOCO_PRESET for env in MUJOCO_V5},
    "gym:Humanoid-v5": {**_MUJOCO_PRESET, "total_env_steps": 2_000_000},
    "gym:Pendulum-v1": {
        "total_env_steps": 20_000, "warmup_steps": 100, "batch_size": 256, "buffer_size": 1_000_000,
        "hparams": {"actor_lr": 1e-3, "critic_lr": 1e-3, "alpha_lr": 1e-3},
        "learner_config": {"hidden": [256, 256]}},
}

DEFINITION = LearnerDef(
    name="sac", presets=PRESETS,
    config_cls=SACConfig,
    hparams_cls=SACHParams,
    make=make_sac,
    default_hparams=default_hparams,
    action_kind="continuous",
    pbt=PBTSupport(SEARCH_SPACES["sac"], policy_state=("actor",),
                   optimizer_state={"actor_opt": "actor", "critic_opt": "critic", "alpha_opt": "log_alpha"}),
    report=Report(counts=lambda config, updates: {"policy_updates": updates}),
)
