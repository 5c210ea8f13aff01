"""TD3: hand-computed losses and the traced policy delay."""

from __future__ import annotations

import jax
import numpy as np
from learner_helpers import (
    ACTION_DIM,
    BATCH,
    HIDDEN,
    assert_trees_close,
    assert_trees_equal,
    compiled,
    fast_compile,  # noqa: F401  (autouse fixture)
    np64,
    population,
    random_batch,
    trees_differ,
    update_keys,
    with_values,
)

from popjax.networks.mlp import DeterministicActor, TwinCritic
from popjax.population.tree import member, stack

ACTOR = DeterministicActor(HIDDEN, ACTION_DIM)
CRITIC = TwinCritic(HIDDEN)


def _state_with_distinct_targets(c):
    """An init state whose target networks differ from the online ones (catches mix-ups)."""
    hp = c.definition.default_hparams(c.config)
    state = c.learner.init(jax.random.key(0), hp)
    other = c.learner.init(jax.random.key(1), hp)
    return state.replace(target_actor=other.actor, target_critic=other.critic)


def _q(params, obs, action):
    return np64(CRITIC.apply(params, np.asarray(obs, np.float32), np.asarray(action, np.float32)))


def test_hand_computed_losses_and_targets():
    c = compiled("td3")
    state = _state_with_distinct_targets(c)
    hp = with_values(
        c.definition.default_hparams(c.config),
        discount=0.9,
        tau=0.1,
        target_noise=0.5,
        noise_clip=0.3,
        policy_delay=1,
    )
    batch = random_batch(jax.random.key(2), c.spec)  # terminated = [0, 1, 0, 1]
    key = jax.random.key(3)
    new, metrics = c.update(key, state, batch, hp)

    # Target policy smoothing: the update draws N(0, 1) noise of the action's shape from its key.
    raw_noise = 0.5 * np64(jax.random.normal(key, (BATCH, ACTION_DIM)))
    assert np.any(np.abs(raw_noise) > 0.3) and np.any(np.abs(raw_noise) < 0.3)  # both clip regimes
    noise = np.clip(raw_noise, -0.3, 0.3)
    next_action = np.clip(np64(ACTOR.apply(state.target_actor, batch.next_obs)) + noise, -1.0, 1.0)
    next_q = _q(state.target_critic, batch.next_obs, next_action).min(axis=0)
    y = np64(batch.reward) + 0.9 * (1.0 - np64(batch.terminated)) * next_q
    q = _q(state.critic, batch.obs, batch.action)  # [2, B]
    critic_loss = np.sum(np.mean((q - y) ** 2, axis=1))
    np.testing.assert_allclose(metrics["critic_loss"], critic_loss, rtol=1e-5)
    np.testing.assert_allclose(metrics["q_mean"], q.mean(), rtol=1e-5, atol=1e-6)

    # DPG on obs (not next_obs) through critic 1 after its update.
    actor_q1 = _q(new.critic, batch.obs, np64(ACTOR.apply(state.actor, batch.obs)))[0]
    np.testing.assert_allclose(metrics["actor_loss"], -actor_q1.mean(), rtol=1e-5)

    # Gradient steps go downhill: the updated critic fits y better, the updated actor has higher Q1.
    assert np.sum(np.mean((_q(new.critic, batch.obs, batch.action) - y) ** 2, axis=1)) < critic_loss
    assert _q(new.critic, batch.obs, np64(ACTOR.apply(new.actor, batch.obs)))[0].mean() > actor_q1.mean()

    # Policy step (delay 1): all targets Polyak-averaged with tau.
    for target, old_target, online in [
        (new.target_actor, state.target_actor, new.actor),
        (new.target_critic, state.target_critic, new.critic),
    ]:
        expected = jax.tree.map(lambda t, o: np64(t) + 0.1 * (np64(o) - np64(t)), old_target, online)
        assert_trees_close(target, expected, atol=1e-6)
    assert int(new.steps) == 1


def test_tau_zero_keeps_targets():
    c = compiled("td3")
    state = _state_with_distinct_targets(c)
    hp = with_values(c.definition.default_hparams(c.config), tau=0.0, policy_delay=1)
    new, _ = c.update(jax.random.key(0), state, random_batch(jax.random.key(1), c.spec), hp)
    assert_trees_equal((new.target_actor, new.target_critic), (state.target_actor, state.target_critic))
    assert trees_differ(new.actor, state.actor) and trees_differ(new.critic, state.critic)


def test_traced_policy_delay_in_one_vmapped_call():
    c = compiled("td3")
    states, batches, hparams = population(c)
    delays = np.asarray(hparams.policy_delay)
    assert sorted(delays.tolist()) == [1, 2, 3]
    gated = ("actor", "actor_opt", "target_actor", "target_critic")
    per_member = [member(states, i) for i in range(3)]
    for step in range(1, 5):
        keys = update_keys(step, 3)
        new, _ = c.pop_update(keys, states, batches, hparams)
        per_member = [c.update(keys[i], per_member[i], member(batches, i), member(hparams, i))[0] for i in range(3)]
        assert_trees_close(new, stack(per_member))
        for i in range(3):
            before, after = member(states, i), member(new, i)
            assert trees_differ(after.critic, before.critic)
            assert trees_differ(after.critic_opt, before.critic_opt)
            policy_step = step % delays[i] == 0
            for field in gated:
                changed = trees_differ(getattr(after, field), getattr(before, field))
                assert changed == policy_step, (step, int(delays[i]), field)
        states = new
