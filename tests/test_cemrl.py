"""CEM ask/tell (test T8), the masked shared-buffer add and CEM-RL end to end."""

import csv
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from learner_helpers import assert_trees_equal, train_cut_and_resume

import popjax
from popjax.buffers import make_uniform_buffer
from popjax.config import ConfigError
from popjax.drivers import cem
from popjax.drivers.cemrl import add_masked


def test_elite_weights_are_normalised_log_weights():
    w = cem.elite_weights(5, "log")
    expected = np.log(6 / np.arange(1, 6))
    np.testing.assert_allclose(w, expected / expected.sum())
    np.testing.assert_allclose(w.sum(), 1.0)
    assert np.all(np.diff(w) < 0)  # best elite weighs most
    np.testing.assert_allclose(cem.elite_weights(4, "uniform"), [0.25] * 4)


@pytest.mark.long
def test_ask_is_mirrored_about_the_mean_with_the_given_variance():
    config = cem.CEMConfig(pop_size=6, n_elites=3)
    dim = 20_000
    mean = jnp.linspace(-1.0, 1.0, dim)
    var = jnp.where(jnp.arange(dim) % 2 == 0, 1e-2, 4.0)
    state = cem.CEMState(mean=mean, var=var, cov_noise=jnp.float32(1e-2), generation=jnp.int32(0))
    samples = jax.jit(cem.ask, static_argnums=2)(jax.random.key(0), state, config)
    assert samples.shape == (6, dim)
    for i in range(3):  # sample i and i + N/2 are symmetric about the mean
        np.testing.assert_allclose(samples[i] + samples[i + 3], 2 * mean, atol=1e-5)
    z = (samples[:3] - mean) / jnp.sqrt(var)  # standard normal draws
    assert abs(float(z.mean())) < 0.02 and abs(float(z.std()) - 1.0) < 0.02
    assert not np.allclose(samples[0], samples[1])
    # not mirrored: independent draws
    free = cem.ask(jax.random.key(0), state, cem.CEMConfig(pop_size=6, n_elites=3, mirrored=False))
    assert not np.allclose(free[0] + free[3], 2 * mean, atol=1e-3)


def test_tell_moves_the_mean_to_the_weighted_elites_with_the_release_variance():
    config = cem.CEMConfig(pop_size=4, n_elites=2)
    old_mean = np.array([0.0, 1.0, -1.0], np.float32)
    state = cem.init(old_mean, config)
    np.testing.assert_allclose(state.var, [1e-2] * 3)  # init_var is a variance
    samples = np.array([[1.0, 1.0, 1.0], [2.0, 0.0, -2.0], [3.0, 3.0, 3.0], [-1.0, 2.0, 0.5]], np.float32)
    fitness = np.array([1.0, 4.0, 2.0, 3.0], np.float32)  # ranking: 1, 3, 2, 0
    new = cem.tell(state, jnp.asarray(samples), jnp.asarray(fitness), config)

    w = np.log(3 / np.array([1.0, 2.0]))
    w /= w.sum()
    elites = samples[[1, 3]]
    cov_noise = 0.95 * 1e-2 + 0.05 * 1e-5
    np.testing.assert_allclose(new.mean, w @ elites, rtol=1e-6)
    np.testing.assert_allclose(new.var, w @ (elites - old_mean) ** 2 / 2 + cov_noise, rtol=1e-6)
    np.testing.assert_allclose(new.cov_noise, cov_noise, rtol=1e-6)
    assert int(new.generation) == 1
    best = samples[1]  # the mean moved toward the best elite
    assert np.linalg.norm(new.mean - best) < 0.5 * np.linalg.norm(old_mean - best)
    # textbook variance without the release's extra 1/n_e
    textbook = cem.tell(state, jnp.asarray(samples), jnp.asarray(fitness),
                        cem.CEMConfig(pop_size=4, n_elites=2, var_div_elites=False))
    np.testing.assert_allclose(textbook.var, w @ (elites - old_mean) ** 2 + cov_noise, rtol=1e-6)
    # NaN fitness ranks last, ties go to the lower index
    np.testing.assert_array_equal(cem.rank(jnp.array([np.nan, 2.0, 5.0, 2.0])), [2, 1, 3, 0])


def test_cov_noise_decays_geometrically_to_its_floor():
    config = cem.CEMConfig(pop_size=2, n_elites=1)
    state = cem.init(jnp.zeros(2), config)
    tell = jax.jit(cem.tell, static_argnums=3)
    samples = jnp.zeros((2, 2))
    for t in range(1, 31):
        state = tell(state, samples, jnp.array([0.0, 1.0]), config)
        np.testing.assert_allclose(state.cov_noise, 1e-5 + (1e-2 - 1e-5) * 0.95**t, rtol=1e-4)
        # all samples equal the old mean: the variance is the cov noise alone
        np.testing.assert_allclose(state.var, [float(state.cov_noise)] * 2, rtol=1e-6)


@pytest.mark.long
def test_masked_add_keeps_valid_rows_in_order_and_wraps():
    buffer = make_uniform_buffer(capacity=5, batch_size=2)
    state = buffer.init({"x": jnp.zeros((), jnp.float32)})
    items = {"x": jnp.arange(1.0, 5.0)}
    state = add_masked(buffer, state, items, jnp.array([True, False, True, True]))
    np.testing.assert_array_equal(state.data["x"], [1, 3, 4, 0, 0])
    assert int(state.size) == 3 and int(state.insert_pos) == 3
    state = add_masked(buffer, state, {"x": jnp.array([7.0, 8.0, 9.0])}, jnp.array([True, True, True]))
    np.testing.assert_array_equal(state.data["x"], [9, 3, 4, 7, 8])
    assert int(state.size) == 5 and int(state.insert_pos) == 1


TINY = dict(learner="td3", env="probe:pendulum", driver="cemrl", pop_size=4, total_env_steps=800, warmup_steps=200,
            eval_interval=400, eval_episodes=2, batch_size=32, buffer_size=4000,
            learner_config={"hidden": [16, 16]}, cemrl={"updates_per_call": 100}, progress=False)


@pytest.mark.parametrize("bad, message", [
    ({"cemrl": {"n_elite": 2}}, r"cemrl\.n_elite: unknown key \(allowed: n_trained"),
    ({"cemrl": {"init_var": "big"}}, "cemrl.init_var: expected a number > 0, got 'big'"),
    ({"pop_size": 5}, "pop_size: mirrored .* needs an even pop_size, got 5"),
    ({"learner": "sac"}, r"learner: the cemrl driver trains TD3 actors .*\(allowed: td3\), got 'sac'"),
    ({"buffer_size": 700}, "buffer_size"),
])
def test_bad_options_fail_before_compiling(bad, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        popjax.train(out_dir=tmp_path, **{**TINY, **bad})


@pytest.mark.long
def test_tiny_cemrl_run_writes_the_run_directory(tmp_path):
    run = popjax.train(out_dir=tmp_path, **TINY)
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert config["driver"] == "cemrl" and config["cemrl"] == {"updates_per_call": 100}
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == json.loads(json.dumps(run.summary))
    # 4 generations of 4 x 200-step episodes; generation 1 is warm-up (no previous data), then
    # each generation makes G = 800 env steps of the previous one = 8 calls of K = 100 steps.
    assert summary["env_steps"] == 800 and summary["env_steps_total"] == 3200
    assert summary["updates"] == 3 * 800
    evals = summary["cem_mean_returns"]
    assert [e[0] for e in evals] == [400, 800]
    assert summary["best_return"] == max(e[1] for e in evals) and summary["final_return"] == evals[-1][1]
    assert all(-2000 < e[1] < 0 for e in evals)  # pendulum returns
    with (tmp_path / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 * 4
    assert [int(r["member"]) for r in rows[:4]] == [0, 1, 2, 3]
    first, last = rows[:4], rows[-4:]
    assert [int(r["trained"]) for r in first] == [0, 0, 0, 0]
    assert [int(r["trained"]) for r in last] == [1, 1, 0, 0]  # half of the population gets gradient steps
    assert float(last[0]["critic_loss"]) > 0 and np.isnan(float(last[3]["critic_loss"]))
    assert [float(r["eval_return"]) for r in last] == summary["final_returns"]
    assert float(last[0]["policy_delay"]) == 1.0  # CEM-RL's TD3 delay
    stds = [float(r["cem_std_mean"]) for r in rows[::4]]
    assert len(set(stds)) == 4  # the CEM variance changes every generation
    for name in ("learning_curves.png", "cemrl_fitness.png"):
        assert (tmp_path / "plots" / name).stat().st_size > 10_000


@pytest.mark.slow
def test_cemrl_resume_equals_uninterrupted_run(tmp_path):
    full, resumed = train_cut_and_resume(tmp_path, TINY, cut_env_steps=400)
    assert resumed.summary["cem_mean_returns"] == full.summary["cem_mean_returns"]
    assert_trees_equal(resumed.state, full.state)


@pytest.mark.slow
def test_cemrl_on_the_gymnasium_path(tmp_path):
    run = popjax.train(out_dir=tmp_path, **{**TINY, "env": "gym:Pendulum-v1"})
    assert run.summary["env_steps"] == 800 and run.summary["updates"] == 3 * 800
    assert all(-2000 < e[1] < 0 for e in run.summary["cem_mean_returns"])
    assert (tmp_path / "plots" / "cemrl_fitness.png").exists()
