"""DQN: hand-computed losses (double/plain, Huber/MSE), epsilon schedule, target copy, CNN."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from learner_helpers import (
    ACTION_DIM,
    HIDDEN,
    POPULATION_CONFIG,
    assert_trees_equal,
    compiled,
    fast_compile,  # noqa: F401  (autouse fixture)
    np64,
    random_batch,
    trees_differ,
    with_values,
)

from popjax.learners.base import one_update
from popjax.learners.dqn import DQNConfig, default_hparams, epsilon, make_dqn
from popjax.networks.mlp import QNetwork
from popjax.types import EnvSpec, Transition

Q_NET = QNetwork(HIDDEN, ACTION_DIM)


def _negated_head(params):
    """Same network with the output layer negated: Q_target = -Q_online, so the online argmax is
    the target's argmin and double-Q differs from max-Q on every non-terminal sample."""
    out = jax.tree.map(lambda x: x, params)
    head = f"Dense_{len(HIDDEN)}"
    out["params"]["MLP_0"][head] = jax.tree.map(lambda x: -x, params["params"]["MLP_0"][head])
    return out


def _batch(c):
    batch = random_batch(jax.random.key(2), c.spec)
    # Rewards chosen so the TD errors fall in both Huber regimes.
    return batch.replace(reward=jnp.array([0.3, -2.5, 0.1, 3.0]), terminated=jnp.array([0.0, 1.0, 1.0, 0.0]))


def _expected(state, batch, discount, double_q, huber):
    q_all = np64(Q_NET.apply(state.params, batch.obs))
    q = q_all[np.arange(len(q_all)), np.asarray(batch.action)]
    next_online = np64(Q_NET.apply(state.params, batch.next_obs))
    next_target = np64(Q_NET.apply(state.target_params, batch.next_obs))
    if double_q:
        next_q = next_target[np.arange(len(q)), next_online.argmax(axis=1)]
    else:
        next_q = next_target.max(axis=1)
    y = np64(batch.reward) + discount * (1.0 - np64(batch.terminated)) * next_q
    return _loss(q - y, huber), q, y


def _loss(td, huber):
    return np.mean(np.where(np.abs(td) <= 1.0, 0.5 * td**2, np.abs(td) - 0.5) if huber else td**2)


@pytest.mark.parametrize("huber", [True, False])
@pytest.mark.parametrize("double_q", [True, False])
def test_hand_computed_loss(double_q, huber):
    c = compiled("dqn", double_q=double_q, huber=huber)
    hp = with_values(c.definition.default_hparams(c.config), discount=0.9)
    state = c.learner.init(jax.random.key(0), hp)
    state = state.replace(target_params=_negated_head(state.params))
    batch = _batch(c)
    new, metrics = c.update(jax.random.key(1), state, batch, hp)

    loss, q, y = _expected(state, batch, 0.9, double_q, huber)
    other_loss, _, other_y = _expected(state, batch, 0.9, not double_q, huber)
    assert np.any(np.abs(q - y) > 1.0) and np.any(np.abs(q - y) < 1.0)  # both Huber regimes exercised
    # double-Q and max-Q targets differ exactly on the non-terminal samples
    np.testing.assert_array_equal(np.abs(y - other_y) > 1e-3, np64(batch.terminated) == 0)
    assert abs(loss - other_loss) > 1e-3
    np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-5)
    np.testing.assert_allclose(metrics["q_mean"], q.mean(), rtol=1e-5, atol=1e-6)
    # The gradient step lowers the loss on this batch, targets held fixed.
    q_new = np64(Q_NET.apply(new.params, batch.obs))[np.arange(len(q)), np.asarray(batch.action)]
    assert _loss(q_new - y, huber) < loss


def test_double_q_equals_max_q_when_target_is_online():
    # With target == online, argmax of either network picks the same action: same loss.
    losses = []
    for double_q in (True, False):
        c = compiled("dqn", double_q=double_q, huber=True)
        hp = c.definition.default_hparams(c.config)
        state = c.learner.init(jax.random.key(0), hp)
        losses.append(float(c.update(jax.random.key(1), state, _batch(c), hp)[1]["loss"]))
    assert losses[0] == losses[1]


def test_epsilon_schedule():
    c = compiled("dqn", **POPULATION_CONFIG["dqn"])
    hp = with_values(c.definition.default_hparams(c.config), epsilon_decay_steps=100.0)
    values = [float(epsilon(hp, jnp.int32(s))) for s in (0, 50, 100, 200)]
    np.testing.assert_allclose(values, [1.0, 0.525, 0.05, 0.05], rtol=1e-6)
    # The update reports the epsilon of its new counter.
    state = c.learner.init(jax.random.key(0), hp).replace(steps=jnp.int32(49))
    _, metrics = c.update(jax.random.key(1), state, random_batch(jax.random.key(2), c.spec), hp)
    np.testing.assert_allclose(metrics["epsilon"], 0.525, rtol=1e-6)


def test_act_is_epsilon_greedy():
    c = compiled("dqn", **POPULATION_CONFIG["dqn"])
    hp = with_values(c.definition.default_hparams(c.config), epsilon_end=0.0, epsilon_decay_steps=10.0)
    state = c.learner.init(jax.random.key(0), hp)
    obs = jax.random.normal(jax.random.key(3), (1024, 3))
    greedy = np.asarray(c.policy(state, obs))
    np.testing.assert_array_equal(greedy, np64(Q_NET.apply(state.params, obs)).argmax(axis=1))
    # Step 0: epsilon = 1, uniform random actions (half of them disagree with greedy on average).
    explore = np.asarray(c.act(jax.random.key(4), state, obs, hp))
    assert explore.dtype == np.int32 and set(np.unique(explore)) == {0, 1}
    assert 0.43 < np.mean(explore != greedy) < 0.57
    # After the decay epsilon = 0: act is greedy.
    done = state.replace(steps=jnp.int32(10))
    np.testing.assert_array_equal(c.act(jax.random.key(4), done, obs, hp), greedy)


def test_hard_target_copy_every_period():
    c = compiled("dqn", **POPULATION_CONFIG["dqn"])  # target_update_period = 2
    assert c.config.target_update_period == 2
    hp = c.definition.default_hparams(c.config)
    state = c.learner.init(jax.random.key(0), hp)
    initial_target = state.target_params
    batch = random_batch(jax.random.key(2), c.spec)
    s1, _ = c.update(jax.random.key(1), state, batch, hp)
    assert trees_differ(s1.params, initial_target)
    assert_trees_equal(s1.target_params, initial_target)  # update 1: no copy
    s2, _ = c.update(jax.random.key(1), s1, batch, hp)
    assert_trees_equal(s2.target_params, s2.params)  # update 2: hard copy
    s3, _ = c.update(jax.random.key(1), s2, batch, hp)
    assert_trees_equal(s3.target_params, s2.params)  # update 3: kept
    assert trees_differ(s3.params, s2.params)


def test_nature_cnn_dueling_update():
    spec = EnvSpec("frames", (84, 84, 4), num_actions=4)
    config = DQNConfig(hidden=(32,), batch_size=2, cnn=True, dueling=True)
    learner = make_dqn(config, spec)
    hp = default_hparams(config)
    state = jax.jit(learner.init)(jax.random.key(0), hp)
    k = jax.random.split(jax.random.key(1), 3)
    batch = Transition(
        obs=jax.random.uniform(k[0], (2, 84, 84, 4)),
        action=jnp.array([0, 3], jnp.int32),
        reward=jnp.array([1.0, -1.0]),
        next_obs=jax.random.uniform(k[1], (2, 84, 84, 4)),
        terminated=jnp.array([0.0, 1.0]),
    )
    new, metrics = jax.jit(one_update(learner))(k[2], state, batch, hp)
    assert np.isfinite(metrics["loss"]) and float(metrics["loss"]) > 0
    assert trees_differ(new.params, state.params)
    net = QNetwork(config.hidden, 4, dueling=True, cnn=True)
    q = np64(jax.jit(net.apply)(state.params, batch.obs))
    assert q.shape == (2, 4)
    np.testing.assert_allclose(float(metrics["q_mean"]), np.mean([q[0, 0], q[1, 3]]), rtol=1e-5, atol=1e-6)
    actions = jax.jit(learner.policy)(state, batch.obs)
    assert actions.dtype == jnp.int32
    np.testing.assert_array_equal(actions, q.argmax(axis=1))
