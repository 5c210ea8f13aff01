"""SPO (Scalable Policy Optimization; Zhang 2022, PhD thesis Ch. 5): local-SGD learner replicas.

A member holds R replicas of a base learner's online networks
and optimizer states (leading axis ``[R]``; a population of SPO learners is ``[N, R, ...]``, one
compiled call) and ONE copy of the target networks: replicas never differ in them.

How batches flow. One SPO update is a *round* and is the learner's ``ReplayStep`` with ``chunk = H``
(``local_steps``): ``update(keys [H], state, batches [H, B, ...], weights, hparams)``, so the
independent driver samples H batches of the run's ``batch_size`` B per round, exactly as it does
for TD3's policy-delay chunks. Replica r trains on slice r of each batch (b = B/R; disjoint slices
of one uniform sample play the thesis's per-replica bank sample). A round is ``scan`` over H local
steps of ``vmap_R(step)`` against frozen targets, then ``x <- broadcast(mean_R(x))`` (no ``cond``
inside the vmaps); every F (``target_rounds``) rounds the targets become hard copies of the averaged
online networks (after round F, 2F, ...). The run's updates count local steps: K updates per
iteration are K/H rounds (``specialize`` checks that H divides K).

A lone local step is no state transition of SPO (SPO-TD3's actor phase needs the round's H batches), so the
round is the smallest update SPO offers.

Choices the thesis leaves open (documented deviations):
- ``opt_state``: ``average`` (default; Adam moments averaged with the weights, replicas stay
  identical after a sync), ``local`` (each replica keeps its own) or ``reset`` (zeroed each round;
  Adam restarts its bias correction). No learning-rate scaling with R.
- ``mode: dp``: the data-parallel baseline, gradients averaged over the replicas at every step
  (``pmean`` over the replica axis) = large-batch SGD of the same algorithm on B; replicas never
  diverge, so the round-end average is skipped and ``opt_state`` must be ``average``.
- SPO-DQN (Alg. 7): double Q selects target actions with the last averaged online network (the
  params at the round's start; in ``dp`` mode every step is a sync, so the current params).
- SPO-TD3 (Alg. 8): H critic steps, average critic, H actor steps on the SAME H batches against
  the averaged critic, average actor. No Polyak, no policy delay (hence no ``tau``/``policy_delay``
  hparams). ``naive``: one phase, each replica's actor follows its local critic (the thesis's
  diverging variant, for comparison); targets stay frozen in both.
- Target copies after rounds F, 2F, ... (Alg. 7/8 test ``e mod F == 0`` from e = 0, i.e. also after the
  first round); this way R = 1 SPO-DQN equals DQN with ``target_update_period = H * F`` (test L5).
- Prioritized replay (``weights`` given, ``banks = R``): replica r's slice of each batch comes from bank r
  of the member's banked buffer (Ch. 5); importance weights scale the TD/critic loss only. Not here: a
  Polyak-at-averaging flag.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import pydantic
from flax import struct
from pydantic import Field

from popjax import schema
from popjax.config import ConfigError
from popjax.learners import dqn, td3
from popjax.learners.actor_critic import exploring
from popjax.learners.base import (
    BatchSize,
    Hidden,
    Learner,
    LearnerDef,
    ReplayStep,
    RunFit,
    adam_init,
    adam_step,
    init_actor_critic,
    select,
)
from popjax.networks.mlp import QNetwork, check_cnn
from popjax.population.hparams import hparam
from popjax.population.tree import member
from popjax.schema import problem
from popjax.types import EnvSpec, Key, PyTree, Transition

REPLICA = "replica"  # vmap axis name of the replicas (``dp`` averages gradients over it)


# --- config -------------------------------------------------------------------------------------
@schema.dataclass
class SPOConfig:
    """The static settings every SPO learner shares (``R``, ``H``, ``F``, optimizer state, mode)."""

    replicas: schema.Int(ge=1, le=1024) = Field(2, description="local learners R per member; must divide batch_size")
    local_steps: schema.Int(ge=1, le=100_000) = Field(
        10, description="local steps H per round between two averagings (thesis default 10)")
    target_rounds: schema.Int(ge=1, le=1_000_000) = Field(
        20, description="rounds F between two hard target copies (F counts rounds, not steps; F * H = 1/tau of TD3)")
    opt_state: schema.OneOf(("average", "local", "reset")) = Field(
        "average", description="optimizer state at each averaging: averaged, kept per replica, or reset")
    mode: schema.OneOf(("local_sgd", "dp")) = Field(
        "local_sgd", description="local_sgd: average every H steps; dp: average gradients every step (baseline)")
    batch_size: BatchSize = Field(256, description="transitions per local step (the run's batch_size), split over the "
                                                   "replicas")

    @pydantic.model_validator(mode="after")
    def _check(self):
        if self.batch_size % self.replicas:
            raise problem(f"must divide batch_size {self.batch_size}, got {self.replicas}", at=("replicas",))
        if self.mode == "dp" and self.opt_state != "average":
            raise problem(f"mode dp keeps replicas identical, so only 'average' applies, got {self.opt_state!r}",
                          at=("opt_state",))
        return self


def specialize(config: SPOConfig, hparams, updates_per_call: int, searched: frozenset[str],
               exact_chunks: bool = True) -> SPOConfig:
    """Checks that the driver's K updates per call are whole rounds of H local steps (a round is SPO's smallest
    update, whatever the replay source)."""
    del hparams, searched, exact_chunks
    if updates_per_call % config.local_steps:
        raise ConfigError(f"learner_config.local_steps: must divide the updates per iteration ({updates_per_call}: "
                          f"rollout_len * envs_per_member * update_ratio), got {config.local_steps}")
    return config


# --- the replica core (generic over the step) ----------------------------------------------------
def first(tree: PyTree) -> PyTree:
    """Replica 0 (all replicas agree after a sync)."""
    return member(tree, 0)


def replica_mean(tree: PyTree) -> PyTree:
    """``x <- broadcast(mean_R(x))`` on floating leaves; integer leaves (Adam's count) agree already."""
    def mean(x):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            return x
        return jnp.broadcast_to(x.mean(axis=0, keepdims=True), x.shape)

    return jax.tree.map(mean, tree)


def replica_spread(params: PyTree) -> jax.Array:
    """How far the replicas drifted apart: the RMS over weights of ``x_r - mean_R(x)`` over the RMS of
    ``mean_R(x)`` (0 when the replicas agree; logged before each average, where local SGD's divergence shows)."""
    leaves = [x for x in jax.tree.leaves(params) if jnp.issubdtype(x.dtype, jnp.floating)]
    centre = [x.mean(axis=0, keepdims=True) for x in leaves]
    drift = sum(jnp.sum((x - c) ** 2) / x.shape[0] for x, c in zip(leaves, centre, strict=True))
    size = sum(jnp.sum(c**2) for c in centre)
    return jnp.sqrt(drift / jnp.maximum(size, jnp.finfo(jnp.float32).tiny))


def sync(params: PyTree, opt: PyTree, config: SPOConfig) -> tuple[PyTree, PyTree]:
    """The round-end averaging of params and optimizer state (``opt_state``); ``dp`` has nothing to average."""
    if config.mode == "dp":
        return params, opt
    if config.opt_state == "average":
        opt = replica_mean(opt)
    elif config.opt_state == "reset":
        opt = jax.tree.map(jnp.zeros_like, opt)
    return replica_mean(params), opt


def grad_sync(grads: PyTree, config: SPOConfig) -> PyTree:
    """Inside ``vmap_R``: ``dp`` averages the replicas' gradients (one large-batch step), local SGD does not."""
    return jax.lax.pmean(grads, REPLICA) if config.mode == "dp" else grads


def split_replicas(batches: Transition, replicas: int) -> Transition:
    """``[H, B, ...] -> [H, R, B/R, ...]``: replica r gets the r-th contiguous slice of each batch."""
    return jax.tree.map(lambda x: x.reshape(x.shape[:1] + (replicas, x.shape[1] // replicas) + x.shape[2:]),
                        batches)


def local_steps(step: Callable, carry: PyTree, keys: Key, batches: Transition, replicas: int,
                weights: jax.Array | None = None):
    """``scan`` over the H batches of ``vmap_R(step)``: ``step(carry_r, key_r, batch_r[, weights_r]) -> (carry_r,
    metrics)``, ``weights_r`` the replica's slice of ``weights [H, B]`` (importance weights), passed only if given.

    ``carry`` leaves are ``[R, ...]``; returns the carry, the metrics averaged over steps and replicas, and the
    metric ``td_abs`` (if the step gives one) unaveraged as ``[H, B]`` (replica-major, the batches' row order).
    """
    replica_keys = jax.vmap(lambda k: jax.random.split(k, replicas))(keys)  # [H, R]
    v_step = jax.vmap(step, axis_name=REPLICA)
    xs = (replica_keys, split_replicas(batches, replicas))
    if weights is not None:
        xs = (*xs, split_replicas(weights, replicas))
    carry, metrics = jax.lax.scan(lambda c, x: v_step(c, *x), carry, xs)
    td_abs = metrics.pop("td_abs", None)
    if td_abs is not None:
        td_abs = td_abs.reshape(td_abs.shape[0], -1)
    return carry, jax.tree.map(jnp.mean, metrics), td_abs


def replicate(tree: PyTree, replicas: int) -> PyTree:
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (replicas,) + x.shape), tree)


def is_copy_round(steps: jax.Array, config: SPOConfig) -> jax.Array:
    """After the round that brought the local-step counter to ``steps``: is it a target-copy round?"""
    return (steps // config.local_steps) % config.target_rounds == 0


# --- SPO-DQN -------------------------------------------------------------------------------------
@schema.dataclass
class SPODQNConfig(SPOConfig):
    hidden: Hidden = Field((256, 256), description="hidden layer sizes of the Q-network (its MLP head with cnn)")
    # F * H = 500 updates at H = 10: plain DQN's target period
    target_rounds: schema.Int(ge=1, le=1_000_000) = Field(
        50, description="rounds F between two hard target copies (F counts rounds, not steps)")
    double_q: schema.Bool = Field(True, description="double Q target, actions selected by the last averaged network")
    dueling: schema.Bool = Field(False, description="dueling value/advantage head")
    cnn: schema.Bool = Field(False, description="Nature CNN torso for [84, 84, 4] frames")
    huber: schema.Bool = Field(True, description="Huber loss (delta 1) instead of the squared TD error")


@struct.dataclass
class SPODQNState:
    params: PyTree  # [R, ...]
    opt: PyTree  # [R, ...]
    target_params: PyTree  # one copy
    steps: jax.Array  # int32, local steps done (H per round; drives epsilon)


def make_spo_dqn(config: SPODQNConfig, spec: EnvSpec) -> Learner:
    q_net = QNetwork(config.hidden, spec.num_actions, dueling=config.dueling, cnn=config.cnn)
    base = dqn.make_dqn(dqn.DQNConfig(hidden=config.hidden, batch_size=config.batch_size, double_q=config.double_q,
                                      dueling=config.dueling, cnn=config.cnn, huber=config.huber), spec)
    r = config.replicas

    def init(key: Key, hparams: dqn.DQNHParams) -> SPODQNState:
        one = base.init(key, hparams)
        return SPODQNState(params=replicate(one.params, r), opt=replicate(one.opt, r), target_params=one.target_params,
                           steps=one.steps)

    def update_round(keys: Key, state: SPODQNState, batches: Transition, weights: jax.Array | None,
                              hp: dqn.DQNHParams):
        """A round; sample i's loss weighted by ``weights`` ``[H, B]`` (None: unweighted); also ``|Q(s, a) - y|``
        ``[H, B]``."""
        averaged = first(state.params)  # the last averaged online network: replicas agree at a round's start

        def step(carry, key, batch, w=None):
            del key
            params, opt = carry
            selector = params if config.mode == "dp" else averaged
            y = jax.lax.stop_gradient(dqn.td_target(q_net, selector, state.target_params, batch, hp.discount,
                                                    config.double_q))
            (loss, q), grads = jax.value_and_grad(dqn.q_loss, has_aux=True)(params, q_net, batch, y, config.huber,
                                                                            w)
            params, opt = adam_step(params, grad_sync(grads, config), opt, hp.lr)
            return (params, opt), {"loss": loss, "q_mean": q.mean(), "td_abs": jnp.abs(q - y)}

        (params, opt), metrics, td_abs = local_steps(step, (state.params, state.opt), keys, batches, r, weights)
        metrics["replica_spread"] = replica_spread(params)
        params, opt = sync(params, opt, config)
        steps = state.steps + config.local_steps
        target = select(is_copy_round(steps, config), first(params), state.target_params)
        new_state = SPODQNState(params=params, opt=opt, target_params=target, steps=steps)
        return new_state, {**metrics, "epsilon": dqn.epsilon(hp, steps)}, td_abs

    # The plain DQN's acting functions on replica 0, with the SPO step counter for epsilon.
    def as_dqn(state: SPODQNState) -> dqn.DQNState:
        return dqn.DQNState(params=first(state.params), target_params=state.target_params, opt=None, steps=state.steps)

    return Learner(init=init, act=lambda key, state, obs, hp: base.act(key, as_dqn(state), obs, hp),
                   policy=lambda state, obs: base.policy(as_dqn(state), obs),
                   step=ReplayStep(update_round, chunk=config.local_steps, banks=r))


# --- SPO-TD3 -------------------------------------------------------------------------------------
@schema.dataclass
class SPOTD3Config(SPOConfig):
    hidden: Hidden = Field((256, 256), description="hidden layer sizes of the actor and of each critic")
    naive: schema.Bool = Field(False, description="one phase: local actors follow local critics (diverging variant)")


@struct.dataclass
class SPOTD3HParams:
    actor_lr: jax.Array = hparam("actor Adam learning rate", gt=0, le=1)
    critic_lr: jax.Array = hparam("critic Adam learning rate", gt=0, le=1)
    discount: jax.Array = hparam("discount factor gamma", ge=0, le=1)
    exploration_noise: jax.Array = hparam("std of the Gaussian exploration noise (actions in [-1, 1])", ge=0)
    target_noise: jax.Array = hparam("std of the target policy smoothing noise", ge=0)
    noise_clip: jax.Array = hparam("clip of the target policy smoothing noise", ge=0)


def default_td3_hparams(config: SPOTD3Config | None = None) -> SPOTD3HParams:
    """TD3's defaults for the fields SPO-TD3 uses (no ``tau``: hard copies; no ``policy_delay``)."""
    del config
    d = td3.default_hparams()
    return SPOTD3HParams(actor_lr=d.actor_lr, critic_lr=d.critic_lr, discount=d.discount,
                         exploration_noise=d.exploration_noise, target_noise=d.target_noise, noise_clip=d.noise_clip)


@struct.dataclass
class SPOTD3State:
    actor: PyTree  # [R, ...]
    critic: PyTree  # [R, ...]
    actor_opt: PyTree  # [R, ...]
    critic_opt: PyTree  # [R, ...]
    target_actor: PyTree  # one copy
    target_critic: PyTree  # one copy
    steps: jax.Array  # int32, local steps done


def make_spo_td3(config: SPOTD3Config, spec: EnvSpec) -> Learner:
    """SPO around TD3's actor-critic ``Core``: its target, critic loss and per-sample actor losses in each local
    step, its acting functions on replica 0."""
    core = td3.td3_core(td3.TD3Config(hidden=config.hidden, batch_size=config.batch_size), spec)
    actor_net, critic_net = core.actor_net, core.critic_net
    r = config.replicas

    def init(key: Key, hparams: SPOTD3HParams) -> SPOTD3State:
        del hparams
        actor, critic = init_actor_critic(key, actor_net, critic_net, spec)
        return SPOTD3State(actor=replicate(actor, r), critic=replicate(critic, r),
                           actor_opt=replicate(adam_init(actor), r), critic_opt=replicate(adam_init(critic), r),
                           target_actor=actor, target_critic=critic, steps=jnp.zeros((), jnp.int32))

    def update_round(keys: Key, state: SPOTD3State, batches: Transition, weights: jax.Array | None,
                              hp: SPOTD3HParams):
        """A round; the critic loss of sample i weighted by ``weights`` ``[H, B]`` (None: unweighted; the actor
        loss never is); also the larger twin's ``|Q(s, a) - y|`` ``[H, B]`` from the critic phase."""
        def critic_step(critic, critic_opt, key, batch, w):
            # against the round's frozen targets (the state's target networks)
            (loss, q, y), grads = core.critic_grads(key, state.replace(critic=critic), batch, w, hp)
            critic, critic_opt = adam_step(critic, grad_sync(grads, config), critic_opt, hp.critic_lr)
            return critic, critic_opt, {"critic_loss": loss, "q_mean": q.mean(), "td_abs": jnp.abs(q - y).max(axis=0)}

        def actor_step(actor, actor_opt, critic, batch):
            (loss, _), grads = core.actor_grads(None, state.replace(actor=actor), critic, batch.obs, hp)
            actor, actor_opt = adam_step(actor, grad_sync(grads, config), actor_opt, hp.actor_lr)
            return actor, actor_opt, {"actor_loss": loss}

        if config.naive:
            def step(carry, key, batch, w=None):
                actor, critic, actor_opt, critic_opt = carry
                critic, critic_opt, m_critic = critic_step(critic, critic_opt, key, batch, w)
                actor, actor_opt, m_actor = actor_step(actor, actor_opt, critic, batch)  # the LOCAL critic
                return (actor, critic, actor_opt, critic_opt), {**m_critic, **m_actor}

            carry = (state.actor, state.critic, state.actor_opt, state.critic_opt)
            (actor, critic, actor_opt, critic_opt), metrics, td_abs = local_steps(step, carry, keys, batches, r,
                                                                                  weights)
            metrics["critic_spread"] = replica_spread(critic)
            critic, critic_opt = sync(critic, critic_opt, config)
        else:
            def c_step(carry, key, batch, w=None):
                critic, critic_opt, m = critic_step(*carry, key, batch, w)
                return (critic, critic_opt), m

            (critic, critic_opt), m_critic, td_abs = local_steps(c_step, (state.critic, state.critic_opt), keys,
                                                                 batches, r, weights)
            m_critic["critic_spread"] = replica_spread(critic)
            critic, critic_opt = sync(critic, critic_opt, config)
            averaged_critic = first(critic)

            def a_step(carry, key, batch):  # the same keys and batches, so the same replica slices
                del key  # no weights: importance weights correct the TD loss only
                actor, actor_opt, m = actor_step(*carry, averaged_critic, batch)
                return (actor, actor_opt), m

            (actor, actor_opt), m_actor, _ = local_steps(a_step, (state.actor, state.actor_opt), keys, batches, r)
            metrics = {**m_critic, **m_actor}
        metrics["actor_spread"] = replica_spread(actor)
        actor, actor_opt = sync(actor, actor_opt, config)
        steps = state.steps + config.local_steps
        copy = is_copy_round(steps, config)
        new_state = SPOTD3State(actor=actor, critic=critic, actor_opt=actor_opt, critic_opt=critic_opt,
                                target_actor=select(copy, first(actor), state.target_actor),
                                target_critic=select(copy, first(critic), state.target_critic), steps=steps)
        return new_state, metrics, td_abs

    def as_td3(state: SPOTD3State) -> td3.TD3State:
        return td3.TD3State(actor=first(state.actor), critic=None, target_actor=None, target_critic=None,
                            actor_opt=None, critic_opt=None, steps=state.steps)

    return Learner(init=init, act=lambda key, state, obs, hp: exploring(core)(key, as_td3(state), obs, hp),
                   policy=lambda state, obs: core.policy(as_td3(state), obs),
                   step=ReplayStep(update_round, chunk=config.local_steps, banks=r))


DQN_DEFINITION = LearnerDef(name="spo_dqn", config_cls=SPODQNConfig, hparams_cls=dqn.DQNHParams, make=make_spo_dqn,
                            default_hparams=dqn.default_hparams, action_kind="discrete",
                            fit=RunFit(specialize=specialize, check_env=check_cnn))
TD3_DEFINITION = LearnerDef(name="spo_td3", config_cls=SPOTD3Config, hparams_cls=SPOTD3HParams, make=make_spo_td3,
                            default_hparams=default_td3_hparams, action_kind="continuous",
                            fit=RunFit(specialize=specialize))
DEFINITIONS = (DQN_DEFINITION, TD3_DEFINITION)
