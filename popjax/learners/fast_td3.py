"""FastTD3 (Seo et al. 2025) as a pure single-member learner: TD3 at the large-batch scale.

What differs from ``td3``: twin categorical critics (C51, ``num_atoms`` fixed atoms on ``[v_min, v_max]``,
per-member traced hparams, so PBT can tune the value support) trained by cross-entropy toward the categorical
projection of the n-step target; clipped double Q picks, per sample, the twin whose projected target has the lower
expected value, and the actor maximises the mean over the batch of the twins' smaller expected value (``cdq`` 1;
``cdq`` 0: each twin learns its own target and the actor their mean; between, a mix); the target action comes from
the online actor (FastTD3 keeps no target actor); the target critic follows every update; AdamW with a traced weight
decay; running observation statistics in the state (``observe``); and one exploration std per env, drawn in
``[std_min, std_max]`` and redrawn when that env's episode ends.

``num_updates`` is a traced integer: of the run's K update slots per training call (the compiled maximum), a member
applies its first ``num_updates`` and skips the rest (the skipped slots still run, masked), so PBT tunes the update
ratio without recompiling; with ``num_updates >= K`` every slot applies.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import optax
from flax import struct
from pydantic import Field

from popjax import schema
from popjax.learners.base import (
    BatchSize,
    Hidden,
    Int,
    Learner,
    LearnerDef,
    PBTSupport,
    RunFit,
    init_actor_critic,
    replay_step,
    scalar,
    select,
)
from popjax.learners.multistep import n_step_return
from popjax.networks.distributional import SmallInitActor, TwinCategoricalCritic
from popjax.population.hparams import hparam
from popjax.types import EnvSpec, Key, PyTree, Transition, Windows

NORM_EPS = 1e-2  # FastTD3's EmpiricalNormalization: std floored at eps, and eps added to it


@schema.dataclass
class FastTD3Config:
    critic_hidden: Hidden = Field((1024, 512, 256), description="hidden layer sizes of each critic")
    actor_hidden: Hidden = Field((512, 256, 128), description="hidden layer sizes of the actor")
    num_atoms: Int(ge=2, le=4_096) = Field(101, description="atoms of each critic's categorical value distribution")
    n_step: Int(ge=1, le=1_000) = Field(1, description="steps of the multi-step TD target (1: one-step)")
    layer_norm: schema.Bool = Field(False, description="LayerNorm before every hidden ReLU of actor and critics")
    obs_normalization: schema.Bool = Field(True, description="normalise observations by running mean and std")
    actor_init_scale: schema.Float(gt=0, le=10) = Field(
        0.01, description="std of the actor's output-layer weights at init")
    batch_size: BatchSize = Field(32_768, description="transitions per gradient step (the run's batch_size)")
    envs_per_member: Int(ge=1, le=10_000) = Field(1, description="envs each member steps (the run's envs_per_member)")
    update_slots: Int(ge=1, le=1_000_000) | None = Field(
        None, description="update slots per training call, the compiled maximum of num_updates (set by popjax from "
                          "the run's updates per call; None: every update applies)")


@struct.dataclass
class FastTD3HParams:
    actor_lr: jax.Array = hparam("actor AdamW learning rate", gt=0, le=1)
    critic_lr: jax.Array = hparam("critic AdamW learning rate", gt=0, le=1)
    weight_decay: jax.Array = hparam("AdamW weight decay (decoupled, times the learning rate)", ge=0, le=10)
    discount: jax.Array = hparam("discount factor gamma", ge=0, le=1)
    tau: jax.Array = hparam("Polyak rate of the target critic, every update", gt=0, le=1)
    std_min: jax.Array = hparam("lowest per-env exploration std (actions in [-1, 1])", ge=0, le=10)
    std_max: jax.Array = hparam("highest per-env exploration std", ge=0, le=10)
    target_noise: jax.Array = hparam("std of the target policy smoothing noise", ge=0)
    noise_clip: jax.Array = hparam("clip of the target policy smoothing noise", ge=0)
    v_min: jax.Array = hparam("lowest atom of the value support", lt=0)
    v_max: jax.Array = hparam("highest atom of the value support", gt=0)
    policy_delay: jax.Array = hparam("critic updates per actor update (int32)", ge=1, le=1_000_000, integer=True)
    num_updates: jax.Array = hparam("update slots applied per training call (int32; at most the run's updates per "
                                    "call)", ge=1, le=1_000_000, integer=True)
    cdq: jax.Array = hparam("weight of clipped double Q: 1 both twins learn the smaller twin's target and the actor "
                            "its value (FastTD3's use_cdq), 0 each twin its own and the actor their mean", ge=0, le=1)


@struct.dataclass
class ObsNorm:
    """Running mean and variance of the observations seen (Chan et al.'s parallel update); ``count`` is float32."""

    count: jax.Array
    mean: jax.Array
    var: jax.Array


@struct.dataclass
class FastTD3State:
    actor: PyTree
    critic: PyTree
    target_critic: PyTree
    actor_opt: PyTree
    critic_opt: PyTree
    obs_norm: ObsNorm
    noise_level: jax.Array  # [envs] in [0, 1]: env e explores with std_min + noise_level[e] (std_max - std_min)
    steps: jax.Array  # int32, critic updates applied
    slots: jax.Array  # int32, update slots seen (applied or masked)


def default_hparams(config: FastTD3Config | None = None) -> FastTD3HParams:
    """FastTD3's MuJoCo Playground defaults (its ``hyperparams.py``)."""
    return FastTD3HParams(
        actor_lr=scalar(3e-4), critic_lr=scalar(3e-4), weight_decay=scalar(0.1), discount=scalar(0.97),
        tau=scalar(0.1), std_min=scalar(0.001), std_max=scalar(0.4), target_noise=scalar(0.001),
        noise_clip=scalar(0.5), v_min=scalar(-10.0), v_max=scalar(10.0), policy_delay=scalar(2, jnp.int32),
        num_updates=scalar(1_000_000, jnp.int32), cdq=scalar(1.0))


# --- the categorical (C51) pieces -------------------------------------------------------------------------------
def support(v_min: jax.Array, v_max: jax.Array, num_atoms: int) -> jax.Array:
    """The atoms ``[num_atoms]``, evenly spaced on ``[v_min, v_max]``."""
    return v_min + (v_max - v_min) * jnp.arange(num_atoms, dtype=jnp.float32) / (num_atoms - 1)


def categorical_projection(probs: jax.Array, returns: jax.Array, bootstrap: jax.Array, v_min: jax.Array,
                           v_max: jax.Array) -> jax.Array:
    """The distribution of ``returns + bootstrap * Z`` (Z: ``probs [B, N]`` on the support) projected back onto the
    support (Bellemare et al. 2017, Alg. 1): each shifted atom, clipped to ``[v_min, v_max]``, splits its mass
    between the two atoms around it in proportion to its closeness. ``returns``, ``bootstrap``: ``[B]``."""
    n = probs.shape[-1]
    atoms = support(v_min, v_max, n)
    shifted = jnp.clip(returns[:, None] + bootstrap[:, None] * atoms, v_min, v_max)
    position = jnp.clip((shifted - v_min) / ((v_max - v_min) / (n - 1)), 0.0, n - 1.0)  # [B, N] in atom units
    lower = jnp.clip(jnp.floor(position), 0, n - 2)
    upper_share = position - lower  # in [0, 1]: the whole mass on the upper atom at the top end
    lower = lower.astype(jnp.int32)

    def one(p, low, share):
        return jnp.zeros(n, probs.dtype).at[low].add(p * (1.0 - share)).at[low + 1].add(p * share)

    return jax.vmap(one)(probs, lower, upper_share)


def expected_value(probs: jax.Array, v_min: jax.Array, v_max: jax.Array) -> jax.Array:
    """``E[Z]`` of distributions ``probs [..., N]`` on the support."""
    return probs @ support(v_min, v_max, probs.shape[-1])


# --- observation statistics ---------------------------------------------------------------------------------------
def init_obs_norm(obs_shape: tuple[int, ...]) -> ObsNorm:
    return ObsNorm(jnp.zeros((), jnp.float32), jnp.zeros(obs_shape, jnp.float32), jnp.ones(obs_shape, jnp.float32))


def update_obs_norm(norm: ObsNorm, obs: jax.Array) -> ObsNorm:
    """The statistics after also seeing ``obs [n, ...]`` (the first batch replaces the initial ones)."""
    n = jnp.float32(obs.shape[0])
    batch_mean, batch_var = obs.mean(axis=0), obs.var(axis=0)
    count = norm.count + n
    delta = batch_mean - norm.mean
    mean = norm.mean + delta * n / count
    var = (norm.var * norm.count + batch_var * n + delta**2 * norm.count * n / count) / count
    return ObsNorm(count, mean, var)


def normalize(norm: ObsNorm, obs: jax.Array) -> jax.Array:
    std = jnp.sqrt(jnp.maximum(norm.var, NORM_EPS**2))
    return (obs - norm.mean) / (std + NORM_EPS)


# --- AdamW with traced learning rate and weight decay -------------------------------------------------------------
_ADAM = optax.scale_by_adam()


def adamw_step(params: PyTree, grads: PyTree, opt_state, lr: jax.Array, weight_decay: jax.Array):
    """One AdamW step (optax's ``adamw``: decoupled decay ``lr * wd * params``) with traced ``lr`` and ``wd``."""
    updates, opt_state = _ADAM.update(grads, opt_state, params)
    return jax.tree.map(lambda p, u: p - lr * (u + weight_decay * p), params, updates), opt_state


# --- the learner --------------------------------------------------------------------------------------------------
def make_fast_td3(config: FastTD3Config, spec: EnvSpec) -> Learner:
    actor_net = SmallInitActor(config.actor_hidden, spec.action_dim, config.actor_init_scale, config.layer_norm)
    critic_net = TwinCategoricalCritic(config.critic_hidden, config.num_atoms, config.layer_norm)
    norm_obs = normalize if config.obs_normalization else (lambda norm, obs: obs)

    def init(key: Key, hparams: FastTD3HParams) -> FastTD3State:
        del hparams
        key_nets, key_noise = jax.random.split(key)
        actor, critic = init_actor_critic(key_nets, actor_net, critic_net, spec)
        return FastTD3State(actor=actor, critic=critic, target_critic=critic, actor_opt=_ADAM.init(actor),
                            critic_opt=_ADAM.init(critic), obs_norm=init_obs_norm(spec.obs_shape),
                            noise_level=jax.random.uniform(key_noise, (config.envs_per_member,)),
                            steps=jnp.zeros((), jnp.int32), slots=jnp.zeros((), jnp.int32))

    def target_distribution(key: Key, state: FastTD3State, batch: Transition | Windows, hp: FastTD3HParams):
        """The projected target ``[B, N]`` both critics learn toward (no gradient)."""
        if isinstance(batch, Windows):
            returns, bootstrap, last = n_step_return(batch, hp.discount)
        else:
            returns, bootstrap, last = batch.reward, hp.discount * (1.0 - batch.terminated), batch
        next_obs = norm_obs(state.obs_norm, last.next_obs)
        noise = jnp.clip(hp.target_noise * jax.random.normal(key, last.action.shape), -hp.noise_clip, hp.noise_clip)
        next_action = jnp.clip(actor_net.apply(state.actor, next_obs) + noise, -1.0, 1.0)
        next_probs = jax.nn.softmax(critic_net.apply(state.target_critic, next_obs, next_action), axis=-1)  # [2,B,N]
        projected = jax.vmap(categorical_projection, in_axes=(0, None, None, None, None))(
            next_probs, returns, bootstrap, hp.v_min, hp.v_max)
        values = expected_value(projected, hp.v_min, hp.v_max)  # [2, B]
        smaller = jnp.where((values[0] < values[1])[:, None], projected[0], projected[1])
        return jax.lax.stop_gradient(hp.cdq * smaller[None] + (1.0 - hp.cdq) * projected)

    def critic_loss(critic: PyTree, obs: jax.Array, action: jax.Array, target: jax.Array):
        """The twins' summed cross-entropy to their targets, each averaged over the batch; also the logits."""
        logits = critic_net.apply(critic, obs, action)
        loss = -jnp.sum(target * jax.nn.log_softmax(logits, axis=-1), axis=-1).mean(axis=-1).sum()
        return loss, logits

    def actor_loss(actor: PyTree, critic: PyTree, obs: jax.Array, hp: FastTD3HParams):
        probs = jax.nn.softmax(critic_net.apply(critic, obs, actor_net.apply(actor, obs)), axis=-1)
        values = expected_value(probs, hp.v_min, hp.v_max)  # [2, B]
        return -(hp.cdq * values.min(axis=0) + (1.0 - hp.cdq) * values.mean(axis=0)).mean()

    def update(key: Key, state: FastTD3State, batch: Transition | Windows, weights: None, hp: FastTD3HParams):
        del weights  # unweighted: it returns no priorities, so no source weights its samples
        first = batch.first() if isinstance(batch, Windows) else batch
        obs = norm_obs(state.obs_norm, first.obs)
        target = target_distribution(key, state, batch, hp)
        (loss_c, logits), grads_c = jax.value_and_grad(critic_loss, has_aux=True)(state.critic, obs, first.action,
                                                                                   target)
        critic, critic_opt = adamw_step(state.critic, grads_c, state.critic_opt, hp.critic_lr, hp.weight_decay)
        loss_a, grads_a = jax.value_and_grad(actor_loss)(state.actor, critic, obs, hp)
        actor, actor_opt = adamw_step(state.actor, grads_a, state.actor_opt, hp.actor_lr, hp.weight_decay)
        is_policy_step = (state.steps + 1) % hp.policy_delay == 0
        actor, actor_opt = select(is_policy_step, (actor, actor_opt), (state.actor, state.actor_opt))
        target_critic = jax.tree.map(lambda t, o: t + hp.tau * (o - t), state.target_critic, critic)
        updated = state.replace(actor=actor, critic=critic, target_critic=target_critic, actor_opt=actor_opt,
                                critic_opt=critic_opt, steps=state.steps + 1)
        applies = True if config.update_slots is None else state.slots % config.update_slots < hp.num_updates
        new_state = select(applies, updated, state).replace(slots=state.slots + 1)
        q = expected_value(jax.nn.softmax(logits, axis=-1), hp.v_min, hp.v_max)
        metrics = {"critic_loss": loss_c, "actor_loss": loss_a, "q_mean": q.mean(),
                   "applied": jnp.asarray(applies, jnp.float32)}
        return new_state, metrics, None

    def explore(key: Key, state: FastTD3State, obs: jax.Array, hp: FastTD3HParams):
        """Actions for one member's envs ``obs [envs, ...]``: each env's own std (``noise_level``); any other batch
        of observations (an unbatched one: env 0's) takes the stds of env ``i mod envs`` in order."""
        mean = actor_net.apply(state.actor, norm_obs(state.obs_norm, obs))
        batch = mean.shape[:-1]
        level = state.noise_level[jnp.arange(math.prod(batch)) % config.envs_per_member].reshape(batch + (1,))
        std = hp.std_min + level * (hp.std_max - hp.std_min)
        return jnp.clip(mean + std * jax.random.normal(key, mean.shape), -1.0, 1.0), None

    def policy(state: FastTD3State, obs: jax.Array) -> jax.Array:
        return actor_net.apply(state.actor, norm_obs(state.obs_norm, obs))

    def observe(key: Key, state: FastTD3State, transitions: Transition, ended: jax.Array, hp: FastTD3HParams):
        """After each rollout ``[T * envs, ...]`` (time-major): the observation statistics see its observations,
        and every env whose episode ended in it draws a new exploration std."""
        del hp
        envs = config.envs_per_member
        reset = ended.reshape(-1, envs).any(axis=0)
        noise_level = jnp.where(reset, jax.random.uniform(key, (envs,)), state.noise_level)
        obs_norm = update_obs_norm(state.obs_norm, transitions.obs) if config.obs_normalization else state.obs_norm
        return state.replace(obs_norm=obs_norm, noise_level=noise_level)

    step = replay_step(update, priorities=False)
    if config.n_step > 1:
        step = step._replace(window=config.n_step)
    return Learner(init=init, act=explore, policy=policy, step=step, observe=observe)


def specialize(config: FastTD3Config, hparams: FastTD3HParams, updates_per_call: int, searched: frozenset[str],
               exact_chunks: bool = True) -> FastTD3Config:
    """The run's updates per call are the compiled maximum of ``num_updates``."""
    del hparams, searched, exact_chunks
    return dataclasses.replace(config, update_slots=updates_per_call)


# PBT's prior: every continuous knob of the recipe, the update ratio as the traced num_updates.
SEARCH_SPACE = {
    "actor_lr": {"low": 3e-5, "high": 3e-3, "log": True},
    "critic_lr": {"low": 3e-5, "high": 3e-3, "log": True},
    "weight_decay": {"low": 0.0, "high": 0.2},
    "discount": {"low": 0.95, "high": 0.995},
    "tau": {"low": 0.01, "high": 0.2},
    "std_max": {"low": 0.05, "high": 0.8},
    "v_min": {"low": -20.0, "high": -5.0},
    "v_max": {"low": 5.0, "high": 20.0},
}

# FastTD3's run shape (its hyperparams.py, MuJoCo Playground section) in popjax's units: one env step of every env
# per call, 2 updates per call; the support is its base settings' [-250, 250] (brax's rewards are larger than the
# Playground's, for which it uses [-10, 10]).
_PLAYGROUND = {"envs_per_member": 1024, "rollout_len": 1, "update_ratio": 2 / 1024, "batch_size": 32_768,
               "buffer_size": 1024 * 10_240, "warmup_steps": 10 * 1024}
PRESETS = {
    "brax:humanoid@mjx": {**_PLAYGROUND, "hparams": {"v_min": -250.0, "v_max": 250.0}},
    "brax:ant@mjx": {**_PLAYGROUND, "hparams": {"v_min": -250.0, "v_max": 250.0}},
}

DEFINITION = LearnerDef(
    name="fast_td3", presets=PRESETS, config_cls=FastTD3Config, hparams_cls=FastTD3HParams, make=make_fast_td3,
    default_hparams=default_hparams, action_kind="continuous",
    pbt=PBTSupport(SEARCH_SPACE, policy_state=("actor", "obs_norm"),
                   optimizer_state={"actor_opt": "actor", "critic_opt": "critic"}),
    fit=RunFit(specialize=specialize),
)
