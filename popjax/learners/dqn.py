"""DQN (Mnih et al. 2015) with double-Q (van Hasselt et al. 2016) and dueling (Wang et al.
2016) options, as a pure single-member learner.

- TD target: ``y = r + gamma * (1 - terminated) * Q_target(s', a*)`` with
  ``a* = argmax_a Q_online(s', a)`` when ``double_q`` (the default) and
  ``a* = argmax_a Q_target(s', a)`` (i.e. ``max_a Q_target``) otherwise.
- Loss: ``mean_batch(huber_1(Q(s, a) - y))`` (delta = 1, as Nature DQN's error clipping and
  SB3's smooth-L1) when ``huber``, else ``mean_batch((Q(s, a) - y)^2)`` (CleanRL's MSE).
- Target network: hard copy of the online parameters every ``target_update_period``
  updates (static period; the predicate depends on the member's own counter, so under
  vmap it is a select, as for the TD3 policy delay).
- Exploration: epsilon-greedy. ``State`` only changes in ``update``, so the schedule is a
  function of the **update** counter ``state.steps``: epsilon decays linearly from
  ``epsilon_start`` to ``epsilon_end`` over ``epsilon_decay_steps`` updates, then stays at
  ``epsilon_end``. A driver that does ``k`` env steps per update should divide an
  env-step horizon by ``k``.

Defaults are not from the fast-PBT paper (it reports no DQN training run); each one below names its source.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import struct
from pydantic import Field

from popjax import schema
from popjax.learners.base import (
    BatchSize,
    Hidden,
    Learner,
    LearnerDef,
    PBTSupport,
    RunFit,
    adam_init,
    adam_step,
    replay_step,
    scalar,
    select,
    without_extras,
)
from popjax.networks.mlp import QNetwork, check_cnn
from popjax.population.hparams import hparam
from popjax.population.search_spaces import SEARCH_SPACES
from popjax.types import EnvSpec, Key, PyTree, Transition


@schema.dataclass
class DQNConfig:
    # SB3 rl-zoo CartPole net_arch
    hidden: Hidden = Field((256, 256), description="hidden layer sizes of the Q-network (its MLP head with cnn)")
    # CleanRL dqn.py (CartPole-v1)
    batch_size: BatchSize = Field(128, description="transitions per gradient step (the run's batch_size)")
    double_q: schema.Bool = Field(True, description="double Q-learning target")
    dueling: schema.Bool = Field(False, description="dueling value/advantage head")
    cnn: schema.Bool = Field(False, description="Nature CNN torso for [84, 84, 4] frames")
    # CleanRL's target_network_frequency value, counted in updates here
    target_update_period: schema.Int(ge=1, le=1_000_000_000) = Field(
        500, description="updates between two hard copies of the target network")
    huber: schema.Bool = Field(True, description="Huber loss (delta 1) instead of the squared TD error")


@struct.dataclass
class DQNHParams:
    lr: jax.Array = hparam("Adam learning rate", gt=0, le=1)
    discount: jax.Array = hparam("discount factor gamma", ge=0, le=1)
    epsilon_start: jax.Array = hparam("exploration epsilon at update 0", ge=0, le=1)
    epsilon_end: jax.Array = hparam("exploration epsilon after the decay", ge=0, le=1)
    epsilon_decay_steps: jax.Array = hparam("updates of the linear epsilon decay (float32)", ge=0)


@struct.dataclass
class DQNState:
    params: PyTree
    target_params: PyTree
    opt: PyTree
    steps: jax.Array  # int32, updates done (also drives the epsilon schedule)


def default_hparams(config: DQNConfig | None = None) -> DQNHParams:
    """CleanRL ``dqn.py`` CartPole-v1 defaults, except the decay horizon (popjax choice)."""
    del config
    return DQNHParams(
        lr=scalar(2.5e-4),  # CleanRL dqn.py
        discount=scalar(0.99),  # CleanRL dqn.py / Nature DQN
        epsilon_start=scalar(1.0),  # CleanRL dqn.py
        epsilon_end=scalar(0.05),  # CleanRL dqn.py
        epsilon_decay_steps=scalar(10_000.0),  # popjax: 10k updates
    )


def epsilon(hp: DQNHParams, steps: jax.Array) -> jax.Array:
    """Linear schedule over updates: ``epsilon_start`` at 0, ``epsilon_end`` from ``epsilon_decay_steps`` on.

    A decay horizon below one update is treated as one (no division by zero).
    """
    frac = jnp.clip(steps.astype(jnp.float32) / jnp.maximum(hp.epsilon_decay_steps, 1.0), 0.0, 1.0)
    return hp.epsilon_start + frac * (hp.epsilon_end - hp.epsilon_start)


def td_target(q_net, selector: PyTree, target_params: PyTree, batch: Transition, discount: jax.Array,
              double_q: bool) -> jax.Array:
    """``r + discount * (1 - terminated) * Q_target(s', a*)``; ``a*`` is the argmax of ``Q_selector`` (double Q)
    or of ``Q_target``. ``selector`` is a parameter (SPO selects with its last averaged network)."""
    next_q_target = q_net.apply(target_params, batch.next_obs)  # [B, A]
    next_action = jnp.argmax(q_net.apply(selector, batch.next_obs) if double_q else next_q_target, axis=-1)
    next_q = jnp.take_along_axis(next_q_target, next_action[..., None], axis=-1)[..., 0]
    return batch.reward + discount * (1.0 - batch.terminated) * next_q


def q_loss(params: PyTree, q_net, batch: Transition, y: jax.Array, huber: bool, weights: jax.Array | None = None):
    """``(mean_batch(huber_1 or square of Q(s, a) - y), Q(s, a))``; sample i weighted by ``weights[i]`` if given
    (importance weights of prioritized replay)."""
    q_all = q_net.apply(params, batch.obs)
    q = jnp.take_along_axis(q_all, batch.action[..., None].astype(jnp.int32), axis=-1)[..., 0]
    td = q - y
    loss = optax.huber_loss(td, delta=1.0) if huber else td**2
    if weights is not None:
        loss = weights * loss
    return jnp.mean(loss), q


def make_dqn(config: DQNConfig, spec: EnvSpec) -> Learner:
    q_net = QNetwork(config.hidden, spec.num_actions, dueling=config.dueling, cnn=config.cnn)

    def init(key: Key, hparams: DQNHParams) -> DQNState:
        del hparams
        params = q_net.init(key, jnp.zeros((1,) + spec.obs_shape, jnp.float32))
        return DQNState(
            params=params,
            target_params=params,
            opt=adam_init(params),
            steps=jnp.zeros((), jnp.int32),
        )

    def update_weighted(key: Key, state: DQNState, batch: Transition, weights: jax.Array | None, hp: DQNHParams):
        """One update, the loss weighted per sample (``weights`` None: unweighted); also ``|Q(s, a) - y|``."""
        del key  # the update is deterministic; randomness enters only in `act`
        y = jax.lax.stop_gradient(td_target(q_net, state.params, state.target_params, batch, hp.discount,
                                            config.double_q))
        (loss, q), grads = jax.value_and_grad(q_loss, has_aux=True)(state.params, q_net, batch, y, config.huber,
                                                                    weights)
        params, opt = adam_step(state.params, grads, state.opt, hp.lr)
        steps = state.steps + 1
        target_params = select(steps % config.target_update_period == 0, params, state.target_params)
        new_state = DQNState(params=params, target_params=target_params, opt=opt, steps=steps)
        metrics = {"loss": loss, "q_mean": q.mean(), "epsilon": epsilon(hp, steps)}
        return new_state, metrics, jnp.abs(q - y)

    def policy(state: DQNState, obs: jax.Array) -> jax.Array:
        return jnp.argmax(q_net.apply(state.params, obs), axis=-1).astype(jnp.int32)

    def act(key: Key, state: DQNState, obs: jax.Array, hp: DQNHParams) -> jax.Array:
        key_explore, key_action = jax.random.split(key)
        greedy = policy(state, obs)
        random_action = jax.random.randint(key_action, greedy.shape, 0, spec.num_actions, jnp.int32)
        explore = jax.random.uniform(key_explore, greedy.shape) < epsilon(hp, state.steps)
        return jnp.where(explore, random_action, greedy)

    return Learner(init=init, act=without_extras(act), policy=policy, step=replay_step(update_weighted))


# The RL Baselines3 Zoo's tuned values, in popjax's units (see ``popjax.presets``): env -> options.
PRESETS = {
    "gym:CartPole-v1": {
        "total_env_steps": 50_000, "warmup_steps": 1_000, "batch_size": 64, "buffer_size": 100_000,
        "rollout_len": 256, "update_ratio": 0.5,
        "hparams": {"lr": 2.3e-3, "discount": 0.99, "epsilon_end": 0.04, "epsilon_decay_steps": 4_000},
        "learner_config": {"hidden": [256, 256], "target_update_period": 128}},
}

DEFINITION = LearnerDef(
    name="dqn", pbt=PBTSupport(SEARCH_SPACES["dqn"]), presets=PRESETS,
    config_cls=DQNConfig,
    hparams_cls=DQNHParams,
    make=make_dqn,
    default_hparams=default_hparams,
    action_kind="discrete",
    fit=RunFit(check_env=check_cnn),
)
