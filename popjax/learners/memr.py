"""MEMR: maximum-entropy one-step model rollouts with SAC (Zhang 2022 thesis, Ch. 3, Algorithm 2), one member.

Where things live: the member's real transitions D_env are its ordinary replay source (the run's ``buffer``:
``prioritized`` for MEMR's start states, ``uniform`` for the ablation), so drivers need nothing new; the dynamics
model with its normalisation statistics and validation losses, the model-data policy pi_psi, the segmented model
buffer D_model and SAC live in the learner state.

One MEMR step per driver update (one env step's worth of Algorithm 2 at update ratio 1) on a batch of M =
``batch_size`` real start transitions drawn by the source (by priority ``p^alpha`` with importance weights, or
uniformly):

1. the model: the step's real rows update the running input/target statistics, the rows whose hash falls in the
   ``holdout`` fraction (a fixed split of the real data: a transition is held out every time it is drawn) give each
   ensemble member's held-out NLL (a running mean ranks the members; the ``elites`` best roll out, MBPO's practice),
   and ``model_steps`` Adam steps fit the ensemble on the other rows (NLL weighted by the importance weights);
2. draws ``a_j ~ pi_phi(.|s_j)``, predicts ``s'_j, r_j`` with one elite per row (one-step rollouts; ``model:
   oracle`` uses the env's own step instead), writes ``(s_j, a_j, r_j, s'_j)`` with the weights as the next segment
   of D_model, fits pi_psi on the new ``(s_j, a_j)`` for ``psi_epochs`` Adam steps (online), computes the new
   priorities by Eq. 3.7 and runs ``policy_updates`` G SAC updates, each on ``sac_batch`` rows: ``real_ratio`` of
   them real start transitions of the step (MBPO's mix; 0 is the thesis), the rest drawn across every written
   segment of D_model, with the weights in the Q loss only (the actor and temperature losses are unweighted);
3. returns the priorities ``p_j = sum_d (a_jd - mu_d(s_j))^2 / (2 sigma_d(s_j)^2)`` as the step's per-sample
   values, which the prioritized source writes back as ``(p + eps)^alpha`` for the just-sampled rows only.

Importance weights across segments: the source gives ``w_j = (N P(j))^-beta / max w`` over its batch (Alg. 2). A
SAC batch here mixes segments, and dividing each segment by its own batch max would weigh segments against each
other by an arbitrary factor (and shrink the critic's step by ``mean w``), so each generation's weights are divided
by their mean before they are stored: within a segment the relative weights are the thesis's, every segment's rows
average weight 1, so each segment's start-state distribution counts equally (as when the thesis picks a segment
uniformly), and the Q loss keeps the scale of an unweighted one (self-normalised importance sampling).

Priorities are fresh: the chunk (the step's ``ReplayStep.chunk``) is ``priority_lag`` steps, default 1, so a
priority written back reaches the tree before the next start-state batch is drawn (with a lag L the driver draws L
batches ahead, Ch. 4's delay D). This is why the model trains a little every step rather than in a fit every F steps:
under the member vmap a periodic fit inside a one-step chunk would be a ``select`` that pays the fit every step.

popjax's choices (the thesis gives none of them): the model type (``popjax.networks.dynamics``), M, G, the fit's
steps, the learning rates, the hash split, that rollouts take the mean of one elite per row, that a rollout ends
where the task's known rule says so (``termination: known``, MBPO's practice, ``popjax.envs.terminations``;
``learned`` cuts the ensemble's termination logit at 0), that SAC starts from the member's key itself (so ``sac``
and ``memr_sac`` runs of a seed start from the same networks), and the weight normalisation above. New real rows
enter the tree with the largest priority so far (the source's rule), not with their Eq. 3.7 priority. With
``start_states: uniform`` every step is the same except that start states are uniform and every weight is 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import pydantic
from flax import struct
from pydantic import Field

from popjax import schema
from popjax.buffers.segmented import SegmentedState, segmented_init, segmented_sample, segmented_write
from popjax.config import ConfigError
from popjax.envs.base import to_native
from popjax.envs.oracles import ORACLES, oracle_model
from popjax.envs.terminations import KNOWN_TERMINATIONS, known_termination
from popjax.learners import sac
from popjax.learners.actor_critic import Core
from popjax.learners.base import (
    MUJOCO_V5,
    BatchSize,
    Hidden,
    Learner,
    LearnerDef,
    PBTSupport,
    ReplayStep,
    Report,
    RunFit,
    adam_init,
    adam_step,
    scalar,
    without_extras,
)
from popjax.networks.dynamics import (
    GaussianEnsemble,
    ModelNorm,
    ensemble_nll,
    gaussian_nll,
    predict,
    stats_init,
    stats_update,
)
from popjax.networks.mlp import GaussianActor
from popjax.population.hparams import extend, hparam, restrict
from popjax.population.search_spaces import SEARCH_SPACES
from popjax.schema import problem
from popjax.types import EnvSpec, Key, PyTree, Transition, dummy_transition

START_STATES = ("prioritized", "uniform")
TERMINATIONS = ("known", "learned")
MODELS = ("learned", "oracle")
VALIDATION_DECAY = 0.9  # the running held-out NLL: a mean over about the last 10 steps' held-out rows


@schema.dataclass
class MEMRConfig:
    hidden: Hidden = Field((256, 256), description="hidden layer sizes of the SAC actor and of each critic")
    start_states: schema.OneOf(START_STATES) = Field(
        "prioritized", description="how start states are drawn from the real transitions: prioritized by Eq. 3.7 "
        "(MEMR; needs a prioritized buffer) or uniform (the ablation; needs a buffer that does not prioritize)")
    model: schema.OneOf(MODELS) = Field(
        "learned", description="the one-step model: the learned ensemble, or (experiments only) the pure-JAX env's "
        "own step (popjax.envs.oracles), which isolates MEMR from its model's errors")
    ensemble: schema.Int(ge=1, le=64) = Field(7, description="dynamics models in the ensemble (MBPO: 7)")
    elites: schema.Int(ge=1, le=64) = Field(
        5, description="ensemble members with the lowest held-out NLL that make the rollouts (MBPO: 5; at most "
        "ensemble)")
    model_hidden: Hidden = Field((128, 128), description="hidden layer sizes of each dynamics model")
    model_steps: schema.Int(ge=1, le=1000) = Field(
        5, description="Adam steps of the ensemble per env step on that step's real training rows")
    holdout: schema.Float(gt=0, le=0.5) = Field(
        0.2, description="fraction of the real transitions held out of the model fit to rank the ensemble members "
        "(a fixed split by a hash of (s, a))")
    psi_hidden: Hidden = Field((64, 64), description="hidden layer sizes of the model-data policy pi_psi")
    psi_epochs: schema.Int(ge=1, le=1000) = Field(5, description="Adam steps D of pi_psi on each new rollout batch")
    model_buffer: schema.Int(ge=1, le=100_000_000) = Field(
        100_000, description="model rollouts the model buffer holds, in segments of batch_size (the thesis's "
        "|D_model| is 2e4, 1e5 or 1e6)")
    policy_updates: schema.Int(ge=1, le=1000) = Field(1, description="SAC updates G per env step")
    sac_batch: BatchSize = Field(256, description="rows per SAC update, drawn across the whole model buffer")
    real_ratio: schema.Float(ge=0, le=1) = Field(
        0.0, description="fraction of each SAC batch taken from the step's real start transitions (MBPO's "
        "practice; 0 is the thesis)")
    batch_size: BatchSize = Field(256, description="start states M per env step (the run's batch_size)")
    termination: schema.OneOf(TERMINATIONS) = Field(
        "known", description="whether a model rollout ends the episode: the task's known rule on the predicted next "
        "state (popjax.envs.terminations; MBPO's practice) or the ensemble's learned termination logit")
    priority_lag: schema.Int(ge=1, le=100_000) = Field(
        1, description="start-state batches drawn before their priorities are written back (1: every write-back "
        "reaches the tree before the next batch is drawn); must divide the updates per iteration")
    update_ratio: schema.Float(gt=0) = Field(1.0, description="the run's update_ratio")
    total_env_steps: schema.Int(ge=1) = Field(100_000_000, description="the run's total_env_steps")

    @pydantic.model_validator(mode="after")
    def _check(self):
        if self.elites > self.ensemble:
            raise problem(f"must be at most ensemble ({self.ensemble}), got {self.elites}", at=("elites",))
        if self.model_buffer < self.sac_batch - self.real_rows:
            raise problem(f"a model buffer of {self.model_buffer} rollouts is smaller than the "
                          f"{self.sac_batch - self.real_rows} model rows of one SAC batch", at=("model_buffer",))
        return self

    @property
    def segments(self) -> int:
        """Segments of ``batch_size`` rollouts in the model buffer: ``model_buffer`` rounded up, but no more than
        the run writes (one per update; a larger buffer would never fill, so this saves memory only)."""
        return max(1, min(-(-self.model_buffer // self.batch_size),
                          math.ceil(self.total_env_steps * self.update_ratio)))

    @property
    def real_rows(self) -> int:
        """Real rows in each SAC batch."""
        return round(self.real_ratio * self.sac_batch)


@struct.dataclass
class MEMRHParams(sac.SACHParams):
    model_lr: jax.Array = hparam("dynamics-model Adam learning rate", gt=0, le=1)
    psi_lr: jax.Array = hparam("model-data policy pi_psi Adam learning rate", gt=0, le=1)


@struct.dataclass
class Counts:
    """What MEMR did so far (int32): SAC policy updates, one-step model rollouts, model fit steps (one per env
    step)."""

    policy_updates: jax.Array
    model_rollouts: jax.Array
    model_fits: jax.Array


@struct.dataclass
class Validation:
    """Each ensemble member's running held-out NLL: ``total / weight`` (a bias-corrected exponential mean, 0 before
    any held-out row)."""

    total: jax.Array  # [ensemble]
    weight: jax.Array  # scalar

    def loss(self) -> jax.Array:
        return self.total / jnp.maximum(self.weight, 1e-12)


@struct.dataclass
class MEMRState:
    sac: sac.SACState
    model: PyTree
    model_opt: PyTree
    norm: ModelNorm
    validation: Validation
    psi: PyTree
    psi_opt: PyTree
    rollouts: SegmentedState
    counts: Counts


def default_hparams(config: MEMRConfig | None = None) -> MEMRHParams:
    """SAC's reference defaults; model and pi_psi learning rates 1e-3 (popjax's choice, as MBPO's model)."""
    del config
    return extend(sac.default_hparams(None), MEMRHParams, model_lr=scalar(1e-3), psi_lr=scalar(1e-3))


def entropy_priority(action: jax.Array, mean: jax.Array, log_std: jax.Array) -> jax.Array:
    """Eq. 3.7 in the spec's multi-dimensional form: ``p = sum_d (a_d - mu_d)^2 / (2 sigma_d^2)``
    (= -log pi_psi(a|s) - sum_d log(sqrt(2 pi) sigma_d)); >= 0, 0 at the mean."""
    return jnp.sum(0.5 * ((action - mean) * jnp.exp(-log_std)) ** 2, axis=-1)


def held_out(obs: jax.Array, action: jax.Array, fraction: float) -> jax.Array:
    """Whether each transition ``[B]`` is in the validation split: a hash of the bits of ``(s, a)`` below
    ``fraction`` of its range, so a transition is on the same side every time the replay returns it."""
    bits = jax.lax.bitcast_convert_type(jnp.concatenate([obs, action], axis=-1).astype(jnp.float32), jnp.uint32)
    odd = jnp.uint32(2654435761) + jnp.uint32(2) * jnp.arange(bits.shape[-1], dtype=jnp.uint32)
    h = jnp.sum(bits * odd, axis=-1, dtype=jnp.uint32)  # wraps modulo 2^32
    for shift, multiplier in ((16, 0x7FEB352D), (15, 0x846CA68B)):  # a murmur-style finaliser mixes every bit
        h = (h ^ (h >> shift)) * jnp.uint32(multiplier)
    h = h ^ (h >> 16)
    return (h >> 8).astype(jnp.float32) < fraction * 2.0**24


class MEMRCore(NamedTuple):
    """MEMR's functions (``make_memr`` builds the learner from them; tests call the pieces)."""

    sac: Core
    model_net: GaussianEnsemble
    psi_net: GaussianActor
    init: Callable  # (key, hp) -> MEMRState
    fit_model: Callable  # (state, batch [M], weights [M], hp) -> (state, metrics): statistics, validation, fit
    rollout: Callable  # (state, key, obs, action) -> (next_obs, reward, terminated): the one-step model
    sac_rows: Callable  # (key, rollouts, batch [M], weights [M]) -> (rows [sac_batch], weights): one SAC batch
    step: Callable  # (key, state, batch [M], weights [M], hp) -> (state, metrics, priorities [M]): one MEMR step
    update: Callable  # the chunk: ``ReplayStep.update``


def memr_core(config: MEMRConfig, spec: EnvSpec) -> MEMRCore:
    core = sac.sac_core(sac.SACConfig(hidden=config.hidden, batch_size=config.sac_batch), spec)
    obs_dim = spec.obs_shape[0]
    model_net = GaussianEnsemble(config.model_hidden, obs_dim + 1, config.ensemble)
    psi_net = GaussianActor(config.psi_hidden, spec.action_dim)
    rows, real_rows = config.batch_size, config.real_rows

    known = known_termination(spec.name) if config.termination == "known" else None
    if config.termination == "known" and known is None:
        raise ValueError(f"memr_core: no known termination rule for {spec.name} (check_run refuses such runs)")
    oracle = oracle_model(spec.name) if config.model == "oracle" else None
    if config.model == "oracle" and oracle is None:
        raise ValueError(f"memr_core: no oracle model for {spec.name} (check_run refuses such runs)")

    def rollout(state: MEMRState, key: Key, obs: jax.Array, action: jax.Array):
        if oracle is not None:
            next_obs, reward, terminated = oracle(obs, to_native(spec, action))
        else:
            elites = jnp.argsort(state.validation.loss())[:config.elites]
            next_obs, reward, terminated = predict(model_net, state.model, state.norm, key, obs, action, elites)
        if known is not None:
            terminated = known(next_obs).astype(jnp.float32)
        return next_obs, reward, terminated

    def init(key: Key, hparams: MEMRHParams) -> MEMRState:
        # SAC starts from the key the ``sac`` learner uses, so the two arms of a seed start from the same networks.
        key_sac, key_model, key_psi = key, jax.random.fold_in(key, 1), jax.random.fold_in(key, 2)
        obs = jnp.zeros((1,) + spec.obs_shape, jnp.float32)
        model = model_net.init(key_model, jnp.zeros((1, obs_dim + spec.action_dim), jnp.float32))
        psi = psi_net.init(key_psi, obs)
        zero = jnp.zeros((), jnp.int32)
        return MEMRState(sac=core.init(key_sac, hparams), model=model, model_opt=adam_init(model),
                         norm=ModelNorm(stats_init(obs_dim + spec.action_dim), stats_init(obs_dim + 1)),
                         validation=Validation(jnp.zeros(config.ensemble, jnp.float32), jnp.zeros((), jnp.float32)),
                         psi=psi, psi_opt=adam_init(psi),
                         rollouts=segmented_init(config.segments, rows, dummy_transition(spec)),
                         counts=Counts(zero, zero, zero))

    def fit_model(state: MEMRState, batch: Transition, weights: jax.Array, hp: MEMRHParams):
        """The step's model work on its real rows ``[M]``: statistics, held-out NLL per member (before the fit, so
        the rows are unseen), then ``model_steps`` Adam steps on the training rows."""
        inputs = jnp.concatenate([batch.obs, batch.action], axis=-1)
        targets = jnp.concatenate([batch.next_obs - batch.obs, batch.reward[:, None]], axis=-1)
        norm = ModelNorm(stats_update(state.norm.inputs, inputs), stats_update(state.norm.targets, targets))
        x, y = norm.inputs.normalize(inputs), norm.targets.normalize(targets)
        valid = held_out(batch.obs, batch.action, config.holdout)
        val_w, train_w = jnp.where(valid, weights, 0.0), jnp.where(valid, 0.0, weights)
        val_nll = ensemble_nll(model_net, state.model, x, y, batch.terminated, val_w)
        seen = jnp.any(valid)
        old = state.validation
        validation = Validation(jnp.where(seen, VALIDATION_DECAY * old.total + (1 - VALIDATION_DECAY) * val_nll,
                                          old.total),
                                jnp.where(seen, VALIDATION_DECAY * old.weight + (1 - VALIDATION_DECAY), old.weight))

        def one(carry, _):
            params, opt = carry
            loss, grads = jax.value_and_grad(
                lambda p: jnp.sum(ensemble_nll(model_net, p, x, y, batch.terminated, train_w)))(params)
            return adam_step(params, grads, opt, hp.model_lr), loss

        (model, model_opt), losses = jax.lax.scan(one, (state.model, state.model_opt), None,
                                                  length=config.model_steps)
        elites = jnp.sort(validation.loss())[:config.elites]
        counts = state.counts.replace(model_fits=state.counts.model_fits + 1)
        state = state.replace(model=model, model_opt=model_opt, norm=norm, validation=validation, counts=counts)
        metrics = {"model_nll": losses[-1] / config.ensemble, "model_val_nll": elites.mean(),
                   "model_val_rows": valid.mean()}
        return state, metrics

    def fit_psi(psi, psi_opt, obs, action, lr):
        """Online maximum likelihood of pi_psi on the newest model-data pairs."""
        def loss_fn(p):
            mean, log_std = psi_net.apply(p, obs)
            return jnp.mean(gaussian_nll(mean, log_std, action))

        def one(carry, _):
            p, opt = carry
            loss, grads = jax.value_and_grad(loss_fn)(p)
            return adam_step(p, grads, opt, lr), loss

        (psi, psi_opt), losses = jax.lax.scan(one, (psi, psi_opt), None, length=config.psi_epochs)
        return psi, psi_opt, losses[-1]

    def sac_rows(key: Key, rollouts: SegmentedState, batch: Transition, weights: jax.Array):
        """One SAC batch: ``real_rows`` of the step's real start transitions, the rest across the model buffer."""
        key_model, key_real = jax.random.split(key)
        model_rows, model_w, _ = segmented_sample(key_model, rollouts, config.sac_batch - real_rows)
        if real_rows == 0:
            return model_rows, model_w
        # Without replacement where the step has enough rows: a resample with replacement repeats about a third of
        # them, a smaller effective batch (with real_ratio 1 on Pendulum it learnt measurably slower than this).
        pick = jax.random.choice(key_real, rows, (real_rows,), replace=real_rows > rows)
        real = jax.tree.map(lambda x: x[pick], batch)
        both = jax.tree.map(lambda r, m: jnp.concatenate([r.astype(m.dtype), m]), real, model_rows)
        return both, jnp.concatenate([weights[pick], model_w])

    def memr_step(key: Key, state: MEMRState, batch: Transition, weights: jax.Array, hp: MEMRHParams):
        """One env step's worth of Algorithm 2 on the start transitions ``batch [M]``; also their new priorities."""
        key_action, key_model, key_sac = jax.random.split(key, 3)
        # Each generation's weights averaged to 1 (see the module docstring): comparable across segments.
        source_w = weights
        weights = weights / jnp.mean(weights)
        state, model_metrics = fit_model(state, batch, weights, hp)
        obs = batch.obs
        action, _ = sac.sample_action(core.actor_net, key_action, state.sac.actor, obs)
        next_obs, reward, terminated = rollout(state, key_model, obs, action)
        generation = Transition(obs=obs, action=action, reward=reward, next_obs=next_obs, terminated=terminated)
        rollouts = segmented_write(state.rollouts, generation, weights)
        psi, psi_opt, psi_loss = fit_psi(state.psi, state.psi_opt, obs, action, hp.psi_lr)
        mean, log_std = psi_net.apply(psi, obs)
        priority = entropy_priority(action, mean, log_std)

        sac_hp = restrict(hp, sac.SACHParams)

        def policy_update(sac_state, k):
            k_sample, k_update = jax.random.split(k)
            sac_batch, w = sac_rows(k_sample, rollouts, batch, weights)
            sac_state, metrics, _ = core.update(k_update, sac_state, sac_batch, w, sac_hp)
            return sac_state, metrics

        sac_state, metrics = jax.lax.scan(policy_update, state.sac,
                                          jax.random.split(key_sac, config.policy_updates))
        counts = state.counts
        counts = counts.replace(policy_updates=counts.policy_updates + config.policy_updates,
                                model_rollouts=counts.model_rollouts + rows)
        state = state.replace(sac=sac_state, psi=psi, psi_opt=psi_opt, rollouts=rollouts, counts=counts)
        metrics = {**jax.tree.map(jnp.mean, metrics), **model_metrics, "psi_nll": psi_loss,
                   "priority": priority.mean(), "priority_std": jnp.std(priority), "is_weight": source_w.mean(),
                   "model_reward": reward.mean(), "model_done": terminated.mean(),
                   "real_done": batch.terminated.astype(jnp.float32).mean()}
        return state, metrics, priority

    def update(keys: Key, state: MEMRState, batches: Transition, weights: jax.Array | None, hp: MEMRHParams):
        """The chunk: ``priority_lag`` MEMR steps on the batches drawn before it."""
        if weights is None or config.start_states == "uniform":
            weights = jnp.ones(batches.reward.shape, jnp.float32)

        def one(state, x):
            key, batch, w = x
            state, metrics, priority = memr_step(key, state, batch, w, hp)
            return state, (metrics, priority)

        state, (metrics, priorities) = jax.lax.scan(one, state, (keys, batches, weights))
        return state, jax.tree.map(jnp.mean, metrics), priorities

    return MEMRCore(core, model_net, psi_net, init, fit_model, rollout, sac_rows, memr_step, update)


def make_memr(config: MEMRConfig, spec: EnvSpec) -> Learner:
    """MEMR's learner; prioritized start states need a source that samples by the priorities it writes back
    (``ReplayStep.by_priority``), uniform ones one that does not (``priorities`` False): checked when the run is
    built, so every option alone, and the learner's defaults, stay valid run options."""
    core = memr_core(config, spec)
    prioritized = config.start_states == "prioritized"
    return Learner(init=core.init,
                   act=without_extras(lambda key, state, obs, hp: core.sac.act(key, state.sac, obs, hp).action),
                   policy=lambda state, obs: core.sac.policy(state.sac, obs),
                   step=ReplayStep(core.update, chunk=config.priority_lag, priorities=prioritized,
                                   by_priority=prioritized))


def check_run(config: MEMRConfig, spec: EnvSpec) -> tuple[str, str] | None:
    """``RunFit.check_env``: a known termination needs the task's rule, an oracle model a pure-JAX env popjax can
    step from an observation (checked when the run is built, so every option alone, and the learner's defaults,
    stay valid run options)."""
    if config.model == "oracle" and oracle_model(spec.name) is None:
        return "model", (f"popjax has no oracle model of {spec.name} (allowed: learned; oracle for "
                         f"{', '.join(ORACLES)})")
    if config.termination == "known" and known_termination(spec.name) is None:
        return "termination", (f"popjax knows no termination rule for {spec.name} (allowed: known for "
                               f"{', '.join(KNOWN_TERMINATIONS)}; learned for any task)")
    return None


def specialize(config: MEMRConfig, hparams, updates_per_call: int, searched: frozenset[str],
               exact_chunks: bool = True) -> MEMRConfig:
    """Checks that the driver's K updates per call are whole chunks of ``priority_lag`` steps."""
    del hparams, searched, exact_chunks
    if updates_per_call % config.priority_lag:
        raise ConfigError(f"learner_config.priority_lag: must divide the updates per iteration ({updates_per_call}: "
                          f"rollout_len * envs_per_member * update_ratio), got {config.priority_lag}")
    return config


def counts(config: MEMRConfig, updates: int) -> dict[str, int]:
    """What ``updates`` MEMR steps did: the state's ``Counts`` (summary.json)."""
    return {"policy_updates": config.policy_updates * updates, "model_rollouts": config.batch_size * updates,
            "model_fits": updates}


_PRIORITIZED = {"buffer": "prioritized"}  # MEMR's start states; the ablation names buffer: uniform
PRESETS = {
    "probe:pendulum": _PRIORITIZED,
    **{env: {**sac.PRESETS[env], **_PRIORITIZED} for env in ("gym:Pendulum-v1", *(f"gym:{e}" for e in MUJOCO_V5))},
}

DEFINITION = LearnerDef(
    name="memr_sac", config_cls=MEMRConfig, hparams_cls=MEMRHParams, make=make_memr,
    default_hparams=default_hparams, action_kind="continuous", presets=PRESETS,
    fit=RunFit(specialize=specialize, check_env=check_run), report=Report(counts=counts),
    pbt=PBTSupport(SEARCH_SPACES["sac"], policy_state=("sac.actor",),
                   optimizer_state={"sac.actor_opt": "sac.actor", "sac.critic_opt": "sac.critic",
                                    "sac.alpha_opt": "sac.log_alpha", "model_opt": "model", "psi_opt": "psi"}),
)
