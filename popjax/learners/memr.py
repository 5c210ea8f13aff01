"""MEMR: maximum-entropy one-step model rollouts with SAC (Zhang 2022 thesis, Ch. 3, Algorithm 2), one member.

Where things live: the member's real transitions D_env are its ordinary replay source (the run's ``buffer``:
``prioritized`` for MEMR's start states, ``uniform`` for the ablation), so drivers need nothing new; the dynamics
model, the model-data policy pi_psi, the segmented model buffer D_model and SAC live in the learner state.

One replay step is a **chunk** of H = ``model_update_every x update_ratio`` MEMR steps (one MEMR step per driver
update, so H env steps' worth of Algorithm 2 at update ratio 1). The driver samples H batches of M = ``batch_size``
real start transitions (by priority ``p^alpha`` with importance weights, or uniformly) and the chunk

1. fits the ensemble by maximum likelihood on those H x M real transitions (``model_epochs`` passes, one Adam step
   per batch, NLL weighted by the importance weights): a model fit every ``model_update_every`` env steps;
2. per step: draws ``a_j ~ pi_phi(.|s_j)``, predicts ``s'_j, r_j`` with the model (one-step rollouts), writes
   ``(s_j, a_j, r_j, s'_j)`` with the weights ``w_j`` as the next segment of D_model, fits pi_psi on the new
   ``(s_j, a_j)`` for ``psi_epochs`` Adam steps (online), computes the new priorities by Eq. 3.7 and runs
   ``policy_updates`` G SAC updates, each on a batch of ``sac_batch`` rows of one segment, the segment's weights
   in the Q loss only (the SAC core's critic loss; the actor and temperature losses are unweighted);
3. returns the priorities ``p_j = sum_d (a_jd - mu_d(s_j))^2 / (2 sigma_d(s_j)^2)`` as the step's per-sample
   values, which the prioritized source writes back as ``(p + eps)^alpha`` for the just-sampled rows only.

popjax's choices (the thesis gives none of them): the model type (``popjax.networks.dynamics``), M, G, the epochs,
the learning rates, that rollouts take the mean of one ensemble member drawn per row, that a rollout ends where the
task's known rule says so (``termination: known``, MBPO's practice, ``popjax.envs.terminations``; ``learned`` cuts
the ensemble's termination logit at 0), that SAC starts from the member's key itself (so ``sac`` and ``memr_sac``
runs of a seed start from the same networks), and that the importance weights are normalised by the max over each
start-state batch (Alg. 2's ``max w``; one batch = one segment). New real rows enter the tree with the largest
priority so far (the source's rule), not with their Eq. 3.7 priority; the chunk's H batches are drawn before the
chunk, so priorities lag by up to H - 1 samplings (the relaxation ``popjax.drivers.replay`` documents, measured
harmless in Ch. 4). With ``start_states: uniform`` every step is the same except that start states are uniform and
every weight is 1 (same policy updates).
"""

from __future__ import annotations

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
from popjax.networks.dynamics import GaussianEnsemble, gaussian_nll, model_nll, predict
from popjax.networks.mlp import GaussianActor
from popjax.population.hparams import extend, hparam, restrict
from popjax.population.search_spaces import SEARCH_SPACES
from popjax.schema import problem
from popjax.types import EnvSpec, Key, PyTree, Transition, dummy_transition

START_STATES = ("prioritized", "uniform")
TERMINATIONS = ("known", "learned")


@schema.dataclass
class MEMRConfig:
    hidden: Hidden = Field((256, 256), description="hidden layer sizes of the SAC actor and of each critic")
    start_states: schema.OneOf(START_STATES) = Field(
        "prioritized", description="how start states are drawn from the real transitions: prioritized by Eq. 3.7 "
        "(MEMR; needs a prioritized buffer) or uniform (the ablation; needs a buffer that does not prioritize)")
    ensemble: schema.Int(ge=1, le=64) = Field(5, description="dynamics models in the ensemble")
    model_hidden: Hidden = Field((128, 128), description="hidden layer sizes of each dynamics model")
    model_update_every: schema.Int(ge=1, le=1_000_000) = Field(
        10, description="env steps between two model fits (x update_ratio must divide the updates per iteration)")
    model_epochs: schema.Int(ge=1, le=1000) = Field(
        5, description="passes of each model fit over the real transitions sampled since the last fit")
    psi_hidden: Hidden = Field((64, 64), description="hidden layer sizes of the model-data policy pi_psi")
    psi_epochs: schema.Int(ge=1, le=1000) = Field(5, description="Adam steps D of pi_psi on each new rollout batch")
    segments: schema.Int(ge=1, le=1_000_000) = Field(
        100, description="segments of the model buffer (each holds one batch of M rollouts)")
    policy_updates: schema.Int(ge=1, le=1000) = Field(1, description="SAC updates G per env step")
    sac_batch: BatchSize = Field(256, description="model rollouts per SAC update, drawn from one segment")
    batch_size: BatchSize = Field(256, description="start states M per env step (the run's batch_size)")
    termination: schema.OneOf(TERMINATIONS) = Field(
        "known", description="whether a model rollout ends the episode: the task's known rule on the predicted next "
        "state (popjax.envs.terminations; MBPO's practice) or the ensemble's learned termination logit")
    update_ratio: schema.Float(gt=0) = Field(1.0, description="the run's update_ratio")

    @pydantic.model_validator(mode="after")
    def _check(self):
        if self.segments * self.batch_size < self.sac_batch:
            raise problem(f"a model buffer of {self.segments} x {self.batch_size} (batch_size) rollouts is smaller "
                          f"than one SAC batch of {self.sac_batch}", at=("segments",))
        chunk = self.model_update_every * self.update_ratio
        if abs(chunk - round(chunk)) > 1e-6 or round(chunk) < 1:
            raise problem(f"model_update_every x update_ratio must be a whole number of updates, got "
                          f"{self.model_update_every} x {self.update_ratio}", at=("model_update_every",))
        return self

    @property
    def chunk(self) -> int:
        """Updates (MEMR steps) per model fit."""
        return round(self.model_update_every * self.update_ratio)


@struct.dataclass
class MEMRHParams(sac.SACHParams):
    model_lr: jax.Array = hparam("dynamics-model Adam learning rate", gt=0, le=1)
    psi_lr: jax.Array = hparam("model-data policy pi_psi Adam learning rate", gt=0, le=1)


@struct.dataclass
class Counts:
    """What MEMR did so far (int32): SAC policy updates, one-step model rollouts, model fits."""

    policy_updates: jax.Array
    model_rollouts: jax.Array
    model_fits: jax.Array


@struct.dataclass
class MEMRState:
    sac: sac.SACState
    model: PyTree
    model_opt: PyTree
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


class MEMRCore(NamedTuple):
    """MEMR's functions (``make_memr`` builds the learner from them; tests call the pieces)."""

    sac: Core
    model_net: GaussianEnsemble
    psi_net: GaussianActor
    init: Callable  # (key, hp) -> MEMRState
    fit_model: Callable  # (state, batches [H, M], weights [H, M], hp) -> (state, last epoch's mean NLL per model)
    step: Callable  # (key, state, batch [M], weights [M], hp) -> (state, metrics, priorities [M]): one MEMR step
    update: Callable  # the chunk: ``ReplayStep.update``


def memr_core(config: MEMRConfig, spec: EnvSpec) -> MEMRCore:
    core = sac.sac_core(sac.SACConfig(hidden=config.hidden, batch_size=config.sac_batch), spec)
    model_net = GaussianEnsemble(config.model_hidden, spec.obs_shape[0] + 1, config.ensemble)
    psi_net = GaussianActor(config.psi_hidden, spec.action_dim)
    rows = config.batch_size

    known = known_termination(spec.name) if config.termination == "known" else None
    if config.termination == "known" and known is None:
        raise ValueError(f"memr_core: no known termination rule for {spec.name} (check_run refuses such runs)")

    def rollout_step(params, key, obs, action):
        next_obs, reward, terminated = predict(model_net, params, key, obs, action)
        if known is not None:
            terminated = known(next_obs).astype(jnp.float32)
        return next_obs, reward, terminated

    def init(key: Key, hparams: MEMRHParams) -> MEMRState:
        # SAC starts from the key the ``sac`` learner uses, so the two arms of a seed start from the same networks.
        key_sac, key_model, key_psi = key, jax.random.fold_in(key, 1), jax.random.fold_in(key, 2)
        obs = jnp.zeros((1,) + spec.obs_shape, jnp.float32)
        model = model_net.init(key_model, jnp.zeros((1, spec.obs_shape[0] + spec.action_dim), jnp.float32))
        psi = psi_net.init(key_psi, obs)
        zero = jnp.zeros((), jnp.int32)
        return MEMRState(sac=core.init(key_sac, hparams), model=model, model_opt=adam_init(model), psi=psi,
                         psi_opt=adam_init(psi),
                         rollouts=segmented_init(config.segments, rows, dummy_transition(spec)),
                         counts=Counts(zero, zero, zero))

    def fit_model(state: MEMRState, batches: Transition, weights: jax.Array, hp: MEMRHParams):
        """``model_epochs`` passes over the chunk's batches ``[H, M]``, one Adam step per batch."""
        def one(carry, batch):
            params, opt = carry
            b, w = batch
            target = jnp.concatenate([b.next_obs - b.obs, b.reward[:, None]], axis=-1)
            loss, grads = jax.value_and_grad(lambda p: model_nll(model_net, p, b.obs, b.action, target, b.terminated,
                                                                 w))(params)
            return adam_step(params, grads, opt, hp.model_lr), loss

        def epoch(carry, _):
            return jax.lax.scan(one, carry, (batches, weights))

        (model, model_opt), losses = jax.lax.scan(epoch, (state.model, state.model_opt), None,
                                                  length=config.model_epochs)
        counts = state.counts.replace(model_fits=state.counts.model_fits + 1)
        return state.replace(model=model, model_opt=model_opt, counts=counts), losses[-1].mean() / config.ensemble

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

    def memr_step(key: Key, state: MEMRState, batch: Transition, weights: jax.Array, hp: MEMRHParams):
        """One env step's worth of Algorithm 2 on the start transitions ``batch [M]``; also their new priorities."""
        key_action, key_model, key_sac = jax.random.split(key, 3)
        obs = batch.obs
        action, _ = sac.sample_action(core.actor_net, key_action, state.sac.actor, obs)
        next_obs, reward, terminated = rollout_step(state.model, key_model, obs, action)
        rollout = Transition(obs=obs, action=action, reward=reward, next_obs=next_obs, terminated=terminated)
        rollouts = segmented_write(state.rollouts, rollout, weights)
        psi, psi_opt, psi_loss = fit_psi(state.psi, state.psi_opt, obs, action, hp.psi_lr)
        mean, log_std = psi_net.apply(psi, obs)
        priority = entropy_priority(action, mean, log_std)

        sac_hp = restrict(hp, sac.SACHParams)

        def policy_update(sac_state, k):
            k_sample, k_update = jax.random.split(k)
            model_batch, w, _ = segmented_sample(k_sample, rollouts, config.sac_batch)
            sac_state, metrics, _ = core.update(k_update, sac_state, model_batch, w, sac_hp)
            return sac_state, metrics

        sac_state, metrics = jax.lax.scan(policy_update, state.sac,
                                          jax.random.split(key_sac, config.policy_updates))
        counts = state.counts
        counts = counts.replace(policy_updates=counts.policy_updates + config.policy_updates,
                                model_rollouts=counts.model_rollouts + rows)
        state = state.replace(sac=sac_state, psi=psi, psi_opt=psi_opt, rollouts=rollouts, counts=counts)
        metrics = {**jax.tree.map(jnp.mean, metrics), "psi_nll": psi_loss, "priority": priority.mean(),
                   "model_reward": reward.mean()}
        return state, metrics, priority

    def update(keys: Key, state: MEMRState, batches: Transition, weights: jax.Array | None, hp: MEMRHParams):
        """The chunk: a model fit on its H batches, then H MEMR steps (see the module docstring)."""
        if weights is None or config.start_states == "uniform":
            weights = jnp.ones(batches.reward.shape, jnp.float32)
        state, model_loss = fit_model(state, batches, weights, hp)

        def one(state, x):
            key, batch, w = x
            state, metrics, priority = memr_step(key, state, batch, w, hp)
            return state, (metrics, priority)

        state, (metrics, priorities) = jax.lax.scan(one, state, (keys, batches, weights))
        metrics = {**jax.tree.map(jnp.mean, metrics), "model_nll": model_loss}
        return state, metrics, priorities

    return MEMRCore(core, model_net, psi_net, init, fit_model, memr_step, update)


def make_memr(config: MEMRConfig, spec: EnvSpec) -> Learner:
    """MEMR's learner; prioritized start states need a source that samples by the priorities it writes back
    (``ReplayStep.by_priority``), uniform ones one that does not (``priorities`` False): checked when the run is
    built, so every option alone, and the learner's defaults, stay valid run options."""
    core = memr_core(config, spec)
    prioritized = config.start_states == "prioritized"
    return Learner(init=core.init,
                   act=without_extras(lambda key, state, obs, hp: core.sac.act(key, state.sac, obs, hp)),
                   policy=lambda state, obs: core.sac.policy(state.sac, obs),
                   step=ReplayStep(core.update, chunk=config.chunk, priorities=prioritized, by_priority=prioritized))


def check_run(config: MEMRConfig, spec: EnvSpec) -> tuple[str, str] | None:
    """``RunFit.check_env``: a known termination needs the task's rule (checked when the run is built, so every
    option alone, and the learner's defaults, stay valid run options)."""
    if config.termination == "known" and known_termination(spec.name) is None:
        return "termination", (f"popjax knows no termination rule for {spec.name} (allowed: known for "
                               f"{', '.join(KNOWN_TERMINATIONS)}; learned for any task)")
    return None


def specialize(config: MEMRConfig, hparams, updates_per_call: int, searched: frozenset[str],
               exact_chunks: bool = True) -> MEMRConfig:
    """Checks that the driver's K updates per call are whole model-fit periods (a chunk is MEMR's smallest
    update: a fit and the steps it serves)."""
    del hparams, searched, exact_chunks
    if updates_per_call % config.chunk:
        raise ConfigError(f"learner_config.model_update_every: x update_ratio ({config.chunk} updates) must divide "
                          f"the updates per iteration ({updates_per_call}: rollout_len * envs_per_member * "
                          f"update_ratio), got {config.model_update_every}")
    return config


def counts(config: MEMRConfig, updates: int) -> dict[str, int]:
    """What ``updates`` MEMR steps did: the state's ``Counts`` (summary.json)."""
    return {"policy_updates": config.policy_updates * updates, "model_rollouts": config.batch_size * updates,
            "model_fits": updates // config.chunk}


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
