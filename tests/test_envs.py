"""Environment adapters: host (gymnasium) path, JAX path (probes, brax), registry."""

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popjax.envs import registry
from popjax.envs.base import make_vec_env
from popjax.envs.gymnasium import SEED_STRIDE, HostVecEnv
from popjax.types import Transition, dummy_transition

CARTPOLE_X, CARTPOLE_THETA = 2.4, 12 * 2 * np.pi / 360


def host_transition(obs, action, out) -> Transition:
    return Transition(obs=obs, action=action, reward=out.reward, next_obs=out.next_obs,
                      terminated=out.terminated)


def shapes_dtypes(tree):
    return [(tuple(x.shape), np.dtype(x.dtype)) for x in jax.tree.leaves(tree)]


# --- host path --------------------------------------------------------------------------------


def test_host_cartpole_termination_returns_terminal_obs_then_reset_obs():
    env = HostVecEnv("CartPole-v1", 2, seed=0)
    env.reset()
    actions = np.ones(2, np.int32)  # always push right: the pole falls within ~10-60 steps
    rewards, done_at = [], None
    for t in range(1, 200):
        before = env.obs
        out = env.step(actions)
        rewards.append(out.reward[0])
        assert out.next_obs.dtype == np.float32 and out.terminated.dtype == np.float32
        if out.done[0]:
            done_at = t
            break
        assert out.terminated[0] == 0 and out.truncated[0] == 0 and out.finished_return[0] == 0
        np.testing.assert_array_equal(env.obs[0], out.next_obs[0])
        assert not np.array_equal(before[0], env.obs[0])
    assert done_at is not None and done_at < 100
    assert out.terminated[0] == 1.0 and out.truncated[0] == 0.0
    terminal = out.next_obs[0]
    assert abs(terminal[0]) > CARTPOLE_X or abs(terminal[2]) > CARTPOLE_THETA  # the true terminal obs
    assert np.all(np.abs(env.obs[0]) <= 0.05)  # ... while obs is a fresh reset obs
    assert out.finished_return[0] == pytest.approx(sum(rewards)) == float(done_at)
    env.close()


def test_host_pendulum_truncates_at_200_and_matches_a_plain_gym_env():
    n, seed = 2, 3
    env = HostVecEnv("Pendulum-v1", n, seed=seed)
    obs0 = env.reset()
    ref = gym.make("Pendulum-v1")  # env 1 of the vec env, driven by hand
    np.testing.assert_array_equal(obs0[1], ref.reset(seed=seed * SEED_STRIDE + 1)[0])
    rng = np.random.default_rng(0)
    total = np.zeros(n)
    for t in range(1, 201):
        a = rng.uniform(-1, 1, (n, 1)).astype(np.float32)
        out = env.step(a)
        np.testing.assert_allclose(env.to_native(a), 2.0 * a, atol=1e-6)
        r_obs, r_rew, r_term, r_trunc, _ = ref.step(env.to_native(a)[1])
        np.testing.assert_array_equal(out.next_obs[1], r_obs)
        assert out.reward[1] == np.float32(r_rew)
        total += out.reward
        assert not out.terminated.any()
        if t < 200:
            assert not out.done.any() and not r_trunc
    assert r_trunc and not r_term
    np.testing.assert_array_equal(out.truncated, [1.0, 1.0])
    np.testing.assert_array_equal(out.terminated, [0.0, 0.0])
    np.testing.assert_allclose(out.finished_return, total, rtol=1e-5)
    np.testing.assert_array_equal(out.next_obs[1], r_obs)  # last true obs, for bootstrapping
    np.testing.assert_array_equal(env.obs[1], ref.reset()[0])  # unseeded reset continues the stream
    assert not np.array_equal(env.obs[1], out.next_obs[1])
    out = env.step(np.zeros((n, 1), np.float32))
    assert not out.done.any() and out.finished_return[0] == 0.0
    env.close()


def test_host_action_rescaling_to_native_bounds():
    env = HostVecEnv("Pendulum-v1", 3, seed=0)
    env.reset()
    env.step(np.array([[1.0], [-1.0], [0.5]], np.float32))
    torques = [e.unwrapped.last_u for e in env.envs]  # the torque the env applied
    np.testing.assert_allclose(torques, [2.0, -2.0, 1.0])
    np.testing.assert_allclose(env.to_native(np.array([[0.0], [-0.5]])), [[0.0], [-1.0]])
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros((2, 1), np.float32))
    env.close()
    with pytest.raises(RuntimeError, match="reset"):
        HostVecEnv("CartPole-v1", 1, 0).step(np.zeros(1, np.int32))


def test_host_same_seed_same_trajectory_across_auto_reset():
    def run(seed):
        env = HostVecEnv("Pendulum-v1", 3, seed=seed)
        obs = [env.reset()]
        rng = np.random.default_rng(1)
        outs = []
        for _ in range(230):  # crosses the auto-reset at step 200
            outs.append(env.step(rng.uniform(-1, 1, (3, 1))))
            obs.append(env.obs)
        env.close()
        return np.stack(obs), np.stack([o.next_obs for o in outs]), np.stack([o.reward for o in outs])

    a, b, c = run(7), run(7), run(8)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[0][0, 0], a[0][0, 1])  # envs within one vec env differ
    assert not np.allclose(a[0][0], c[0][0])  # another seed differs
    assert not np.allclose(a[0][201], c[0][201])  # ... also after the auto-reset


# --- both paths agree -------------------------------------------------------------------------


@pytest.mark.long
@pytest.mark.parametrize("gym_name, probe_name", [("gym:Pendulum-v1", "probe:pendulum"),
                                                  ("gym:CartPole-v1", "probe:cartpole")])
def test_gym_and_jax_paths_share_spec_and_transition_layout(gym_name, probe_name):
    g, p = registry.env_spec(gym_name), registry.env_spec(probe_name)
    for field in ("obs_shape", "action_dim", "num_actions", "action_low", "action_high", "max_episode_steps"):
        assert getattr(g, field) == getattr(p, field), field
    n = 4
    host = registry.make_host_env(gym_name, n, seed=0)
    obs = host.reset()
    action = np.zeros((n, *g.action_shape), g.action_dtype)
    t_host = host_transition(obs, action, host.step(action))
    host.close()
    vec = make_vec_env(registry.make_jax_env(probe_name))
    state = vec.reset(jax.random.key(0), n)
    _, out = jax.jit(vec.step)(jax.random.key(1), state, jnp.asarray(action))
    t_jax = Transition(state.obs, jnp.asarray(action), out.reward, out.next_obs, out.terminated)
    batched_dummy = jax.tree.map(lambda x: jnp.zeros((n, *x.shape), x.dtype), dummy_transition(g))
    assert shapes_dtypes(t_host) == shapes_dtypes(t_jax) == shapes_dtypes(batched_dummy)


@pytest.mark.long
def test_brax_inverted_pendulum_spec_vec_env_and_termination():
    spec = registry.env_spec("brax:inverted_pendulum")
    assert (spec.obs_shape, spec.action_dim, spec.action_low, spec.action_high, spec.max_episode_steps) == (
        (4,), 1, (-1.0,), (1.0,), 1000)
    assert registry.is_jax_env("brax:inverted_pendulum")
    n, steps = 3, 25
    vec = make_vec_env(registry.make_jax_env("brax:inverted_pendulum"))
    action = jnp.ones((n, 1))  # full push: the pole tips past 0.2 rad within a few steps

    @jax.jit  # one compilation for reset + rollout (an eager brax reset alone takes ~10 s)
    def run(key):
        def body(s, k):
            s2, out = vec.step(k, s, action)
            return s2, (s.obs, out)

        return jax.lax.scan(body, vec.reset(key, n), jax.random.split(key, steps))

    final, (obs_before, out) = jax.device_get(run(jax.random.key(0)))
    actions = np.broadcast_to(action, (steps, n, 1))
    tr = Transition(obs_before, actions, out.reward, out.next_obs, out.terminated)
    assert shapes_dtypes(tr) == shapes_dtypes(
        jax.tree.map(lambda x: jnp.zeros((steps, n, *x.shape), x.dtype), dummy_transition(spec)))
    assert np.all(np.abs(obs_before[0]) <= 0.01)  # brax reset noise is +-0.01
    done = out.done.any(axis=1)
    assert done.any(), f"no termination within {steps} steps"
    d = int(np.argmax(done))  # first step at which an episode ended
    np.testing.assert_array_equal(out.done[d], np.ones(n, bool))  # same push, same fate
    np.testing.assert_array_equal(out.terminated[d], np.ones(n))
    np.testing.assert_array_equal(out.truncated, np.zeros((steps, n)))
    assert not out.done[:d].any()
    np.testing.assert_array_equal(out.next_obs[:d], obs_before[1 : d + 1])  # no reset before d
    assert np.all(np.abs(out.next_obs[d, :, 1]) > 0.2)  # next_obs: the pre-reset terminal obs
    assert np.all(np.abs(obs_before[d + 1]) <= 0.01)  # then a fresh reset obs
    np.testing.assert_array_equal(out.finished_return[d], np.full(n, d + 1.0))  # reward 1 per step
    np.testing.assert_array_equal(out.finished_return[:d], np.zeros((d, n)))
    assert final.t.shape == (n,) and np.all(final.t < steps)


# --- JAX path ---------------------------------------------------------------------------------


def test_jax_vec_env_truncates_probe_pendulum_at_200():
    vec = make_vec_env(registry.make_jax_env("probe:pendulum"))
    n = 3

    @jax.jit
    def run(key):
        state = vec.reset(key, n)

        def body(s, k):
            s2, out = vec.step(k, s, jnp.full((n, 1), 0.3))
            return s2, (s.obs, out)

        return jax.lax.scan(body, state, jax.random.split(key, 200))

    final, (obs_before, out) = run(jax.random.key(0))
    done = np.asarray(out.done)
    assert not done[:199].any() and done[199].all()
    np.testing.assert_array_equal(out.truncated[199], np.ones(n))
    assert not np.asarray(out.terminated).any()
    np.testing.assert_allclose(out.finished_return[199], np.asarray(out.reward).sum(0), rtol=1e-5)
    np.testing.assert_array_equal(out.next_obs[:199], obs_before[1:])  # no reset before the limit
    assert not np.allclose(out.next_obs[199], final.obs)  # next_obs is the pre-reset obs
    np.testing.assert_array_equal(final.t, np.zeros(n))


def test_jax_vec_env_terminates_probe_cartpole():
    vec = make_vec_env(registry.make_jax_env("probe:cartpole"))
    step = jax.jit(vec.step)
    state = vec.reset(jax.random.key(0), 2)
    for t in range(1, 200):
        state, out = step(jax.random.key(t), state, jnp.ones(2, jnp.int32))
        if bool(out.done[0]):
            break
    assert float(out.terminated[0]) == 1.0 and float(out.truncated[0]) == 0.0
    terminal = np.asarray(out.next_obs[0])
    assert abs(terminal[0]) > CARTPOLE_X or abs(terminal[2]) > CARTPOLE_THETA
    assert np.all(np.abs(np.asarray(state.obs[0])) <= 0.05)
    assert float(out.finished_return[0]) == float(t)


# --- probes are ports of gymnasium's dynamics -------------------------------------------------


def test_probe_pendulum_matches_gymnasium_pendulum():
    probe = registry.make_jax_env("probe:pendulum")
    step = jax.jit(probe.step)
    state, obs = probe.reset(jax.random.key(3))
    ref = gym.make("Pendulum-v1").unwrapped
    ref.reset(seed=0)
    ref.state = np.asarray(state, np.float64)
    np.testing.assert_allclose(obs, ref._get_obs(), atol=1e-6)
    rng = np.random.default_rng(0)
    for _ in range(100):
        u = rng.uniform(-3, 3, (1,)).astype(np.float32)  # beyond the bounds: both clip to +-2
        state, obs, reward, terminated = step(state, jnp.asarray(u))
        r_obs, r_reward, r_term, _, _ = ref.step(u)
        np.testing.assert_allclose(obs, r_obs, atol=1e-5)
        assert float(reward) == pytest.approx(r_reward, abs=1e-5)
        assert not bool(terminated) and not r_term
        ref.state = np.asarray(state, np.float64)  # re-sync so float32 rounding cannot accumulate


def test_probe_cartpole_matches_gymnasium_cartpole():
    probe = registry.make_jax_env("probe:cartpole")
    step = jax.jit(probe.step)
    ref = gym.make("CartPole-v1").unwrapped
    rng = np.random.default_rng(0)
    steps = 0
    for episode in range(3):
        state, obs = probe.reset(jax.random.key(episode))
        ref.reset(seed=episode)
        ref.state = np.asarray(state, np.float64)
        for _ in range(500):
            a = int(rng.integers(0, 2))
            state, obs, reward, terminated = step(state, jnp.asarray(a, jnp.int32))
            r_obs, r_reward, r_term, _, _ = ref.step(a)
            steps += 1
            np.testing.assert_allclose(obs, r_obs, atol=1e-5)
            assert float(reward) == r_reward == 1.0
            assert bool(terminated) == r_term
            if r_term:
                break
            ref.state = np.asarray(state, np.float64)
    assert steps > 30  # several real transitions were compared, including terminations


# --- registry -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name, words", [
    ("foo:bar", ["gym", "brax", "probe"]),
    ("Pendulum-v1", ["gym:<id>"]),
    ("gym:NoSuchEnv-v0", list(registry.GYM_IDS)),
    ("brax:nosuch", list(registry.BRAX_NAMES)),
    ("brax:nosuch@spring", list(registry.BRAX_NAMES)),
    ("brax:halfcheetah@warp", ["generalized", "positional", "spring", "mjx"]),
    ("probe:nosuch", ["pendulum", "cartpole", "bandit", "chain"]),
])
def test_registry_errors_name_allowed_values(name, words):
    with pytest.raises(ValueError) as err:
        registry.env_spec(name)
    message = str(err.value)
    assert "\n" not in message and name in message
    for word in words:
        assert word in message


def test_brax_backend_defaults_and_the_at_suffix():
    from popjax.envs.brax import resolve_backend

    assert resolve_backend("halfcheetah") == "spring"
    assert resolve_backend("inverted_pendulum") == "generalized"  # spring's soft hinge cannot be balanced
    assert registry.parse("brax:halfcheetah@generalized") == ("brax", "halfcheetah@generalized")
    spec = registry.env_spec("brax:inverted_pendulum@spring")
    assert spec.name == "brax:inverted_pendulum@spring" and spec.obs_shape == (4,)


def test_registry_routes_paths():
    with pytest.raises(ValueError, match="make_host_env"):
        registry.make_jax_env("gym:Pendulum-v1")
    with pytest.raises(ValueError, match="make_jax_env"):
        registry.make_host_env("probe:pendulum", 1, 0)
    env = registry.make_host_env("gym:CartPole-v1", 2, 0)
    assert isinstance(env, HostVecEnv) and env.spec.num_actions == 2 and env.spec.name == "gym:CartPole-v1"
    env.close()
    assert not registry.is_jax_env("gym:HalfCheetah-v5") and registry.is_jax_env("probe:bandit")
    # other gymnasium-registered ids are allowed
    spec = registry.env_spec("gym:MountainCarContinuous-v0")
    assert (spec.obs_shape, spec.action_low, spec.max_episode_steps) == ((2,), (-1.0,), 999)
