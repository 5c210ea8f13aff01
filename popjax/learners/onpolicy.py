"""What the on-policy learners (PPO, A2C) share: the actor-critic, its action distribution, GAE, the losses.

- Network: separate actor and critic MLPs with tanh activations and orthogonal initialisation (hidden
  layers gain sqrt(2), policy output 0.01, value output 1), as in the PPO implementations of Huang et al.
  (2022, "The 37 implementation details of PPO"). Discrete envs: a categorical head over the logits.
  Continuous envs: a Gaussian with a state-independent log-std parameter (initially 0), squashed by
  ``tanh`` so that every action lies in [-1, 1]; log-probabilities are those of the squashed action
  (``atanh`` of the stored action, with the Jacobian of ``tanh``), and the entropy bonus is the entropy of
  the Gaussian before squashing (the squashed one has no closed form). The PPO ratio and the A2C gradient
  do not depend on the Jacobian term (it has no parameters).
- Advantages: GAE (Schulman et al. 2016, Eq. 16) over a time-major trajectory, with
  ``delta_t = r_t + gamma (1 - terminated_t) V(next_obs_t) - V(obs_t)`` and
  ``A_t = delta_t + gamma lambda (1 - ended_t) A_{t+1}``, ``A_T = 0``: a termination does not bootstrap,
  a truncation (``ended`` without ``terminated``) bootstraps from the real last observation and cuts the
  recursion, and the rollout's last step bootstraps from ``V(next_obs_{T-1})``. Returns are ``A + V``.
- Values, old log-probabilities and advantages come from the **behaviour** parameters (the policy that
  collected the trajectory).
- Optimizer: Adam with a traced learning rate (``adam_step``) after clipping the gradient's global norm
  to ``max_grad_norm``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

from popjax.learners.base import adam_init
from popjax.types import EnvSpec, Key, PyTree, Trajectory

ATANH_LIMIT = 1.0 - 1e-6  # |action| is clipped below 1 before atanh (a float32 tanh can round to 1)
HALF_LOG_2PI_E = 0.5 * math.log(2 * math.pi * math.e)


class ActorCritic(nn.Module):
    """obs -> (policy head, value): logits ``[..., A]`` (discrete) or ``(mean, log_std)`` ``[..., D]``."""

    hidden: Sequence[int]
    num_actions: int = 0  # discrete
    action_dim: int = 0  # continuous

    @nn.compact
    def __call__(self, obs: jax.Array):
        def mlp(x, out, out_scale, name):
            for i, width in enumerate(self.hidden):
                x = jnp.tanh(nn.Dense(width, kernel_init=nn.initializers.orthogonal(math.sqrt(2)),
                                      name=f"{name}_{i}")(x))
            return nn.Dense(out, kernel_init=nn.initializers.orthogonal(out_scale), name=f"{name}_out")(x)

        value = mlp(obs, 1, 1.0, "critic")[..., 0]
        if self.num_actions:
            return mlp(obs, self.num_actions, 0.01, "actor"), value
        mean = mlp(obs, self.action_dim, 0.01, "actor")
        log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))
        return (mean, jnp.broadcast_to(log_std, mean.shape)), value


def network(hidden: Sequence[int], spec: EnvSpec) -> ActorCritic:
    return ActorCritic(tuple(hidden), num_actions=spec.num_actions, action_dim=0 if spec.discrete else spec.action_dim)


# --- the action distribution ----------------------------------------------------------------------
def log_prob(head, action: jax.Array) -> jax.Array:
    """log pi(action) for a categorical head (logits) or a tanh-squashed Gaussian head (mean, log_std)."""
    if not isinstance(head, tuple):
        logp = jax.nn.log_softmax(head)
        return jnp.take_along_axis(logp, action[..., None].astype(jnp.int32), axis=-1)[..., 0]
    mean, log_std = head
    a = jnp.clip(action, -ATANH_LIMIT, ATANH_LIMIT)
    u = jnp.arctanh(a)
    gauss = -0.5 * ((u - mean) / jnp.exp(log_std)) ** 2 - log_std - 0.5 * math.log(2 * math.pi)
    return jnp.sum(gauss - jnp.log1p(-a**2), axis=-1)


def entropy(head) -> jax.Array:
    """Entropy of the categorical, or of the Gaussian before the tanh squashing."""
    if not isinstance(head, tuple):
        logp = jax.nn.log_softmax(head)
        return -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    return jnp.sum(head[1] + HALF_LOG_2PI_E, axis=-1)


def sample(key: Key, head) -> jax.Array:
    if not isinstance(head, tuple):
        return jax.random.categorical(key, head).astype(jnp.int32)
    mean, log_std = head
    return jnp.tanh(mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape))


def mode(head) -> jax.Array:
    if not isinstance(head, tuple):
        return jnp.argmax(head, axis=-1).astype(jnp.int32)
    return jnp.tanh(head[0])


# --- returns ---------------------------------------------------------------------------------------
def gae(reward, terminated, ended, value, next_value, discount, lam) -> tuple[jax.Array, jax.Array]:
    """``(advantages, returns)``, every input time-major ``[T, ...]`` (see the module docstring)."""
    delta = reward + discount * (1.0 - terminated) * next_value - value
    carry_on = discount * lam * (1.0 - ended.astype(jnp.float32))

    def back(next_advantage, step):
        d, c = step
        advantage = d + c * next_advantage
        return advantage, advantage

    _, advantages = jax.lax.scan(back, jnp.zeros_like(delta[0]), (delta, carry_on), reverse=True)
    return advantages, advantages + value


@struct.dataclass
class Batch:
    """Flat on-policy samples ``[n, ...]``: what the losses read."""

    obs: jax.Array
    action: jax.Array
    old_log_prob: jax.Array
    advantage: jax.Array
    ret: jax.Array


def behaviour_batch(net: ActorCritic, params: PyTree, trajectory: Trajectory, discount, lam) -> Batch:
    """The trajectory ``[T, envs, ...]`` as a flat ``[T * envs]`` batch with log-probabilities, GAE advantages
    and returns from ``params`` (the behaviour parameters)."""
    tr = trajectory.transitions
    head, value = net.apply(params, tr.obs)
    _, next_value = net.apply(params, tr.next_obs)
    advantage, ret = gae(tr.reward, tr.terminated, trajectory.ended, value, next_value, discount, lam)
    batch = Batch(tr.obs, tr.action, log_prob(head, tr.action), advantage, ret)
    flat = lambda x: x.reshape((-1,) + x.shape[2:])
    return jax.lax.stop_gradient(jax.tree.map(flat, batch))


def normalize(advantage: jax.Array) -> jax.Array:
    return (advantage - advantage.mean()) / (advantage.std() + 1e-8)


# --- losses ----------------------------------------------------------------------------------------
def value_loss(value: jax.Array, ret: jax.Array) -> jax.Array:
    return 0.5 * jnp.mean((value - ret) ** 2)


def a2c_loss(params, net: ActorCritic, batch: Batch, ent_coef, vf_coef, normalize_advantages: bool):
    """Mnih et al. (2016): ``-mean(log pi(a|s) A) + vf_coef * 0.5 mean((V - R)^2) - ent_coef * mean(H)``."""
    head, value = net.apply(params, batch.obs)
    advantage = normalize(batch.advantage) if normalize_advantages else batch.advantage
    pg = -jnp.mean(log_prob(head, batch.action) * advantage)
    vl, ent = value_loss(value, batch.ret), jnp.mean(entropy(head))
    return pg + vf_coef * vl - ent_coef * ent, {"pg_loss": pg, "value_loss": vl, "entropy": ent}


def truncated_is_weights(log_prob_current: jax.Array, log_prob_behaviour: jax.Array, c_bar) -> jax.Array:
    """``min(c_bar, pi(a|s) / mu(a|s))``, constant under differentiation (the truncated importance weights of
    Retrace and IMPALA's V-trace, applied to the policy-gradient term)."""
    return jax.lax.stop_gradient(jnp.minimum(c_bar, jnp.exp(log_prob_current - log_prob_behaviour)))


def a2c_truncated_is_loss(params, net: ActorCritic, batch: Batch, c_bar, ent_coef, vf_coef,
                          normalize_advantages: bool):
    """A2C on data of another (behaviour) policy mu, evaluated at ``params``: the policy-gradient term of
    ``a2c_loss`` weighted per sample by ``truncated_is_weights`` (``batch.old_log_prob`` is log mu(a|s));
    the value and entropy terms are A2C's. With mu = pi and ``c_bar >= 1`` it is ``a2c_loss``."""
    head, value = net.apply(params, batch.obs)
    advantage = normalize(batch.advantage) if normalize_advantages else batch.advantage
    current = log_prob(head, batch.action)
    weight = truncated_is_weights(current, batch.old_log_prob, c_bar)
    pg = -jnp.mean(weight * current * advantage)
    vl, ent = value_loss(value, batch.ret), jnp.mean(entropy(head))
    return pg + vf_coef * vl - ent_coef * ent, {"pg_loss": pg, "value_loss": vl, "entropy": ent,
                                                 "is_weight": jnp.mean(weight)}


def ppo_loss(params, net: ActorCritic, batch: Batch, clip, ent_coef, vf_coef, normalize_advantages: bool):
    """Schulman et al. (2017), Eq. 7 and 9: ``-mean(min(r A, clip(r, 1 - eps, 1 + eps) A))`` with
    ``r = pi(a|s) / pi_old(a|s)``, plus ``vf_coef * 0.5 mean((V - R)^2) - ent_coef * mean(H)``."""
    head, value = net.apply(params, batch.obs)
    advantage = normalize(batch.advantage) if normalize_advantages else batch.advantage
    log_ratio = log_prob(head, batch.action) - batch.old_log_prob
    ratio = jnp.exp(log_ratio)
    pg = -jnp.mean(jnp.minimum(ratio * advantage, jnp.clip(ratio, 1.0 - clip, 1.0 + clip) * advantage))
    vl, ent = value_loss(value, batch.ret), jnp.mean(entropy(head))
    metrics = {"pg_loss": pg, "value_loss": vl, "entropy": ent,
               "approx_kl": jnp.mean((ratio - 1.0) - log_ratio),  # Schulman's k3 estimator of KL(old, new)
               "clip_fraction": jnp.mean((jnp.abs(ratio - 1.0) > clip).astype(jnp.float32))}
    return pg + vf_coef * vl - ent_coef * ent, metrics


def clip_by_global_norm(grads: PyTree, max_norm: jax.Array) -> tuple[PyTree, jax.Array]:
    """``grads`` scaled to a global norm of at most ``max_norm`` (traced); also the norm before clipping."""
    norm = optax.tree.norm(grads)  # optax.global_norm is deprecated (its warning names optax, not the caller)
    scale = jnp.minimum(1.0, max_norm / (norm + 1e-6))
    return jax.tree.map(lambda g: g * scale, grads), norm


# --- state ----------------------------------------------------------------------------------------
@struct.dataclass
class OnPolicyState:
    params: PyTree
    opt: PyTree
    steps: jax.Array  # int32, gradient steps done


def init_state(net: ActorCritic, spec: EnvSpec, key: Key) -> OnPolicyState:
    params = net.init(key, jnp.zeros((1,) + spec.obs_shape, jnp.float32))
    return OnPolicyState(params=params, opt=adam_init(params), steps=jnp.zeros((), jnp.int32))


def acting(net: ActorCritic):
    """``(act, policy)`` of the learner contract: a sample, and the distribution's mode."""

    def act(key: Key, state: OnPolicyState, obs: jax.Array, hparams) -> jax.Array:
        del hparams
        return sample(key, net.apply(state.params, obs)[0])

    def policy(state: OnPolicyState, obs: jax.Array) -> jax.Array:
        return mode(net.apply(state.params, obs)[0])

    return act, policy
