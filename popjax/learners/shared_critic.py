"""Population-coupled TD3: one shared critic, one actor per member (CEM-RL, DvD).

The fast-PBT paper (§4.2) makes the shared-critic update vectorizable: every step, each
member's sub-batch goes through its own actor (target actions, DPG) in parallel and the
critic loss is **averaged over the population**, so the critic gets one update per step,
exactly as many as in the sequential CEM-RL order, but each on ``pop * B`` samples.

The update is written for one member and vmapped with ``axis_name="pop"``; every reduction
over members is a collective (``lax.pmean`` of the critic gradients, loss, critic lr and
tau; ``lax.pmin`` of the policy delay; ``lax.all_gather`` of the DvD embeddings). Inside
``vmap`` the results of those collectives are unbatched, so the shared critic and its Adam
step are computed once, not ``pop`` times, and the same function can run under
``shard_map`` with the member axis split over devices: pass ``device_axis`` and the
collectives also run over it (every reduction then spans the whole population).

Everything else is popjax's TD3 through its actor-critic core (``td3.td3_core``: its ``critic_grads``,
``actor_grads``, ``act`` and ``policy``): one target ``y`` per member and step (one smoothing-noise
draw from the member's own key), DPG on ``obs`` through
critic 1 of the just-updated critic, all targets Polyak-averaged on policy steps only,
Adam with a traced per-member learning rate. Per-member hyperparameters are the usual
``TD3HParams`` with a leading ``[pop]`` axis; for the shared critic, whose update is
common to all members, ``critic_lr`` and ``tau`` are the population means and the target
critic moves on the policy steps of the smallest ``policy_delay`` (all equal in CEM-RL and
DvD, where this choice is moot).

The sequential CEM-RL order (one member after the other), the reference this step is
measured against, lives with the benchmarks (``popjax_bench.cemrl_order``): it is not a
training path.

DvD (``diversity`` given): the embedding of actor ``i`` is its actions on all ``pop * B``
observations of the step (``lax.all_gather``), the kernel is the RBF
``K_ij = exp(-||e_i - e_j||^2 / (2 * rbf_scale))``, and ``weight * (-log det(K + eps I))``
is added to each member's DPG loss (its gradient is added before the Adam step, as in the
fast-PBT release). The log-determinant is Cholesky-based with a larger-jitter fallback and
never produces NaN for finite actors, including identical ones (singular ``K``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from popjax.learners.base import adam_init, adam_step, polyak, select
from popjax.learners.td3 import TD3Config, TD3HParams, TD3State, td3_core
from popjax.population.tree import member
from popjax.precision import network_module
from popjax.types import EnvSpec, Key, Metrics, PyTree, Transition

AXIS = "pop"
FALLBACK_JITTER = 1e-3


@dataclasses.dataclass(frozen=True)
class DiversityConfig:
    """Static DvD settings (the weight itself is a traced argument of ``update``).

    Attributes:
      rbf_scale: ``K = exp(-D / (2 * rbf_scale))`` with ``D`` the squared embedding distance
        (0.5 with ``normalize``; the fast-PBT release uses 1.0 on the unnormalised ``D``).
      jitter: ``eps`` in ``log det(K + eps I)``; ``K`` has a unit diagonal.
      embedding_states: how many of the step's ``pop * B`` observations form the embedding
        (the first ones of the gathered batch); 0 = all of them (release).
      normalize: divide ``D`` by the embedding size, so ``rbf_scale`` is in units of squared
        action difference per coordinate. With the release's unnormalised ``D`` (sums over
        ``pop * B * |A|`` coordinates), ``K`` is ~identity unless actors nearly coincide,
        and the diversity gradient vanishes; normalising keeps it active at any batch size, so
        it is the default (``normalize=False, rbf_scale=1.0`` is the release's kernel).
    """

    rbf_scale: float = 0.5
    jitter: float = 1e-6
    embedding_states: int = 0
    normalize: bool = True


@struct.dataclass
class SharedCriticState:
    """Per-member actors (leading ``[pop]`` axis) and one shared critic (no member axis)."""

    actor: PyTree  # [pop, ...]
    target_actor: PyTree  # [pop, ...]
    actor_opt: PyTree  # [pop, ...]
    critic: PyTree
    target_critic: PyTree
    critic_opt: PyTree
    steps: jax.Array  # int32 scalar, shared critic updates done


class SharedCriticTD3(NamedTuple):
    """Shared-critic TD3: a ``PopulationLearner`` (see ``popjax.learners.base``) plus CEM-RL's hooks."""

    init: Callable  # (key, hparams[pop]) -> state
    update: Callable  # (keys[pop], state, batch[pop, B], hparams[pop], weight=0.) -> (state, metrics[pop])
    act: Callable  # (keys[pop], state, obs[pop, ...], hparams[pop]) -> actions with exploration noise
    policy: Callable  # (state, obs[pop, ...]) -> actions[pop, ...]
    member_axes: SharedCriticState  # True where a leaf has the member axis (actors), False (critic)
    train: Callable  # (keys[K, pop], state, batches[K, pop, B], hparams, weight=0.) -> (state, metrics[pop])
    critic_grads: Callable  # (keys[pop], state, batch[pop, B], hparams[pop]) -> (loss, grads, member_losses)
    load_actors: Callable  # (state, actors[pop]) -> state (fresh targets and Adam states)
    actor_apply: Callable  # (actor_params, obs) -> action (one member)
    critic_apply: Callable  # (critic_params, obs, action) -> q [2, ...] (twin critics)
    init_actor: Callable  # (key) -> one member's actor params
    pop_size: int


MEMBER_AXES = SharedCriticState(actor=True, target_actor=True, actor_opt=True, critic=False, target_critic=False,
                                critic_opt=False, steps=False)


# --- DvD: kernel and numerically safe log-determinant ------------------------------------------
def rbf_kernel(embeddings: jax.Array, rbf_scale: float = 1.0, normalize: bool = False) -> jax.Array:
    """``K_ij = exp(-||e_i - e_j||^2 / (2 rbf_scale))`` for embeddings ``[n, dim]`` (``/ dim`` if normalize).

    Distances come from explicit differences (not ``|a|^2 + |b|^2 - 2ab``), so ``K`` is
    exactly symmetric with an exactly unit diagonal, and the gradient at ``e_i == e_j`` is 0.
    """
    diff = embeddings[:, None, :] - embeddings[None, :, :]
    sq_dist = jnp.sum(diff * diff, axis=-1)
    if normalize:
        sq_dist = sq_dist / embeddings.shape[-1]
    return jnp.exp(-sq_dist / (2.0 * rbf_scale))


def _chol_logdet(matrix: jax.Array) -> jax.Array:
    return 2.0 * jnp.sum(jnp.log(jnp.diagonal(jnp.linalg.cholesky(matrix))))


def safe_logdet(kernel: jax.Array, jitter: float = 1e-6) -> jax.Array:
    """``log det(K + jitter I)`` by Cholesky, with a ``FALLBACK_JITTER`` retry; never NaN for finite K.

    If the first factorisation fails (float32 rounding can make a near-singular PSD kernel
    numerically indefinite; the Cholesky then has NaNs), the value is recomputed with the
    larger jitter. The "double where" feeds each branch a harmless identity when it is not
    the selected one, so no NaN can leak into the gradient through ``0 * NaN``.
    """
    n = kernel.shape[-1]
    eye = jnp.eye(n, dtype=kernel.dtype)
    kernel = 0.5 * (kernel + kernel.T)
    probe = jnp.linalg.cholesky(jax.lax.stop_gradient(kernel) + jitter * eye)
    ok = jnp.all(jnp.isfinite(probe))
    first = _chol_logdet(jnp.where(ok, kernel, eye) + jitter * eye)
    fallback = _chol_logdet(jnp.where(ok, eye, kernel) + max(FALLBACK_JITTER, jitter) * eye)
    return jnp.where(ok, first, fallback)


def diversity_loss(embeddings: jax.Array, rbf_scale: float = 1.0, jitter: float = 1e-6,
                   normalize: bool = False) -> jax.Array:
    """DvD's loss ``-log det(K + eps I)`` of the RBF kernel over embeddings ``[n, dim]``."""
    return -safe_logdet(rbf_kernel(embeddings, rbf_scale, normalize), jitter)


def mean_pairwise_distance(embeddings: jax.Array) -> jax.Array:
    """Mean over pairs ``i < j`` of the RMS difference ``sqrt(||e_i - e_j||^2 / dim)`` (a metric, no grad)."""
    n, dim = embeddings.shape
    if n < 2:
        return jnp.zeros((), embeddings.dtype)
    diff = embeddings[:, None, :] - embeddings[None, :, :]
    d = jnp.sum(diff * diff, axis=-1) / dim
    iu = jnp.triu_indices(n, 1)
    return jnp.mean(jnp.sqrt(d[iu]))


# --- reductions over the population --------------------------------------------------------------
class Collectives(NamedTuple):
    """Reductions over the whole population from inside the member vmap (axis ``pop``), and over the devices of
    per-device programs that each hold ``pop_size`` members (equal shares: the mean of means is the mean)."""

    pmean: Callable[[PyTree], PyTree]
    pmin: Callable[[jax.Array], jax.Array]
    gather: Callable[[jax.Array], jax.Array]  # every member's x, ``[all members, ...]`` in global member order
    member_index: Callable[[], jax.Array]  # this member's global index


def population_collectives(pop_size: int, device_axis: str | None = None) -> Collectives:
    def over_devices(reduce, x, **kw):
        return x if device_axis is None else reduce(x, device_axis, **kw)

    def member_index():
        index = jax.lax.axis_index(AXIS)
        return index if device_axis is None else jax.lax.axis_index(device_axis) * pop_size + index

    return Collectives(
        pmean=lambda x: over_devices(jax.lax.pmean, jax.lax.pmean(x, AXIS)),
        pmin=lambda x: over_devices(jax.lax.pmin, jax.lax.pmin(x, AXIS)),
        gather=lambda x: over_devices(jax.lax.all_gather, jax.lax.all_gather(x, AXIS), tiled=True),
        member_index=member_index)


def diversity_term(actor_net, collectives: Collectives, diversity: DiversityConfig, actor: PyTree,
                   obs_all: jax.Array):
    """A member's share of DvD: (loss, d loss / d own actor, distance metric); the loss is over every actor's
    embedding (its actions on ``obs_all``), the gradient flows into the member's own actor only."""
    emb, pullback = jax.vjp(lambda p: actor_net.apply(p, obs_all).reshape(-1), actor)
    embeddings = collectives.gather(emb)  # [pop, S * A], identical for every member
    loss, grad_emb = jax.value_and_grad(diversity_loss)(embeddings, diversity.rbf_scale, diversity.jitter,
                                                        diversity.normalize)
    (grads,) = pullback(grad_emb[collectives.member_index()])
    return loss, grads, mean_pairwise_distance(jax.lax.stop_gradient(embeddings))


# --- the learner --------------------------------------------------------------------------------
def make_shared_critic_td3(config: TD3Config, spec: EnvSpec, pop_size: int,
                           diversity: DiversityConfig | None = None,
                           device_axis: str | None = None) -> SharedCriticTD3:
    """Builds the shared-critic TD3 population functions.

    Args:
      config: TD3 network sizes (``hidden``) and batch size.
      spec: environment spec (continuous actions).
      pop_size: number of actors this program holds (the members that receive gradient steps).
      diversity: DvD settings; None compiles no diversity term (CEM-RL).
      device_axis: the mesh axis of per-device programs that each hold ``pop_size`` of the actors
        (``--parallel pmap``); None when one program holds them all.
    """
    if spec.discrete:
        raise ValueError("the shared-critic TD3 needs continuous actions")
    # Network passes (rounded under matmul_precision bf16); DvD's kernel and Cholesky are not.
    core = td3_core(config, spec, module=network_module)
    actor_net, critic_net = core.actor_net, core.critic_net
    obs0 = jnp.zeros((1,) + spec.obs_shape, jnp.float32)
    act0 = jnp.zeros((1, spec.action_dim), jnp.float32)
    collectives = population_collectives(pop_size, device_axis)  # every reduction spans the population
    pmean, pmin, gather = collectives.pmean, collectives.pmin, collectives.gather

    def member_view(actor, target_actor=None, critic=None, target_critic=None) -> TD3State:
        """The networks of one member (its actor, the shared critic) as the TD3 state the core reads."""
        return TD3State(actor=actor, critic=critic, target_actor=target_actor, target_critic=target_critic,
                        actor_opt=None, critic_opt=None, steps=None)

    def init_actor(key: Key) -> PyTree:
        return actor_net.init(key, obs0)

    def init(key: Key, hparams: TD3HParams) -> SharedCriticState:
        del hparams
        key_actors, key_critic = jax.random.split(key)
        actors = jax.vmap(init_actor)(jax.random.split(key_actors, pop_size))
        critic = critic_net.init(key_critic, obs0, act0)
        return SharedCriticState(actor=actors, target_actor=actors, actor_opt=jax.vmap(adam_init)(actors),
                                 critic=critic, target_critic=critic, critic_opt=adam_init(critic),
                                 steps=jnp.zeros((), jnp.int32))

    def load_actors(state: SharedCriticState, actors: PyTree) -> SharedCriticState:
        """New actors (CEM-RL samples): target := actor and a fresh Adam state, as in the release."""
        return state.replace(actor=actors, target_actor=jax.tree.map(jnp.copy, actors),
                             actor_opt=jax.vmap(adam_init)(actors))

    def member_critic_grads(key, target_actor, batch, hp, critic, target_critic):
        """Member's TD loss on its own sub-batch (own target actor and noise key) and the
        population mean of loss and gradient (= loss and gradient of the mean over all pop*B
        samples, the sub-batches having equal sizes)."""
        (member_loss, q, _), grads = core.critic_grads(key, member_view(None, target_actor, critic, target_critic),
                                                       batch, None, hp)
        return member_loss, q, pmean(member_loss), pmean(grads)

    def member_step(key, actor, target_actor, actor_opt, batch, hp, critic, target_critic, critic_opt, steps,
                    weight):
        # 1. Shared critic, updated once with the population-mean gradient.
        member_loss, q, critic_loss, grads = member_critic_grads(key, target_actor, batch, hp, critic,
                                                                 target_critic)
        new_critic, new_critic_opt = adam_step(critic, grads, critic_opt, pmean(hp.critic_lr))
        critic_policy_step = (steps + 1) % pmin(hp.policy_delay) == 0
        moved = polyak(target_critic, new_critic, pmean(hp.tau))
        new_target_critic = select(critic_policy_step, moved, target_critic)

        # 2. Actors: DPG through the just-updated shared critic (+ DvD's diversity gradient).
        (actor_loss, _), actor_grads = core.actor_grads(None, member_view(actor), new_critic, batch.obs, hp)
        metrics = {"critic_loss": critic_loss, "member_critic_loss": member_loss, "actor_loss": actor_loss,
                   "q_mean": q.mean()}
        if diversity is not None:
            obs_all = gather(batch.obs).reshape((-1,) + spec.obs_shape)
            if diversity.embedding_states:
                obs_all = obs_all[: diversity.embedding_states]
            div_loss, div_grads, distance = diversity_term(actor_net, collectives, diversity, actor, obs_all)
            actor_grads = jax.tree.map(lambda g, d: g + weight * d, actor_grads, div_grads)
            metrics.update(diversity_loss=div_loss, diversity_weight=jnp.asarray(weight, jnp.float32),
                           embedding_distance=distance)
        new_actor, new_actor_opt = adam_step(actor, actor_grads, actor_opt, hp.actor_lr)
        is_policy_step = (steps + 1) % hp.policy_delay == 0
        new_actor, new_actor_opt = select(is_policy_step, (new_actor, new_actor_opt), (actor, actor_opt))
        new_target_actor = select(is_policy_step, polyak(target_actor, new_actor, hp.tau), target_actor)
        critic_part = (new_critic, new_critic_opt, new_target_critic)
        return critic_part, (new_actor, new_target_actor, new_actor_opt), metrics

    v_critic_grads = jax.vmap(member_critic_grads, in_axes=(0, 0, 0, 0, None, None),
                              out_axes=(0, 0, None, None), axis_name=AXIS)

    def critic_grads(keys: Key, state: SharedCriticState, batch: Transition, hparams: TD3HParams):
        """``(population_loss, population_grads, member_losses [pop])`` of the shared critic (no update)."""
        member_losses, _, loss, grads = v_critic_grads(keys, state.target_actor, batch, hparams, state.critic,
                                                       state.target_critic)
        return loss, grads, member_losses

    v_member_step = jax.vmap(member_step, in_axes=(0, 0, 0, 0, 0, 0, None, None, None, None, None),
                             out_axes=(None, 0, 0), axis_name=AXIS)

    def update(keys: Key, state: SharedCriticState, batch: Transition, hparams: TD3HParams,
               weight: jax.Array | float = 0.0) -> tuple[SharedCriticState, Metrics]:
        """One vectorized step: ``keys [pop]``, ``batch [pop, B, ...]``; ``weight`` = DvD weight (traced)."""
        critic_part, actor_part, metrics = v_member_step(
            keys, state.actor, state.target_actor, state.actor_opt, batch, hparams, state.critic,
            state.target_critic, state.critic_opt, state.steps, jnp.asarray(weight, jnp.float32))
        critic, critic_opt, target_critic = critic_part
        actor, target_actor, actor_opt = actor_part
        new_state = SharedCriticState(actor=actor, target_actor=target_actor, actor_opt=actor_opt,
                                      critic=critic, target_critic=target_critic, critic_opt=critic_opt,
                                      steps=state.steps + 1)
        return new_state, metrics

    def train(keys: Key, state: SharedCriticState, batches: Transition, hparams: TD3HParams,
              weight: jax.Array | float = 0.0) -> tuple[SharedCriticState, Metrics]:
        """``K`` vectorized steps (scan) over ``keys [K, pop]``, ``batches [K, pop, B, ...]``; mean metrics"""

        def body(state, xs):
            step_keys, batch = xs
            return update(step_keys, state, batch, hparams, weight)

        state, metrics = jax.lax.scan(body, state, (keys, batches))
        return state, jax.tree.map(lambda m: m.mean(axis=0), metrics)

    def policy(state: SharedCriticState, obs: jax.Array) -> jax.Array:
        return jax.vmap(lambda actor, o: core.policy(member_view(actor), o))(state.actor, obs)

    def act(keys: Key, state: SharedCriticState, obs: jax.Array, hparams: TD3HParams) -> jax.Array:
        """Exploration actions; ``keys [pop]``, one per member (its noise does not depend on the others)."""
        return jax.vmap(lambda k, actor, o, hp: core.act(k, member_view(actor), o, hp).action)(
            keys, state.actor, obs, hparams)

    return SharedCriticTD3(init=init, update=update, act=act, policy=policy, member_axes=MEMBER_AXES, train=train,
                           critic_grads=critic_grads, load_actors=load_actors, actor_apply=actor_net.apply,
                           critic_apply=critic_net.apply, init_actor=init_actor, pop_size=pop_size)


def from_member_states(td3_states) -> SharedCriticState:
    """A shared-critic state from stacked single-agent ``TD3State``s; the critic of member 0 is shared."""
    return SharedCriticState(actor=td3_states.actor, target_actor=td3_states.target_actor,
                             actor_opt=td3_states.actor_opt, critic=member(td3_states.critic, 0),
                             target_critic=member(td3_states.target_critic, 0),
                             critic_opt=member(td3_states.critic_opt, 0),
                             steps=td3_states.steps[0])
