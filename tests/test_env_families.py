"""The JAX env families (issue 46): gymnax, craftax, jumanji through popjax's ``make_vec_env``.

Each family's batched, auto-resetting step must equal the package's own step called directly with the same
per-env keys (same observation up to float32 rounding of a differently fused program, identical reward and done),
across auto-resets; termination and truncation must reach a TD target apart; bad names are one line.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popjax.envs import registry
from popjax.envs.base import make_vec_env, to_native
from popjax.population.members import indexed_keys
from popjax.types import Transition

N = 3  # envs per test


def random_actions(spec, key, n):
    if spec.discrete:
        return jax.random.randint(key, (n,), 0, spec.num_actions)
    return jax.random.uniform(key, (n, spec.action_dim), minval=-1.0, maxval=1.0)


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def run_against(vec, reference_reset, reference_step, steps, seed=0):
    """Steps ``vec`` and the reference (``reference_step(keys, state, native_action) -> (state, obs after any
    reset, final obs, reward, done)``) side by side with the same keys; returns (episodes ended, terminations)."""
    ids = jnp.arange(N)
    key = jax.random.key(seed)
    state = vec.reset(key, N)
    ref_state, ref_obs = reference_reset(indexed_keys(key, ids))
    close(state.obs, ref_obs)
    v_step, r_step = jax.jit(vec.step), jax.jit(reference_step)
    ended = terminations = 0
    for t in range(steps):
        k = jax.random.fold_in(jax.random.key(seed + 1), t)
        action = random_actions(vec.spec, jax.random.fold_in(k, 7), N)
        state, out = v_step(k, state, action)
        ref_state, obs, final_obs, reward, done = r_step(indexed_keys(k, ids), ref_state,
                                                         to_native(vec.spec, action))
        close(state.obs, obs)  # after the auto-reset
        close(out.next_obs, final_obs)  # the true last observation
        np.testing.assert_array_equal(out.reward, reward)
        np.testing.assert_array_equal(out.done, done)
        ended += int(out.done.sum())
        terminations += int(out.terminated.sum())
    return ended, terminations


# --- gymnax ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id, steps", [("CartPole-v1", 60), ("Breakout-MinAtar", 60), ("Pendulum-v1", 205)])
def test_gymnax_batched_step_equals_gymnax_step(env_id, steps):
    import gymnax

    genv, params = gymnax.make(env_id)
    vec = make_vec_env(registry.make_jax_env(f"gymnax:{env_id}"))
    flat = lambda x: x.reshape(N, -1).astype(jnp.float32)

    def reference_reset(keys):
        obs, state = jax.vmap(genv.reset, in_axes=(0, None))(keys, params)
        return state, flat(obs)

    def reference_step(keys, state, action):  # gymnax's own auto-resetting step, per env key
        obs, state, reward, terminated, truncated, info = jax.vmap(genv.step, in_axes=(0, 0, 0, None))(
            keys, state, action, params)
        return state, flat(obs), flat(info["final_observation"]), reward, terminated | truncated

    ended, terminations = run_against(vec, reference_reset, reference_step, steps)
    assert ended > 0  # crossed at least one auto-reset
    if env_id == "Pendulum-v1":  # never terminates: 200-step truncations
        assert ended == N and terminations == 0
    else:
        assert terminations == ended


def test_gymnax_spec_kinds():
    cartpole, breakout, pendulum, point = (registry.env_spec(f"gymnax:{i}") for i in
                                           ("CartPole-v1", "Breakout-MinAtar", "Pendulum-v1", "PointRobot-misc"))
    assert (cartpole.obs_shape, cartpole.num_actions, cartpole.max_episode_steps) == ((4,), 2, 500)
    assert (breakout.obs_shape, breakout.num_actions, breakout.max_episode_steps) == ((400,), 3, 1000)
    assert (pendulum.action_low, pendulum.action_high, pendulum.max_episode_steps) == ((-2.0,), (2.0,), 200)
    np.testing.assert_allclose(point.action_high, (0.1, 0.1))
    assert registry.is_jax_env("gymnax:CartPole-v1")


@pytest.mark.parametrize("env_id, steps", [("CartPole-v1", 40), ("MountainCar-v0", 201)])
def test_truncation_bootstraps_and_termination_does_not_in_the_td_target(env_id, steps):
    """CartPole (falls: terminations) and MountainCar (a random policy never reaches the flag: 200-step
    truncations) through the transitions the runners build, into DQN's TD target."""
    from popjax.learners.dqn import td_target
    from popjax.networks.mlp import QNetwork

    vec = make_vec_env(registry.make_jax_env(f"gymnax:{env_id}"))
    q_net = QNetwork((8,), vec.spec.num_actions)
    params = q_net.init(jax.random.key(0), jnp.zeros((1,) + vec.spec.obs_shape))

    def collect(state, t):
        k = jax.random.fold_in(jax.random.key(3), t)
        action = random_actions(vec.spec, k, N)
        new_state, out = vec.step(k, state, action)
        return new_state, (Transition(state.obs, action, out.reward, out.next_obs, out.terminated), out,
                           new_state.obs)

    _, (batch, out, reset_obs) = jax.lax.scan(collect, vec.reset(jax.random.key(2), N), jnp.arange(steps))
    flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), batch)
    y = td_target(q_net, params, params, flat, jnp.float32(0.9), double_q=False)
    bootstrap = flat.reward + 0.9 * q_net.apply(params, flat.next_obs).max(axis=-1)
    terminated = np.asarray(out.terminated).reshape(-1) == 1
    truncated = np.asarray(out.truncated).reshape(-1) == 1
    if env_id == "CartPole-v1":
        assert terminated.any() and not truncated.any()
    else:
        assert truncated.sum() == N and not terminated.any()
        # the target bootstraps from the true last state, not from the state the env was reset to
        assert not np.isclose(flat.next_obs[truncated], reset_obs.reshape(flat.next_obs.shape)[truncated]).any()
    np.testing.assert_allclose(y[terminated], flat.reward[terminated], rtol=1e-6)
    np.testing.assert_allclose(y[~terminated], bootstrap[~terminated], rtol=1e-5)


@pytest.mark.parametrize("name, words", [
    ("gymnax:NoSuch-v0", ["CartPole-v1", "Breakout-MinAtar"]),
    ("gymnax:MNISTBandit-bsuite", ["not offered", "MNIST"]),
    ("craftax:Craftax-Pixels-v1", ["Craftax-Symbolic-v1", "Craftax-Classic-Symbolic-v1"]),
    ("jumanji:Snak-v1", ["Snake-v1", "Maze-v0"]),
    ("jumanji:Sokoban-v0", ["not offered"]),
    ("jumanji:JobShop-v0", ["multi-discrete", "at most 1024"]),
    ("jumanji:SearchAndRescue-v0", ["BoundedArray", "allowed"]),
    ("playground:Go1JoystickFlatTerrain", ["CheetahRun", "HumanoidWalk"]),
])
def test_bad_names_and_unsupported_actions_are_one_line(name, words):
    with pytest.raises(ValueError) as err:
        registry.env_spec(name)
    message = str(err.value)
    assert "\n" not in message and name.split(":")[1] in message
    for word in words:
        assert word in message


def test_a_missing_extra_is_one_line_naming_the_install(monkeypatch):
    import sys

    for module, prefix, install in (("gymnax", "gymnax:CartPole-v1", 'pip install "popjax[gymnax]"'),
                                    ("jumanji", "jumanji:Snake-v1", 'pip install "popjax[jumanji]"'),
                                    ("craftax", "craftax:Craftax-Symbolic-v1", 'pip install "popjax[craftax]"')):
        monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
        with pytest.raises(ValueError) as err:
            registry.parse(prefix)
        assert "\n" not in str(err.value) and install in str(err.value)
        monkeypatch.delitem(sys.modules, module)


def test_the_cli_refuses_a_bad_gymnax_name_in_one_line_exit_2(tmp_path, capsys):
    from popjax.cli import main

    out = tmp_path / "run"
    assert main(["train", "--learner", "ppo", "--env", "gymnax:NoSuch-v0", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gymnax:NoSuch-v0" in err[0] and "CartPole-v1" in err[0]
    assert not out.exists()


# --- craftax -----------------------------------------------------------------------------------------------------


@pytest.mark.long  # craftax's world generation compiles for about a minute on 2 cores
def test_craftax_batched_step_equals_craftax_step_across_a_time_limit():
    """Craftax-Classic-Symbolic with its time limit shortened to 12 steps (the same params on both sides), so the
    episodes end and auto-reset inside the test."""
    from craftax.craftax_env import make_craftax_env_from_name

    from popjax.envs.craftax import make_env

    env = make_env("Craftax-Classic-Symbolic-v1", max_timesteps=12)
    assert env.spec.max_episode_steps == 12 and env.spec.num_actions == 17 and env.spec.obs_shape == (1345,)
    cenv = make_craftax_env_from_name("Craftax-Classic-Symbolic-v1", auto_reset=True)
    params = cenv.default_params.replace(max_timesteps=12)

    def reference_reset(keys):
        obs, state = jax.vmap(cenv.reset, in_axes=(0, None))(keys, params)
        return state, obs

    def reference_step(keys, state, action):
        obs, state2, reward, done, _ = jax.vmap(cenv.step, in_axes=(0, 0, 0, None))(keys, state, action, params)
        final, _, _, _, _ = jax.vmap(cenv.step_env, in_axes=(0, 0, 0, None))(
            jax.vmap(lambda k: jax.random.split(k)[0])(keys), state, action, params)
        return state2, obs, final, reward, done

    ended, terminations = run_against(make_vec_env(env), reference_reset, reference_step, 14)
    assert ended == N and terminations == 0  # every env truncated at step 12
    assert registry.env_spec("craftax:Craftax-Symbolic-v1").obs_shape == (8268,)


# --- jumanji -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id, steps", [("Snake-v1", 40), ("RubiksCube-partly-scrambled-v0", 24)])
def test_jumanji_batched_step_equals_jumanji_step(env_id, steps):
    import jumanji

    from popjax.envs.jumanji import flat_obs

    jenv = jumanji.make(env_id)
    env = registry.make_jax_env(f"jumanji:{env_id}")
    nvec = getattr(jenv.action_spec, "num_values", None)

    def native(action):  # the joint index of a multi-discrete spec, unraveled by hand
        if jnp.ndim(nvec) == 0:
            return action
        sizes = [int(n) for n in np.ravel(nvec)]
        parts, rest = [], action
        for size in reversed(sizes):
            parts.append(rest % size)
            rest = rest // size
        return jnp.stack(parts[::-1], axis=-1).astype(jenv.action_spec.dtype)

    def reference_reset(keys):
        state, timestep = jax.vmap(jenv.reset)(keys)
        return state, jax.vmap(flat_obs)(timestep.observation)

    def reference_step(keys, state, action):  # jumanji's step; a finished env restarts from the vec env's key
        new, timestep = jax.vmap(jenv.step)(state, native(action))
        fresh, fresh_timestep = jax.vmap(jenv.reset)(keys)
        done = timestep.last()
        pick = lambda a, b: jnp.where(done.reshape(done.shape + (1,) * (a.ndim - 1)), a, b)
        final = jax.vmap(flat_obs)(timestep.observation)
        return (jax.tree.map(pick, fresh, new), pick(jax.vmap(flat_obs)(fresh_timestep.observation), final), final,
                timestep.reward, done)

    ended, terminations = run_against(make_vec_env(env), reference_reset, reference_step, steps)
    assert ended > 0
    if env_id == "RubiksCube-partly-scrambled-v0":  # time limit 20: truncations unless solved by chance
        assert env.spec.num_actions == 18 and env.spec.max_episode_steps == 20
    else:
        assert terminations > 0 and env.spec.num_actions == 4


# --- popjax bench envstep --family ---------------------------------------------------------------------------------


def test_bench_envstep_family_rows(tmp_path):
    from popjax_bench import envstep, report

    payload = envstep.run(learners=("td3",), gym_envs=(), brax_envs=(), families=("gymnax:CartPole-v1",),
                          family_envs=(2, 4), steps=5, repeats=10, min_time=0.0, allow_busy=True, out_dir=tmp_path,
                          plot=False)
    rows = payload["results"]
    assert [(r["mode"], r["env"], r["envs"]) for r in rows] == [("family", "gymnax:CartPole-v1", 2),
                                                              ("family", "gymnax:CartPole-v1", 4)]
    for r in rows:
        assert "skipped" not in r, r
        assert r["steps_per_s"] == pytest.approx(r["envs"] * 5 / r["adapter"]["timing"]["median_s"])
        assert r["ratio"] == pytest.approx(r["steps_per_s"] / r["package_steps_per_s"]) and r["ratio"] > 0
    text = "\n".join(report.section_envstep(payload))
    assert "| gymnax:CartPole-v1 | 4 |" in text and "adapter / package" in text
    with pytest.raises(ValueError, match="--family"):
        envstep.Options(families=("gym:Pendulum-v1",))


def test_bench_family_sides_carry_what_their_step_returns():
    """Both sides' scans carry the observation (a carry of the env state alone lets XLA drop the package's
    observation, which the adapter must compute): gymnax's carry is its whole step output, popjax's the vec env
    state and the ``StepOutput``."""
    from popjax_bench import envstep_families

    key = jax.random.key(0)
    init, step = envstep_families.native("gymnax:CartPole-v1", 2)
    obs, _, reward, terminated, truncated, info = step(key, init(key))
    assert obs.shape == (2, 4) and reward.shape == terminated.shape == truncated.shape == (2,)
    assert info["final_observation"].shape == (2, 4)
    _, init, step = envstep_families.adapter("gymnax:CartPole-v1", 2)
    state, out = step(key, init(key))
    assert state.obs.shape == out.next_obs.shape == (2, 4) and out.done.shape == (2,)


def test_rejax_section_renders_from_its_json():
    from popjax_bench import report, report_rejax

    arm = lambda wall, returns, load: {"wall_s": wall, "compile_s": 2.0, "train_s": wall - 2.0,
                                       "env_steps_per_member": 100_096, "final_returns": returns,
                                       "mean_final_return": sum(returns) / len(returns), "load_1min_before": load,
                                       "load_1min_after": load + 0.5}
    run = lambda name, ours, theirs: {"clipping": name, "arms": {"popjax": ours, "rejax": theirs},
                                      "time_ratio": ours["wall_s"] / theirs["wall_s"],
                                      "train_time_ratio": ours["train_s"] / theirs["train_s"]}
    rejax = {"versions": {"rejax": "0.1.3"}}
    payload = {"study": "rejax_ppo", "env": "gymnax:CartPole-v1", "pop": 2, "seed": 0, "env_steps_per_member": 100_096,
               "eval_episodes": 32, "unmatched": ["initialisation"],
               "settings": dict(envs=8, rollout_len=32, epochs=20, minibatches=1, lr=1e-3, discount=0.98,
                                gae_lambda=0.8, clip=0.2, ent_coef=0.0, vf_coef=0.5, hidden=[64, 64],
                                activation="tanh"),
               "runs": [run("none", arm(10.0, [500.0, 480.0], 3.0), {**arm(20.0, [500.0, 300.0], 4.0), **rejax}),
                        run("0.5", arm(12.0, [100.0, 100.0], 3.0), {**arm(10.0, [500.0, 500.0], 4.0), **rejax})]}
    text = "\n".join(report_rejax.section_rejax_ppo(payload))
    assert "| none | popjax | 10.0 | 2.0 | 8.0 | 100,096 | 490.0 | 1 / 2 | 480.0 | 3.00 → 3.50 |" in text
    assert "| none | rejax | 20.0 | 2.0 | 18.0 | 100,096 | 400.0 | 1 / 2 | 300.0 | 4.00 → 4.50 |" in text
    assert "- none: popjax / rejax wall time 0.50× (train time 0.44×); popjax's mean final return is equal or better" \
        in text
    assert "- 0.5: popjax / rejax wall time 1.20× (train time 1.25×); popjax's mean final return is lower" in text
    assert "Not matched: initialisation." in text and "rejax 0.1.3" in text
    assert "rejax_ppo" in report.STUDY_ORDER


# --- MJX: playground:<name> and brax:<name>@mjx ---------------------------------------------------------------------


@pytest.mark.long  # MJX compiles for a minute or more on 2 cores
def test_playground_batched_step_equals_playground_step():
    from popjax.envs.playground import _load

    env, _ = _load("CartpoleBalance")
    vec = make_vec_env(registry.make_jax_env("playground:CartpoleBalance"))
    assert vec.spec.max_episode_steps == 1000 and vec.spec.action_dim == 1 and vec.spec.obs_shape == (5,)

    def reference_reset(keys):
        state = jax.vmap(env.reset)(keys)
        return state, state.obs

    def reference_step(keys, state, action):  # no episode ends in 30 steps: no reset to mirror
        new = jax.vmap(env.step)(state, action)
        return new, new.obs, new.obs, new.reward, new.done > 0.5

    ended, _ = run_against(vec, reference_reset, reference_step, 30)
    assert ended == 0


@pytest.mark.long  # brax's MJX pipeline compiles for a minute or more on 2 cores
def test_brax_humanoid_on_mjx_steps_and_shapes_at_1024_envs():
    """The documented MJX locomotion path: ``brax:humanoid@mjx`` steps at 2 envs (finite observations, the
    humanoid's fall terminates); at 1,024 envs its reset and step are traced abstractly (shapes only)."""
    vec = make_vec_env(registry.make_jax_env("brax:humanoid@mjx"))
    state = vec.reset(jax.random.key(0), 2)
    step = jax.jit(vec.step)
    for t in range(3):
        state, out = step(jax.random.key(t), state, jnp.zeros((2, vec.spec.action_dim)))
        assert np.isfinite(np.asarray(out.next_obs)).all() and out.next_obs.shape == (2,) + vec.spec.obs_shape
    big = jax.eval_shape(lambda k: vec.reset(k, 1024), jax.random.key(0))
    _, out = jax.eval_shape(vec.step, jax.random.key(1), big, jax.ShapeDtypeStruct((1024, vec.spec.action_dim),
                                                                                  jnp.float32))
    assert out.next_obs.shape == (1024,) + vec.spec.obs_shape and out.terminated.shape == (1024,)
