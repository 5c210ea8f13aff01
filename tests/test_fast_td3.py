"""fast_td3: the C51 projection, the n-step target, AdamW, the observation statistics, masked update slots, and
the population against its members alone (tiny widths)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from popjax.learners import fast_td3
from popjax.learners.base import one_update
from popjax.learners.multistep import n_step_return
from popjax.types import EnvSpec, Transition, Windows

SPEC = EnvSpec("toy", obs_shape=(3,), action_dim=2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
TINY = fast_td3.FastTD3Config(critic_hidden=(8, 8), actor_hidden=(8,), num_atoms=11, batch_size=6,
                              envs_per_member=3)


def numpy_projection(probs, returns, bootstrap, v_min, v_max):
    """Bellemare et al. 2017, Alg. 1, one atom at a time (CleanRL's tie handling: an atom landing exactly on a
    support atom keeps its whole mass there)."""
    batch, n = probs.shape
    atoms = np.linspace(v_min, v_max, n)
    delta = (v_max - v_min) / (n - 1)
    out = np.zeros_like(probs, dtype=np.float64)
    for i in range(batch):
        for j in range(n):
            tz = min(max(returns[i] + bootstrap[i] * atoms[j], v_min), v_max)
            b = (tz - v_min) / delta
            low, up = int(np.floor(b)), int(np.ceil(b))
            if low == up:
                out[i, low] += probs[i, j]
            else:
                out[i, low] += probs[i, j] * (up - b)
                out[i, up] += probs[i, j] * (b - low)
    return out


def test_projection_matches_numpy_reference_inside_at_and_beyond_the_ends():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(11), size=6).astype(np.float32)
    # inside, exactly on atoms (0 with no bootstrap; a shift by one atom), at v_max, far beyond both ends
    returns = np.array([0.3, 0.0, 2.0, 10.0, 50.0, -70.0], np.float32)
    bootstrap = np.array([0.9, 0.0, 1.0, 0.0, 0.97, 0.5], np.float32)
    got = fast_td3.categorical_projection(jnp.asarray(probs), jnp.asarray(returns), jnp.asarray(bootstrap),
                                          jnp.float32(-10.0), jnp.float32(10.0))
    want = numpy_projection(probs, returns, bootstrap, -10.0, 10.0)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-6)
    np.testing.assert_allclose(np.asarray(got).sum(axis=1), 1.0, atol=1e-6)  # mass is kept
    assert got[3, 10] == pytest.approx(1.0) and got[5, 0] == pytest.approx(1.0)  # clipped to the ends


def test_projection_vmapped_over_members_with_different_supports():
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.ones(11), size=(2, 4)).astype(np.float32)
    returns = rng.normal(0, 8, size=(2, 4)).astype(np.float32)
    bootstrap = np.full((2, 4), 0.97, np.float32)
    v_min, v_max = np.array([-10.0, -100.0], np.float32), np.array([10.0, 40.0], np.float32)
    got = jax.vmap(fast_td3.categorical_projection)(*map(jnp.asarray, (probs, returns, bootstrap, v_min, v_max)))
    for m in range(2):
        want = numpy_projection(probs[m], returns[m], bootstrap[m], v_min[m], v_max[m])
        np.testing.assert_allclose(np.asarray(got[m]), want, atol=1e-6)


def test_n_step_return_with_termination_and_truncation_inside_the_window():
    # 3 windows of 4 steps, gamma 0.5: plain; terminated at step 1; truncated (ended, not terminated) at step 2
    reward = jnp.array([[1.0, 2.0, 4.0, 8.0]] * 3)
    terminated = jnp.array([[0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]], jnp.float32)
    ended = jnp.array([[0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]], bool)
    next_obs = jnp.arange(12, dtype=jnp.float32).reshape(3, 4, 1)
    zeros = jnp.zeros((3, 4, 1))
    windows = Windows(Transition(zeros, zeros, reward, next_obs, terminated), ended)
    returns, bootstrap, last = n_step_return(windows, jnp.float32(0.5))
    np.testing.assert_allclose(returns, [1 + 1 + 1 + 1, 1 + 1, 1 + 1 + 1])  # gamma^k r_k up to the first end
    np.testing.assert_allclose(bootstrap, [0.5**4, 0.0, 0.5**3])  # no bootstrap past a termination
    np.testing.assert_allclose(last.next_obs[:, 0], [3.0, 5.0, 10.0])  # the true last observation


def test_adamw_step_equals_optax_adamw():
    params = {"w": jnp.array([1.0, -2.0, 3.0]), "b": jnp.array(0.5)}
    grads = {"w": jnp.array([0.1, 0.2, -0.3]), "b": jnp.array(1.0)}
    opt = optax.adamw(1e-2, weight_decay=0.1)
    state, ours, opt_state = opt.init(params), params, fast_td3._ADAM.init(params)
    theirs = params
    for _ in range(3):
        updates, state = opt.update(grads, state, theirs)
        theirs = optax.apply_updates(theirs, updates)
        ours, opt_state = fast_td3.adamw_step(ours, grads, opt_state, jnp.float32(1e-2), jnp.float32(0.1))
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_observation_statistics_equal_the_moments_of_everything_seen():
    rng = np.random.default_rng(2)
    batches = [rng.normal(3.0, 2.0, size=(n, 3)).astype(np.float32) for n in (5, 7, 1)]
    norm = fast_td3.init_obs_norm((3,))
    for batch in batches:
        norm = fast_td3.update_obs_norm(norm, jnp.asarray(batch))
    seen = np.concatenate(batches)
    np.testing.assert_allclose(norm.mean, seen.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(norm.var, seen.var(axis=0), rtol=1e-4)
    assert float(norm.count) == len(seen)


def _batch(key, n=6):
    k = jax.random.split(key, 4)
    return Transition(obs=jax.random.normal(k[0], (n, 3)), action=jax.random.uniform(k[1], (n, 2), minval=-1),
                      reward=jax.random.normal(k[2], (n,)), next_obs=jax.random.normal(k[3], (n, 3)),
                      terminated=jnp.zeros((n,)))


def test_observe_redraws_the_std_of_ended_envs_only():
    learner = fast_td3.make_fast_td3(TINY, SPEC)
    hp = fast_td3.default_hparams(TINY)
    state = learner.init(jax.random.key(0), hp)
    ended = jnp.array([[False, True, False], [False, False, False]]).reshape(-1)  # [T=2 * envs=3], time-major
    transitions = _batch(jax.random.key(1))
    new = learner.observe(jax.random.key(2), state, transitions, ended, hp)
    assert new.noise_level[0] == state.noise_level[0] and new.noise_level[2] == state.noise_level[2]
    assert new.noise_level[1] != state.noise_level[1]
    np.testing.assert_allclose(new.obs_norm.mean, transitions.obs.mean(axis=0), rtol=1e-5)


def test_explore_uses_each_envs_own_std():
    learner = fast_td3.make_fast_td3(TINY, SPEC)
    hp = fast_td3.default_hparams(TINY).replace(std_min=jnp.float32(0.0), std_max=jnp.float32(0.5))
    state = learner.init(jax.random.key(0), hp).replace(noise_level=jnp.array([0.0, 1.0, 0.5]))
    obs = jnp.zeros((3, 3))
    action, _ = learner.act(jax.random.key(3), state, obs, hp)
    mean = learner.policy(state, obs)
    noise = jax.random.normal(jax.random.key(3), mean.shape) * jnp.array([0.0, 0.5, 0.25])[:, None]
    np.testing.assert_allclose(action, jnp.clip(mean + noise, -1, 1), rtol=1e-6)


def test_masked_update_slots_equal_that_many_plain_updates():
    slots, applied = 4, 2
    masked_cfg = dataclasses.replace(TINY, update_slots=slots)
    hp = fast_td3.default_hparams(TINY).replace(num_updates=jnp.int32(applied))
    masked, plain = fast_td3.make_fast_td3(masked_cfg, SPEC), fast_td3.make_fast_td3(TINY, SPEC)
    state = plain.init(jax.random.key(0), hp)
    keys = jax.random.split(jax.random.key(1), slots)
    batches = [_batch(k) for k in jax.random.split(jax.random.key(2), slots)]
    masked_state, plain_state = state, state
    for i in range(slots):  # two calls of 4 slots: slots 0, 1 and 4, 5 apply
        masked_state = one_update(masked)(keys[i], masked_state, batches[i], hp)[0]
    for i in range(applied):
        plain_state = one_update(plain)(keys[i], plain_state, batches[i], hp)[0]
    assert int(masked_state.slots) == slots and int(masked_state.steps) == applied
    for a, b in zip(jax.tree.leaves(masked_state.replace(slots=0)), jax.tree.leaves(plain_state.replace(slots=0)),
                    strict=True):
        np.testing.assert_array_equal(a, b)


def test_losses_by_hand_on_a_tiny_batch():
    """The critic loss is the twins' summed cross-entropy to the projected target: a terminal batch of reward -1
    on the support [-1, 1] puts the whole target on atom 0, so the loss is -(mean log p_1(atom 0) + mean log
    p_2(atom 0)) of the critics' own logits."""
    cfg = dataclasses.replace(TINY, num_atoms=3, obs_normalization=False)
    learner = fast_td3.make_fast_td3(cfg, SPEC)
    hp = fast_td3.default_hparams(cfg).replace(v_min=jnp.float32(-1.0), v_max=jnp.float32(1.0),
                                               critic_lr=jnp.float32(0.0), actor_lr=jnp.float32(0.0),
                                               weight_decay=jnp.float32(0.0))
    state = learner.init(jax.random.key(0), hp)
    batch = _batch(jax.random.key(1)).replace(reward=jnp.full((6,), -1.0), terminated=jnp.ones((6,)))
    _, metrics = one_update(learner)(jax.random.key(2), state, batch, hp)
    logits = np.asarray(learner_critic_logits(cfg, state, batch))  # [2, B, 3]
    log_p = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    want = -(log_p[0, :, 0].mean() + log_p[1, :, 0].mean())  # target: all mass on the atom -1
    assert float(metrics["critic_loss"]) == pytest.approx(want, rel=1e-5)


def learner_critic_logits(cfg, state, batch):
    from popjax.networks.distributional import TwinCategoricalCritic
    return TwinCategoricalCritic(cfg.critic_hidden, cfg.num_atoms).apply(state.critic, batch.obs, batch.action)


@pytest.mark.parametrize("pop", [1, 2, 4])
def test_population_equals_each_member_alone(pop):
    learner = fast_td3.make_fast_td3(dataclasses.replace(TINY, update_slots=2), SPEC)
    base = fast_td3.default_hparams(TINY)
    hps = jax.tree.map(lambda x: jnp.stack([x] * pop), base)
    hps = hps.replace(v_max=jnp.linspace(5.0, 20.0, pop), actor_lr=jnp.linspace(1e-4, 1e-3, pop),
                      num_updates=jnp.arange(pop, dtype=jnp.int32) % 2 + 1)
    keys = jax.random.split(jax.random.key(0), pop)
    states = jax.vmap(learner.init)(keys, hps)
    batches = jax.vmap(_batch)(jax.random.split(jax.random.key(1), pop))
    update_keys = jax.random.split(jax.random.key(2), pop)
    update = one_update(learner)
    together = jax.jit(jax.vmap(update))(update_keys, states, batches, hps)[0]
    for m in range(pop):
        take = lambda tree, m=m: jax.tree.map(lambda x: x[m], tree)  # noqa: E731
        alone = jax.jit(update)(update_keys[m], take(states), take(batches), take(hps))[0]
        for a, b in zip(jax.tree.leaves(take(together)), jax.tree.leaves(alone), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_cdq_mixes_the_smaller_twins_target_and_each_twins_own():
    """Cross-entropy is linear in its target, so the critic loss at cdq 0.5 is the mean of the losses at 0 and 1;
    and 0 and 1 differ (the twins' targets differ)."""
    learner = fast_td3.make_fast_td3(TINY, SPEC)
    base = fast_td3.default_hparams(TINY).replace(v_min=jnp.float32(-2.0), v_max=jnp.float32(2.0))
    state = learner.init(jax.random.key(0), base)
    batch = _batch(jax.random.key(1))
    loss = {c: float(one_update(learner)(jax.random.key(2), state, batch, base.replace(cdq=jnp.float32(c)))[1]
                     ["critic_loss"]) for c in (0.0, 0.5, 1.0)}
    assert loss[0.0] != pytest.approx(loss[1.0], rel=1e-4)
    assert loss[0.5] == pytest.approx((loss[0.0] + loss[1.0]) / 2, rel=1e-5)
