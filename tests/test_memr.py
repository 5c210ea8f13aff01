"""MEMR (memr_sac): the model fit on a known linear system, Eq. 3.7 priorities (M1), the segmented model buffer (M2),
IS weights in the Q loss only (M3), the chunk against its pieces, vmap == per-member loop, bad input, a run, resume."""

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
from popjax.config import ConfigError, make_config
from popjax.learners.memr import MEMRConfig, default_hparams, entropy_priority, make_memr, memr_core
from popjax.learners.sac import SACConfig, SACHParams, make_sac
from popjax.networks.dynamics import model_nll
from popjax.population.hparams import restrict
from popjax.population.tree import member, stack
from popjax.types import EnvSpec, Transition

SPEC = EnvSpec("test-linear", (3,), action_dim=2, action_low=(-1.0,) * 2, action_high=(1.0,) * 2)
M = 16


def config(**overrides) -> MEMRConfig:
    base = dict(hidden=(16, 16), model_hidden=(32, 32), psi_hidden=(16,), ensemble=2, segments=4, sac_batch=8,
                batch_size=M, model_update_every=2, model_epochs=1, psi_epochs=2, policy_updates=2,
                termination="learned")
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


def held_out_nll(core, params, batch) -> float:
    target = jnp.concatenate([batch.next_obs - batch.obs, batch.reward[:, None]], axis=-1)
    return float(model_nll(core.model_net, params, batch.obs, batch.action, target, batch.terminated,
                           jnp.ones(batch.reward.shape)))


@pytest.mark.long
def test_model_fit_reduces_held_out_nll_on_a_known_linear_system():
    c = config(model_update_every=8, model_epochs=25, batch_size=64)
    core = memr_core(c, SPEC)
    hp = hparams(model_lr=3e-3)
    state = jax.jit(core.init)(jax.random.key(0), hp)
    train = linear_batch(jax.random.key(1), (8, 64))  # one fit's H = 8 batches of M = 64 real transitions
    test = linear_batch(jax.random.key(2), (512,))
    before = held_out_nll(core, state.model, test)
    fit = jax.jit(lambda s: core.fit_model(s, train, jnp.ones((8, 64)), hp))
    fitted = state
    for _ in range(4):
        fitted, _ = fit(fitted)
    after = held_out_nll(core, fitted.model, test)
    assert int(fitted.counts.model_fits) == 4
    assert after < before - 10.0, (before, after)
    # The mean prediction of every ensemble member is close to the true change and reward on held-out data.
    mean, _, logit = core.model_net.apply(fitted.model, jnp.concatenate([test.obs, test.action], -1))
    truth = jnp.concatenate([test.next_obs - test.obs, test.reward[:, None]], -1)
    relative = jnp.mean((mean - truth) ** 2, axis=(1, 2)) / jnp.var(truth)
    assert float(relative.max()) < 0.05, relative
    assert bool(jnp.all(logit < 0))  # nothing terminates


@pytest.mark.long
def test_model_nll_is_the_gaussian_nll_by_hand():
    core = memr_core(config(ensemble=1, model_hidden=(4,)), SPEC)
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
@pytest.mark.long
def test_m2_a_batch_never_mixes_segments_and_carries_the_segment_weights():
    segments, rows = 3, 6
    example = jnp.zeros(2)
    state = segmented_init(segments, rows, example)
    weights = {}
    for s in range(4):  # the 4th write overwrites segment 0
        items = jnp.stack([jnp.full(rows, float(s)), jnp.arange(rows, dtype=jnp.float32)], -1)
        weights[s % segments] = (s, jnp.linspace(0.1, 1.0, rows) * (s + 1))
        state = segmented_write(state, items, weights[s % segments][1])
        assert int(state.filled) == min(s + 1, segments) and int(state.next) == (s + 1) % segments
    seen = set()
    for i in range(200):
        items, w, segment = segmented_sample(jax.random.key(i), state, 8)
        generation, segment_weights = weights[int(segment)]
        np.testing.assert_array_equal(np.asarray(items[:, 0]), generation)  # one segment only
        np.testing.assert_array_equal(np.asarray(w), np.asarray(segment_weights)[np.asarray(items[:, 1], int)])
        seen.add(int(segment))
    assert seen == {0, 1, 2}


@pytest.mark.long
def test_m2_only_written_segments_are_sampled():
    state = segmented_write(segmented_init(5, 4, jnp.zeros(())), jnp.arange(4.0) + 1, jnp.ones(4))
    for i in range(50):
        items, _, segment = segmented_sample(jax.random.key(i), state, 4)
        assert int(segment) == 0 and bool(jnp.all(items > 0))


@pytest.mark.long
def test_m2_memr_writes_the_sources_weights_of_its_sampling_distribution():
    """One chunk from a prioritized source: segment h holds batch h's importance weights (N P)^-beta / max w."""
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
    np.testing.assert_array_equal(np.asarray(state.rollouts.weights[:2]), np.asarray(weights))
    np.testing.assert_array_equal(np.asarray(state.rollouts.data.obs[:2]), np.asarray(batches.obs))
    assert priorities.shape == (2, M) and bool(jnp.all(priorities >= 0))
    assert (int(state.counts.policy_updates), int(state.counts.model_rollouts), int(state.counts.model_fits)) == (
        2 * c.policy_updates, 2 * M, 1)


# --- M3: IS weights enter the Q loss only ---------------------------------------------------------------------
@pytest.mark.long
def test_m3_weights_change_the_q_gradient_never_the_policy_gradient():
    core, hp = CORE, hparams()
    state = INIT(jax.random.key(0), hp)
    batch = linear_batch(jax.random.key(1), (8,))
    y = jnp.linspace(-1.0, 1.0, 8)
    w1, w2 = jnp.ones(8), jnp.linspace(0.1, 1.0, 8)
    q_grad = lambda w: jax.grad(lambda p: core.sac.critic_loss(p, batch, y, w)[0])(state.sac.critic)
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
    """The termination flags one MEMR step writes to the model buffer, on a spec named ``env_name``."""
    spec = EnvSpec(env_name, (3,), action_dim=2, action_low=(-1.0,) * 2, action_high=(1.0,) * 2)
    core = memr_core(config(termination=termination), spec)
    state = core.init(jax.random.key(0), hparams())
    batch = linear_batch(jax.random.key(1), (M,))
    state, _, _ = core.step(jax.random.key(2), state, batch, jnp.ones(M), hparams())
    return np.asarray(state.rollouts.data.terminated[0])


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
    c = config(start_states="uniform")
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


def test_the_chunk_is_a_model_fit_then_its_steps():
    core, hp = CORE, hparams()
    state = INIT(jax.random.key(0), hp)
    batches = linear_batch(jax.random.key(1), (2, M))
    weights = jnp.linspace(0.2, 1.0, 2 * M).reshape(2, M)
    keys = jax.random.split(jax.random.key(4), 2)
    chunk, _, priorities = UPDATE(keys, state, batches, weights, hp)
    by_hand, _ = jax.jit(core.fit_model)(state, batches, weights, hp)
    expected = []
    for h in range(2):
        by_hand, _, p = STEP(keys[h], by_hand, member(batches, h), weights[h], hp)
        expected.append(p)
    assert_trees_close(chunk, by_hand)
    assert_trees_close(priorities, jnp.stack(expected))


# --- population, bad input, runs ------------------------------------------------------------------------------
@pytest.mark.slow  # test_invariants checks vmap == loop for memr_sac in the default selection (unweighted)
def test_vmapped_population_equals_per_member_loop():
    learner = make_memr(config(), SPEC)
    hps = stack([hparams(), hparams(actor_lr=1e-3, model_lr=3e-3), hparams(psi_lr=1e-2, discount=0.9)])
    states = jax.vmap(learner.init)(jax.random.split(jax.random.key(0), 3), hps)
    per_member = [member(states, i) for i in range(3)]
    run, v_run = UPDATE, jax.jit(jax.vmap(learner.step.update))
    for t in range(2):
        keys = jax.random.split(jax.random.key(10 + t), 6).reshape(3, 2)
        batches = linear_batch(jax.random.key(20 + t), (3, 2, M))
        weights = jax.random.uniform(jax.random.key(30 + t), (3, 2, M), minval=0.1, maxval=1.0)
        states, metrics, priorities = v_run(keys, states, batches, weights, hps)
        outs = [run(keys[i], per_member[i], member(batches, i), weights[i], member(hps, i)) for i in range(3)]
        per_member = [s for s, _, _ in outs]
        assert_trees_close(priorities, stack([p for _, _, p in outs]), atol=1e-4, rtol=1e-4)
    assert_trees_close(states, stack(per_member), atol=1e-4, rtol=1e-4)
    assert trees_differ(member(states.sac.actor, 0), member(states.sac.actor, 1))


RUN = dict(env="probe:pendulum", pop_size=2, total_env_steps=120, warmup_steps=40, rollout_len=20, eval_interval=60,
           eval_episodes=1, batch_size=8, buffer_size=200, buffer="prioritized", progress=False,
           learner_config={"hidden": [8], "model_hidden": [8], "psi_hidden": [8], "ensemble": 2, "segments": 3,
                           "sac_batch": 8, "model_update_every": 10, "model_epochs": 1, "psi_epochs": 1})


@pytest.mark.parametrize("options,field", [
    ({"learner_config": {"ensemble": 0}}, "learner_config.ensemble"),
    ({"batch_size": 0}, "batch_size"),
    ({"per_alpha": 1.5}, "per_alpha"),
    ({"per_alpha": -0.1}, "per_alpha"),
    ({"learner_config": {"segments": 0}}, "learner_config.segments"),
    ({"learner_config": {"segments": 3, "sac_batch": 25}}, "learner_config.segments"),
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


def test_discrete_env_and_a_model_period_that_splits_an_iteration_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"^env: memr_sac needs continuous actions"):
        popjax.train(learner="memr_sac", out_dir=tmp_path / "a", **{**RUN, "env": "probe:cartpole"})
    bad = {**RUN, "learner_config": {**RUN["learner_config"], "model_update_every": 15}}
    with pytest.raises(ConfigError, match=r"^learner_config\.model_update_every: .* must divide the updates per "):
        popjax.train(learner="memr_sac", out_dir=tmp_path / "b", **bad)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    make_config(learner="memr_sac", **{**RUN, "buffer": "uniform",
                                       "learner_config": {**RUN["learner_config"], "start_states": "uniform"}})


@pytest.mark.slow
@pytest.mark.parametrize("start_states", ["prioritized", "uniform"])
def test_a_memr_population_trains_counts_and_resumes_exactly(start_states, tmp_path):
    options = {**RUN, "learner": "memr_sac", "buffer": start_states,
               "learner_config": {**RUN["learner_config"], "start_states": start_states}}
    full, resumed = train_cut_and_resume(tmp_path, options, cut_env_steps=60)
    assert resumed.summary["final_returns"] == full.summary["final_returns"]
    assert_trees_equal(resumed.state, full.state)
    updates = (120 - 40) // 20 * 20
    assert full.summary["updates"] == updates
    assert full.summary["counts"] == {"policy_updates": updates, "model_rollouts": 8 * updates,
                                      "model_fits": updates // 10}
    counts = full.state.learner.counts
    np.testing.assert_array_equal(counts.policy_updates, updates)
    np.testing.assert_array_equal(counts.model_rollouts, 8 * updates)
    np.testing.assert_array_equal(counts.model_fits, updates // 10)
    assert np.isfinite(full.summary["final_returns"]).all()


@pytest.mark.parametrize(("argv", "message"), [
    (["--learner-config", "ensemble=0"], "learner_config.ensemble: must lie in [1, 64], got 0"),
    (["--batch-size", "0"], "batch_size: must lie in [1, 1048576], got 0"),
    (["--set", "per_alpha=1.2"], "per_alpha: must lie in [0, 1], got 1.2"),
    (["--learner-config", "segments=0"], "learner_config.segments: must lie in [1, 1000000], got 0"),
    (["--learner-config", "segments=1", "--learner-config", "sac_batch=512"],
     "learner_config.segments: a model buffer of 1 x 256 (batch_size) rollouts is smaller than one SAC batch of 512"),
    (["--set", "buffer=uniform"], "buffer: the memr_sac learner draws its samples by priority, which the uniform "
                                  "source does not (allowed: prioritized)"),
    (["--env", "probe:cartpole", "--set", "buffer=prioritized"], "env: memr_sac needs continuous actions"),
    (["--learner-config", "model_update_every=30"], "learner_config.model_update_every: x update_ratio (30 updates) "
                                                    "must divide the updates per iteration (50"),
])
def test_cli_refuses_bad_memr_input_in_one_line_with_exit_2(argv, message, capsys, tmp_path):
    out = tmp_path / "run"
    code = cli.main(["train", "--learner", "memr_sac", "--out", str(out), "--no-progress", *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and message in err, err
    assert not out.exists()
