"""The population learners and wrappers that step the networks themselves use the actor-critic core's gradients
(``Core.critic_grads``, ``Core.actor_grads``): the shared-critic TD3 step of CEM-RL and DvD on the core equals the
step written out from TD3's module functions leaf for leaf, and RLx2's dense topology scores are the gradients of
TD3's losses written out."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popjax.learners import td3
from popjax.learners.actor_critic import PLAIN
from popjax.learners.base import adam_step, polyak, select
from popjax.learners.rlx2 import dense_grads
from popjax.learners.shared_critic import (
    DiversityConfig,
    diversity_term,
    make_shared_critic_td3,
    population_collectives,
)
from popjax.networks.mlp import DeterministicActor, TwinCritic
from popjax.population.hparams import population_hparams
from popjax.types import EnvSpec, Transition

SPEC = EnvSpec("test", (3,), action_dim=2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
CONFIG = td3.TD3Config(hidden=(16, 16), batch_size=8)


def batch(seed: int, shape: tuple[int, ...]) -> Transition:
    rng = np.random.default_rng(seed)
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return Transition(obs=f32(rng.normal(size=shape + (3,))), action=f32(rng.uniform(-1, 1, shape + (2,))),
                      reward=f32(rng.normal(size=shape)), next_obs=f32(rng.normal(size=shape + (3,))),
                      terminated=f32(rng.uniform(size=shape) < 0.2))


def assert_same_leaves(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def written_out_update(config, spec, pop_size, diversity):
    """The shared-critic step as it was written before it used the core: TD3's module functions (``target_q``,
    ``critic_loss_fn``, ``dpg_loss``), the population means and minimum as collectives, DvD's term added."""
    actor_net, critic_net = DeterministicActor(config.hidden, spec.action_dim), TwinCritic(config.hidden)
    collectives = population_collectives(pop_size)
    pmean, pmin = collectives.pmean, collectives.pmin

    def member_step(key, actor, target_actor, actor_opt, batch, hp, critic, target_critic, critic_opt, steps, weight):
        y = td3.target_q(key, actor_net, critic_net, target_actor, target_critic, batch, hp)
        (member_loss, q), grads = jax.value_and_grad(td3.critic_loss_fn, has_aux=True)(critic, critic_net, batch, y)
        new_critic, new_critic_opt = adam_step(critic, pmean(grads), critic_opt, pmean(hp.critic_lr))
        moved = polyak(target_critic, new_critic, pmean(hp.tau))
        new_target_critic = select((steps + 1) % pmin(hp.policy_delay) == 0, moved, target_critic)
        actor_loss, actor_grads = jax.value_and_grad(
            lambda a: td3.dpg_loss(actor_net, critic_net, a, new_critic, batch.obs))(actor)
        metrics = {"critic_loss": pmean(member_loss), "member_critic_loss": member_loss, "actor_loss": actor_loss,
                   "q_mean": q.mean()}
        if diversity is not None:
            obs_all = collectives.gather(batch.obs).reshape((-1,) + spec.obs_shape)
            div_loss, div_grads, distance = diversity_term(actor_net, collectives, diversity, actor, obs_all)
            actor_grads = jax.tree.map(lambda g, d: g + weight * d, actor_grads, div_grads)
            metrics.update(diversity_loss=div_loss, diversity_weight=jnp.asarray(weight, jnp.float32),
                           embedding_distance=distance)
        new_actor, new_actor_opt = adam_step(actor, actor_grads, actor_opt, hp.actor_lr)
        is_policy_step = (steps + 1) % hp.policy_delay == 0
        new_actor, new_actor_opt = select(is_policy_step, (new_actor, new_actor_opt), (actor, actor_opt))
        new_target_actor = select(is_policy_step, polyak(target_actor, new_actor, hp.tau), target_actor)
        return (new_critic, new_critic_opt, new_target_critic), (new_actor, new_target_actor, new_actor_opt), metrics

    step = jax.vmap(member_step, in_axes=(0, 0, 0, 0, 0, 0, None, None, None, None, None), out_axes=(None, 0, 0),
                    axis_name="pop")

    def update(keys, state, batch, hparams, weight=0.0):
        (critic, critic_opt, target_critic), (actor, target_actor, actor_opt), metrics = step(
            keys, state.actor, state.target_actor, state.actor_opt, batch, hparams, state.critic, state.target_critic,
            state.critic_opt, state.steps, jnp.asarray(weight, jnp.float32))
        return state.replace(actor=actor, target_actor=target_actor, actor_opt=actor_opt, critic=critic,
                             target_critic=target_critic, critic_opt=critic_opt, steps=state.steps + 1), metrics

    return update


@pytest.mark.parametrize("dvd", [False, True])
def test_shared_critic_step_on_the_core_equals_it_written_out_leaf_for_leaf(dvd):
    """CEM-RL's and DvD's population step through the core computes exactly what TD3's functions written out
    compute: every leaf of the state and every metric, over four steps with the policy delay 2."""
    pop, diversity = 3, (DiversityConfig() if dvd else None)
    shared = make_shared_critic_td3(CONFIG, SPEC, pop, diversity)
    hp = population_hparams(td3.default_hparams(), pop, {"discount": 0.9, "tau": 0.05})
    # compiled (run eagerly first, the initializers made test_memr's eager-vs-compiled init check differ by 1 ulp)
    init = jax.jit(shared.init)
    state = ref = init(jax.random.key(0), hp)
    ours, theirs = jax.jit(shared.update), jax.jit(written_out_update(CONFIG, SPEC, pop, diversity))
    for t in range(4):
        keys = jax.random.split(jax.random.key(10 + t), pop)
        b = batch(20 + t, (pop, CONFIG.batch_size))
        state, metrics = ours(keys, state, b, hp, 0.5)
        ref, ref_metrics = theirs(keys, ref, b, hp, 0.5)
        assert set(metrics) == set(ref_metrics)
        assert_same_leaves(metrics, ref_metrics)
    assert_same_leaves(state, ref)
    initial = init(jax.random.key(0), hp)
    assert int(state.steps) == 4 and not np.array_equal(jax.tree.leaves(state.critic)[0],
                                                         jax.tree.leaves(initial.critic)[0])  # it trained


def test_rlx2_dense_grads_are_the_gradients_of_td3s_losses_written_out():
    core = td3.td3_core(CONFIG, SPEC)
    hp = td3.default_hparams()
    state = jax.jit(core.init)(jax.random.key(1), hp)
    key, b = jax.random.key(2), batch(3, (CONFIG.batch_size,))
    actor_grads, critic_grads = jax.jit(lambda k, s, x: dense_grads(core, k, s, x, hp, PLAIN))(key, state, b)

    @jax.jit
    def by_hand(key, state, b):
        y = td3.target_q(key, core.actor_net, core.critic_net, state.target_actor, state.target_critic, b, hp)
        critic = jax.grad(lambda c: td3.critic_loss_fn(c, core.critic_net, b, y)[0])(state.critic)
        actor = jax.grad(lambda a: -td3.dpg_values(core.actor_net, core.critic_net, a, state.critic, b.obs).mean())(
            state.actor)
        return actor, critic

    expected_actor, expected_critic = by_hand(key, state, b)
    np.testing.assert_allclose(jax.tree.leaves(critic_grads)[0], jax.tree.leaves(expected_critic)[0], rtol=1e-6)
    assert_same_leaves((actor_grads, critic_grads), (expected_actor, expected_critic))
    assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves((actor_grads, critic_grads)))
