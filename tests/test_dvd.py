"""DvD: RBF kernel, safe log-det, the diversity gradient in the shared-critic step (test T10), schedule, e2e."""

import csv
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from learner_helpers import assert_trees_equal, train_cut_and_resume

import popjax
from popjax.config import ConfigError
from popjax.drivers.dvd import BanditState, DvDSettings, bandit_init, bandit_step, diversity_weight
from popjax.learners import td3
from popjax.learners.base import adam_step
from popjax.learners.shared_critic import (
    DiversityConfig,
    diversity_loss,
    make_shared_critic_td3,
    rbf_kernel,
    safe_logdet,
)
from popjax.networks.mlp import DeterministicActor, TwinCritic
from popjax.population import tree
from popjax.population.hparams import population_hparams
from popjax.types import EnvSpec, Transition

JIT = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})
SPEC = EnvSpec("test", (3,), action_dim=2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
CONFIG = td3.TD3Config(hidden=(16, 16), batch_size=4)
ACTOR = DeterministicActor(CONFIG.hidden, SPEC.action_dim)
CRITIC = TwinCritic(CONFIG.hidden)
POP = 3
# rbf_scale chosen so the 3 random actors are neither ~orthogonal (K ~ I) nor ~identical
DIVERSITY = DiversityConfig(rbf_scale=0.5, jitter=1e-6, normalize=True)
SHARED = make_shared_critic_td3(CONFIG, SPEC, POP, DIVERSITY)
PLAIN = make_shared_critic_td3(CONFIG, SPEC, POP)
UPDATE, PLAIN_UPDATE = JIT(SHARED.update), JIT(PLAIN.update)


def numpy_loss(embeddings: np.ndarray, scale: float, jitter: float, normalize: bool) -> float:
    e = np.asarray(embeddings, np.float64)
    d = ((e[:, None, :] - e[None, :, :]) ** 2).sum(-1)
    if normalize:
        d /= e.shape[1]
    k = np.exp(-d / (2 * scale))
    sign, logdet = np.linalg.slogdet(k + jitter * np.eye(len(e)))
    assert sign > 0
    return -logdet


def batch(seed, shape):
    rng = np.random.default_rng(seed)
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    return Transition(obs=f32(rng.normal(size=shape + (3,))), action=f32(rng.uniform(-1, 1, shape + (2,))),
                      reward=f32(rng.normal(size=shape)), next_obs=f32(rng.normal(size=shape + (3,))),
                      terminated=jnp.zeros(shape, jnp.float32))


def setup_state(hp, identical=False):
    """Random numpy weights (scaled 1/sqrt(fan_in)), zero biases and Adam moments: nothing to compile."""
    rng = np.random.default_rng(0)
    shapes = jax.eval_shape(SHARED.init, jax.random.key(0), hp)
    weights = lambda tree, ndim: jax.tree.map(
        lambda s: (rng.normal(size=s.shape) / np.sqrt(s.shape[-2])).astype(s.dtype) if len(s.shape) == ndim
        else np.zeros(s.shape, s.dtype), tree)  # kernels: ndim 3 for the stacked actors, 2 for the critic
    zeros = lambda tree: jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), tree)
    actor, critic = weights(shapes.actor, 3), weights(shapes.critic, 2)
    if identical:
        actor = jax.tree.map(lambda x: np.broadcast_to(x[:1], x.shape).copy(), actor)
    state = shapes.replace(actor=actor, critic=critic, target_actor=actor, target_critic=critic,
                           actor_opt=zeros(shapes.actor_opt), critic_opt=zeros(shapes.critic_opt),
                           steps=np.zeros((), np.int32))
    return jax.tree.map(jnp.asarray, state)


@pytest.mark.long
def test_kernel_is_symmetric_with_unit_diagonal():
    e = jax.random.normal(jax.random.key(0), (4, 7))
    k = rbf_kernel(e, 2.0)
    np.testing.assert_array_equal(k, k.T)
    np.testing.assert_array_equal(np.diag(k), np.ones(4))
    assert np.all((k > 0) & (k <= 1))
    d = np.sum((np.asarray(e)[0] - np.asarray(e)[1]) ** 2)
    np.testing.assert_allclose(k[0, 1], np.exp(-d / 4.0), rtol=1e-5)


@pytest.mark.long
def test_diversity_loss_on_three_hand_built_actors_matches_numpy():
    hp = population_hparams(td3.default_hparams(), POP, {})
    state = setup_state(hp)
    b = batch(0, (POP, CONFIG.batch_size))
    _, metrics = UPDATE(jax.random.split(jax.random.key(1), POP), state, b, hp, 0.5)
    # the embedding: each actor's actions on all POP * B states of the step
    states = np.asarray(b.obs).reshape(-1, 3)
    emb = np.stack([np.asarray(ACTOR.apply(tree.member(state.actor, i), states)).reshape(-1) for i in range(POP)])
    expected = numpy_loss(emb, DIVERSITY.rbf_scale, DIVERSITY.jitter, normalize=True)
    assert 0.05 < expected < 5  # a well-conditioned, non-trivial example
    np.testing.assert_allclose(metrics["diversity_loss"], np.full(POP, expected), rtol=1e-4)
    np.testing.assert_allclose(diversity_loss(jnp.asarray(emb), 0.5, 1e-6, True), expected, rtol=1e-4)
    # the release's unnormalised distance: same formula without /dim
    np.testing.assert_allclose(diversity_loss(jnp.asarray(emb), 3.0, 1e-6), numpy_loss(emb, 3.0, 1e-6, False),
                               rtol=1e-4)
    pairs = [np.sqrt(((emb[i] - emb[j]) ** 2).mean()) for i, j in ((0, 1), (0, 2), (1, 2))]
    np.testing.assert_allclose(metrics["embedding_distance"], np.full(POP, np.mean(pairs)), rtol=1e-4)


def test_update_adds_the_weighted_diversity_gradient_to_each_dpg_gradient():
    hp = population_hparams(td3.default_hparams(), POP, {"policy_delay": 1, "actor_lr": [1e-3, 3e-4, 1e-4]})
    state = setup_state(hp)
    b = batch(2, (POP, CONFIG.batch_size))
    weight = 0.7
    new, _ = UPDATE(jax.random.split(jax.random.key(3), POP), state, b, hp, weight)

    @JIT
    def expected_actors(state, b, new_critic):
        states = b.obs.reshape(-1, 3)

        def population_loss(actors):  # -log det K over all actors, as one function of the stacked params
            emb = jax.vmap(lambda p: ACTOR.apply(p, states).reshape(-1))(actors)
            return diversity_loss(emb, DIVERSITY.rbf_scale, DIVERSITY.jitter, DIVERSITY.normalize)

        div = jax.grad(population_loss)(state.actor)

        def one(actor, opt, obs, lr, div):
            dpg = jax.grad(lambda a: -CRITIC.apply(new_critic, obs, ACTOR.apply(a, obs))[0].mean())(actor)
            return adam_step(actor, jax.tree.map(lambda g, d: g + weight * d, dpg, div), opt, lr)[0]

        return jax.vmap(one)(state.actor, state.actor_opt, b.obs, hp.actor_lr, div), div

    expected, div = expected_actors(state, b, new.critic)
    assert float(jnp.abs(jax.tree.leaves(div)[0]).max()) > 1e-4  # the diversity term really acts
    for a, e in zip(jax.tree.leaves(new.actor), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-6)


def test_weight_zero_gives_the_plain_shared_critic_update():
    hp = population_hparams(td3.default_hparams(), POP, {})
    state = setup_state(hp)
    b = batch(4, (POP, CONFIG.batch_size))
    keys = jax.random.split(jax.random.key(5), POP)
    with_div, metrics = UPDATE(keys, state, b, hp, 0.0)
    plain, _ = PLAIN_UPDATE(keys, state, b, hp)
    assert float(metrics["diversity_weight"][0]) == 0.0
    for a, e in zip(jax.tree.leaves(with_div), jax.tree.leaves(plain), strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-7)


@pytest.mark.long
def test_identical_actors_singular_kernel_give_finite_loss_and_gradient():
    e = jnp.tile(jax.random.normal(jax.random.key(0), (1, 12)), (3, 1))
    loss, grad = jax.value_and_grad(diversity_loss)(e, 1.0, 1e-6)
    # float32: the value is dominated by log(fl(1 + eps) - 1), a few % off eps itself
    np.testing.assert_allclose(loss, numpy_loss(np.asarray(e), 1.0, 1e-6, False), rtol=2e-2)
    assert np.isfinite(loss) and np.all(np.isfinite(grad))
    np.testing.assert_allclose(grad, 0.0, atol=1e-6)  # every direction is symmetric at the singular point
    # a kernel whose first factorisation fails (jitter ~0): the fallback jitter keeps it finite
    ones = jnp.ones((3, 3))
    value, g = jax.value_and_grad(safe_logdet)(ones, 1e-12)
    np.testing.assert_allclose(value, np.linalg.slogdet(np.ones((3, 3)) + 1e-3 * np.eye(3))[1], rtol=1e-3)
    assert np.all(np.isfinite(g))
    # the full update with identical actors and a positive weight stays finite
    hp = population_hparams(td3.default_hparams(), POP, {"policy_delay": 1})
    state = setup_state(hp, identical=True)
    new, metrics = UPDATE(jax.random.split(jax.random.key(6), POP), state, batch(6, (POP, CONFIG.batch_size)), hp, 0.5)
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(new))
    assert all(np.isfinite(v).all() for v in metrics.values())
    np.testing.assert_allclose(metrics["embedding_distance"], 0.0, atol=1e-7)
    assert float(metrics["diversity_loss"][0]) > 10  # -log det of a (near) singular kernel is large


def test_weight_schedule_follows_the_release_steps_and_rescales():
    settings = DvDSettings(diversity=DiversityConfig())
    steps = jnp.array([0, 49_999, 50_000, 299_999, 300_000, 699_999, 700_000, 3_000_000])
    np.testing.assert_allclose(diversity_weight(steps, settings), [0, 0, 0.3, 0.3, 0.5, 0.5, 0.2, 0.2])
    short = DvDSettings(diversity=DiversityConfig(), schedule_scale=0.01)
    np.testing.assert_allclose(diversity_weight(jnp.array([499, 500, 3000, 7000]), short), [0, 0.3, 0.5, 0.2])


TINY = dict(learner="td3", env="probe:pendulum", driver="dvd", pop_size=3, total_env_steps=600, warmup_steps=200,
            eval_interval=200, eval_episodes=2, batch_size=32, buffer_size=3000, learner_config={"hidden": [16, 16]},
            dvd={"schedule_scale": 0.005, "normalize": True}, progress=False)


@pytest.mark.parametrize("bad, message", [
    ({"dvd": {"kernel": "rbf"}}, r"dvd\.kernel: unknown key \(allowed: rbf_scale"),
    ({"dvd": {"thresholds": [1, 2], "weights": [0.1]}},
     r"dvd\.weights: needs one more weight than thresholds \(2\), got 1"),
    ({"dvd": {"jitter": 0}}, "dvd.jitter: must be > 0, got 0"),
    ({"dvd": {"weight_source": "ucb"}}, r"dvd\.weight_source: 'ucb' unknown \(allowed: schedule, bandit\)"),
    ({"dvd": {"weight_source": "bandit", "bandit_arms": [0.5]}},
     r"dvd\.bandit_arms: expected a list of numbers >= 0 \(at least two\), got \[0\.5\]"),
    ({"dvd": {"bandit_arms": ["a", "b"]}}, r"dvd\.bandit_arms: expected a list of numbers"),
    ({"learner": "sac"}, r"learner: the dvd driver trains TD3 actors .*\(allowed: td3\)"),
])
def test_bad_options_fail_before_compiling(bad, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        popjax.train(out_dir=tmp_path, **{**TINY, **bad})


@pytest.mark.long
def test_tiny_dvd_run_writes_the_run_directory(tmp_path):
    run = popjax.train(out_dir=tmp_path, **TINY)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["driver"] == "dvd" and summary["env_steps"] == 600 and summary["updates"] == 400
    # schedule thresholds x 0.005 on the summed env steps: 250, 1500, 3500
    assert summary["dvd_schedule"]["thresholds"] == [250.0, 1500.0, 3500.0]
    with (tmp_path / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["env_steps"]) for r in rows] == [200] * 3 + [400] * 3 + [600] * 3
    assert {"diversity_loss", "diversity_weight", "embedding_distance", "critic_loss"} <= set(rows[0])
    assert np.isnan(float(rows[0]["diversity_loss"]))  # evaluated before the first update
    # weight of the last training call before each evaluation: summed env steps 1200 -> 0.3, 1800 -> 0.5
    assert [round(float(rows[i]["diversity_weight"]), 6) for i in (3, 6)] == [0.3, 0.5]
    assert all(np.isfinite(float(r["diversity_loss"])) for r in rows[3:])
    assert [float(r["eval_return"]) for r in rows[-3:]] == run.summary["final_returns"]
    assert int(run.state.counters.env_steps) * 3 == 1800  # transitions in the shared buffer
    for name in ("learning_curves.png", "dvd_diversity.png"):
        assert (tmp_path / "plots" / name).stat().st_size > 10_000


STEP = jax.jit(bandit_step, static_argnums=(3, 4))


def test_bandit_rewards_the_arm_played_when_the_best_return_improves():
    arms = (0.0, 0.5)
    bandit = bandit_init(len(arms))
    played = []
    for i, best in enumerate([1.0, 2.0, 2.0, 5.0, 4.0, 6.0]):
        played.append(int(bandit.arm))
        bandit = STEP(jax.random.key(i), bandit, best, arms, 0)
        assert float(bandit.weight) == arms[int(bandit.arm)]
    # evaluation i rewards the arm drawn at evaluation i-1: improved at 2, 4 and 6, not at 3 and 5
    improved = [True, False, True, False, True]
    expected_s, expected_f = [0, 0], [0, 0]
    for arm, up in zip(played[1:], improved, strict=True):
        (expected_s if up else expected_f)[arm] += 1
    assert (bandit.successes.tolist(), bandit.failures.tolist()) == (expected_s, expected_f)
    assert int(bandit.draws) == 6 and float(bandit.last_best) == 6.0


def test_bandit_posterior_picks_the_arm_that_keeps_improving():
    # Beta(41, 1) against Beta(1, 41): the improving arm wins every Thompson draw
    arms = (0.0, 0.5, 1.0)
    trained = BanditState(successes=jnp.array([0, 40, 0]), failures=jnp.array([40, 0, 40]), arm=jnp.int32(-1),
                          draws=jnp.int32(0), last_best=jnp.float32(jnp.nan), weight=jnp.float32(0.0))
    draw = lambda random_draws, k: float(STEP(jax.random.key(k), trained, 0.0, arms, random_draws).weight)
    assert {draw(0, k) for k in range(20)} == {0.5}
    # the first ``random_draws`` draws ignore the posterior
    assert {draw(5, k) for k in range(20)} == {0.0, 0.5, 1.0}


@pytest.mark.long
def test_tiny_dvd_run_with_the_bandit_logs_its_draws(tmp_path):
    run = popjax.train(out_dir=tmp_path, **{**TINY, "dvd": {"weight_source": "bandit", "bandit_arms": [0.0, 0.7],
                                                            "normalize": True}})
    bandit = run.summary["dvd_bandit"]
    # 3 evaluations: the first only draws, the next two reward the arm played before them
    assert bandit["draws"] == 3 and sum(bandit["successes"]) + sum(bandit["failures"]) == 2
    assert bandit["last_best"] == max(run.summary["final_returns"])
    assert float(run.state.bandit.weight) == pytest.approx([0.0, 0.7][bandit["arm"]])
    with (tmp_path / "metrics.csv").open() as f:
        weights = [float(r["diversity_weight"]) for r in csv.DictReader(f)]
    assert all(w in (0.0, pytest.approx(0.7)) for w in weights[3:])


@pytest.mark.slow
@pytest.mark.parametrize("dvd", [TINY["dvd"], {"weight_source": "bandit", "normalize": True}])
def test_dvd_resume_equals_uninterrupted_run(dvd, tmp_path):
    full, resumed = train_cut_and_resume(tmp_path, {**TINY, "dvd": dvd}, cut_env_steps=400)
    assert resumed.summary["final_returns"] == full.summary["final_returns"]
    assert_trees_equal(resumed.state, full.state)


@pytest.mark.slow
def test_dvd_on_the_gymnasium_path(tmp_path):
    run = popjax.train(out_dir=tmp_path, **{**TINY, "env": "gym:Pendulum-v1"})
    assert run.summary["env_steps"] == 600 and run.summary["updates"] == 400
    assert all(np.isfinite(run.summary["final_returns"]))
    assert (tmp_path / "plots" / "dvd_diversity.png").exists()
