"""The original CEM-RL update order, one member after the other: the reference of ``bench shared_critic``.

CEM-RL (Pourchot & Sigaud 2019, Algorithm 1 / ``es_grad.py``) trains its actors in turn:
member ``i`` makes its share of the shared critic's updates on its own sub-batches, then its
actor updates through the current critic. The fast-PBT paper replaces this order by one
vectorized step (``popjax.learners.shared_critic``); this module keeps the sequential order
so that the speed-up can be measured and the two orders compared in tests. It is not a
training path (a Python loop over members is the point of it).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from popjax.learners.base import adam_step, polyak
from popjax.learners.shared_critic import SharedCriticState, SharedCriticTD3
from popjax.learners.td3 import TD3HParams, critic_loss_fn, dpg_loss, target_q
from popjax.networks.mlp import DeterministicActor, TwinCritic
from popjax.types import Key, Metrics, Transition


class SequentialOrder(NamedTuple):
    critic_step: object  # (key, (critic, opt, target), target_actor, batch, hp) -> (critic part, loss)
    actor_step: object  # ((actor, opt, target), critic, obs, hp) -> (actor part, loss)
    update: object  # (keys [K, pop], state, batches [K, pop, B], hparams, interleave=False) -> (state, metrics)


def make_sequential_order(shared: SharedCriticTD3, hidden, action_dim: int) -> SequentialOrder:
    """The CEM-RL-order functions for the networks of ``shared`` (same TD3 target and DPG loss)."""
    actor_net, critic_net = DeterministicActor(hidden, action_dim), TwinCritic(hidden)
    pop_size = shared.pop_size

    def critic_step(key: Key, critic_part, target_actor, batch: Transition, hp: TD3HParams):
        """One critic update on one member's sub-batch (targets from that member's target actor).

        ``critic_part = (critic, critic_opt, target_critic)``; the target critic moves every
        critic update (CEM-RL: policy delay 1).
        """
        critic, critic_opt, target_critic = critic_part
        y = target_q(key, actor_net, critic_net, target_actor, target_critic, batch, hp)
        (loss, _), grads = jax.value_and_grad(critic_loss_fn, has_aux=True)(critic, critic_net, batch, y)
        critic, critic_opt = adam_step(critic, grads, critic_opt, hp.critic_lr)
        return (critic, critic_opt, polyak(target_critic, critic, hp.tau)), loss

    def actor_step(actor_part, critic, obs: jax.Array, hp: TD3HParams):
        """One DPG update of one member through ``critic``; ``actor_part = (actor, opt, target_actor)``."""
        actor, actor_opt, target_actor = actor_part
        loss, grads = jax.value_and_grad(lambda a: dpg_loss(actor_net, critic_net, a, critic, obs))(actor)
        actor, actor_opt = adam_step(actor, grads, actor_opt, hp.actor_lr)
        return (actor, actor_opt, polyak(target_actor, actor, hp.tau)), loss

    def update(keys: Key, state: SharedCriticState, batches: Transition, hparams: TD3HParams,
               interleave: bool = False) -> tuple[SharedCriticState, Metrics]:
        """The CEM-RL order over ``K`` steps (``keys [K, pop]``, ``batches [K, pop, B, ...]``).

        Member ``i`` in turn gets ``K // pop`` (+1 for the first ``K % pop`` members) critic
        updates on its own sub-batches (targets from its own target actor) and ``K`` actor
        updates through the current critic on ``batches[:, i]``. ``interleave=False``
        (CEM-RL's Algorithm 1 and ``es_grad.py``): first all its critic updates, each on the
        sub-batch of a distinct step ``s`` with ``keys[s, i]``, then its actor updates.
        ``interleave=True``: its critic updates spread evenly between its actor updates (a
        critic update on the same step's sub-batch before the actor update of that step).
        Totals either way: ``K`` critic updates (as the vectorized ``train``), ``K`` actor
        updates per member. Ignores ``policy_delay`` (CEM-RL uses 1).
        """
        n_steps = keys.shape[0]
        counts = [n_steps // pop_size + (i < n_steps % pop_size) for i in range(pop_size)]
        critic_part = (state.critic, state.critic_opt, state.target_critic)
        actors, critic_losses, actor_losses = [], [], []
        start = 0
        for i, count in enumerate(counts):
            hp = jax.tree.map(lambda x, i=i: x[i], hparams)
            member = lambda tree, i=i: jax.tree.map(lambda x: x[i], tree)
            part = (member(state.actor), member(state.actor_opt), member(state.target_actor))
            if interleave:
                mask = np.zeros(n_steps, bool)
                mask[(np.arange(count) * n_steps) // max(count, 1)] = True

                def body(carry, xs, hp=hp):
                    critic_part, part = carry
                    key, batch, do_critic = xs
                    critic_part, loss = jax.lax.cond(
                        do_critic, lambda cp: critic_step(key, cp, part[2], batch, hp),
                        lambda cp: (cp, jnp.zeros((), jnp.float32)), critic_part)
                    part, actor_loss = actor_step(part, critic_part[0], batch.obs, hp)
                    return (critic_part, part), (loss, actor_loss)

                member_batches = jax.tree.map(lambda x, i=i: x[:, i], batches)
                (critic_part, part), (losses, a_losses) = jax.lax.scan(
                    body, (critic_part, part), (keys[:, i], member_batches, jnp.asarray(mask)))
                critic_losses.append(losses.sum() / max(count, 1))
            else:
                sub = jax.tree.map(lambda x, i=i, start=start, count=count: x[start:start + count, i], batches)

                def critic_body(cp, xs, hp=hp, target_actor=part[2]):
                    return critic_step(xs[0], cp, target_actor, xs[1], hp)

                critic_part, losses = jax.lax.scan(critic_body, critic_part, (keys[start:start + count, i], sub))
                critic_losses.append(losses.mean() if count else jnp.zeros(()))

                def actor_body(part, obs, hp=hp, critic=critic_part[0]):
                    return actor_step(part, critic, obs, hp)

                part, a_losses = jax.lax.scan(actor_body, part, batches.obs[:, i])
            start += count
            actors.append(part)
            actor_losses.append(a_losses.mean())
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *actors)
        critic, critic_opt, target_critic = critic_part
        new_state = SharedCriticState(actor=stacked[0], actor_opt=stacked[1], target_actor=stacked[2],
                                      critic=critic, critic_opt=critic_opt, target_critic=target_critic,
                                      steps=state.steps + n_steps)
        member_losses = jnp.stack(critic_losses)
        metrics = {"critic_loss": jnp.full((pop_size,), member_losses.mean()), "member_critic_loss": member_losses,
                   "actor_loss": jnp.stack(actor_losses)}
        return new_state, metrics

    return SequentialOrder(critic_step, actor_step, update)
