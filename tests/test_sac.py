"""SAC: hand-computed critic/actor/alpha losses, the target regression (T11), stable log-prob."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from learner_helpers import (
    ACTION_DIM,
    BATCH,
    HIDDEN,
    assert_trees_close,
    compiled,
    fast_compile,  # noqa: F401  (autouse fixture)
    np64,
    random_batch,
    with_values,
)

from popjax.learners.sac import squashed_gaussian
from popjax.networks.mlp import GaussianActor, TwinCritic

ACTOR = GaussianActor(HIDDEN, ACTION_DIM)
CRITIC = TwinCritic(HIDDEN)
ALPHA = 0.3
HP = dict(discount=0.9, tau=0.1, reward_scale=2.0, target_entropy_scale=0.5, alpha_lr=0.01)


def _setup():
    c = compiled("sac")
    hp = with_values(c.definition.default_hparams(c.config), **HP)
    state = c.learner.init(jax.random.key(0), hp)
    other = c.learner.init(jax.random.key(1), hp)
    # Distinct target critic and alpha != 1, so mix-ups show in the numbers.
    state = state.replace(target_critic=other.critic, log_alpha=jnp.float32(np.log(ALPHA)))
    return c, state, hp


def _q(params, obs, action):
    return np64(CRITIC.apply(params, np.asarray(obs, np.float32), np.asarray(action, np.float32)))


def _sample(actor_params, obs, noise):
    """Squashed-Gaussian sample and log-density written out in float64 with the naive formula."""
    mean, log_std = (np64(x) for x in ACTOR.apply(actor_params, obs))
    action = np.tanh(mean + np.exp(log_std) * noise)
    gaussian = -0.5 * noise**2 - log_std - 0.5 * np.log(2 * np.pi)
    return action, np.sum(gaussian - np.log(1.0 - action**2), axis=-1)


def _noises(key):
    # The update splits its key into (next-action key, actor key), each drawing [B, A] normals.
    key_next, key_actor = jax.random.split(key)
    return (np64(jax.random.normal(k, (BATCH, ACTION_DIM))) for k in (key_next, key_actor))


def _expected_critic_loss(state, batch, key, discount, scale, discount_power=1, mask=True):
    noise_next, _ = _noises(key)
    next_action, next_log_prob = _sample(state.actor, batch.next_obs, noise_next)
    soft_v = _q(state.target_critic, batch.next_obs, next_action).min(axis=0) - ALPHA * next_log_prob
    not_done = 1.0 - np64(batch.terminated) if mask else 1.0
    y = np64(batch.reward) * scale + discount**discount_power * not_done * soft_v
    q = _q(state.critic, batch.obs, batch.action)
    return 0.5 * np.sum(np.mean((q - y) ** 2, axis=1)), q


def test_hand_computed_losses():
    c, state, hp = _setup()
    batch = random_batch(jax.random.key(2), c.spec)  # terminated = [0, 1, 0, 1]
    key = jax.random.key(3)
    new, metrics = c.update(key, state, batch, hp)

    critic_loss, q = _expected_critic_loss(state, batch, key, discount=0.9, scale=2.0)
    np.testing.assert_allclose(metrics["critic_loss"], critic_loss, rtol=1e-5)
    np.testing.assert_allclose(metrics["q_mean"], q.mean(), rtol=1e-5, atol=1e-6)

    # Actor: reparameterised sample from the pre-update actor, through the updated critic.
    _, noise_actor = _noises(key)
    action, log_prob = _sample(state.actor, batch.obs, noise_actor)
    min_q = _q(new.critic, batch.obs, action).min(axis=0)
    np.testing.assert_allclose(metrics["actor_loss"], np.mean(ALPHA * log_prob - min_q), rtol=1e-5)
    np.testing.assert_allclose(metrics["entropy"], -log_prob.mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["alpha"], ALPHA, rtol=1e-6)

    # Alpha: mean(-log_alpha * (log_pi + target_entropy)), target entropy = -0.5 * |A| = -1.
    target_entropy = -0.5 * ACTION_DIM
    c_alpha = log_prob + target_entropy
    np.testing.assert_allclose(metrics["alpha_loss"], np.mean(-np.log(ALPHA) * c_alpha), rtol=1e-5)
    # First Adam step moves log_alpha by ~alpha_lr against the gradient -mean(c_alpha):
    # alpha grows when the policy entropy is below the target.
    expected_log_alpha = np.log(ALPHA) + 0.01 * np.sign(np.mean(c_alpha))
    np.testing.assert_allclose(new.log_alpha, expected_log_alpha, atol=1e-6)

    # Target critic: Polyak with tau every step.
    expected = jax.tree.map(lambda t, o: np64(t) + 0.1 * (np64(o) - np64(t)), state.target_critic, new.critic)
    assert_trees_close(new.target_critic, expected, atol=1e-6)
    # Gradient steps go downhill on this batch.
    new_critic_loss, _ = _expected_critic_loss(state.replace(critic=new.critic), batch, key, discount=0.9, scale=2.0)
    assert new_critic_loss < critic_loss


def test_target_regression_terminal_and_single_discount():
    """T11: ``terminated = 1`` removes the bootstrap; gamma appears once (release bug: gamma^2, no mask)."""
    c, state, hp = _setup()
    key = jax.random.key(4)
    # All terminal: the loss only sees r * scale, whatever the target critic and the discount.
    terminal = random_batch(jax.random.key(5), c.spec, terminated=1.0)
    _, metrics = c.update(key, state, terminal, hp)
    q = _q(state.critic, terminal.obs, terminal.action)
    expected = 0.5 * np.sum(np.mean((q - 2.0 * np64(terminal.reward)) ** 2, axis=1))
    np.testing.assert_allclose(metrics["critic_loss"], expected, rtol=1e-5)
    other = c.learner.init(jax.random.key(9), hp)
    _, metrics_other = c.update(key, state.replace(target_critic=other.critic), terminal, hp)
    np.testing.assert_allclose(metrics_other["critic_loss"], expected, rtol=1e-5)

    # Mixed batch: the loss matches gamma once with the mask, and neither buggy variant.
    mixed = random_batch(jax.random.key(6), c.spec)
    _, metrics = c.update(key, state, mixed, hp)
    right, _ = _expected_critic_loss(state, mixed, key, 0.9, 2.0)
    gamma_squared, _ = _expected_critic_loss(state, mixed, key, 0.9, 2.0, discount_power=2)
    no_mask, _ = _expected_critic_loss(state, mixed, key, 0.9, 2.0, mask=False)
    np.testing.assert_allclose(metrics["critic_loss"], right, rtol=1e-5)
    for wrong in (gamma_squared, no_mask):
        assert abs(wrong - right) > 1e-3 * abs(right)
        assert not np.isclose(metrics["critic_loss"], wrong, rtol=1e-4)


@pytest.mark.parametrize("u", [-30.0, -20.0, -3.0, 0.0, 0.7, 5.0, 20.0, 30.0])
def test_squashed_gaussian_log_prob_is_stable(u):
    mean = jnp.full((1, 2), u, jnp.float32)
    log_std = jnp.full((1, 2), -1.0, jnp.float32)
    noise = jnp.zeros((1, 2), jnp.float32)
    action, log_prob = squashed_gaussian(mean, log_std, noise)
    # log(1 - tanh(u)^2) = -2 log cosh(u), written out without tanh.
    log_det = -2.0 * (abs(u) + np.log1p(np.exp(-2.0 * abs(u))) - np.log(2.0))
    expected = 2 * ((1.0 - 0.5 * np.log(2 * np.pi)) - log_det)  # log_std = -1, noise = 0
    assert np.isfinite(log_prob).all()
    np.testing.assert_allclose(log_prob[0], expected, rtol=1e-5)
    np.testing.assert_allclose(action, np.tanh(u), rtol=1e-6)


def test_policy_is_tanh_of_mean_and_act_samples_around_it():
    c, state, hp = _setup()
    obs = jax.random.normal(jax.random.key(7), (64, 3))
    mean, log_std = (np64(x) for x in ACTOR.apply(state.actor, obs))
    np.testing.assert_allclose(c.policy(state, obs), np.tanh(mean), rtol=1e-5, atol=1e-6)
    # act = tanh(mean + std * N(0, 1)) with the key's noise.
    noise = np64(jax.random.normal(jax.random.key(8), (64, ACTION_DIM)))
    expected = np.tanh(mean + np.exp(log_std) * noise)
    np.testing.assert_allclose(c.act(jax.random.key(8), state, obs, hp), expected, rtol=1e-5, atol=1e-6)
