"""On-policy learners (PPO, A2C): GAE and losses by hand, vmap == per-member loop, the behaviour state
(Liu et al. 2020, Eq. 6), the runners' ``ended``, config errors, PBT and exact resume, learning on CartPole."""

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from learner_helpers import (  # noqa: F401
    SPECS,
    assert_trees_close,
    assert_trees_equal,
    fast_compile,
    trees_differ,
    use_shared_xla_cache,
)
from test_resume import CHILD, ROOT, metric_rows

import popjax
from popjax import cli
from popjax.config import ConfigError, make_config
from popjax.envs import registry
from popjax.envs.base import make_vec_env
from popjax.envs.runner import HostRunner, JaxRunner
from popjax.learners import LEARNERS, onpolicy
from popjax.learners.base import adam_step
from popjax.population.hparams import hparams_table
from popjax.population.members import Members
from popjax.population.tree import stack
from popjax.types import Trajectory, Transition

GAMMA, LAM = 0.9, 0.5


# --- GAE by hand ---------------------------------------------------------------------------------
# Two envs, three steps (time-major [T=3, envs=2]):
#   env 0: t0 plain, t1 truncated (ended, not terminated: bootstraps from V(next_obs_1), cuts),
#          t2 plain and last of the rollout (bootstraps from V(next_obs_2));
#   env 1: t0 plain, t1 plain, t2 terminated (no bootstrap).
REWARD = [[1.0, 0.0], [2.0, 1.0], [3.0, -1.0]]
VALUE = [[0.5, 1.0], [1.0, 2.0], [1.5, 0.5]]
NEXT_VALUE = [[1.0, 2.0], [4.0, 0.5], [6.0, 3.0]]
TERMINATED = [[0.0, 0.0], [0.0, 0.0], [0.0, 1.0]]
ENDED = [[False, False], [True, False], [False, True]]
# By hand, gamma = 0.9, lambda = 0.5 (gamma * lambda = 0.45):
#   env 0: delta = (1 + 0.9*1 - 0.5, 2 + 0.9*4 - 1, 3 + 0.9*6 - 1.5) = (1.4, 4.6, 6.9)
#          A2 = 6.9; A1 = 4.6 (cut by the truncation); A0 = 1.4 + 0.45 * 4.6 = 3.47
#   env 1: delta = (0 + 0.9*2 - 1, 1 + 0.9*0.5 - 2, -1 - 0.5) = (0.8, -0.55, -1.5)
#          A2 = -1.5; A1 = -0.55 + 0.45 * -1.5 = -1.225; A0 = 0.8 + 0.45 * -1.225 = 0.24875
ADVANTAGE = [[3.47, 0.24875], [4.6, -1.225], [6.9, -1.5]]
RETURN = [[3.97, 1.24875], [5.6, 0.775], [8.4, -1.0]]  # A + V


def test_gae_by_hand_with_a_termination_a_truncation_and_the_rollout_end():
    f = lambda x: jnp.asarray(x, jnp.float32)
    advantage, ret = onpolicy.gae(f(REWARD), f(TERMINATED), jnp.asarray(ENDED), f(VALUE), f(NEXT_VALUE), GAMMA, LAM)
    np.testing.assert_allclose(advantage, ADVANTAGE, rtol=1e-6)
    np.testing.assert_allclose(ret, RETURN, rtol=1e-6)


class ObsNet:
    """A fixed "network" that reads its outputs from the observation: V = obs[0], logits = obs[1:3]."""

    @staticmethod
    def apply(params, obs):
        del params
        return obs[..., 1:3], obs[..., 0]


def hand_trajectory() -> Trajectory:
    logits = jnp.zeros((3, 2, 2))
    obs = jnp.concatenate([jnp.asarray(VALUE)[..., None], logits], axis=-1)
    next_obs = jnp.concatenate([jnp.asarray(NEXT_VALUE)[..., None], logits], axis=-1)
    transitions = Transition(obs=obs, action=jnp.array([[0, 1], [1, 1], [0, 0]], jnp.int32),
                             reward=jnp.asarray(REWARD), next_obs=next_obs, terminated=jnp.asarray(TERMINATED))
    return Trajectory(transitions, jnp.asarray(ENDED))


@pytest.mark.long
def test_behaviour_batch_is_the_flat_time_major_trajectory_with_its_gae():
    batch = onpolicy.behaviour_batch(ObsNet, None, hand_trajectory(), GAMMA, LAM)
    # flat index = t * envs + e
    np.testing.assert_allclose(batch.advantage, np.ravel(ADVANTAGE), rtol=1e-6)
    np.testing.assert_allclose(batch.ret, np.ravel(RETURN), rtol=1e-6)
    np.testing.assert_array_equal(batch.action, [0, 1, 1, 1, 0, 0])
    np.testing.assert_allclose(batch.old_log_prob, np.full(6, math.log(0.5)), rtol=1e-6)  # uniform over 2 actions


# --- losses by hand ------------------------------------------------------------------------------
class FixedNet:
    """params = {"logits": [n, 2], "value": [n]}, whatever the observation."""

    @staticmethod
    def apply(params, obs):
        del obs
        return params["logits"], params["value"]


# Three samples; the policy is pi = (0.25, 0.75) everywhere (logits 0 and log 3).
LOSS_PARAMS = {"logits": jnp.tile(jnp.array([0.0, math.log(3.0)]), (3, 1)), "value": jnp.array([1.0, 2.0, 3.0])}
LOSS_BATCH = onpolicy.Batch(obs=jnp.zeros((3, 1)), action=jnp.array([1, 0, 1], jnp.int32),
                            old_log_prob=jnp.log(jnp.array([0.5, 0.25, 1.0])),
                            advantage=jnp.array([2.0, -1.0, -3.0]), ret=jnp.array([2.0, 2.0, 1.0]))
ENTROPY = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))  # 0.5623351
VALUE_LOSS = 0.5 * (1.0 + 0.0 + 4.0) / 3  # 0.5 * mean((V - R)^2)


def test_ppo_clipped_loss_by_hand():
    loss, metrics = onpolicy.ppo_loss(LOSS_PARAMS, FixedNet, LOSS_BATCH, 0.2, 0.01, 0.5, False)
    # ratios (0.75/0.5, 0.25/0.25, 0.75/1) = (1.5, 1, 0.75); clip to [0.8, 1.2]:
    #   A = 2: min(1.5 * 2, 1.2 * 2) = 2.4;  A = -1: -1;  A = -3: min(0.75 * -3, 0.8 * -3) = -2.4
    pg = -(2.4 - 1.0 - 2.4) / 3
    np.testing.assert_allclose(metrics["pg_loss"], pg, rtol=1e-6)
    np.testing.assert_allclose(metrics["value_loss"], VALUE_LOSS, rtol=1e-6)
    np.testing.assert_allclose(metrics["entropy"], ENTROPY, rtol=1e-6)
    np.testing.assert_allclose(metrics["clip_fraction"], 2 / 3, rtol=1e-6)
    np.testing.assert_allclose(loss, pg + 0.5 * VALUE_LOSS - 0.01 * ENTROPY, rtol=1e-6)


def test_a2c_loss_by_hand():
    loss, metrics = onpolicy.a2c_loss(LOSS_PARAMS, FixedNet, LOSS_BATCH, 0.01, 0.5, False)
    pg = -(math.log(0.75) * 2.0 + math.log(0.25) * -1.0 + math.log(0.75) * -3.0) / 3
    np.testing.assert_allclose(metrics["pg_loss"], pg, rtol=1e-6)
    np.testing.assert_allclose(loss, pg + 0.5 * VALUE_LOSS - 0.01 * ENTROPY, rtol=1e-6)


def test_truncated_is_weights_by_hand():
    current, behaviour = jnp.log(jnp.array([0.5, 0.2])), jnp.log(jnp.array([0.25, 0.4]))  # ratios 2 and 0.5
    np.testing.assert_allclose(onpolicy.truncated_is_weights(current, behaviour, 1.0), [1.0, 0.5], rtol=1e-6)
    np.testing.assert_allclose(onpolicy.truncated_is_weights(current, behaviour, 3.0), [2.0, 0.5], rtol=1e-6)


def test_a2c_truncated_is_loss_by_hand():
    loss, metrics = onpolicy.a2c_truncated_is_loss(LOSS_PARAMS, FixedNet, LOSS_BATCH, 1.0, 0.01, 0.5, False)
    # pi(a) = (0.75, 0.25, 0.75), mu(a) = (0.5, 0.25, 1): ratios (1.5, 1, 0.75), truncated at 1: (1, 1, 0.75)
    pg = -(1.0 * math.log(0.75) * 2.0 + 1.0 * math.log(0.25) * -1.0 + 0.75 * math.log(0.75) * -3.0) / 3
    np.testing.assert_allclose(metrics["pg_loss"], pg, rtol=1e-6)
    np.testing.assert_allclose(metrics["is_weight"], 2.75 / 3, rtol=1e-6)
    np.testing.assert_allclose(loss, pg + 0.5 * VALUE_LOSS - 0.01 * ENTROPY, rtol=1e-6)


@pytest.mark.long
def test_truncated_is_scales_the_policy_gradient_by_the_truncation():
    """On-policy (mu = pi) every ratio is 1: is_clip >= 1 gives A2C's gradient, is_clip = 0.5 half of its
    policy-gradient part (no value or entropy term here)."""
    on_policy = LOSS_BATCH.replace(old_log_prob=jnp.log(jnp.array([0.75, 0.25, 0.75])))
    plain = jax.grad(lambda p: onpolicy.a2c_loss(p, FixedNet, on_policy, 0.0, 0.0, False)[0])(LOSS_PARAMS)
    for c_bar, scale in ((1.0, 1.0), (4.0, 1.0), (0.5, 0.5)):
        grads = jax.grad(lambda p, c=c_bar: onpolicy.a2c_truncated_is_loss(p, FixedNet, on_policy, c, 0.0, 0.0,
                                                                           False)[0])(LOSS_PARAMS)
        np.testing.assert_allclose(grads["logits"], scale * plain["logits"], rtol=1e-6, atol=1e-7)


@pytest.mark.long
def test_tanh_gaussian_log_prob_and_actions_in_range():
    mean, log_std = jnp.array([[0.0, 1.0]]), jnp.array([[0.0, math.log(2.0)]])
    u = np.array([0.5, -1.0])
    a = np.tanh(u)
    by_hand = sum(-0.5 * ((u_ - m) / s) ** 2 - math.log(s) - 0.5 * math.log(2 * math.pi) - math.log(1 - a_**2)
                  for u_, m, s, a_ in zip(u, (0.0, 1.0), (1.0, 2.0), a, strict=True))
    np.testing.assert_allclose(onpolicy.log_prob((mean, log_std), jnp.asarray(a)[None]), [by_hand], rtol=1e-5)
    np.testing.assert_allclose(onpolicy.entropy((mean, log_std)), [2 * 0.5 * math.log(2 * math.pi * math.e)
                                                                    + math.log(2.0)], rtol=1e-6)
    wide = (jnp.zeros((1000, 2)), jnp.full((1000, 2), 2.0))  # std e^2: most samples far outside [-1, 1] pre-squash
    actions = onpolicy.sample(jax.random.key(0), wide)
    assert float(jnp.abs(actions).max()) <= 1.0 and np.isfinite(np.asarray(onpolicy.log_prob(wide, actions))).all()
    np.testing.assert_array_equal(onpolicy.mode((mean, log_std)), jnp.tanh(mean))


# --- learners: vmap, behaviour, Eq. 6 ------------------------------------------------------------
def tiny(name, kind, **config):
    definition = LEARNERS[name]
    cfg = definition.config_cls(hidden=(8, 8), **config)
    return definition, definition.make(cfg, SPECS[kind]), SPECS[kind]


def random_trajectory(key, spec, t=4, envs=2) -> Trajectory:
    k = jax.random.split(key, 5)
    if spec.discrete:
        action = jax.random.randint(k[0], (t, envs), 0, spec.num_actions, jnp.int32)
    else:
        action = jnp.tanh(jax.random.normal(k[0], (t, envs, spec.action_dim)))
    ended = jax.random.uniform(k[1], (t, envs)) < 0.3
    terminated = (ended & (jax.random.uniform(k[2], (t, envs)) < 0.5)).astype(jnp.float32)
    return Trajectory(Transition(obs=jax.random.normal(k[3], (t, envs) + spec.obs_shape), action=action,
                                 reward=jax.random.normal(k[4], (t, envs)),
                                 next_obs=jax.random.normal(k[3], (t, envs) + spec.obs_shape) + 0.1,
                                 terminated=terminated), ended)


MEMBER_HPARAMS = {"ppo": [dict(), dict(lr=1e-3, clip=0.1, discount=0.9), dict(gae_lambda=0.8, ent_coef=0.0)],
                  "a2c": [dict(), dict(lr=1e-3, discount=0.9), dict(gae_lambda=0.8, ent_coef=0.0, max_grad_norm=0.1)]}


@pytest.mark.long
@pytest.mark.parametrize(("name", "kind"), [("ppo", "discrete"), ("ppo", "continuous"), ("a2c", "discrete"),
                                            ("a2c", "continuous")])
def test_vmap_equals_the_per_member_loop(name, kind):
    config = {"minibatches": 2, "epochs": 2} if name == "ppo" else {}
    definition, learner, spec = tiny(name, kind, **config)
    hparams = [definition.default_hparams(None).replace(**{k: jnp.float32(v) for k, v in h.items()})
               for h in MEMBER_HPARAMS[name]]
    states = [learner.init(jax.random.key(i), hp) for i, hp in enumerate(hparams)]
    trajectories = [random_trajectory(jax.random.key(10 + i), spec) for i in range(3)]
    keys = jax.random.split(jax.random.key(7), 3)
    pop_state, pop_metrics = jax.jit(jax.vmap(learner.step.update))(
        keys, stack(states), stack(trajectories), stack(hparams), stack(states))
    one = jax.jit(learner.step.update)
    outs = [one(keys[i], states[i], trajectories[i], hparams[i], states[i]) for i in range(3)]
    assert_trees_close(pop_state, stack([s for s, _ in outs]), atol=1e-6, rtol=1e-6)
    assert_trees_close(pop_metrics, stack([m for _, m in outs]), atol=1e-6, rtol=1e-6)
    assert int(pop_state.steps[0]) == learner.step.updates == (4 if name == "ppo" else 1)
    acts, extras = jax.vmap(learner.act, in_axes=(0, 0, None, 0))(keys, pop_state, jnp.zeros((5,) + spec.obs_shape),
                                                                  stack(hparams))
    assert extras is None
    assert acts.shape == (3, 5) + spec.action_shape
    if not spec.discrete:
        assert float(jnp.abs(acts).max()) <= 1.0


INIT_CHILD = """
import jax
from popjax.config import make_config
from popjax.experiment import build
loop = build(make_config(learner="ppo", env="gym:HalfCheetah-v5", pop_size=8, total_env_steps=4096,
                         rollout_len=2048, eval_interval=2048, progress=False))
jax.block_until_ready(loop.initial_state()[0])
print("initialised")
"""


@pytest.mark.long
def test_a_population_of_orthogonally_initialised_members_initialises_without_deadlock():
    """Regression: a vmapped init of 8 PPO members (17-d obs, 6-d actions) deadlocked in jaxlib's batched QR on
    a 2-thread CPU pool, every time; members are now initialised one after the other. A fresh process, so a
    hang fails this test after its timeout instead of stalling the suite."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    try:
        out = subprocess.run([sys.executable, "-c", INIT_CHILD], env=env, capture_output=True, text=True,
                             timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("initialising a PPO population of 8 on HalfCheetah-v5 hung")
    assert out.returncode == 0 and "initialised" in out.stdout, out.stderr[-2000:]


def test_init_members_equals_each_member_initialised_alone():
    from types import SimpleNamespace

    from popjax.drivers.independent import init_members

    definition, learner, _ = tiny("ppo", "continuous")
    hparams = stack([definition.default_hparams(None).replace(lr=jnp.float32(lr)) for lr in (1e-3, 2e-3, 3e-3)])
    ctx = SimpleNamespace(members=Members(3), hparams=hparams, learner=learner)
    states, taken = jax.jit(lambda k: init_members(ctx, k))(jax.random.key(3))
    keys = ctx.members.keys(jax.random.key(3))
    for m in range(3):
        one = jax.tree.map(lambda x, m=m: x[m], hparams)
        assert_trees_equal(jax.tree.map(lambda x, m=m: x[m], states), jax.jit(learner.init)(keys[m], one))
    assert_trees_equal(taken, hparams)


def a2c_plain(net, state, trajectory, hp, at_params):
    """A2C by hand: the gradient of the loss at ``at_params``, clipped, one Adam step from ``state``."""
    batch = onpolicy.behaviour_batch(net, at_params, trajectory, hp.discount, hp.gae_lambda)
    grads = jax.grad(lambda p: onpolicy.a2c_loss(p, net, batch, hp.ent_coef, hp.vf_coef, False)[0])(at_params)
    norm = jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree.leaves(grads)))
    grads = jax.tree.map(lambda g: g * jnp.minimum(1.0, hp.max_grad_norm / (norm + 1e-6)), grads)
    return adam_step(state.params, grads, state.opt, hp.lr)[0]


@pytest.mark.long
@pytest.mark.parametrize("kind", ["discrete", "continuous"])
def test_a2c_eq6_gradient_at_the_behaviour_params_applied_to_the_current_ones(kind):
    definition, learner, spec = tiny("a2c", kind)
    net = onpolicy.network((8, 8), spec)
    hp = definition.default_hparams(None).replace(max_grad_norm=jnp.float32(100.0))
    state = learner.init(jax.random.key(0), hp)
    behaviour = learner.init(jax.random.key(1), hp)  # another policy (the previous one under a lag)
    trajectory = random_trajectory(jax.random.key(2), spec)
    update = jax.jit(learner.step.update)

    same, _ = update(jax.random.key(3), state, trajectory, hp, state)
    copy = jax.tree.map(jnp.array, state)  # equal values, another object
    assert_trees_equal(update(jax.random.key(3), state, trajectory, hp, copy)[0], same)
    assert_trees_close(same.params, a2c_plain(net, state, trajectory, hp, state.params), atol=1e-6, rtol=1e-5)

    lagged, _ = update(jax.random.key(3), state, trajectory, hp, behaviour)
    assert_trees_close(lagged.params, a2c_plain(net, state, trajectory, hp, behaviour.params), atol=1e-6, rtol=1e-5)
    assert trees_differ(lagged.params, same.params)


@pytest.mark.parametrize("kind", ["discrete", "continuous"])
def test_a2c_truncated_is_takes_the_gradient_at_the_current_params(kind):
    definition, learner, spec = tiny("a2c", kind, lag_correction="truncated_is")
    _, eq6, _ = tiny("a2c", kind)
    hp = definition.default_hparams(None).replace(max_grad_norm=jnp.float32(100.0))
    state = learner.init(jax.random.key(0), hp)
    behaviour = learner.init(jax.random.key(1), hp)
    trajectory = random_trajectory(jax.random.key(2), spec)
    update = jax.jit(learner.step.update)
    same, metrics = update(jax.random.key(3), state, trajectory, hp, state)  # on-policy: plain A2C
    assert_trees_close(same.params, jax.jit(eq6.step.update)(jax.random.key(3), state, trajectory, hp, state)[0].params,
                       atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(metrics["is_weight"], 1.0, rtol=1e-6)
    lagged, metrics = update(jax.random.key(3), state, trajectory, hp, behaviour)
    net = onpolicy.network((8, 8), spec)
    batch = onpolicy.behaviour_batch(net, behaviour.params, trajectory, hp.discount, hp.gae_lambda)
    grads = jax.grad(lambda p: onpolicy.a2c_truncated_is_loss(p, net, batch, 1.0, hp.ent_coef, hp.vf_coef,
                                                              False)[0])(state.params)
    assert_trees_close(lagged.params, adam_step(state.params, grads, state.opt, hp.lr)[0], atol=1e-6, rtol=1e-5)
    assert float(metrics["is_weight"]) < 1.0  # another policy collected the data: weights truncated below 1


@pytest.mark.long
def test_ppo_takes_old_log_probs_and_advantages_from_the_behaviour_state():
    definition, learner, spec = tiny("ppo", "discrete", epochs=1, minibatches=1, normalize_advantages=False)
    net = onpolicy.network((8, 8), spec)
    hp = definition.default_hparams(None).replace(max_grad_norm=jnp.float32(100.0), lr=jnp.float32(1e-2))
    state = learner.init(jax.random.key(0), hp)
    behaviour = learner.init(jax.random.key(1), hp)
    trajectory = random_trajectory(jax.random.key(2), spec)
    update = jax.jit(learner.step.update)

    def by_hand(behaviour_params):  # one epoch of one minibatch: one step from the current params
        batch = onpolicy.behaviour_batch(net, behaviour_params, trajectory, hp.discount, hp.gae_lambda)
        grads = jax.grad(lambda p: onpolicy.ppo_loss(p, net, batch, hp.clip, hp.ent_coef, hp.vf_coef, False)[0])(
            state.params)
        return adam_step(state.params, grads, state.opt, hp.lr)[0]

    same, metrics = update(jax.random.key(3), state, trajectory, hp, state)
    np.testing.assert_allclose(metrics["approx_kl"], 0.0, atol=1e-7)  # ratio 1 when behaviour == current
    assert_trees_close(same.params, by_hand(state.params), atol=1e-6, rtol=1e-4)
    lagged, metrics = update(jax.random.key(3), state, trajectory, hp, behaviour)
    assert float(metrics["approx_kl"]) > 1e-6
    assert_trees_close(lagged.params, by_hand(behaviour.params), atol=1e-6, rtol=1e-4)
    assert trees_differ(lagged.params, same.params)


# --- runners: ended ------------------------------------------------------------------------------
def test_runners_report_ended_on_truncation_and_termination():
    runner = JaxRunner(make_vec_env(registry.make_jax_env("probe:pendulum")), Members(1), 2)
    act = lambda key, t, actor, obs: (jnp.zeros(obs.shape[:2] + (1,)), None)
    _, exp = jax.jit(lambda k: runner.rollout(k, act, None, runner.reset(k), 250))(jax.random.key(0))
    ended = np.asarray(exp.ended).reshape(250, 2)  # [members, T * envs] -> time-major
    assert ended.dtype == bool and np.array_equal(np.flatnonzero(ended[:, 0]), [199])  # 200-step time limit
    assert np.array_equal(ended[:, 0], ended[:, 1]) and not np.asarray(exp.transitions.terminated).any()
    runner = JaxRunner(make_vec_env(registry.make_jax_env("probe:cartpole")), Members(1), 1)
    act = lambda key, t, actor, obs: (jnp.ones(obs.shape[:2], jnp.int32), None)  # always push right: falls quickly
    _, exp = jax.jit(lambda k: runner.rollout(k, act, None, runner.reset(k), 100))(jax.random.key(0))
    np.testing.assert_array_equal(exp.ended, exp.transitions.terminated > 0)
    assert int(exp.finished_episodes[0]) == int(exp.ended.sum()) >= 3
    pytest.importorskip("gymnasium")
    host = HostRunner(lambda n, seed, first: registry.make_host_env("gym:CartPole-v1", n, seed, first), 1, 2, 0)
    host.reset(None)
    _, exp = host.rollout(None, lambda key, t, actor, obs: (np.ones(obs.shape[:2], np.int32), None), None, None, 60)
    host.close()
    assert exp.ended.shape == (1, 120) and exp.ended.dtype == bool
    np.testing.assert_array_equal(exp.ended, exp.transitions.terminated > 0)
    assert int(exp.finished_episodes[0]) == int(exp.ended.sum()) >= 2


# --- configuration errors ------------------------------------------------------------------------
@pytest.mark.parametrize(("options", "message"), [
    (dict(driver="cemrl"), "driver: the cemrl driver trains from a replay buffer, not the on-policy learner ppo "
                           "(allowed: independent, pbt"),
    (dict(driver="dvd"), "driver: the dvd driver trains from a replay buffer"),
    (dict(buffer="prioritized"),
     "buffer: the on-policy learner ppo keeps no replay buffer (allowed: uniform, the default)"),
    (dict(env="gym:CartPole-v1", overlap=True), "overlap: acting one update behind would hand the on-policy"),
    (dict(hparams={"clip": 0.0}), "hparams.clip: must lie in (0, 10], got 0.0"),
    (dict(hparams={"gae_lambda": 1.5}), "hparams.gae_lambda: must lie in [0, 1]"),
    (dict(learner_config={"epochs": 0}), "learner_config.epochs: must lie in [1, 1000]"),
])
def test_bad_on_policy_configs_are_one_line_errors(options, message):
    with pytest.raises(ConfigError) as err:
        make_config(**{"learner": "ppo", "env": "probe:cartpole", **options})
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_minibatches_that_do_not_divide_the_rollout_are_refused_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"learner_config.minibatches: 3 does not divide the 50 transitions"):
        popjax.train(learner="ppo", env="probe:cartpole", rollout_len=50, learner_config={"minibatches": 3},
                     out_dir=out, progress=False)
    assert not out.exists()
    code = cli.main(["train", "--learner", "a2c", "--env", "probe:cartpole", "--driver", "dvd", "--out", str(out),
                     "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("popjax: error: driver: the dvd driver") and "\n" not in err
    assert not out.exists()


# --- PBT and exact resume ------------------------------------------------------------------------
PBT_RUN = dict(learner="ppo", env="probe:cartpole", driver="pbt", pop_size=4, seed=1, total_env_steps=1024,
               rollout_len=32, envs_per_member=2, eval_interval=128, eval_episodes=1,
               learner_config={"hidden": [16, 16], "minibatches": 2, "epochs": 2},
               pbt={"interval": 256, "quantile": 0.25}, progress=False)


@pytest.mark.long
def test_pbt_with_ppo_exploits_without_recompiling():
    from popjax.experiment import build

    loop = build(make_config(**{**PBT_RUN, "pbt": {"interval": 64, "quantile": 0.25}}))
    state, env_state = loop.initial_state()
    assert state.buffer is None
    for _ in range(3):
        state, env_state, _ = loop.step(state, env_state)
        state = loop.unpacked(state)  # the JAX path keeps the state packed between iterations
        before = hparams_table(state.hparams)
        state, info = loop.after_eval(state, np.arange(4.0))
        assert info["ready"] and hparams_table(state.hparams) != before
    state, env_state, _ = loop.step(state, env_state)
    state = loop.unpacked(state)
    assert loop.compiler.traces["iteration"] == 1 and loop.compiler.traces["after_eval"] == 1
    assert int(state.counters.updates) == 4 * 2 * 2 and int(state.counters.env_steps) == 4 * 64


@pytest.mark.processes
@pytest.mark.filterwarnings("ignore:.*taking over the lock")
def test_pbt_ppo_run_killed_mid_training_resumes_bit_identically(tmp_path):
    """SIGKILL a PPO + PBT run past its first exploit, resume it: it equals the uninterrupted run."""
    jax.config.update("jax_disable_most_optimizations", False)  # as in the child process
    full = popjax.train(out_dir=tmp_path / "full", **PBT_RUN)
    assert full.summary["updates"] == 1024 // 64 * 4 and len(full.summary["lineage"]) >= 1
    assert (full.out_dir / "plots" / "pbt_hparams.png").exists()

    out, script = tmp_path / "killed", tmp_path / "child.py"
    script.write_text(CHILD.replace("time.sleep(0.05)", "time.sleep(0.3)"))  # slower: a short run
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with (tmp_path / "child.log").open("w") as log:
        options = json.dumps({**PBT_RUN, "checkpoint_interval": 64})  # a checkpoint every iteration
        child = subprocess.Popen([sys.executable, str(script), str(out), options, use_shared_xla_cache()], env=env,
                                 stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and child.poll() is None:
            steps = [int(p.name) for p in (out / "checkpoints").glob("*") if p.name.isdigit()]
            if steps and max(steps) >= 9:  # past the exploit at 512 env steps (iteration 8)
                break
            time.sleep(0.02)
        assert child.poll() is None, (tmp_path / "child.log").read_text()[-2000:]
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait() == -signal.SIGKILL
    assert not (out / "summary.json").exists()

    run = popjax.experiment.resume(out)
    for field in ("final_returns", "best_return", "env_steps", "updates", "hparams", "lineage"):
        assert run.summary[field] == full.summary[field], field
    assert_trees_equal(run.state, full.state)
    assert metric_rows(out) == metric_rows(full.out_dir)


# --- learning ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "options", "threshold"), [
    # PPO: 4 envs x 128 steps per update, 4 epochs x 4 minibatches (CleanRL's CartPole setting)
    ("ppo", dict(rollout_len=128, envs_per_member=4, total_env_steps=40_000), 300.0),
    # A2C: 8 envs x 8 steps per update
    ("a2c", dict(rollout_len=8, envs_per_member=8, total_env_steps=40_000), 150.0),
])
@pytest.mark.long
def test_learns_cartpole(name, options, threshold, tmp_path):
    """Random play scores about 22; both members' final mean return (5 episodes each) must pass the threshold."""
    jax.config.update("jax_disable_most_optimizations", False)  # a real run: optimized programs
    run = popjax.train(learner=name, env="probe:cartpole", pop_size=2, seed=0, eval_interval=10_000,
                       eval_episodes=5, out_dir=tmp_path / name, progress=False, **options)
    assert np.mean(run.summary["final_returns"]) >= threshold, run.summary["final_returns"]


@pytest.mark.long
def test_gym_cartpole_and_a_continuous_env_run_end_to_end(tmp_path):
    pytest.importorskip("gymnasium")
    run = popjax.train(learner="ppo", env="gym:CartPole-v1", pop_size=2, total_env_steps=256, rollout_len=32,
                       envs_per_member=2, eval_interval=128, eval_episodes=1, out_dir=tmp_path / "gym",
                       progress=False)
    # the rl-zoo preset fills what was not given: 20 epochs of one minibatch, lr 1e-3, ...
    assert run.summary["env_steps"] == 256 and run.summary["updates"] == 4 * 20
    assert run.summary["hparams"]["lr"] == [1e-3, 1e-3]
    run = popjax.train(learner="a2c", env="probe:pendulum", pop_size=2, total_env_steps=200, rollout_len=5,
                       envs_per_member=2, eval_interval=100, eval_episodes=1, out_dir=tmp_path / "pendulum",
                       progress=False)
    assert run.summary["updates"] == 20 and np.isfinite(run.summary["final_returns"]).all()
    assert dataclasses.is_dataclass(run.state) and run.state.buffer is None
