"""A2C, the synchronous advantage actor-critic (Mnih et al. 2016), as a pure single-member on-policy learner.

One gradient step per rollout on ``-log pi(a|s) A + vf_coef * 0.5 (V - R)^2 - ent_coef * H`` with GAE
advantages (``gae_lambda = 1`` gives the paper's n-step returns, bootstrapped at the end of the rollout).
The gradient is evaluated at the **behaviour** parameters (the policy that collected the trajectory) and
applied to the **current** ones: ``theta_{j+1} = theta_j + eta grad J(theta_{j-1}; D(theta_{j-1}))``
(Liu et al. 2020, HTS-RL, Eq. 6), which is plain A2C when the two are the same state (a synchronous loop).
``lag_correction: truncated_is`` is the alternative of the paper's Table A1: the gradient at the current
parameters with each sample's policy-gradient term weighted by ``min(is_clip, pi(a|s) / mu(a|s))`` (mu: the
behaviour policy; advantages and returns still from the behaviour critic); on-policy with ``is_clip >= 1`` it
is plain A2C too.

Optimizer: Adam with a traced learning rate (popjax choice, as the PPO learner; Mnih et al. and Liu et al.
used RMSProp). Defaults: Stable-Baselines3 A2C (lr 7e-4, gamma 0.99, lambda 1, entropy 0, value 0.5,
max grad norm 0.5), except an entropy coefficient of 0.01 (Mnih et al. 2016; Liu et al. 2020, Table A3).
"""

from __future__ import annotations

import jax
from flax import struct
from pydantic import Field

from popjax import schema
from popjax.learners import onpolicy
from popjax.learners.base import (
    Hidden,
    Learner,
    LearnerDef,
    PBTSupport,
    RolloutStep,
    adam_step,
    scalar,
    without_extras,
)
from popjax.population.hparams import hparam
from popjax.population.search_spaces import SEARCH_SPACES
from popjax.types import EnvSpec, Key, Trajectory


@schema.dataclass
class A2CConfig:
    hidden: Hidden = Field((64, 64), description="hidden layer sizes of the actor and of the critic (tanh)")
    normalize_advantages: schema.Bool = Field(False, description="normalize the advantages of each rollout")
    lag_correction: schema.OneOf(("gradient", "truncated_is")) = Field(
        "gradient", description="data of a lagged behaviour policy (hts): gradient = the gradient at the behaviour "
        "parameters (Eq. 6); truncated_is = at the current ones, weighted by min(is_clip, pi/mu)")


@struct.dataclass
class A2CHParams:
    lr: jax.Array = hparam("Adam learning rate", gt=0, le=1)
    discount: jax.Array = hparam("discount factor gamma", ge=0, le=1)
    gae_lambda: jax.Array = hparam("GAE lambda (1: n-step returns)", ge=0, le=1)
    ent_coef: jax.Array = hparam("entropy bonus coefficient", ge=0, le=100)
    vf_coef: jax.Array = hparam("value loss coefficient", ge=0, le=100)
    max_grad_norm: jax.Array = hparam("global gradient norm clip", gt=0)
    is_clip: jax.Array = hparam("truncation of the importance weights pi/mu (lag_correction: truncated_is)", gt=0)


def default_hparams(config: A2CConfig | None = None) -> A2CHParams:
    del config
    return A2CHParams(lr=scalar(7e-4), discount=scalar(0.99), gae_lambda=scalar(1.0), ent_coef=scalar(0.01),
                      vf_coef=scalar(0.5), max_grad_norm=scalar(0.5), is_clip=scalar(1.0))


def make_a2c(config: A2CConfig, spec: EnvSpec) -> Learner:
    net = onpolicy.network(config.hidden, spec)

    def init(key: Key, hparams: A2CHParams) -> onpolicy.OnPolicyState:
        del hparams
        return onpolicy.init_state(net, spec, key)

    def update_rollout(key: Key, state: onpolicy.OnPolicyState, trajectory: Trajectory, hp: A2CHParams, behaviour):
        del key  # deterministic
        batch = onpolicy.behaviour_batch(net, behaviour.params, trajectory, hp.discount, hp.gae_lambda)
        if config.lag_correction == "gradient":  # Eq. 6: the gradient where the data came from
            grads, metrics = jax.grad(onpolicy.a2c_loss, has_aux=True)(behaviour.params, net, batch, hp.ent_coef,
                                                                       hp.vf_coef, config.normalize_advantages)
        else:  # truncated importance sampling: the gradient here, the lag weighted out
            grads, metrics = jax.grad(onpolicy.a2c_truncated_is_loss, has_aux=True)(
                state.params, net, batch, hp.is_clip, hp.ent_coef, hp.vf_coef, config.normalize_advantages)
        grads, metrics["grad_norm"] = onpolicy.clip_by_global_norm(grads, hp.max_grad_norm)
        params, opt = adam_step(state.params, grads, state.opt, hp.lr)
        return onpolicy.OnPolicyState(params=params, opt=opt, steps=state.steps + 1), metrics

    act, policy = onpolicy.acting(net)
    return Learner(init=init, act=without_extras(act), policy=policy, step=RolloutStep(update_rollout, updates=1))


# The RL Baselines3 Zoo's tuned values, in popjax's units (see ``popjax.presets``): env -> options.
# zoo a2c.yml CartPole-v1: 8 envs, no entropy bonus, 5e5 steps (SB3 defaults otherwise: 5 steps, lr 7e-4, vf_coef
# 0.5, which is popjax's 1.0)
PRESETS = {
    "gym:CartPole-v1": {
        "total_env_steps": 500_000, "envs_per_member": 8, "rollout_len": 5,
        "hparams": {"ent_coef": 0.0, "vf_coef": 1.0}},
}

DEFINITION = LearnerDef(name="a2c", pbt=PBTSupport(SEARCH_SPACES["a2c"]), presets=PRESETS,
                        config_cls=A2CConfig, hparams_cls=A2CHParams, make=make_a2c,
                        default_hparams=default_hparams, action_kind="any", step_kind=RolloutStep)
