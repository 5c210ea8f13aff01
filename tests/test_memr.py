"""MEMR (memr_sac): the model fit on a known linear system, its normalisation, held-out split and elites, Eq. 3.7
priorities (M1), the segmented model buffer (M2), IS weights in the Q loss only (M3), real rows in SAC batches, fresh
priorities, the oracle model, the chunk against its pieces, vmap == per-member loop, bad input, a run, resume."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from learner_helpers import (
    assert_trees_close,
    assert_trees_equal,
    fast_compile,  # noqa: F401  (autouse fixture)
    train_cut_and_resume,
    trees_differ,
)

import popjax
from popjax import cli
from popjax.buffers.prioritized import importance_weights, make_prioritized_buffer
from popjax.buffers.segmented import segmented_init, segmented_sample, segmented_write
from popjax.buffers.sources import ReplaySource
from popjax.config import ConfigError, make_config
from popjax.drivers.replay import replay_updates
from popjax.envs.base import to_native
from popjax.envs.probes import pendulum
from popjax.learners.actor_critic import Steps
from popjax.learners.memr import MEMRConfig, default_hparams, entropy_priority, held_out, make_memr, memr_core
from popjax.learners.sac import SACConfig, SACHParams, make_sac
from popjax.networks.dynamics import model_nll, stats_init, stats_update
from popjax.population.hparams import restrict
from popjax.population.members import Members
from popjax.population.tree import member, stack
from popjax.types import EnvSpec, Transition

SPEC = EnvSpec("test-linear", (3,), action_dim=2, action_low=(-1.0,) * 2, action_high=(1.0,) * 2)
M = 16


def config(**overrides) -> MEMRConfig:
    base = dict(hidden=(16, 16), model_hidden=(32, 32), psi_hidden=(16,), ensemble=2, elites=2, model_buffer=4 * M,
                sac_batch=8, batch_size=M, model_steps=1, psi_epochs=2, policy_updates=2, termination="learned")
    return MEMRConfig(**{**base, **overrides})


def hparams(**values):
    hp = default_hparams()
    return hp.replace(**{k: jnp.float32(v) for k, v in values.items()})


# One learner and its compiled pieces, shared by the tests (compiling dominates their time).
CORE = memr_core(config(), SPEC)
INIT = jax.jit(CORE.init)
UPDATE = jax.jit(CORE.update)
STEP = jax.jit(CORE.step)


# --- a known linear system ----------------------------------------------------------------------------
A = np.array([[0.9, 0.1, 0.0], [0.0, 0.8, 0.2], [0.1, 0.0, 0.7]], np.float32)
B = np.array([[0.5, 0.0], [0.0, 0.5], [0.3, -0.3]], np.float32)
C = np.array([1.0, -1.0, 0.5], np.float32)


def linear_batch(key, shape) -> Transition:
    """``s' = A s + B a``, ``r = c . s`` (noise-free), never terminal."""
    k_s, k_a = jax.random.split(key)
    obs = jax.random.normal(k_s, shape + (3,))
    action = jax.random.uniform(k_a, shape + (2,), minval=-1.0, maxval=1.0)
    return Transition(obs=obs, action=action, reward=obs @ C, next_obs=obs @ A.T + action @ B.T,
                      terminated=jnp.zeros(shape))


def relative_error(core, state, batch) -> np.ndarray:
    """Each member's mean squared error of its de-normalised mean prediction of ``(s' - s, r)``, over the
    variance of the truth."""
    norm = state.norm
    mean, _, _ = core.model_net.apply(state.model, norm.inputs.normalize(jnp.concatenate([batch.obs, batch.action],
                                                                                          -1)))
    truth = jnp.concatenate([batch.next_obs - batch.obs, batch.reward[:, None]], -1)
    return np.asarray(jnp.mean((norm.targets.denormalize(mean) - truth) ** 2, axis=(1, 2)) / jnp.var(truth))


@pytest.mark.long
def test_model_fit_learns_a_known_linear_system_and_ranks_members_on_held_out_rows():
    core = memr_core(config(model_steps=10, batch_size=64, ensemble=3, elites=1), SPEC)
    hp = hparams(model_lr=3e-3)
    state = jax.jit(core.init)(jax.random.key(0), hp)
    train = linear_batch(jax.random.key(1), (8, 64))
    test = linear_batch(jax.random.key(2), (512,))
    fit = jax.jit(lambda s, b: core.fit_model(s, b, jnp.ones(64), hp))
    fitted = state
    for _ in range(6):
        for h in range(8):
            fitted, metrics = fit(fitted, member(train, h))
    assert int(fitted.counts.model_fits) == 48
    assert float(relative_error(core, fitted, test).max()) < 0.05, relative_error(core, fitted, test)
    # The running held-out NLL fell from the first fit and ranks the members: the rollouts use the best one.
    _, first = fit(state, member(train, 0))
    assert float(metrics["model_val_nll"]) < float(first["model_val_nll"]) - 1.0
    best = int(jnp.argmin(fitted.validation.loss()))
    obs, action = test.obs[:8], test.action[:8]
    next_obs, reward, _ = core.rollout(fitted, jax.random.key(3), obs, action)
    norm = fitted.norm
    mean, _, _ = core.model_net.apply(fitted.model, norm.inputs.normalize(jnp.concatenate([obs, action], -1)))
    expected = norm.targets.denormalize(mean[best])
    np.testing.assert_allclose(np.asarray(next_obs), np.asarray(obs + expected[:, :-1]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(reward), np.asarray(expected[:, -1]), rtol=1e-5, atol=1e-5)


def test_running_statistics_by_hand():
    rng = np.random.default_rng(0)
    x1, x2 = rng.normal(3.0, 2.0, (5, 2)).astype(np.float32), rng.normal(-1.0, 0.5, (3, 2)).astype(np.float32)
    stats = stats_update(stats_update(stats_init(2), jnp.asarray(x1)), jnp.asarray(x2))
    both = np.concatenate([x1, x2]).astype(np.float64)
    assert int(stats.count) == 8
    np.testing.assert_allclose(np.asarray(stats.mean), both.mean(0), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(stats.std()), both.std(0), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(stats.normalize(jnp.asarray(both, jnp.float32))),
                               (both - both.mean(0)) / both.std(0), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(stats_init(2).std()), 1.0)  # before any data: the identity


def test_a_fit_merges_the_real_rows_into_the_model_statistics():
    batch = linear_batch(jax.random.key(1), (M,))
    state, _ = jax.jit(CORE.fit_model)(INIT(jax.random.key(0), hparams()), batch, jnp.ones(M), hparams())
    inputs = np.concatenate([batch.obs, batch.action], -1).astype(np.float64)
    targets = np.concatenate([batch.next_obs - batch.obs, batch.reward[:, None]], -1).astype(np.float64)
    for stats, rows in ((state.norm.inputs, inputs), (state.norm.targets, targets)):
        assert int(stats.count) == M
        np.testing.assert_allclose(np.asarray(stats.mean), rows.mean(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(stats.std()), rows.std(0), rtol=1e-5)


def test_the_held_out_split_is_a_fixed_fraction_of_the_transitions():
    batch = linear_batch(jax.random.key(5), (4000,))
    valid = np.asarray(held_out(batch.obs, batch.action, 0.2))
    assert abs(valid.mean() - 0.2) < 0.025
    again = np.asarray(held_out(batch.obs[::-1], batch.action[::-1], 0.2))[::-1]  # in another order, another batch
    np.testing.assert_array_equal(valid, again)
    np.testing.assert_array_equal(np.asarray(held_out(batch.obs, batch.action, 0.4))[valid], True)  # nested


@pytest.mark.long
def test_model_nll_is_the_gaussian_nll_by_hand():
    core = memr_core(config(ensemble=1, elites=1, model_hidden=(4,)), SPEC)
    params = core.model_net.init(jax.random.key(0), jnp.zeros((1, 5)))
    batch = linear_batch(jax.random.key(1), (5,))
    target = jnp.concatenate([batch.next_obs - batch.obs, batch.reward[:, None]], -1)
    mean, log_std, logit = core.model_net.apply(params, jnp.concatenate([batch.obs, batch.action], -1))
    m, ls, lg, t = (np.asarray(x, np.float64) for x in (mean[0], log_std[0], logit[0], target))
    gauss = np.sum(0.5 * ((t - m) / np.exp(ls)) ** 2 + ls + 0.5 * math.log(2 * math.pi), axis=-1)
    bce = np.log1p(np.exp(lg))  # label 0
    w = np.array([1.0, 2.0, 0.5, 1.0, 3.0])
    expected = np.sum((gauss + bce) * w) / w.sum()
    got = model_nll(core.model_net, params, batch.obs, batch.action, target, batch.terminated, jnp.asarray(w))
    np.testing.assert_allclose(float(got), expected, rtol=1e-5)


# --- M1: the Eq. 3.7 priority -------------------------------------------------------------------------------
def refit_gain(data: np.ndarray, t: float) -> float:
    """The exact entropy gain of refitting a Gaussian (MLE) after adding ``t`` (float64)."""
    return 0.5 * math.log(np.var(np.append(data, t)) / np.var(data))


@pytest.mark.long
def test_m1_priority_by_hand_nonnegative_and_zero_at_the_mean():
    p = entropy_priority(jnp.array([1.0, 2.0]), jnp.array([0.0, 0.0]), jnp.log(jnp.array([1.0, 2.0])))
    assert float(p) == pytest.approx(0.5 * 1.0 + 0.5 * (2.0 / 2.0) ** 2)
    key_a, key_m, key_s = jax.random.split(jax.random.key(0), 3)
    mean = jax.random.normal(key_m, (100, 3))
    log_std = jax.random.normal(key_s, (100, 3))
    assert bool(jnp.all(entropy_priority(jax.random.normal(key_a, (100, 3)) * 3, mean, log_std) >= 0))
    np.testing.assert_array_equal(np.asarray(entropy_priority(mean, mean, log_std)), 0.0)
    # = -log pi_psi(a|s) - sum_d log(sqrt(2 pi) sigma_d), the thesis's form
    a = jnp.array([0.3, -0.7, 1.1])
    m, ls = jnp.array([0.1, 0.2, -0.4]), jnp.array([-0.5, 0.3, 0.0])
    log_density = jax.scipy.stats.norm.logpdf(a, m, jnp.exp(ls)).sum()
    thesis = -log_density - jnp.sum(jnp.log(jnp.sqrt(2 * jnp.pi) * jnp.exp(ls)))
    assert float(entropy_priority(a, m, ls)) == pytest.approx(float(thesis), rel=1e-5)


def test_m1_priority_ranks_candidates_exactly_like_the_refit_entropy_gain():
    rng = np.random.default_rng(0)
    data = rng.normal(0.4, 1.7, size=200)
    mu, sigma = data.mean(), data.std()  # the MLE fit
    candidates = rng.normal(0.0, 4.0, size=64)
    gains = np.array([refit_gain(data, t) for t in candidates])
    n = len(data)
    lemma = 0.5 * np.log(n / (n + 1) * (1 + (candidates - mu) ** 2 / ((n + 1) * sigma**2)))
    np.testing.assert_allclose(gains, lemma, rtol=1e-9, atol=1e-12)  # Lemma 3.2.2 is exact
    p = np.asarray(entropy_priority(jnp.asarray(candidates[:, None], jnp.float32), jnp.float32(mu),
                                    jnp.float32(math.log(sigma))), np.float64)
    np.testing.assert_array_equal(np.argsort(p), np.argsort(gains))
    assert int(np.argmax(p)) == int(np.argmax(gains))
    # The gain is an increasing function of p alone: g = 1/2 log(N/(N+1) (1 + 2p/(N+1))), so ranks are exact.
    np.testing.assert_allclose(gains, 0.5 * np.log(n / (n + 1) * (1 + 2 * p / (n + 1))), rtol=1e-5, atol=1e-9)


# --- M2: the segmented model buffer ---------------------------------------------------------------------------
def test_m2_a_batch_spans_the_segments_and_each_row_carries_its_own_segments_weight():
    segments, rows = 3, 6
    example = jnp.zeros(2)
    state = segmented_init(segments, rows, example)
    weights = {}
    for s in range(4):  # the 4th write overwrites segment 0
        items = jnp.stack([jnp.full(rows, float(s)), jnp.arange(rows, dtype=jnp.float32)], -1)
        weights[s % segments] = (s, jnp.linspace(0.1, 1.0, rows) * (s + 1))
        state = segmented_write(state, items, weights[s % segments][1])
        assert int(state.filled) == min(s + 1, segments) and int(state.next) == (s + 1) % segments
    items, w, segment = segmented_sample(jax.random.key(0), state, 3000)
    for row, weight, seg in zip(np.asarray(items), np.asarray(w), np.asarray(segment), strict=True):
        generation, segment_weights = weights[int(seg)]
        assert row[0] == generation and weight == np.asarray(segment_weights)[int(row[1])]
    counts = np.bincount(np.asarray(segment), minlength=segments)
    assert len(set(np.asarray(segment[:8]).tolist())) > 1  # one batch mixes segments
    np.testing.assert_allclose(counts / 3000, 1 / 3, atol=0.04)  # every segment equally likely


def test_the_model_buffer_is_whole_segments_and_no_larger_than_the_run_writes():
    assert config(model_buffer=1000).segments == 63  # 1000 rollouts in segments of M = 16, rounded up
    assert MEMRConfig(batch_size=256).segments * 256 >= 100_000  # the default holds 1e5 rollouts
    assert config(model_buffer=1000, total_env_steps=40, update_ratio=0.5).segments == 20  # one segment per update
    assert INIT(jax.random.key(0), hparams()).rollouts.weights.shape == (4, M)


@pytest.mark.long
def test_m2_only_written_segments_are_sampled():
    state = segmented_write(segmented_init(5, 4, jnp.zeros(())), jnp.arange(4.0) + 1, jnp.ones(4))
    state = segmented_write(state, jnp.arange(4.0) + 5, jnp.ones(4))
    items, _, segment = segmented_sample(jax.random.key(0), state, 400)
    assert set(np.asarray(segment).tolist()) == {0, 1} and bool(jnp.all(items > 0))


@pytest.mark.long
def test_m2_memr_writes_the_sources_weights_of_its_sampling_distribution():
    """Two steps from a prioritized source: segment h holds batch h's importance weights (N P)^-beta / max w,
    divided by their mean (comparable across segments)."""
    c = config()
    buffer = make_prioritized_buffer(64, M)
    real = linear_batch(jax.random.key(3), (64,))
    replay = buffer.add(buffer.init(jax.tree.map(lambda x: x[0], real)), real)
    replay = buffer.update(replay, jnp.arange(64)[None], jnp.linspace(0.0, 5.0, 64))  # unequal priorities
    samples = [buffer.sample(jax.random.key(10 + h), replay) for h in range(2)]
    batches = stack([b for b, _ in samples])
    weights = jnp.stack([info.weights.reshape(-1) for _, info in samples])
    for _, info in samples:
        np.testing.assert_allclose(info.weights[0], importance_weights(info.probabilities[0], 64, 0.4), rtol=1e-6)
    assert float(weights.min()) < 0.9
    state = INIT(jax.random.key(0), hparams())
    state, _, priorities = UPDATE(jax.random.split(jax.random.key(1), 2), state, batches, weights, hparams())
    expected = np.asarray(weights) / np.asarray(weights).mean(axis=1, keepdims=True)
    np.testing.assert_allclose(np.asarray(state.rollouts.weights[:2]), expected, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(state.rollouts.weights[:2]).mean(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(state.rollouts.data.obs[:2]), np.asarray(batches.obs))
    assert priorities.shape == (2, M) and bool(jnp.all(priorities >= 0))
    assert (int(state.counts.policy_updates), int(state.counts.model_rollouts), int(state.counts.model_fits)) == (
        2 * c.policy_updates, 2 * M, 2)


# --- M3: IS weights enter the Q loss only ---------------------------------------------------------------------
@pytest.mark.long
def test_m3_weights_change_the_q_gradient_never_the_policy_gradient():
    core, hp = CORE, hparams()
    state = INIT(jax.random.key(0), hp)
    batch = linear_batch(jax.random.key(1), (8,))
    y = jnp.linspace(-1.0, 1.0, 8)
    w1, w2 = jnp.ones(8), jnp.linspace(0.1, 1.0, 8)
    fixed_target = Steps(target=lambda key, state, batch, hp: y)
    q_grad = lambda w: core.sac.critic_grads(jax.random.key(3), state.sac, batch, w, hp, fixed_target)[1]
    assert trees_differ(q_grad(w1), q_grad(w2))
    # A full SAC update with a frozen critic (lr 0): the actor and temperature steps are bit-identical whatever the
    # weights, while the weighted Q loss differs.
    frozen = hp.replace(critic_lr=jnp.float32(0.0))
    update = jax.jit(lambda w: core.sac.update(jax.random.key(2), state.sac, batch, w, restrict(frozen, SACHParams)))
    (s1, m1, _), (s2, m2, _) = update(w1), update(w2)
    assert_trees_equal((s1.actor, s1.log_alpha, s1.critic), (s2.actor, s2.log_alpha, s2.critic))
    assert float(m1["critic_loss"]) != float(m2["critic_loss"])
    assert float(m1["actor_loss"]) == float(m2["actor_loss"])


@pytest.mark.long
def test_m3_in_a_memr_step_the_weights_reach_the_critic_only():
    hp = hparams()
    state = INIT(jax.random.key(0), hp)
    batch = linear_batch(jax.random.key(1), (M,))
    step = lambda w, h: STEP(jax.random.key(2), state, batch, w, h)
    w1, w2 = jnp.ones(M), jnp.linspace(0.05, 1.0, M)
    frozen = hp.replace(critic_lr=jnp.float32(0.0))
    (a, _, pa), (b, _, pb) = step(w1, frozen), step(w2, frozen)
    assert_trees_equal((a.sac.actor, a.sac.log_alpha, a.psi), (b.sac.actor, b.sac.log_alpha, b.psi))
    np.testing.assert_array_equal(np.asarray(pa), np.asarray(pb))  # priorities do not depend on the weights
    (a, _, _), (b, _, _) = step(w1, hp), step(w2, hp)
    assert trees_differ(a.sac.critic, b.sac.critic)


def rollout_terminations(termination: str, env_name: str) -> np.ndarray:
    """The termination flags of one batch of model rollouts (what a step writes to the model buffer), on a spec
    named ``env_name``."""
    spec = EnvSpec(env_name, (3,), action_dim=2, action_low=(-1.0,) * 2, action_high=(1.0,) * 2)
    core = memr_core(config(termination=termination), spec)
    batch = linear_batch(jax.random.key(1), (M,))
    key, model_key, obs = jax.random.key(0), jax.random.key(2), batch.obs
    return np.asarray(jax.jit(lambda: core.rollout(core.init(key, hparams()), model_key, obs, batch.action)[2])())


@pytest.mark.long
def test_known_terminations_replace_the_learned_logit():
    learned = rollout_terminations("learned", "probe:pendulum")
    assert 0 < learned.sum() < M  # the untrained logit ends some rollouts and not others
    np.testing.assert_array_equal(rollout_terminations("known", "probe:pendulum"), np.zeros(M))  # never ends
    np.testing.assert_array_equal(rollout_terminations("known", "probe:bandit"), np.ones(M))  # always ends
    with pytest.raises(ValueError, match="no known termination rule for test-linear"):
        memr_core(config(termination="known"), SPEC)


def test_memr_and_sac_start_from_the_same_sac_networks():
    """Pairing by network: for the same member key, ``memr_sac``'s SAC part is the ``sac`` learner's init."""
    key = jax.random.key(7)
    sac_state = make_sac(SACConfig(hidden=(16, 16), batch_size=8), SPEC).init(key, restrict(hparams(), SACHParams))
    assert_trees_equal(INIT(key, hparams()).sac, sac_state)


@pytest.mark.long
def test_uniform_start_states_ignore_the_weights_and_declare_no_priorities():
    c = config(start_states="uniform", priority_lag=2)
    learner = make_memr(c, SPEC)
    assert not learner.step.priorities and not learner.step.by_priority and learner.step.chunk == 2
    assert make_memr(config(), SPEC).step.by_priority
    state = jax.jit(learner.init)(jax.random.key(0), hparams())
    batches = linear_batch(jax.random.key(1), (2, M))
    keys = jax.random.split(jax.random.key(1), 2)
    run = jax.jit(learner.step.update)
    a, _, _ = run(keys, state, batches, None, hparams())
    b, _, _ = run(keys, state, batches, jnp.linspace(0.1, 1.0, 2 * M).reshape(2, M), hparams())
    assert_trees_equal(a, b)
    np.testing.assert_array_equal(np.asarray(a.rollouts.weights[:2]), 1.0)


def test_the_chunk_is_its_steps():
    hp = hparams()
    state = INIT(jax.random.key(0), hp)
    batches = linear_batch(jax.random.key(1), (2, M))
    weights = jnp.linspace(0.2, 1.0, 2 * M).reshape(2, M)
    keys = jax.random.split(jax.random.key(4), 2)
    chunk, _, priorities = UPDATE(keys, state, batches, weights, hp)
    by_hand, expected = state, []
    for h in range(2):
        by_hand, _, p = STEP(keys[h], by_hand, member(batches, h), weights[h], hp)
        expected.append(p)
    assert_trees_close(chunk, by_hand)
    assert_trees_close(priorities, jnp.stack(expected))


@pytest.mark.parametrize("ratio,real", [(0.0, 0), (0.25, 2), (0.3, 2), (1.0, 8)])
def test_real_ratio_puts_exactly_that_many_real_rows_in_each_sac_batch(ratio, real):
    core = memr_core(config(real_ratio=ratio), SPEC)
    rollouts = segmented_init(4, M, jax.tree.map(lambda x: x[0], linear_batch(jax.random.key(0), (1,))))
    rollouts = segmented_write(rollouts, linear_batch(jax.random.key(1), (M,)), jnp.full(M, 0.5))
    batch = linear_batch(jax.random.key(2), (M,))
    batch = batch.replace(obs=batch.obs + 100.0)  # real rows are the ones far from the model's
    weights = jnp.linspace(1.0, 2.0, M)
    for i in range(5):
        rows, w = core.sac_rows(jax.random.key(i), rollouts, batch, weights)
        is_real = np.asarray(rows.obs[:, 0] > 50)
        assert rows.obs.shape[0] == 8 and is_real.sum() == real
        np.testing.assert_array_equal(np.asarray(w)[~is_real], 0.5)
        assert set(np.round(np.asarray(w)[is_real], 5)) <= set(np.round(np.asarray(weights), 5))
        real_obs = np.asarray(rows.obs)[is_real]
        assert len(np.unique(real_obs, axis=0)) == real  # drawn without replacement: no real row twice


def test_a_priority_written_back_is_the_one_the_next_sampling_sees_with_lag_1():
    """Two driver updates (``replay_updates``, ``priority_lag`` 1) equal sample -> step -> write twice by hand; by
    hand with both batches drawn before the first write (a lag of 2) differs, so the check can fail."""
    buffer = make_prioritized_buffer(64, M)

    def sample(key, replay):
        batch, info = buffer.sample(key, replay)
        return batch, info.weights.reshape(-1), info.indices

    source = ReplaySource(init=None, add=None, sample=sample, write_back=buffer.update)
    real = linear_batch(jax.random.key(3), (64,))
    replay = buffer.add(buffer.init(jax.tree.map(lambda x: x[0], real)), real)
    members, hp, key = Members(1), hparams(), jax.random.key(9)
    pop = lambda tree: jax.tree.map(lambda x: x[None], tree)
    learner = make_memr(config(), SPEC)
    assert learner.step.chunk == 1
    driven = jax.jit(lambda s, r: replay_updates(learner, source, members, 2, key, s, r, pop(hp)))(
        pop(INIT(jax.random.key(0), hp)), pop(replay))[0]

    def by_hand(lagged: bool):
        state, now, drawn = INIT(jax.random.key(0), hp), replay, []
        for step_key in jax.random.split(key, 2):
            sample_key, update_key = jax.random.split(step_key)
            batch, weights, indices = sample(members.keys(sample_key)[0], replay if lagged else now)
            state, _, priorities = STEP(members.keys(update_key)[0], state, batch, weights, hp)
            now = buffer.update(now, indices, priorities)
            drawn.append(indices)
        return state, drawn

    fresh, fresh_drawn = by_hand(lagged=False)
    stale, stale_drawn = by_hand(lagged=True)
    assert_trees_close(member(driven, 0), fresh)
    assert not np.array_equal(np.asarray(fresh_drawn[1]), np.asarray(stale_drawn[1]))  # the write moved the draw
    assert trees_differ(stale, fresh)


def test_the_oracle_model_is_the_envs_own_step():
    env = pendulum()
    spec = env.spec
    core = memr_core(config(model="oracle", termination="known"), spec)
    states = jax.random.uniform(jax.random.key(0), (M, 2), minval=-8.0, maxval=8.0)  # unwrapped angles too
    obs = jax.vmap(lambda s: env.step(s, jnp.zeros(1))[1])(states)  # observations of reachable states
    action = jax.random.uniform(jax.random.key(1), (M, 1), minval=-1.0, maxval=1.0)
    # the env's step from its own (unwrapped) state: the oracle sees only the observation
    truth = jax.vmap(lambda s, a: env.step(env.step(s, jnp.zeros(1))[0], a))(states, to_native(spec, action))
    state = core.init(jax.random.key(2), hparams())
    next_obs, reward, terminated = core.rollout(state, jax.random.key(3), obs, action)
    np.testing.assert_allclose(np.asarray(next_obs), np.asarray(truth[1]), atol=2e-5)
    np.testing.assert_allclose(np.asarray(reward), np.asarray(truth[2]), rtol=1e-5, atol=1e-4)
    assert float(jnp.abs(reward).max()) > 1.0  # not a trivial range
    np.testing.assert_array_equal(np.asarray(terminated), 0.0)
    with pytest.raises(ValueError, match="no oracle model for test-linear"):
        memr_core(config(model="oracle"), SPEC)


# --- population, bad input, runs ------------------------------------------------------------------------------
@pytest.mark.slow  # test_invariants checks vmap == loop for memr_sac in the default selection (unweighted)
@pytest.mark.parametrize("spec,options", [(SPEC, {}), (pendulum().spec, {"model": "oracle", "real_ratio": 0.5})])
def test_vmapped_population_equals_per_member_loop(spec, options):
    learner = make_memr(config(**options), spec)
    obs_dim, act_dim = spec.obs_shape[0], spec.action_dim
    hps = stack([hparams(), hparams(actor_lr=1e-3, model_lr=3e-3), hparams(psi_lr=1e-2, discount=0.9)])
    states = jax.vmap(learner.init)(jax.random.split(jax.random.key(0), 3), hps)
    per_member = [member(states, i) for i in range(3)]
    run, v_run = jax.jit(learner.step.update), jax.jit(jax.vmap(learner.step.update))
    for t in range(2):
        keys = jax.random.split(jax.random.key(10 + t), 6).reshape(3, 2)
        batches = linear_batch(jax.random.key(20 + t), (3, 2, M))
        batches = batches.replace(obs=batches.obs[..., :obs_dim], next_obs=batches.next_obs[..., :obs_dim],
                                  action=batches.action[..., :act_dim])
        weights = jax.random.uniform(jax.random.key(30 + t), (3, 2, M), minval=0.1, maxval=1.0)
        states, metrics, priorities = v_run(keys, states, batches, weights, hps)
        outs = [run(keys[i], per_member[i], member(batches, i), weights[i], member(hps, i)) for i in range(3)]
        per_member = [s for s, _, _ in outs]
        assert_trees_close(priorities, stack([p for _, _, p in outs]), atol=1e-4, rtol=1e-4)
    assert_trees_close(states, stack(per_member), atol=1e-4, rtol=1e-4)
    assert trees_differ(member(states.sac.actor, 0), member(states.sac.actor, 1))


RUN = dict(env="probe:pendulum", pop_size=2, total_env_steps=120, warmup_steps=40, rollout_len=20, eval_interval=60,
           eval_episodes=1, batch_size=8, buffer_size=200, buffer="prioritized", progress=False,
           learner_config={"hidden": [8], "model_hidden": [8], "psi_hidden": [8], "ensemble": 2, "elites": 1,
                           "model_buffer": 24, "sac_batch": 8, "model_steps": 1, "psi_epochs": 1})


@pytest.mark.parametrize("options,field", [
    ({"learner_config": {"ensemble": 0}}, "learner_config.ensemble"),
    ({"batch_size": 0}, "batch_size"),
    ({"per_alpha": 1.5}, "per_alpha"),
    ({"per_alpha": -0.1}, "per_alpha"),
    ({"learner_config": {"model_buffer": 0}}, "learner_config.model_buffer"),
    ({"learner_config": {"model_buffer": 24, "sac_batch": 25}}, "learner_config.model_buffer"),
    ({"learner_config": {"elites": 3}}, "learner_config.elites"),
    ({"learner_config": {"real_ratio": 1.5}}, "learner_config.real_ratio"),
    ({"learner_config": {"holdout": 0.0}}, "learner_config.holdout"),
    ({"learner_config": {"priority_lag": 0}}, "learner_config.priority_lag"),
    ({"learner_config": {"model": "exact"}}, "learner_config.model"),
    ({"env": "probe:bandit", "learner_config": {"model": "oracle"}}, "learner_config.model"),
    ({"buffer": "uniform"}, "buffer"),
    ({"learner_config": {"start_states": "uniform"}}, "buffer"),
    ({"learner_config": {"start_states": "greedy"}}, "learner_config.start_states"),
    ({"learner_config": {"termination": "oracle"}}, "learner_config.termination"),
    ({"env": "gym:InvertedPendulum-v5", "buffer_size": 2000}, "learner_config.termination"),
])
def test_bad_memr_input_is_one_line_naming_the_field(options, field, tmp_path):
    given = {**RUN, **options, "learner_config": {**RUN["learner_config"], **options.get("learner_config", {})}}
    with pytest.raises(ConfigError) as err:
        popjax.train(learner="memr_sac", out_dir=tmp_path / "run", **given)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{field}:"), message
    assert not (tmp_path / "run").exists()


def test_discrete_env_and_a_priority_lag_that_splits_an_iteration_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"^env: memr_sac needs continuous actions"):
        popjax.train(learner="memr_sac", out_dir=tmp_path / "a", **{**RUN, "env": "probe:cartpole"})
    bad = {**RUN, "learner_config": {**RUN["learner_config"], "priority_lag": 15}}
    with pytest.raises(ConfigError, match=r"^learner_config\.priority_lag: must divide the updates per "):
        popjax.train(learner="memr_sac", out_dir=tmp_path / "b", **bad)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    make_config(learner="memr_sac", **{**RUN, "buffer": "uniform",
                                       "learner_config": {**RUN["learner_config"], "start_states": "uniform"}})


@pytest.mark.slow
@pytest.mark.parametrize("start_states,extra", [("prioritized", {}), ("uniform", {}),
                                                ("prioritized", {"model": "oracle", "real_ratio": 0.5,
                                                                 "priority_lag": 2})])
def test_a_memr_population_trains_counts_and_resumes_exactly(start_states, extra, tmp_path):
    options = {**RUN, "learner": "memr_sac", "buffer": start_states,
               "learner_config": {**RUN["learner_config"], "start_states": start_states, **extra}}
    full, resumed = train_cut_and_resume(tmp_path, options, cut_env_steps=60)
    assert resumed.summary["final_returns"] == full.summary["final_returns"]
    assert_trees_equal(resumed.state, full.state)
    updates = (120 - 40) // 20 * 20
    assert full.summary["updates"] == updates
    assert full.summary["counts"] == {"policy_updates": updates, "model_rollouts": 8 * updates,
                                      "model_fits": updates}
    counts = full.state.learner.counts
    np.testing.assert_array_equal(counts.policy_updates, updates)
    np.testing.assert_array_equal(counts.model_rollouts, 8 * updates)
    np.testing.assert_array_equal(counts.model_fits, updates)
    assert int(full.state.learner.norm.inputs.count[0]) == 8 * updates  # the statistics are restored too
    assert np.isfinite(full.summary["final_returns"]).all()


@pytest.mark.parametrize(("argv", "message"), [
    (["--learner-config", "ensemble=0"], "learner_config.ensemble: must lie in [1, 64], got 0"),
    (["--batch-size", "0"], "batch_size: must lie in [1, 1048576], got 0"),
    (["--set", "per_alpha=1.2"], "per_alpha: must lie in [0, 1], got 1.2"),
    (["--learner-config", "model_buffer=0"], "learner_config.model_buffer: must lie in [1, 100000000], got 0"),
    (["--learner-config", "model_buffer=300", "--learner-config", "sac_batch=512"],
     "learner_config.model_buffer: a model buffer of 300 rollouts is smaller than the 512 model rows of one SAC "
     "batch"),
    (["--learner-config", "elites=9"], "learner_config.elites: must be at most ensemble (7), got 9"),
    (["--set", "buffer=uniform"], "buffer: the memr_sac learner draws its samples by priority, which the uniform "
                                  "source does not (allowed: prioritized)"),
    (["--env", "probe:cartpole", "--set", "buffer=prioritized"], "env: memr_sac needs continuous actions"),
    (["--learner-config", "priority_lag=30"], "learner_config.priority_lag: must divide the updates per iteration "
                                              "(50"),
])
def test_cli_refuses_bad_memr_input_in_one_line_with_exit_2(argv, message, capsys, tmp_path):
    out = tmp_path / "run"
    code = cli.main(["train", "--learner", "memr_sac", "--out", str(out), "--no-progress", *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and message in err, err
    assert not out.exists()


@pytest.mark.long
def test_extending_a_memr_run_that_sizes_its_model_buffer_by_the_budget_is_refused_in_one_line(tmp_path):
    # issue 49: the model buffer holds at most one segment per update of the run (total_env_steps x update_ratio),
    # so a longer budget changes its shape; the resume says so in one line and changes nothing
    from rundir_helpers import snapshot

    import popjax

    cfg = dict(learner="memr_sac", env="probe:pendulum", pop_size=1, total_env_steps=300, warmup_steps=100,
               eval_interval=100, eval_episodes=1, batch_size=16, buffer_size=500, rollout_len=50, progress=False,
               learner_config={"hidden": [8, 8], "model_hidden": [8, 8], "psi_hidden": [8, 8], "ensemble": 2,
                               "elites": 1, "sac_batch": 16, "model_buffer": 100_000})
    out = popjax.train(out_dir=tmp_path / "run", **cfg).out_dir
    before = snapshot(out)
    with pytest.raises(popjax.ConfigError) as err:
        popjax.resume(out, total_env_steps=600)
    message = str(err.value)
    assert message.startswith(f"resume: total_env_steps: extending {out} from 300 to 600 env steps changes the "
                              "shapes of its memr_sac state") and "\n" not in message
    assert message.endswith("(allowed: total_env_steps 300 for this run; train a new run for a longer budget)")
    assert snapshot(out) == before
