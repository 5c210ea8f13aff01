"""RLx2 (Tan et al., ICLR 2023): TD3 trained sparse from scratch, with per-member masks under vmap.

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
``policy_delay``-th call (its counter counts actor updates), neither after ``dst_end``. A member whose sparsity
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
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from pydantic import Field

from popjax import schema
from popjax.config import ConfigError
from popjax.learners import td3
from popjax.learners.base import Learner, LearnerDef, adam_step, scalar
from popjax.networks import sparse
from popjax.population.hparams import hparam
from popjax.types import EnvSpec, Key, PyTree, Transition, Windows


# --- config and hyperparameters ------------------------------------------------------------------
@schema.dataclass
class RLx2TD3Config(td3.TD3Config):
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


@struct.dataclass
class RLx2TD3HParams(td3.TD3HParams):
    actor_sparsity: jax.Array = hparam("fraction of the actor's weights that is masked", ge=0, lt=1)
    critic_sparsity: jax.Array = hparam("fraction of the critic's (both Q-nets') weights that is masked", ge=0, lt=1)
    drop_fraction: jax.Array = hparam("initial drop fraction zeta0 of a topology step (cosine-annealed)", gt=0, lt=1)


def default_hparams(config: RLx2TD3Config | None = None) -> RLx2TD3HParams:
    """TD3's defaults, 90 % sparse actor and critic, zeta0 = 0.5 (the released code's)."""
    base = td3.default_hparams()
    return RLx2TD3HParams(**{f: getattr(base, f) for f in base.__dataclass_fields__},
                          actor_sparsity=scalar(0.9), critic_sparsity=scalar(0.9), drop_fraction=scalar(0.5))


@struct.dataclass
class RLx2TD3State:
    td3: td3.TD3State  # weights already zeroed where masked
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


def rlx2_steps(state: RLx2TD3State, config: RLx2TD3Config) -> td3.TD3Steps:
    """TD3's update with masked steps and targets and, for ``n_step`` > 1, the delayed multi-step target."""
    steps = td3.TD3Steps(critic=masked(adam_step, state.critic_mask), actor=masked(adam_step, state.actor_mask),
                         critic_targets=lambda t: sparse.apply_masks(t, state.critic_mask),
                         actor_targets=lambda t: sparse.apply_masks(t, state.actor_mask))
    if config.n_step == 1:
        return steps
    # Multi-step from T0 critic updates on (the counter of the update being made: steps before it).
    used = jnp.where(state.td3.steps >= config.multi_step_start, config.n_step, 1)

    def target(key, actor_net, critic_net, target_actor, target_critic, windows, hp):
        return multi_step_target(key, actor_net, critic_net, target_actor, target_critic, windows, hp, used)

    return dataclasses.replace(steps, target=target, sample=Windows.first)


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


# --- delayed multi-step target --------------------------------------------------------------------
def multi_step_target(key: Key, actor_net, critic_net, target_actor: PyTree, target_critic: PyTree,
                      windows: Windows, hp, steps_used: jax.Array) -> jax.Array:
    """The uncorrected n-step TD3 target (Tan et al. 2023, Eq. 3) over windows ``[B, n]``, using the first
    ``steps_used`` steps (1 before T0).

    Rewards add up to the first step whose episode ended (inclusive); the target bootstraps from that step's
    ``next_obs`` with ``gamma**m`` (m = steps used) unless it was a true termination, with the clipped-noise
    target action and the min over the twin target critics (``td3.target_q``).
    """
    transitions, n = windows.transitions, windows.ended.shape[1]
    k = jnp.arange(n)
    ended_before = jnp.cumsum(windows.ended, axis=1) - windows.ended
    used = (ended_before == 0) & (k < steps_used)  # [B, n]; step 0 always
    m = used.sum(axis=1)
    returns = jnp.sum(jnp.where(used, hp.discount ** k * transitions.reward, 0.0), axis=1)
    last = jax.tree.map(lambda x: jnp.take_along_axis(x, (m - 1).reshape((-1,) + (1,) * (x.ndim - 1)), axis=1)[:, 0],
                        transitions)
    bootstrap = last.replace(reward=returns)
    return td3.target_q(key, actor_net, critic_net, target_actor, target_critic, bootstrap,
                        hp.replace(discount=hp.discount ** m))


# --- the learner ----------------------------------------------------------------------------------
def make_rlx2_td3(config: RLx2TD3Config, spec: EnvSpec) -> Learner:
    core = td3.td3_core(config, spec)
    actor_net, critic_net = core.actor_net, core.critic_net

    def init(key: Key, hp: RLx2TD3HParams) -> RLx2TD3State:
        key_net, key_actor, key_critic = jax.random.split(key, 3)
        state = core.init(key_net, hp)
        actor_mask = initial_masks(key_actor, state.actor, hp.actor_sparsity, config.init_mask)
        critic_mask = initial_masks(key_critic, state.critic, hp.critic_sparsity, config.init_mask)
        actor = sparse.apply_masks(state.actor, actor_mask)
        critic = sparse.apply_masks(state.critic, critic_mask)
        # Targets start from the masked online networks (the released code copies them before masking).
        state = state.replace(actor=actor, critic=critic, target_actor=actor, target_critic=critic)
        return RLx2TD3State(td3=state, actor_mask=actor_mask, critic_mask=critic_mask)

    def update(key: Key, state: RLx2TD3State, batch: Transition | Windows, hp: RLx2TD3HParams):
        inner, metrics, _ = core.update_weighted(key, state.td3, batch, None, hp, rlx2_steps(state, config))
        return state.replace(td3=inner), metrics

    def update_chunk(keys: Key, state: RLx2TD3State, batches: Transition, hp: RLx2TD3HParams):
        inner, metrics = core.update_chunk(keys, state.td3, batches, hp, rlx2_steps(state, config))
        return state.replace(td3=inner), metrics

    def grow_scores(key: Key, state: RLx2TD3State, batch: Transition | Windows, hp: RLx2TD3HParams):
        """``(actor, critic)`` scores of the inactive links: dense |grad| (RigL) or uniform noise (SET)."""
        inner = state.td3
        if config.topology == "set":
            key_actor, key_critic = jax.random.split(key)
            return sparse.uniform_like(key_actor, inner.actor), sparse.uniform_like(key_critic, inner.critic)
        steps = rlx2_steps(state, config)
        y = steps.target(key, actor_net, critic_net, inner.target_actor, inner.target_critic, batch, hp)
        sample = steps.sample(batch)
        critic_grad = jax.grad(lambda c: td3.critic_loss_fn(c, critic_net, sample, y)[0])(inner.critic)
        actor_grad = jax.grad(lambda a: td3.dpg_loss(actor_net, critic_net, a, inner.critic, sample.obs))(inner.actor)
        return jax.tree.map(jnp.abs, actor_grad), jax.tree.map(jnp.abs, critic_grad)

    def evolve_net(params, mask, scores, sparsity, fraction, due):
        """One network's topology step: evolve, or redraw magnitude masks when the sparsity changed."""
        counts = layer_counts(params, sparsity)
        sizes = jnp.asarray([i * o for i, o in sparse.kernel_shapes(params)], jnp.int32)
        evolving = counts < sizes
        evolved = sparse.evolve(params, mask, scores, fraction, evolving & due, config.forbid_regrow)
        redrawn_mask = sparse.magnitude_masks(params, counts)
        redrawn = (sparse.apply_masks(params, redrawn_mask), redrawn_mask)
        changed = jnp.any(sparse.active_counts(mask) != counts)
        return jax.tree.map(lambda a, b: jnp.where(changed, a, b), redrawn, evolved)

    def maintain(key: Key, state: RLx2TD3State, batch: Transition | Windows, hp: RLx2TD3HParams):
        """The topology step (see the module docstring); no optimizer step, no counter advances."""
        inner = state.td3
        actor_scores, critic_scores = grow_scores(key, state, batch, hp)
        actor_updates = inner.steps // hp.policy_delay
        critic_fraction = sparse.drop_fraction(inner.steps, hp.drop_fraction, config.evolution_end)
        actor_fraction = sparse.drop_fraction(actor_updates, hp.drop_fraction, config.evolution_end)
        # The actor's counter counts actor updates: it reaches a multiple of dst_interval every d-th call.
        actor_due = (inner.steps // config.dst_interval) % hp.policy_delay == 0
        critic, critic_mask = evolve_net(inner.critic, state.critic_mask, critic_scores, hp.critic_sparsity,
                                         critic_fraction, jnp.asarray(True))
        actor, actor_mask = evolve_net(inner.actor, state.actor_mask, actor_scores, hp.actor_sparsity,
                                       actor_fraction, actor_due)
        # Targets share the online masks at once (the released code masks them at their next Polyak average).
        inner = inner.replace(actor=actor, critic=critic,
                              target_actor=sparse.apply_masks(inner.target_actor, actor_mask),
                              target_critic=sparse.apply_masks(inner.target_critic, critic_mask))
        state = RLx2TD3State(td3=inner, actor_mask=actor_mask, critic_mask=critic_mask)
        return state, {"critic_drop_fraction": critic_fraction,
                       "actor_drop_fraction": jnp.where(actor_due, actor_fraction, 0.0)}

    def policy(state: RLx2TD3State, obs: jax.Array) -> jax.Array:
        return core.policy(state.td3, obs)

    def act(key: Key, state: RLx2TD3State, obs: jax.Array, hp: RLx2TD3HParams) -> jax.Array:
        return core.act(key, state.td3, obs, hp)

    delay = config.fixed_policy_delay
    evolves = config.topology != "static"
    def replay_shrink(state: RLx2TD3State, oldest: Transition, valid: jax.Array, size: jax.Array, hp):
        """``(rows to drop, distance)``: the oldest 10 % when the policy distance exceeds D0 above ``buffer_min``.

        Distance: half the mean squared difference between today's policy action and the stored action on the
        oldest transitions (actions in [-1, 1], so already normalised by the max action). The paper stores the
        pre-noise policy action; popjax stores the executed one, whose exploration noise adds about
        ``exploration_noise**2 / 2`` (0.005 at the default 0.1, against D0 = 0.2) - a documented deviation.
        """
        del hp
        squared = jnp.mean((core.policy(state.td3, oldest.obs) - oldest.action) ** 2, axis=-1)
        distance = 0.5 * jnp.sum(jnp.where(valid, squared, 0.0)) / jnp.maximum(jnp.sum(valid), 1)
        drop = (distance > config.buffer_threshold) & (size > config.buffer_min)
        return jnp.where(drop, size // 10, 0), distance

    if config.n_step > spec.max_episode_steps:
        raise ConfigError(f"learner_config.n_step: {config.n_step} is longer than the episode limit of {spec.name} "
                          f"(allowed: at most {spec.max_episode_steps})")
    return Learner(init=init, update=update, act=act, policy=policy, chunk=delay or 1,
                   update_chunk=update_chunk if delay else None,
                   maintain=maintain if evolves else None, maintain_every=config.dst_interval if evolves else 0,
                   window=config.n_step, replay_shrink=replay_shrink if config.dynamic_buffer else None,
                   replay_check_every=config.buffer_check_interval, replay_oldest=config.oldest_checked)


def costs(config: RLx2TD3Config, spec: EnvSpec, hparams: RLx2TD3HParams) -> dict[str, list[float]]:
    """Model sizes and FLOPs of each member against the dense model (Tan et al. 2023, App. C.3).

    Sizes count weights (no biases), actor + both Q-nets, and the targets with them (the paper's "total size").
    Training FLOPs per update are ``B (F_A + 8 F_C) + B (3 F_A + F_C) / d`` (one Q-net's F_C); inference FLOPs are
    one actor forward. A ``*_reduction`` is dense / sparse (the paper's "x" figures).
    """
    core = td3.td3_core(config, spec)
    actor_params, critic_params = jax.eval_shape(
        lambda: td3.init_actor_critic(jax.random.key(0), core.actor_net, core.critic_net, spec))
    actor_shapes, critic_shapes = sparse.kernel_shapes(actor_params), sparse.kernel_shapes(critic_params)
    q_layers = len(critic_shapes) // 2
    rows: dict[str, list[float]] = {name: [] for name in (
        "actor_weights", "critic_weights", "size_reduction", "train_flops", "train_flops_reduction",
        "inference_flops", "inference_flops_reduction")}
    dense_actor, dense_critic = [1.0] * len(actor_shapes), [1.0] * len(critic_shapes)

    def measures(actor_dens, critic_dens, delay):
        f_a = sparse.forward_flops(actor_shapes, actor_dens)
        f_q = sparse.forward_flops(critic_shapes[:q_layers], critic_dens[:q_layers])
        size = sparse.model_size(actor_shapes, actor_dens) + sparse.model_size(critic_shapes, critic_dens)
        return size, sparse.train_flops(f_a, f_q, config.batch_size, delay, "td3"), f_a

    for a_s, c_s, d in zip(np.atleast_1d(hparams.actor_sparsity), np.atleast_1d(hparams.critic_sparsity),
                           np.atleast_1d(hparams.policy_delay), strict=True):
        actor_dens = np.asarray(sparse.er_densities(actor_shapes, float(a_s)), np.float64)
        critic_dens = np.asarray(sparse.er_densities(critic_shapes, float(c_s)), np.float64)
        size, train, inference = measures(actor_dens, critic_dens, int(d))
        dense_size, dense_train, dense_inference = measures(dense_actor, dense_critic, int(d))
        rows["actor_weights"].append(sparse.model_size(actor_shapes, actor_dens))
        rows["critic_weights"].append(sparse.model_size(critic_shapes, critic_dens))
        rows["size_reduction"].append(dense_size / size)
        rows["train_flops"].append(train)
        rows["train_flops_reduction"].append(dense_train / train)
        rows["inference_flops"].append(inference)
        rows["inference_flops_reduction"].append(dense_inference / inference)
    return rows


def specialize(config: RLx2TD3Config, hparams, updates_per_call: int, searched: frozenset[str]) -> RLx2TD3Config:
    """TD3's fixed policy delay, and a topology period no shorter than one call's updates."""
    if config.topology != "static" and updates_per_call > config.dst_interval:
        raise ConfigError(f"learner_config.dst_interval: {config.dst_interval} is shorter than the updates per "
                          f"iteration ({updates_per_call}); topology steps run between iterations "
                          f"(allowed: at least {updates_per_call})")
    return td3.specialize(config, hparams, updates_per_call, searched)


TD3_DEFINITION = LearnerDef(name="rlx2_td3", config_cls=RLx2TD3Config, hparams_cls=RLx2TD3HParams,
                            make=make_rlx2_td3, default_hparams=default_hparams, action_kind="continuous",
                            specialize=specialize, costs=costs, actor_params=lambda state: state.td3.actor)
