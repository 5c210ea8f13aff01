"""PPO (Schulman et al. 2017) with GAE (Schulman et al. 2016), as a pure single-member on-policy learner.

``update_rollout`` computes log-probabilities, values and GAE advantages of the trajectory with the
**behaviour** parameters (the policy that collected it), then runs ``epochs`` passes of ``minibatches``
shuffled minibatches of the clipped surrogate (Eq. 7) plus value loss and entropy bonus (Eq. 9) from the
**current** parameters. In a synchronous loop the two are the same state; under a one-step policy lag
(Liu et al. 2020, HTS-RL) the ratio ``pi_current / pi_behaviour`` and its clip absorb the lag. The shared
network, distribution, GAE and losses are in ``popjax.learners.onpolicy``.

Defaults: CleanRL ``ppo.py`` / ``ppo_continuous_action.py`` (Huang et al. 2022), except the hidden sizes
(64, 64) which both use anyway.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
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
class PPOConfig:
    hidden: Hidden = Field((64, 64), description="hidden layer sizes of the actor and of the critic (tanh)")
    epochs: schema.Int(ge=1, le=1_000) = Field(4, description="passes over each rollout")
    minibatches: schema.Int(ge=1, le=1_000_000) = Field(
        4, description="minibatches per pass; must divide rollout_len x envs_per_member")
    normalize_advantages: schema.Bool = Field(True, description="normalize the advantages of each minibatch")


@struct.dataclass
class PPOHParams:
    lr: jax.Array = hparam("Adam learning rate", gt=0, le=1)
    discount: jax.Array = hparam("discount factor gamma", ge=0, le=1)
    gae_lambda: jax.Array = hparam("GAE lambda", ge=0, le=1)
    clip: jax.Array = hparam("clip range epsilon of the probability ratio", gt=0, le=10)
    ent_coef: jax.Array = hparam("entropy bonus coefficient", ge=0, le=100)
    vf_coef: jax.Array = hparam("value loss coefficient", ge=0, le=100)
    max_grad_norm: jax.Array = hparam("global gradient norm clip", gt=0)


def default_hparams(config: PPOConfig | None = None) -> PPOHParams:
    """CleanRL ``ppo.py`` (CartPole) defaults."""
    del config
    return PPOHParams(lr=scalar(2.5e-4), discount=scalar(0.99), gae_lambda=scalar(0.95), clip=scalar(0.2),
                      ent_coef=scalar(0.01), vf_coef=scalar(0.5), max_grad_norm=scalar(0.5))


def make_ppo(config: PPOConfig, spec: EnvSpec) -> Learner:
    net = onpolicy.network(config.hidden, spec)
    epochs, minibatches = config.epochs, config.minibatches

    def init(key: Key, hparams: PPOHParams) -> onpolicy.OnPolicyState:
        del hparams
        return onpolicy.init_state(net, spec, key)

    def minibatch_step(carry, batch: onpolicy.Batch, hp: PPOHParams):
        params, opt = carry
        grads, metrics = jax.grad(onpolicy.ppo_loss, has_aux=True)(params, net, batch, hp.clip, hp.ent_coef,
                                                                    hp.vf_coef, config.normalize_advantages)
        grads, metrics["grad_norm"] = onpolicy.clip_by_global_norm(grads, hp.max_grad_norm)
        return adam_step(params, grads, opt, hp.lr), metrics

    def update_rollout(key: Key, state: onpolicy.OnPolicyState, trajectory: Trajectory, hp: PPOHParams, behaviour):
        data = onpolicy.behaviour_batch(net, behaviour.params, trajectory, hp.discount, hp.gae_lambda)
        n = data.advantage.shape[0]
        if n % minibatches:
            raise ValueError(f"learner_config.minibatches: {minibatches} does not divide the {n} transitions of a "
                             "rollout (rollout_len x envs_per_member)")

        def epoch(carry, epoch_key):
            order = jax.random.permutation(epoch_key, n)
            shuffled = jax.tree.map(lambda x: x[order].reshape((minibatches, n // minibatches) + x.shape[1:]), data)
            return jax.lax.scan(lambda c, b: minibatch_step(c, b, hp), carry, shuffled)

        (params, opt), metrics = jax.lax.scan(epoch, (state.params, state.opt), jax.random.split(key, epochs))
        new_state = onpolicy.OnPolicyState(params=params, opt=opt, steps=state.steps + epochs * minibatches)
        return new_state, jax.tree.map(jnp.mean, metrics)

    act, policy = onpolicy.acting(net)
    return Learner(init=init, act=without_extras(act), policy=policy,
                   step=RolloutStep(update_rollout, updates=epochs * minibatches))


# The RL Baselines3 Zoo's tuned values, in popjax's units (see ``popjax.presets``): env -> options.
# zoo ppo.yml CartPole-v1: 8 envs x 32 steps, minibatch 256, 20 epochs, lr 1e-3 and clip 0.2 (both linearly
# decayed there), gamma 0.98, lambda 0.8, no entropy bonus, 1e5 steps; SB3's vf_coef 0.5 is popjax's 1.0
PRESETS = {
    "gym:CartPole-v1": {
        "total_env_steps": 100_000, "envs_per_member": 8, "rollout_len": 32,
        "hparams": {"lr": 1e-3, "clip": 0.2, "discount": 0.98, "gae_lambda": 0.8, "ent_coef": 0.0, "vf_coef": 1.0},
        "learner_config": {"epochs": 20, "minibatches": 1}},
}

DEFINITION = LearnerDef(name="ppo", pbt=PBTSupport(SEARCH_SPACES["ppo"]), presets=PRESETS,
                        config_cls=PPOConfig, hparams_cls=PPOHParams, make=make_ppo,
                        default_hparams=default_hparams, action_kind="any", step_kind=RolloutStep)
