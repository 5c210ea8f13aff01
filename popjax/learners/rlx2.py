"""RLx2 (Tan et al., ICLR 2023): TD3 and SAC trained sparse from scratch, with per-member masks under vmap.

Every weight matrix of the actor and of both Q-nets has a bool mask in the state (biases stay dense). Weights
are stored already zeroed where masked and the forward uses them as they are, so the dense gradient ``dL/dW``
exists on inactive links for growing; the optimizer sees only the masked gradient, the weights are re-masked
after each Adam step (Adam's moments of inactive links decay under zero gradients, as in the released code), and
the targets are re-masked after every Polyak average.

Per-layer sparsities follow the Erdos-Renyi allocation of each network's sparsity (the two Q-nets are allocated
jointly); the sparsities and the drop fraction are per-member hyperparameters, so a sweep or PBT may give members
different ones. Masks start as the largest ``|w|`` of the fresh dense init (the released code; ``init_mask:
random`` keeps a uniformly random support).

Topology evolution (RigL) is the learner's ``maintain``: the drivers run it as its own compiled call every
``dst_interval`` critic updates, never inside the K-step scan. It takes a fresh batch, drops the smallest active
``|w|`` and grows the largest dense ``|dL/dW|`` (``topology: set`` grows at random, ``static`` never evolves)
with the cosine-annealed fraction, and takes no optimizer step. The critic evolves at every call, the actor every
``policy_delay``-th call for TD3 (its counter counts actor updates; SAC updates its actor at every step), neither
after ``dst_end``. A member whose sparsity
hyperparameter changed (PBT explore) gets magnitude masks of its new sizes at that call instead.

Delayed multi-step target: 1-step TD3 targets for the first ``n_step_start`` (T0) critic updates, then the
uncorrected ``n_step``-step target (no importance weights): rewards summed up to the first episode end inside the
window, no bootstrap past a termination, a bootstrap from the truncating step's ``next_obs``. The learner declares
``window = n_step``, so drivers sample windows of one env's consecutive transitions from the buffer.

Dynamic-capacity buffer: every ``buffer_check_interval`` env steps, the policy distance on the oldest
``buffer_oldest`` transitions (half the mean squared difference between today's policy and the stored action)
above ``buffer_threshold`` drops the oldest 10 % of the replay, once per check, while above ``buffer_min``; the
run's ``buffer_size`` is the cap (as the released code).

popjax deviations, documented: the topology step is an extra iteration after the ``dst_interval``-th update
rather than replacing that update's optimizer step, and it masks the targets with the new masks at once. The
dense baseline is the ``td3`` learner, and "Tiny" is ``td3`` with ``tiny_hidden`` units.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from pydantic import Field

from popjax import schema
from popjax.config import ConfigError
from popjax.learners import sac, td3
from popjax.learners.actor_critic import Core, Steps
from popjax.learners.base import (
    BatchSize,
    Hidden,
    Learner,
    LearnerDef,
    Periodic,
    ReplayShrink,
    ReplayStep,
    Report,
    RunFit,
    adam_step,
    init_actor_critic,
    one_step_chunk,
    scalar,
    without_extras,
)
from popjax.learners.multistep import at_step, window_steps
from popjax.networks import sparse
from popjax.population.hparams import extend, hparam
from popjax.types import EnvSpec, Key, PyTree, Transition, Windows


# --- config and hyperparameters ------------------------------------------------------------------
@schema.dataclass
class RLx2Config:
    hidden: Hidden = Field((256, 256), description="hidden layer sizes of the actor and of each critic")
    batch_size: BatchSize = Field(256, description="transitions per gradient step (the run's batch_size)")
    topology: schema.OneOf(("rigl", "set", "static")) = Field(
        "rigl", description="rigl: grow by dense |gradient|; set: grow at random; static: masks never change")
    dst_interval: schema.Int(ge=1, le=100_000_000) = Field(
        10_000, description="critic updates between two topology steps (the paper's 1e4; rescale with the run)")
    dst_end: schema.Int(ge=1, le=2_000_000_000) | None = Field(
        None, description="updates after which the topology stops evolving (default: the run's training updates)")
    forbid_regrow: schema.Bool = Field(False, description="never regrow a link in the step that dropped it (the "
                                                          "paper's Alg. 2; the released code allows it)")
    n_step: schema.Int(ge=1, le=1_000) = Field(3, description="steps n of the delayed multi-step TD target")
    n_step_start: schema.Int(ge=0, le=2_000_000_000) | None = Field(
        None, description="critic updates with 1-step targets before n-step ones (T0; default: a tenth of the run's "
                          "training updates, the paper's 3e5 of 3e6)")
    dynamic_buffer: schema.Bool = Field(True, description="shrink the replay while the current policy is far from "
                                                          "the one that collected its oldest transitions")
    buffer_check_interval: schema.Int(ge=1, le=2_000_000_000) = Field(
        10_000, description="env steps between two checks of the dynamic buffer (the paper's 1e4)")
    buffer_threshold: schema.Float(gt=0) = Field(
        0.2, description="policy distance D0 above which the oldest 10 % of the replay are dropped")
    buffer_min: schema.Int(ge=0) = Field(100_000, description="transitions the dynamic buffer never shrinks below "
                                                              "(the paper's TD3 1e5; rescale with the run)")
    buffer_oldest: schema.Int(ge=1) | None = Field(
        None, description="oldest transitions the policy distance is measured on (default 8 x batch_size)")
    buffer_size: schema.Int(ge=1) = Field(1_000_000, description="the run's buffer_size (the dynamic buffer's cap)")
    init_mask: schema.OneOf(("magnitude", "random")) = Field(
        "magnitude", description="initial support: largest |w| of the dense init (released code) or random")
    total_env_steps: schema.Int(ge=1) = Field(20_000, description="the run's total_env_steps")
    warmup_steps: schema.Int(ge=0) = Field(0, description="the run's warmup_steps")
    update_ratio: schema.Float(gt=0) = Field(1.0, description="the run's update_ratio")

    @property
    def evolution_end(self) -> int:
        """``dst_end``, or the run's training updates (the paper: the whole run after warm-up)."""
        if self.dst_end is not None:
            return self.dst_end
        return max(1, math.floor((self.total_env_steps - self.warmup_steps) * self.update_ratio))

    @property
    def oldest_checked(self) -> int:
        """``buffer_oldest``, or 8 x batch_size, at most the buffer."""
        return min(self.buffer_oldest or 8 * self.batch_size, self.buffer_size)

    @property
    def multi_step_start(self) -> int:
        """``n_step_start``, or a tenth of the run's training updates."""
        return self.n_step_start if self.n_step_start is not None else self.evolution_end // 10



@schema.dataclass
class RLx2TD3Config(RLx2Config):
    fixed_policy_delay: schema.Int(ge=1, le=1_000) | None = Field(
        None, description="a policy delay every member keeps (set by popjax when the run allows it)")


@struct.dataclass
class SparsityHParams:
    actor_sparsity: jax.Array = hparam("fraction of the actor's weights that is masked", ge=0, lt=1)
    critic_sparsity: jax.Array = hparam("fraction of the critic's (both Q-nets') weights that is masked", ge=0, lt=1)
    drop_fraction: jax.Array = hparam("initial drop fraction zeta0 of a topology step (cosine-annealed)", gt=0, lt=1)


@struct.dataclass
class RLx2TD3HParams(SparsityHParams, td3.TD3HParams):
    """TD3's hyperparameters and the sparsities."""


@struct.dataclass
class RLx2SACHParams(SparsityHParams, sac.SACHParams):
    """SAC's hyperparameters and the sparsities."""


def sparsity_defaults() -> dict[str, jax.Array]:
    """90 % sparse actor and critic, zeta0 = 0.5 (a function: importing popjax must not start JAX)."""
    return {"actor_sparsity": scalar(0.9), "critic_sparsity": scalar(0.9), "drop_fraction": scalar(0.5)}


def default_hparams(config: RLx2TD3Config | None = None) -> RLx2TD3HParams:
    """TD3's defaults, 90 % sparse actor and critic, zeta0 = 0.5 (the released code's)."""
    return extend(td3.default_hparams(), RLx2TD3HParams, **sparsity_defaults())


def default_sac_hparams(config: RLx2Config | None = None) -> RLx2SACHParams:
    """SAC's defaults, 90 % sparse actor and critic, zeta0 = 0.5."""
    return extend(sac.default_hparams(), RLx2SACHParams, **sparsity_defaults())


@struct.dataclass
class RLx2State:
    inner: Any  # the TD3State or SACState, weights already zeroed where masked
    actor_mask: PyTree  # bool, shaped like the actor params (biases all True)
    critic_mask: PyTree


# --- masks ----------------------------------------------------------------------------------------
def layer_counts(params: PyTree, sparsity) -> jax.Array:
    """Active weights per kernel of ``params`` under the ER allocation of ``sparsity``."""
    shapes = sparse.kernel_shapes(params)
    return sparse.kept_counts(shapes, sparse.er_densities(shapes, sparsity))


def initial_masks(key: Key, params: PyTree, sparsity, init_mask: str) -> PyTree:
    counts = layer_counts(params, sparsity)
    if init_mask == "random":
        return sparse.random_masks(key, params, counts)
    return sparse.magnitude_masks(params, counts)


def masked(step, mask: PyTree):
    """An optimizer step that sees only the masked gradient and leaves the weights masked."""

    def run(params, grads, opt_state, lr):
        params, opt_state = step(params, sparse.apply_masks(grads, mask), opt_state, lr)
        return sparse.apply_masks(params, mask), opt_state

    return run


def tiny_hidden(obs_dim: int, action_dim: int, layers: int, sparsity: float) -> int:
    """Width of a dense actor with ``layers`` hidden layers holding as many weights as a ``sparsity`` sparse
    256-wide one (the paper's "Tiny" baseline)."""
    target = (1 - sparsity) * sparse.model_size(_mlp_shapes(obs_dim, action_dim, layers, 256), [1.0] * (layers + 1))
    width = 1
    while sparse.model_size(_mlp_shapes(obs_dim, action_dim, layers, width + 1), [1.0] * (layers + 1)) <= target:
        width += 1
    return width


def _mlp_shapes(inputs: int, outputs: int, layers: int, width: int) -> list[tuple[int, int]]:
    return [(inputs, width)] + [(width, width)] * (layers - 1) + [(width, outputs)]


# --- delayed multi-step targets -------------------------------------------------------------------
def multi_step_target(key: Key, actor_net, critic_net, target_actor: PyTree, target_critic: PyTree,
                      windows: Windows, hp, steps_used: jax.Array) -> jax.Array:
    """The uncorrected n-step TD3 target (Tan et al. 2023, Eq. 3) over windows ``[B, n]``, using the first
    ``steps_used`` steps (1 before T0).

    Rewards add up to the first step whose episode ended (inclusive); the target bootstraps from that step's
    ``next_obs`` with ``gamma**m`` (m = steps used) unless it was a true termination, with the clipped-noise
    target action and the min over the twin target critics (``td3.target_q``).
    """
    used, m, last = window_steps(windows, steps_used)
    k = jnp.arange(used.shape[1])
    returns = jnp.sum(jnp.where(used, hp.discount ** k * windows.transitions.reward, 0.0), axis=1)
    return td3.target_q(key, actor_net, critic_net, target_actor, target_critic, last.replace(reward=returns),
                        hp.replace(discount=hp.discount ** m))


def sac_multi_step_target(key: Key, sample_fn, target_critic: PyTree, critic_net, actor: PyTree, windows: Windows,
                          alpha: jax.Array, hp, steps_used: jax.Array) -> jax.Array:
    """The uncorrected n-step SAC target (Tan et al. 2023, App. B) over windows ``[B, n]``.

    ``sum_k gamma^k r_k scale - alpha sum_{k < m-1} gamma^(k+1) log pi(a_k|s'_k) + gamma^m (1 - terminated)
    (min_i Q'_i(s'_L, a_L) - alpha log pi(a_L|s'_L))`` with ``a_k ~ pi(.|s'_k)`` from the online actor at every
    next state and L = m - 1 the bootstrap step: with m = 1 it is SAC's one-step target.
    """
    used, m, last = window_steps(windows, steps_used)
    n = used.shape[1]
    k = jnp.arange(n)
    actions, log_probs = sample_fn(key, actor, windows.transitions.next_obs)  # [B, n, A], [B, n]
    returns = jnp.sum(jnp.where(used, hp.discount ** k * windows.transitions.reward, 0.0), axis=1) * hp.reward_scale
    inner = used & (k < (m - 1)[:, None])  # next states inside the window that are not the bootstrap one
    entropy = jnp.sum(jnp.where(inner, hp.discount ** (k + 1) * log_probs, 0.0), axis=1)
    last_action, last_log_prob = at_step(actions, m - 1), at_step(log_probs, m - 1)
    next_q = critic_net.apply(target_critic, last.next_obs, last_action).min(axis=0)
    y = returns - alpha * entropy + hp.discount ** m * (1.0 - last.terminated) * (next_q - alpha * last_log_prob)
    return jax.lax.stop_gradient(y)


# --- the learner's pieces ------------------------------------------------------------------------
def dense_grads(core: Core, key: Key, inner, batch, hp, made: Steps):
    """Dense ``(actor, critic)`` gradients of the core's losses at ``inner``, both through ``inner.critic`` (the
    critic's loss alone for the critic: the released SAC code also leaks the actor loss's gradient into it one step
    before a topology step; popjax does not)."""
    _, critic = core.critic_grads(key, inner, batch, None, hp, made)
    _, actor = core.actor_grads(key, inner, inner.critic, made.sample(batch).obs, hp, made)
    return actor, critic


def evolve_net(params, mask, scores, sparsity, fraction, due, forbid_regrow: bool):
    """One network's topology step: evolve, or redraw magnitude masks when the sparsity changed."""
    counts = layer_counts(params, sparsity)
    sizes = jnp.asarray([i * o for i, o in sparse.kernel_shapes(params)], jnp.int32)
    evolving = counts < sizes
    evolved = sparse.evolve(params, mask, scores, fraction, evolving & due, forbid_regrow)
    redrawn_mask = sparse.magnitude_masks(params, counts)
    redrawn = (sparse.apply_masks(params, redrawn_mask), redrawn_mask)
    changed = jnp.any(sparse.active_counts(mask) != counts)
    return jax.tree.map(lambda a, b: jnp.where(changed, a, b), redrawn, evolved)


def replay_shrink(config: RLx2Config, core: Core) -> Callable:
    """RLx2's dynamic buffer (``ReplayShrink.run``) for the core's policy."""

    def run(state: RLx2State, oldest: Transition, valid: jax.Array, size: jax.Array, hp):
        """``(rows to drop, distance)``: the oldest 10 % when the policy distance exceeds D0 above ``buffer_min``.

        Distance: half the mean squared difference between today's policy action (SAC: ``tanh`` of its mean) and
        the stored action on the oldest transitions (actions in [-1, 1], so already normalised by the max
        action). The paper stores the pre-noise policy action; popjax stores the executed one, whose exploration
        noise adds about ``exploration_noise**2 / 2`` (TD3: 0.005 at the default 0.1, against D0 = 0.2) - a
        documented deviation.
        """
        del hp
        squared = jnp.mean((core.policy(state.inner, oldest.obs) - oldest.action) ** 2, axis=-1)
        distance = 0.5 * jnp.sum(jnp.where(valid, squared, 0.0)) / jnp.maximum(jnp.sum(valid), 1)
        drop = (distance > config.buffer_threshold) & (size > config.buffer_min)
        return jnp.where(drop, size // 10, 0), distance

    return run


# --- the learner ----------------------------------------------------------------------------------
def masked_target_fn(tree_mask: PyTree):
    return lambda tree: sparse.apply_masks(tree, tree_mask)


def make_rlx2(config: RLx2Config, spec: EnvSpec, core: Core, n_step_target: Callable) -> Learner:
    """RLx2 around an actor-critic ``Core``: masked steps and targets, and ``n_step_target(key, state, windows, hp,
    steps_used) -> y``, the core's multi-step TD target."""
    delay = getattr(config, "fixed_policy_delay", None)
    targets = {target: f"{online}_mask" for target, online in core.targets.items()}  # the mask each target shares

    def made_steps(state: RLx2State) -> Steps:
        made = Steps(critic=masked(adam_step, state.critic_mask), actor=masked(adam_step, state.actor_mask),
                     critic_targets=masked_target_fn(state.critic_mask),
                     actor_targets=masked_target_fn(state.actor_mask))
        if config.n_step == 1:
            return made
        # Multi-step from T0 critic updates on (the counter of the update being made: steps before it).
        used = jnp.where(state.inner.steps >= config.multi_step_start, config.n_step, 1)
        return dataclasses.replace(made, target=lambda key, inner, windows, hp: n_step_target(key, inner, windows, hp,
                                                                                            used),
                                   sample=Windows.first)

    def init(key: Key, hp) -> RLx2State:
        key_net, key_actor, key_critic = jax.random.split(key, 3)
        inner = core.init(key_net, hp)
        actor_mask = initial_masks(key_actor, inner.actor, hp.actor_sparsity, config.init_mask)
        critic_mask = initial_masks(key_critic, inner.critic, hp.critic_sparsity, config.init_mask)
        actor = sparse.apply_masks(inner.actor, actor_mask)
        critic = sparse.apply_masks(inner.critic, critic_mask)
        # Targets start from the masked online networks (the released code copies them before masking).
        online = {"target_actor": actor, "target_critic": critic}
        inner = inner.replace(actor=actor, critic=critic, **{t: online[t] for t in targets})
        return RLx2State(inner=inner, actor_mask=actor_mask, critic_mask=critic_mask)

    def update(keys: Key, state: RLx2State, batches: Transition | Windows, weights: None, hp):
        """One update (chunk 1) or a fixed-delay chunk; unweighted (no prioritized replay: windows need uniform)."""
        del weights
        steps = made_steps(state)
        if delay:
            update = functools.partial(core.update_chunk, steps=steps)
        else:
            update = one_step_chunk(functools.partial(core.update, steps=steps))
        inner, metrics, _ = update(keys, state.inner, batches, None, hp)
        return state.replace(inner=inner), metrics, None

    def grow_scores(key: Key, state: RLx2State, batch: Transition | Windows, hp):
        """``(actor, critic)`` scores of the inactive links: dense |grad| (RigL) or uniform noise (SET)."""
        inner = state.inner
        if config.topology == "set":
            key_actor, key_critic = jax.random.split(key)
            return sparse.uniform_like(key_actor, inner.actor), sparse.uniform_like(key_critic, inner.critic)
        actor_grad, critic_grad = dense_grads(core, key, inner, batch, hp, made_steps(state))
        return jax.tree.map(jnp.abs, actor_grad), jax.tree.map(jnp.abs, critic_grad)

    def maintain(key: Key, state: RLx2State, batch: Transition | Windows, hp):
        """The topology step (see the module docstring); no optimizer step, no counter advances."""
        inner = state.inner
        actor_scores, critic_scores = grow_scores(key, state, batch, hp)
        critic_fraction = sparse.drop_fraction(inner.steps, hp.drop_fraction, config.evolution_end)
        actor_fraction = sparse.drop_fraction(inner.steps // core.actor_period(hp), hp.drop_fraction,
                                              config.evolution_end)
        # The actor's counter counts actor updates: it reaches a multiple of dst_interval every d-th call.
        actor_due = (inner.steps // config.dst_interval) % core.actor_period(hp) == 0
        critic, critic_mask = evolve_net(inner.critic, state.critic_mask, critic_scores, hp.critic_sparsity,
                                         critic_fraction, jnp.asarray(True), config.forbid_regrow)
        actor, actor_mask = evolve_net(inner.actor, state.actor_mask, actor_scores, hp.actor_sparsity,
                                       actor_fraction, actor_due, config.forbid_regrow)
        masks = {"actor_mask": actor_mask, "critic_mask": critic_mask}
        # Targets share the online masks at once (the released code masks them at their next Polyak average).
        masked_targets = {t: sparse.apply_masks(getattr(inner, t), masks[m]) for t, m in targets.items()}
        state = RLx2State(inner=inner.replace(actor=actor, critic=critic, **masked_targets), **masks)
        return state, {"critic_drop_fraction": critic_fraction,
                       "actor_drop_fraction": jnp.where(actor_due, actor_fraction, 0.0)}

    def policy(state: RLx2State, obs: jax.Array) -> jax.Array:
        return core.policy(state.inner, obs)

    def act(key: Key, state: RLx2State, obs: jax.Array, hp) -> jax.Array:
        return core.act(key, state.inner, obs, hp).action

    if config.n_step > spec.max_episode_steps:
        raise ConfigError(f"learner_config.n_step: {config.n_step} is longer than the episode limit of {spec.name} "
                          f"(allowed: at most {spec.max_episode_steps})")
    evolves = config.topology != "static"
    return Learner(init=init, act=without_extras(act), policy=policy,
                   step=ReplayStep(update, chunk=delay or 1, window=config.n_step, priorities=False),
                   maintain=Periodic(config.dst_interval, maintain) if evolves else None,
                   shrink=(ReplayShrink(config.buffer_check_interval, config.oldest_checked,
                                        replay_shrink(config, core))
                           if config.dynamic_buffer else None))


def make_rlx2_td3(config: RLx2TD3Config, spec: EnvSpec) -> Learner:
    core = td3.td3_core(config, spec)

    def n_step_target(key, inner, windows, hp, used):
        return multi_step_target(key, core.actor_net, core.critic_net, inner.target_actor, inner.target_critic,
                                 windows, hp, used)

    return make_rlx2(config, spec, core, n_step_target)


def make_rlx2_sac(config: RLx2Config, spec: EnvSpec) -> Learner:
    core = sac.sac_core(config, spec)
    sample = functools.partial(sac.sample_action, core.actor_net)

    def n_step_target(key, inner, windows, hp, used):
        return sac_multi_step_target(key, sample, inner.target_critic, core.critic_net, inner.actor, windows,
                                     jnp.exp(inner.log_alpha), hp, used)

    return make_rlx2(config, spec, core, n_step_target)


# --- accounting and registry ---------------------------------------------------------------------
def make_costs(kind: str):
    """``costs(config, spec, hparams)``: model sizes and FLOPs of each member against dense (Tan et al. 2023,
    App. C.3).

    Sizes count weights (no biases) of the actor and both Q-nets. Training FLOPs per update: TD3 ``B (F_A + 8 F_C)
    + B (3 F_A + F_C) / d``, SAC ``B (2 F_A + 8 F_C) + B (3 F_A + 2 F_C)`` (F_C one Q-net's forward); inference
    FLOPs are one actor forward. A ``*_reduction`` is dense / sparse (the paper's "x" figures).
    """
    core_fn = {"td3": td3.td3_core, "sac": sac.sac_core}[kind]

    def costs(config: RLx2Config, spec: EnvSpec, hparams) -> dict[str, list[float]]:
        core = core_fn(config, spec)
        actor_params, critic_params = jax.eval_shape(
            lambda: init_actor_critic(jax.random.key(0), core.actor_net, core.critic_net, spec))
        actor_shapes, critic_shapes = sparse.kernel_shapes(actor_params), sparse.kernel_shapes(critic_params)
        q_layers = len(critic_shapes) // 2
        rows: dict[str, list[float]] = {name: [] for name in (
            "actor_weights", "critic_weights", "size_reduction", "train_flops", "train_flops_reduction",
            "inference_flops", "inference_flops_reduction")}

        def measures(actor_dens, critic_dens, delay):
            f_a = sparse.forward_flops(actor_shapes, actor_dens)
            f_q = sparse.forward_flops(critic_shapes[:q_layers], critic_dens[:q_layers])
            size = sparse.model_size(actor_shapes, actor_dens) + sparse.model_size(critic_shapes, critic_dens)
            return size, sparse.train_flops(f_a, f_q, config.batch_size, delay, kind), f_a

        delays = np.atleast_1d(getattr(hparams, "policy_delay", np.ones_like(np.atleast_1d(hparams.actor_sparsity))))
        for a_s, c_s, d in zip(np.atleast_1d(hparams.actor_sparsity), np.atleast_1d(hparams.critic_sparsity), delays,
                               strict=True):
            actor_dens = np.asarray(sparse.er_densities(actor_shapes, float(a_s)), np.float64)
            critic_dens = np.asarray(sparse.er_densities(critic_shapes, float(c_s)), np.float64)
            size, train, inference = measures(actor_dens, critic_dens, int(d))
            dense_size, dense_train, dense_inference = measures([1.0] * len(actor_shapes),
                                                                [1.0] * len(critic_shapes), int(d))
            rows["actor_weights"].append(sparse.model_size(actor_shapes, actor_dens))
            rows["critic_weights"].append(sparse.model_size(critic_shapes, critic_dens))
            rows["size_reduction"].append(dense_size / size)
            rows["train_flops"].append(train)
            rows["train_flops_reduction"].append(dense_train / train)
            rows["inference_flops"].append(inference)
            rows["inference_flops_reduction"].append(dense_inference / inference)
        return rows

    return costs


costs = make_costs("td3")


def check_topology_period(config: RLx2Config, updates_per_call: int) -> None:
    if config.topology != "static" and updates_per_call > config.dst_interval:
        raise ConfigError(f"learner_config.dst_interval: {config.dst_interval} is shorter than the updates per "
                          f"iteration ({updates_per_call}); topology steps run between iterations "
                          f"(allowed: at least {updates_per_call})")


def specialize(config: RLx2TD3Config, hparams, updates_per_call: int, searched: frozenset[str],
               exact_chunks: bool = True) -> RLx2TD3Config:
    """TD3's fixed policy delay, and a topology period no shorter than one call's updates."""
    check_topology_period(config, updates_per_call)
    return td3.specialize(config, hparams, updates_per_call, searched, exact_chunks)


def specialize_sac(config: RLx2Config, hparams, updates_per_call: int, searched: frozenset[str],
                   exact_chunks: bool = True) -> RLx2Config:
    """A topology period no shorter than one call's updates."""
    del hparams, searched, exact_chunks
    check_topology_period(config, updates_per_call)
    return config


TD3_DEFINITION = LearnerDef(name="rlx2_td3", config_cls=RLx2TD3Config, hparams_cls=RLx2TD3HParams,
                            make=make_rlx2_td3, default_hparams=default_hparams, action_kind="continuous",
                            fit=RunFit(specialize=specialize),
                            report=Report(costs=costs, actor_params=lambda state: state.inner.actor))
SAC_DEFINITION = LearnerDef(name="rlx2_sac", config_cls=RLx2Config, hparams_cls=RLx2SACHParams,
                            make=make_rlx2_sac, default_hparams=default_sac_hparams, action_kind="continuous",
                            fit=RunFit(specialize=specialize_sac), report=Report(costs=make_costs("sac")))
DEFINITIONS = (TD3_DEFINITION, SAC_DEFINITION)
