"""ReF-ER, Remember and Forget Experience Replay (Novati & Koumoutsakos, ICML 2019), around TD3 and SAC.

A wrapper, not a copy: the base learner's update runs unchanged with two substitutions, its critic's per-sample
weights and the objective over its per-sample actor losses (``actor_critic.Steps.actor_objective``):

- every transition records the behaviour policy that acted, a diagonal Gaussian in the network's action space
  (``extras``: mean, log-std, the pre-clip / pre-tanh action ``u`` and the last ratio ``rho``, 1 on insert).
  TD3's behaviour is ``N(actor(s), sigma^2)`` with ``sigma = exploration_noise``, the sigma actually used to act;
  SAC's is the actor's own Gaussian before the tanh (whose Jacobian cancels in the ratio).
- ``rho = pi(u|s) / mu(u|s)`` from untruncated Gaussian densities, ``log rho`` clipped at +-7; a sample is near
  iff ``1/c_max < rho < c_max`` (strict), ``c_max = 1 + C / (1 + A t)`` (Eq. 13, t = gradient steps).
- Rule 1: far samples get no task gradient (a multiplicative mask on the critic's squared TD errors and on the
  per-sample actor terms, the batch still divided by B). The critic is not scaled by beta (the authors' DDPG).
- Rule 2: the actor minimises ``mean_B(beta * near_i * L_task,i) + (1 - beta) * mean_B(KL_i)``, KL(mu || pi) by
  default (``kl: pi_mu`` for the authors' code's direction; equal for TD3, whose sigma is not learned).
- beta (Eq. 12) after every step: ``beta += beta_lr * (1[far fraction <= D] - beta)``, the far fraction counted
  over every stored ratio of the replay with the current c_max; beta and t are learner state (PBT copies them).
- the ratios of the sampled rows are written back (``Refresh``), and recomputed for the whole replay in one call
  when a PBT exploit replaces the member's learner state.
- ``anneal_lr``: the learning rates follow ``lr / (1 + A t)`` (Eq. 13; off by default, PBT may own the lr).

SAC's temperature step is unchanged (it uses every sample). Discrete-action learners have no density and are
not wrapped (``refer`` refuses them).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from pydantic import Field

from popjax import schema
from popjax.learners import sac, td3
from popjax.learners.actor_critic import Core, Steps
from popjax.learners.base import (
    BatchSize,
    Hidden,
    Learner,
    LearnerDef,
    PBTSupport,
    Refresh,
    ReplayStep,
    Report,
    RunFit,
    one_step_chunk,
    scalar,
)
from popjax.population.hparams import extend, hparam
from popjax.population.search_spaces import SEARCH_SPACES
from popjax.types import EnvSpec, Key, Replayed, Transition

LOG_RHO_CLIP = 7.0  # the authors' code: rho = exp(clip(log pi - log mu, -7, 7))
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


# --- the mechanism, as pure functions ---------------------------------------------------------------
def gaussian_log_density(x: jax.Array, mean: jax.Array, log_std: jax.Array) -> jax.Array:
    """Log-density of a diagonal Gaussian at ``x``, summed over the last axis (untruncated)."""
    return jnp.sum(-0.5 * ((x - mean) * jnp.exp(-log_std)) ** 2 - log_std - _HALF_LOG_2PI, axis=-1)


def importance_ratio(u, mean_pi, log_std_pi, mean_mu, log_std_mu) -> jax.Array:
    """``rho = pi(u) / mu(u)`` with ``log rho`` clipped at +-``LOG_RHO_CLIP``."""
    log_rho = gaussian_log_density(u, mean_pi, log_std_pi) - gaussian_log_density(u, mean_mu, log_std_mu)
    return jnp.exp(jnp.clip(log_rho, -LOG_RHO_CLIP, LOG_RHO_CLIP))


def c_max(c: jax.Array, a: jax.Array, t: jax.Array) -> jax.Array:
    """Eq. 13: ``1 + C / (1 + A t)``."""
    return 1.0 + c / (1.0 + a * t.astype(jnp.float32))


def near_mask(rho: jax.Array, cmax: jax.Array) -> jax.Array:
    """Near-policy iff ``1/c_max < rho < c_max`` (strict); with ``c_max <= 1`` nothing is far (plain ER)."""
    return ((rho > 1.0 / cmax) & (rho < cmax)) | (cmax <= 1.0)


def far_fraction(stored: jax.Array, valid: jax.Array, cmax: jax.Array) -> jax.Array:
    """n_far / N over the replay's valid rows, from the stored (possibly outdated) ratios, with the current c_max."""
    far = valid & ~near_mask(stored, cmax)
    return far.sum() / jnp.maximum(valid.sum(), 1)


def kl_gaussian(mean_p, log_std_p, mean_q, log_std_q) -> jax.Array:
    """``KL(p || q)`` of diagonal Gaussians, summed over the last axis."""
    var_ratio = jnp.exp(2.0 * (log_std_p - log_std_q))
    return jnp.sum(log_std_q - log_std_p + 0.5 * (var_ratio + ((mean_p - mean_q) * jnp.exp(-log_std_q)) ** 2) - 0.5,
                   axis=-1)


def beta_step(beta: jax.Array, far: jax.Array, d: jax.Array, lr: jax.Array) -> jax.Array:
    """Eq. 12: ``(1 - lr) beta`` when the far fraction exceeds D, else ``(1 - lr) beta + lr`` (written as a step
    towards 0 or 1, so beta = 1 stays exactly 1)."""
    return beta + lr * ((far <= d).astype(beta.dtype) - beta)


def refer_objective(task: jax.Array, near: jax.Array, kl: jax.Array, beta: jax.Array) -> jax.Array:
    """The minimised actor loss ``mean_B(beta * near * task) + (1 - beta) * mean_B(KL)``: far samples keep only
    their KL term, and the task part is divided by B, not by the number of near samples."""
    beta, near = jax.lax.stop_gradient(beta), jax.lax.stop_gradient(near)
    return beta * jnp.mean(near * task) + (1.0 - beta) * jnp.mean(kl)


# --- config, hyperparameters, state ------------------------------------------------------------------
@schema.dataclass
class ReferConfig:
    hidden: Hidden = Field((256, 256), description="hidden layer sizes of the actor and of each critic")
    batch_size: BatchSize = Field(256, description="transitions per gradient step (the run's batch_size)")
    anneal_lr: schema.Bool = Field(False, description="learning rates follow lr / (1 + A t) (Eq. 13); off: the lr "
                                                      "is the hparam's (PBT may own it)")
    kl: schema.OneOf(("mu_pi", "pi_mu")) = Field(
        "mu_pi", description="the penalty's direction: KL(mu || pi) as the paper writes, or KL(pi || mu) as the "
                             "authors' code (equal for TD3)")


@struct.dataclass
class ReferHParams:
    refer_c: jax.Array = hparam("C: c_max(0) - 1 (c_max = 1 + C / (1 + A t); near iff 1/c_max < rho < c_max)", gt=1)
    refer_d: jax.Array = hparam("D: target fraction of far-policy transitions in the replay", gt=0, lt=1)
    refer_a: jax.Array = hparam("A: annealing rate of c_max (and of the lr with anneal_lr) per gradient step", ge=0)
    beta_lr: jax.Array = hparam("step of the beta controller (Eq. 12)", gt=0, lt=1)
    beta_init: jax.Array = hparam("initial beta (weight of the task gradient)", ge=0, le=1)


@struct.dataclass
class ReferTD3HParams(ReferHParams, td3.TD3HParams):
    """TD3's hyperparameters (the exploration sigma is also the sigma of rho and KL) and ReF-ER's."""

    exploration_noise: jax.Array = hparam("sigma: std of the Gaussian exploration, of rho and of the KL", gt=0)


@struct.dataclass
class ReferSACHParams(ReferHParams, sac.SACHParams):
    """SAC's hyperparameters and ReF-ER's."""


def refer_defaults() -> dict[str, jax.Array]:
    """The paper's C = 4, D = 0.1, A = 5e-7, beta step 1e-4 and beta0 = 0 (the paper-era code's)."""
    return {"refer_c": scalar(4.0), "refer_d": scalar(0.1), "refer_a": scalar(5e-7), "beta_lr": scalar(1e-4),
            "beta_init": scalar(0.0)}


def default_td3_hparams(config: ReferConfig | None = None) -> ReferTD3HParams:
    """TD3's defaults with the paper's sigma = 0.2 and ReF-ER's defaults."""
    return extend(td3.default_hparams(), ReferTD3HParams, exploration_noise=scalar(0.2), **refer_defaults())


def default_sac_hparams(config: ReferConfig | None = None) -> ReferSACHParams:
    return extend(sac.default_hparams(), ReferSACHParams, **refer_defaults())


@struct.dataclass
class ReferState:
    base: Any  # the TD3State or SACState
    beta: jax.Array  # float32, weight of the task gradient (Eq. 12)
    t: jax.Array  # int32, gradient steps (the annealing clock of Eq. 13)


# --- the learner ---------------------------------------------------------------------------------------
def behaviour_example(spec: EnvSpec) -> dict[str, jax.Array]:
    """What every transition records (``ReplayStep.extras``): the behaviour Gaussian, the pre-squash action, rho."""
    vector = jnp.zeros((spec.action_dim,), jnp.float32)
    return {"mean": vector, "log_std": vector, "u": vector, "rho": jnp.ones((), jnp.float32)}


def make_refer(config: ReferConfig, spec: EnvSpec, base: Core) -> Learner:
    """ReF-ER around an actor-critic ``Core``: its update with the near mask as critic weights and ReF-ER's actor
    objective over the core's per-sample actor losses."""
    if spec.discrete:  # the registry's action_kind refuses it first; a greedy policy has no density
        raise ValueError("ReF-ER needs a continuous-action learner: a greedy policy gives no density for rho")

    def init(key: Key, hp) -> ReferState:
        return ReferState(base.init(key, hp), beta=jnp.asarray(hp.beta_init, jnp.float32),
                          t=jnp.zeros((), jnp.int32))

    def act(key: Key, state: ReferState, obs: jax.Array, hp):
        action, mean, log_std, u = base.act(key, state.base, obs, hp)
        return action, {"mean": mean, "log_std": log_std, "u": u, "rho": jnp.ones(mean.shape[:-1], jnp.float32)}

    def policy(state: ReferState, obs: jax.Array) -> jax.Array:
        return base.policy(state.base, obs)

    def kl(mu: dict, mean, log_std) -> jax.Array:
        if config.kl == "mu_pi":
            return kl_gaussian(mu["mean"], mu["log_std"], mean, log_std)
        return kl_gaussian(mean, log_std, mu["mean"], mu["log_std"])

    def ratios(state: ReferState, transitions: Transition, hp) -> jax.Array:
        """rho of ``transitions [N, ...]`` under the current policy: one batched forward pass."""
        mu = transitions.extras
        mean, log_std = base.gaussian(state.base.actor, transitions.obs, hp)
        return importance_ratio(mu["u"], mean, log_std, mu["mean"], mu["log_std"])

    def update(key: Key, state: ReferState, replayed: Replayed, weights, hp):
        del weights  # no importance-weighted source serves a refreshing learner (step.priorities is False)
        batch, mu = replayed.transitions, replayed.transitions.extras
        cmax = c_max(hp.refer_c, hp.refer_a, state.t)
        rho = ratios(state, batch, hp)
        near = near_mask(rho, cmax).astype(jnp.float32)

        def actor_objective(actor, task):
            mean, log_std = base.gaussian(actor, batch.obs, hp)
            return refer_objective(task, near, kl(mu, mean, log_std), state.beta)

        if config.anneal_lr:
            scale = 1.0 / (1.0 + hp.refer_a * state.t.astype(jnp.float32))
            hp = hp.replace(actor_lr=hp.actor_lr * scale, critic_lr=hp.critic_lr * scale)
        new_base, metrics, _ = base.update(key, state.base, batch, near, hp, Steps(actor_objective=actor_objective))
        far = far_fraction(replayed.stored, replayed.valid, cmax)
        mean, log_std = base.gaussian(state.base.actor, batch.obs, hp)
        metrics = {**metrics, "far_fraction": far, "beta": state.beta, "c_max": cmax,
                   "kl": jax.lax.stop_gradient(kl(mu, mean, log_std)).mean(), "batch_near": near.mean()}
        new_state = ReferState(new_base, beta_step(state.beta, far, hp.refer_d, hp.beta_lr), state.t + 1)
        return new_state, metrics, rho

    # Chunk 1 (no fixed-delay chunks: the ratios are refreshed between samplings).
    step = ReplayStep(one_step_chunk(update), chunk=1, priorities=False, extras=behaviour_example(spec),
                      refresh=Refresh("rho", ratios))
    return Learner(init=init, act=act, policy=policy, step=step)


def make_refer_td3(config: ReferConfig, spec: EnvSpec) -> Learner:
    return make_refer(config, spec, td3.td3_core(td3.TD3Config(hidden=config.hidden, batch_size=config.batch_size),
                                                 spec))


def make_refer_sac(config: ReferConfig, spec: EnvSpec) -> Learner:
    return make_refer(config, spec, sac.sac_core(sac.SACConfig(hidden=config.hidden, batch_size=config.batch_size),
                                                 spec))


# PBT priors: the base's, sigma kept > 0, plus C and D (the two that matter most, App. E).
_REFER_SPACE = {"refer_c": {"low": 2.0, "high": 8.0, "log": True}, "refer_d": {"low": 0.05, "high": 0.2}}
TD3_SPACE = {**SEARCH_SPACES["td3"], "exploration_noise": {"low": 0.05, "high": 0.5}, **_REFER_SPACE}
SAC_SPACE = {**SEARCH_SPACES["sac"], **_REFER_SPACE}

# Shared buffers (CEM-RL, DvD): most rows are far from any one member's policy, so beta -> 0 and every member is
# pulled to the mixture of behaviours (against DvD's diversity term). Refused rather than silently degraded.
FIT = RunFit(own_replay="needs each member's own replay (in a shared buffer most transitions are far from any one "
                        "member's policy: beta -> 0 and the KL pulls every member to the mixture of behaviours)")
SUMMARY_METRICS = ("far_fraction", "beta", "c_max", "kl")
TD3_DEFINITION = LearnerDef(name="refer_td3", config_cls=ReferConfig, hparams_cls=ReferTD3HParams,
                            make=make_refer_td3, default_hparams=default_td3_hparams, action_kind="continuous",
                            pbt=PBTSupport(TD3_SPACE), fit=FIT,
                            report=Report(summary_metrics=SUMMARY_METRICS, actor_params=lambda state: state.base.actor))
SAC_DEFINITION = LearnerDef(name="refer_sac", config_cls=ReferConfig, hparams_cls=ReferSACHParams,
                            make=make_refer_sac, default_hparams=default_sac_hparams, action_kind="continuous",
                            pbt=PBTSupport(SAC_SPACE), fit=FIT, report=Report(summary_metrics=SUMMARY_METRICS))
DEFINITIONS = (TD3_DEFINITION, SAC_DEFINITION)
