"""SPO local-SGD replicas (tests L1a-L5): the averaging core on a toy loss, SPO-DQN and
SPO-TD3 against hand-written per-replica loops, the dp baseline, populations, bad inputs, a short run."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from learner_helpers import (
    SPECS,
    assert_trees_close,
    assert_trees_equal,
    fast_compile,  # noqa: F401  (autouse fixture)
    random_batch,
    train_cut_and_resume,
    trees_differ,
    with_values,
)

import popjax
from popjax.config import ConfigError, make_config
from popjax.learners import LEARNERS, dqn, spo, td3
from popjax.learners.base import adam_step, chunk_update, one_update
from popjax.networks.mlp import DeterministicActor, QNetwork, TwinCritic
from popjax.population.tree import member, stack

HIDDEN = (8,)
B = 8


def batches_of(spec, n: int, seed: int = 0, batch_size: int = B):
    return stack([random_batch(jax.random.key(seed + i), spec, batch_size) for i in range(n)])


def step_keys(n: int, seed: int = 7):
    return jax.random.split(jax.random.key(seed), n)


def sub(tree, r: int, replicas: int):
    """Replica r's slice of a ``[B, ...]`` batch."""
    b = jax.tree.leaves(tree)[0].shape[0] // replicas
    return jax.tree.map(lambda x: x[r * b:(r + 1) * b], tree)


def mean_over(trees):
    return jax.tree.map(lambda *xs: sum(xs) / len(xs), *trees)


# --- L1: the averaging core on a toy regression with an injected optax optimizer -------------------------
def toy_loss(params, batch):
    x, y = batch
    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((hidden @ params["w2"] - y) ** 2)


def toy_setup(steps: int = 5):
    k1, k2, kx, ky = jax.random.split(jax.random.key(3), 4)
    params = {"w1": jax.random.normal(k1, (3, 4)), "b1": jnp.zeros(4), "w2": jax.random.normal(k2, (4, 1))}
    data = (jax.random.normal(kx, (steps, 1, B, 3)), jax.random.normal(ky, (steps, 1, B, 1)))
    return params, data


def run_replicas(opt: optax.GradientTransformation, replicas: int, opt_state: str, steps: int = 5):
    """R replicas, H = 1, averaging every step via ``spo.local_steps`` + ``spo.sync``; returns the replica states."""
    params, data = toy_setup(steps)
    config = SimpleNamespace(mode="local_sgd", opt_state=opt_state)

    def step(carry, key, batch):
        del key
        p, s = carry
        updates, s = opt.update(jax.grad(toy_loss)(p, batch), s, p)
        return (optax.apply_updates(p, updates), s), {}

    carry = spo.replicate((params, opt.init(params)), replicas)
    run = jax.jit(lambda c, batch: spo.sync(*spo.local_steps(step, c, step_keys(1), batch, replicas)[0], config))
    for t in range(steps):
        carry = run(carry, member(data, t))
    return carry


def run_large_batch(opt: optax.GradientTransformation, steps: int = 5):
    params, data = toy_setup(steps)
    state = opt.init(params)
    for t in range(steps):
        batch = member(member(data, t), 0)
        updates, state = opt.update(jax.grad(toy_loss)(params, batch), state, params)
        params = optax.apply_updates(params, updates)
    return params, state


@pytest.mark.long
@pytest.mark.parametrize("replicas", [2, 4])
def test_l1a_local_sgd_with_h1_is_large_batch_sgd(replicas):
    opt = optax.sgd(0.1)
    params, _ = run_replicas(opt, replicas, "average")
    expected, _ = run_large_batch(opt)
    for r in range(replicas):
        assert_trees_close(member(params, r), expected, atol=1e-6, rtol=0)


@pytest.mark.long
def test_l1b_momentum_buffers_averaged_equal_large_batch_momentum_sgd():
    opt = optax.sgd(0.1, momentum=0.9)
    expected = run_large_batch(opt)
    averaged = run_replicas(opt, 2, "average")
    assert_trees_close(member(averaged, 0), expected, atol=1e-6, rtol=0)
    # opt_state=local: each replica's momentum follows its own sub-batch gradients, so the optimizer state is not
    # the large-batch one. (Heavy-ball momentum is linear, so at H = 1 the MEAN of local momenta, hence the
    # averaged params, still match; a nonlinear optimizer such as Adam separates the params too.)
    params, local_momentum = run_replicas(opt, 2, "local")
    assert trees_differ(member(local_momentum, 0), expected[1])
    assert trees_differ(member(local_momentum, 0), member(local_momentum, 1))
    assert_trees_close(member(params, 0), expected[0], atol=1e-6, rtol=0)
    reset_params, _ = run_replicas(opt, 2, "reset")
    assert not np.allclose(reset_params["w1"][0], expected[0]["w1"], atol=1e-4)
    adam = optax.adam(0.05)
    adam_local, _ = run_replicas(adam, 2, "local")
    assert not np.allclose(adam_local["w1"][0], run_large_batch(adam)[0]["w1"], atol=1e-4)


# --- SPO-DQN -----------------------------------------------------------------------------------------
def make(name: str, **config):
    definition = LEARNERS[name]
    config = definition.config_cls(**{"hidden": HIDDEN, "batch_size": B, **config})
    spec = SPECS[definition.action_kind]
    learner = definition.make(config, spec)
    return SimpleNamespace(definition=definition, config=config, spec=spec, learner=learner,
                           chunk=jax.jit(chunk_update(learner)), hparams=definition.default_hparams(config))


def rounds(c, state, hp, n: int, seed: int = 0):
    """``n`` rounds with fresh batches and keys; returns the states after each round."""
    out = []
    for i in range(n):
        h = c.config.local_steps
        state, _ = c.chunk(step_keys(h, 100 + i), state, batches_of(c.spec, h, seed + 10 * i), hp)
        out.append(state)
    return out


@pytest.mark.long
def test_l2_targets_frozen_inside_rounds_and_copied_from_averaged_params():
    for name in ("spo_dqn", "spo_td3"):
        c = make(name, replicas=2, local_steps=3, target_rounds=2)
        state = c.learner.init(jax.random.key(0), c.hparams)
        first, second, third = rounds(c, state, c.hparams, 3)
        online, target = ("params", "target_params") if name == "spo_dqn" else ("critic", "target_critic")
        assert_trees_equal(getattr(first, target), getattr(state, target))  # round 1: no copy
        assert trees_differ(getattr(first, online), spo.replicate(getattr(state, target), 2))
        # round 2 is a copy round: targets = the averaged online params, bitwise; replicas agree
        assert_trees_equal(getattr(second, target), member(getattr(second, online), 0))
        assert_trees_equal(member(getattr(second, online), 0), member(getattr(second, online), 1))
        assert_trees_equal(getattr(third, target), getattr(second, target))
        if name == "spo_td3":
            assert_trees_equal(first.target_actor, state.target_actor)
            assert_trees_equal(second.target_actor, member(second.actor, 0))


def dqn_round_by_hand(c, state, keys, batches, hp, local_selector: bool):
    """One SPO-DQN round written as plain loops over replicas and steps."""
    del keys
    q_net = QNetwork(HIDDEN, c.spec.num_actions)
    r_count, h_count = c.config.replicas, c.config.local_steps
    averaged = member(state.params, 0)
    finals = []
    for r in range(r_count):
        params, opt = member(state.params, r), member(state.opt, r)
        for h in range(h_count):
            batch = sub(member(batches, h), r, r_count)
            selector = params if local_selector else averaged
            y = dqn.td_target(q_net, selector, state.target_params, batch, hp.discount, True)
            grads = jax.grad(dqn.q_loss, has_aux=True)(params, q_net, batch, y, True)[0]
            params, opt = adam_step(params, grads, opt, hp.lr)
        finals.append((params, opt))
    return mean_over(finals)


@pytest.mark.long
def test_l4_spo_dqn_selects_target_actions_with_the_last_averaged_network():
    c = make("spo_dqn", replicas=2, local_steps=4, target_rounds=100)
    hp = with_values(c.hparams, lr=0.05)
    state = c.learner.init(jax.random.key(0), hp)
    state = rounds(c, state, hp, 1, seed=50)[0]  # online != target from here on
    keys, batches = step_keys(4), batches_of(c.spec, 4, seed=1)
    new, _ = c.chunk(keys, state, batches, hp)
    params, opt = dqn_round_by_hand(c, state, keys, batches, hp, local_selector=False)
    assert_trees_close(member(new.params, 0), params, atol=1e-5)
    assert_trees_close(member(new.opt, 0), opt, atol=1e-5)
    local, _ = dqn_round_by_hand(c, state, keys, batches, hp, local_selector=True)
    assert not np.allclose(jax.tree.leaves(local)[0], jax.tree.leaves(params)[0], atol=1e-4)  # the test can tell


@pytest.mark.parametrize("local_steps,double_q", [(1, True), (3, False), (4, False)])
def test_l5_one_replica_equals_plain_dqn_when_targets_are_copied_at_the_same_steps(local_steps, double_q):
    # R = 1: the only difference left would be double Q's selector (the round's start vs the current params), equal
    # at H = 1; without double Q, any H.
    c = make("spo_dqn", replicas=1, local_steps=local_steps, target_rounds=2, double_q=double_q)
    plain = dqn.make_dqn(dqn.DQNConfig(hidden=HIDDEN, batch_size=B, double_q=double_q,
                                       target_update_period=2 * local_steps), c.spec)
    hp = with_values(c.hparams, lr=0.01)
    state = c.learner.init(jax.random.key(0), hp)
    ref = plain.init(jax.random.key(0), hp)
    update = jax.jit(one_update(plain))
    for i in range(5):
        keys, batches = step_keys(local_steps, i), batches_of(c.spec, local_steps, 10 * i)
        state, metrics = c.chunk(keys, state, batches, hp)
        losses = []
        for h in range(local_steps):
            ref, m = update(keys[h], ref, member(batches, h), hp)
            losses.append(m["loss"])
        assert_trees_close(member(state.params, 0), ref.params, atol=1e-6)
        assert_trees_close(state.target_params, ref.target_params, atol=1e-6)
        assert_trees_close(member(state.opt, 0), ref.opt, atol=1e-6)
        assert int(state.steps) == int(ref.steps)
        np.testing.assert_allclose(metrics["loss"], np.mean(losses), rtol=1e-5)


def test_dp_mode_is_large_batch_dqn():
    dp = make("spo_dqn", replicas=2, local_steps=3, target_rounds=2, mode="dp")
    plain = dqn.make_dqn(dqn.DQNConfig(hidden=HIDDEN, batch_size=B, target_update_period=6), dp.spec)
    hp = with_values(dp.hparams, lr=0.01)
    state, ref = dp.learner.init(jax.random.key(0), hp), plain.init(jax.random.key(0), hp)
    update = jax.jit(one_update(plain))
    for i in range(4):
        keys, batches = step_keys(3, i), batches_of(dp.spec, 3, 10 * i)
        state, _ = dp.chunk(keys, state, batches, hp)
        for h in range(3):
            ref, _ = update(keys[h], ref, member(batches, h), hp)
    for r in range(2):
        assert_trees_close(member(state.params, r), ref.params, atol=1e-6)
    assert_trees_close(state.target_params, ref.target_params, atol=1e-6)


# --- SPO-TD3 -----------------------------------------------------------------------------------------
def td3_round_by_hand(c, state, keys, batches, hp, critic_for_actor=None):
    """One two-phase SPO-TD3 round as plain loops; ``critic_for_actor`` overrides the averaged critic."""
    actor_net, critic_net = DeterministicActor(HIDDEN, c.spec.action_dim), TwinCritic(HIDDEN)
    r_count, h_count = c.config.replicas, c.config.local_steps
    critics = []
    for r in range(r_count):
        critic, opt = member(state.critic, r), member(state.critic_opt, r)
        for h in range(h_count):
            batch = sub(member(batches, h), r, r_count)
            key = jax.random.split(keys[h], r_count)[r]
            y = td3.target_q(key, actor_net, critic_net, state.target_actor, state.target_critic, batch, hp)
            grads = jax.grad(td3.critic_loss_fn, has_aux=True)(critic, critic_net, batch, y)[0]
            critic, opt = adam_step(critic, grads, opt, hp.critic_lr)
        critics.append((critic, opt))
    critic, critic_opt = mean_over(critics)
    reader = critic if critic_for_actor is None else critic_for_actor
    actors = []
    for r in range(r_count):
        actor, opt = member(state.actor, r), member(state.actor_opt, r)
        for h in range(h_count):
            batch = sub(member(batches, h), r, r_count)
            grads = jax.grad(td3.dpg_loss, argnums=2)(actor_net, critic_net, actor, reader, batch.obs)
            actor, opt = adam_step(actor, grads, opt, hp.actor_lr)
        actors.append((actor, opt))
    actor, actor_opt = mean_over(actors)
    return critic, critic_opt, actor, actor_opt


@pytest.mark.long
def test_l3_spo_td3_actor_phase_reuses_the_round_batches_against_the_averaged_critic():
    c = make("spo_td3", replicas=2, local_steps=3, target_rounds=100)
    hp = with_values(c.hparams, actor_lr=0.01, critic_lr=0.01)
    state = c.learner.init(jax.random.key(0), hp)
    keys, batches = step_keys(3), batches_of(c.spec, 3, seed=1)
    new, _ = c.chunk(keys, state, batches, hp)
    critic, critic_opt, actor, actor_opt = td3_round_by_hand(c, state, keys, batches, hp)
    for got, want in ((new.critic, critic), (new.critic_opt, critic_opt), (new.actor, actor),
                      (new.actor_opt, actor_opt)):
        assert_trees_close(member(got, 0), want, atol=1e-5)
        assert_trees_close(member(got, 1), want, atol=1e-5)
    # against the critic from before the round, or against other batches, the actor would differ
    _, _, stale, _ = td3_round_by_hand(c, state, keys, batches, hp, critic_for_actor=member(state.critic, 0))
    assert trees_differ(stale, actor)
    naive = make("spo_td3", replicas=2, local_steps=3, target_rounds=100, naive=True)
    naive_state, _ = naive.chunk(keys, state, batches, hp)
    assert_trees_close(naive_state.critic, new.critic, atol=1e-6)  # same critic phase
    assert trees_differ(naive_state.actor, new.actor)


def test_l5_one_replica_spo_td3_at_h1_equals_td3_with_hard_copies_and_no_delay():
    c = make("spo_td3", replicas=1, local_steps=1, target_rounds=1)
    plain = td3.make_td3(td3.TD3Config(hidden=HIDDEN, batch_size=B), c.spec)
    # target noise 0: replica keys are split from the step key, the plain learner uses the step key itself
    hp = with_values(c.hparams, target_noise=0.0, actor_lr=0.01, critic_lr=0.01)
    plain_hp = with_values(td3.default_hparams(), tau=1.0, policy_delay=1, target_noise=0.0, actor_lr=0.01,
                           critic_lr=0.01)
    state, ref = c.learner.init(jax.random.key(0), hp), plain.init(jax.random.key(0), plain_hp)
    update = jax.jit(one_update(plain))
    for i in range(4):
        keys, batches = step_keys(1, i), batches_of(c.spec, 1, 10 * i)
        state, _ = c.chunk(keys, state, batches, hp)
        ref, _ = update(keys[0], ref, member(batches, 0), plain_hp)
    for field in ("actor", "critic", "actor_opt", "critic_opt"):
        assert_trees_close(member(getattr(state, field), 0), getattr(ref, field), atol=1e-6)
    assert_trees_close((state.target_actor, state.target_critic), (ref.target_actor, ref.target_critic), atol=1e-6)


def test_dp_mode_spo_td3_equals_one_replica_on_the_whole_batch():
    hp_values = dict(target_noise=0.0, actor_lr=0.01, critic_lr=0.01)
    dp = make("spo_td3", replicas=2, local_steps=3, target_rounds=2, mode="dp")
    one = make("spo_td3", replicas=1, local_steps=3, target_rounds=2)
    hp = with_values(dp.hparams, **hp_values)
    a, b = dp.learner.init(jax.random.key(0), hp), one.learner.init(jax.random.key(0), hp)
    for i in range(3):
        keys, batches = step_keys(3, i), batches_of(dp.spec, 3, 10 * i)
        a, _ = dp.chunk(keys, a, batches, hp)
        b, _ = one.chunk(keys, b, batches, hp)
    for field in ("actor", "critic", "actor_opt", "critic_opt"):
        assert_trees_close(member(getattr(a, field), 1), member(getattr(b, field), 0), atol=1e-5)
    assert_trees_close(a.target_critic, b.target_critic, atol=1e-5)


# --- populations ------------------------------------------------------------------------------------
MEMBERS = {"spo_dqn": [dict(), dict(lr=1e-2, discount=0.9), dict(lr=1e-3, epsilon_end=0.2)],
           "spo_td3": [dict(), dict(actor_lr=1e-3, critic_lr=1e-2, discount=0.9), dict(target_noise=0.5)]}


@pytest.mark.long
@pytest.mark.parametrize("name", ["spo_dqn", "spo_td3"])
def test_vmapped_population_equals_per_member_loop(name):
    c = make(name, replicas=2, local_steps=2, target_rounds=1)
    hparams = stack([with_values(c.hparams, **values) for values in MEMBERS[name]])
    n = len(MEMBERS[name])
    states = jax.vmap(c.learner.init)(jax.random.split(jax.random.key(0), n), hparams)
    per_member = [member(states, i) for i in range(n)]
    pop_chunk = jax.jit(jax.vmap(chunk_update(c.learner)))
    for t in range(2):
        keys = stack([step_keys(2, 10 * t + i) for i in range(n)])
        batches = stack([batches_of(c.spec, 2, 100 * t + 10 * i) for i in range(n)])
        states, metrics = pop_chunk(keys, states, batches, hparams)
        outs = [c.chunk(keys[i], per_member[i], member(batches, i), member(hparams, i)) for i in range(n)]
        per_member = [s for s, _ in outs]
        assert_trees_close(metrics, stack([m for _, m in outs]))
    assert_trees_close(states, stack(per_member))
    assert jax.tree.leaves(states)[0].shape[:2] == (n, 2)  # [N, R, ...]
    params = states.params if name == "spo_dqn" else states.actor
    assert trees_differ(member(params, 0), member(params, 1))
    obs = jnp.zeros((n, 5, 3))
    assert jax.vmap(c.learner.policy)(states, obs).shape[:2] == (n, 5)
    assert jax.vmap(c.learner.act)(jax.random.split(jax.random.key(1), n), states, obs, hparams)[0].shape[:2] == (n, 5)


# --- bad inputs and a short run ------------------------------------------------------------------------
RUN = dict(env="probe:cartpole", pop_size=2, total_env_steps=200, warmup_steps=50, rollout_len=10, eval_interval=200,
           eval_episodes=1, batch_size=8, buffer_size=500, progress=False)


@pytest.mark.parametrize("learner_config,field", [
    ({"replicas": 3}, "learner_config.replicas"),
    ({"local_steps": 0}, "learner_config.local_steps"),
    ({"local_steps": 1.5}, "learner_config.local_steps"),
    ({"target_rounds": 0}, "learner_config.target_rounds"),
    ({"target_rounds": -2}, "learner_config.target_rounds"),
    ({"opt_state": "sum"}, "learner_config.opt_state"),
    ({"mode": "dp", "opt_state": "reset"}, "learner_config.opt_state"),
    ({"batch_size": 16}, "learner_config.batch_size"),
])
def test_bad_spo_config_is_one_line_naming_the_field(learner_config, field):
    with pytest.raises(ConfigError) as err:
        make_config(learner="spo_dqn", learner_config=learner_config, **RUN)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{field}:"), message


def test_local_steps_must_divide_the_updates_per_iteration(tmp_path):
    with pytest.raises(ConfigError, match=r"^learner_config\.local_steps: must divide the updates per iteration \(10"):
        popjax.train(learner="spo_dqn", learner_config={"local_steps": 3}, out_dir=tmp_path / "run", **RUN)
    assert not (tmp_path / "run").exists()


@pytest.mark.long
@pytest.mark.parametrize("learner,env", [("spo_dqn", "probe:cartpole"), ("spo_td3", "probe:pendulum")])
def test_a_population_of_spo_learners_trains(learner, env, tmp_path):
    run = popjax.train(learner=learner, out_dir=tmp_path / "run",
                       learner_config={"hidden": [8], "replicas": 2, "local_steps": 5, "target_rounds": 2},
                       **{**RUN, "env": env})
    params = run.state.learner.params if learner == "spo_dqn" else run.state.learner.actor
    leaf = jax.tree.leaves(params)[0]
    assert leaf.shape[:2] == (2, 2) and np.isfinite(np.asarray(leaf)).all()
    assert int(run.state.learner.steps[0]) == (200 - 50) // 10 * 10  # K = 10 local steps (2 rounds) per iteration


@pytest.mark.long
def test_spo_resume_equals_uninterrupted_run(tmp_path):
    options = {**RUN, "learner": "spo_dqn", "learner_config": {"hidden": [8], "local_steps": 5, "target_rounds": 2}}
    full, resumed = train_cut_and_resume(tmp_path, options, cut_env_steps=100)
    assert resumed.summary["final_returns"] == full.summary["final_returns"]
    assert_trees_equal(resumed.state, full.state)


@pytest.mark.long
def test_spo_dqn_solves_the_chain_probe(tmp_path):
    # reward 1 for action 2 of 3 (as test_learning's DQN check), with 2 replicas averaging every 5 steps
    run = popjax.train(learner="spo_dqn", env="probe:chain", total_env_steps=1000, eval_interval=1000, pop_size=2,
                       rollout_len=10, warmup_steps=100, eval_episodes=4, batch_size=32, buffer_size=2000,
                       learner_config={"hidden": [32, 32], "replicas": 2, "local_steps": 5}, progress=False,
                       out_dir=tmp_path)
    assert min(run.summary["final_returns"]) == 1.0


# --- the replica spread logged before each average (local SGD's divergence shows there) -------------------------
def test_replica_spread_is_the_relative_rms_drift_from_the_replica_mean():
    tree = {"w": jnp.array([[1.0, 3.0], [3.0, 5.0]]), "count": jnp.array([2, 2])}  # 2 replicas; ints ignored
    # mean [2, 4]; deviations ±1 everywhere: drift = (4 * 1) / 2 replicas = 2; size = 2^2 + 4^2 = 20
    assert float(spo.replica_spread(tree)) == pytest.approx(np.sqrt(2 / 20))
    assert float(spo.replica_spread({"w": jnp.ones((3, 4))})) == 0.0


@pytest.mark.long
def test_spo_rounds_log_the_spread_of_the_replicas_before_they_are_averaged():
    c = make("spo_td3", replicas=2, local_steps=3, target_rounds=2)
    hp = c.hparams
    state = c.learner.init(jax.random.key(0), hp)
    keys, batches = step_keys(3), batches_of(c.spec, 3)
    new, metrics = c.chunk(keys, state, batches, hp)
    assert float(metrics["critic_spread"]) > 1e-4 and float(metrics["actor_spread"]) > 1e-4
    assert float(spo.replica_spread(new.critic)) == 0.0  # averaged afterwards
    dp = make("spo_dqn", replicas=2, local_steps=3, target_rounds=2, mode="dp")
    _, dp_metrics = dp.chunk(keys, dp.learner.init(jax.random.key(0), dp.hparams), batches_of(dp.spec, 3), dp.hparams)
    assert float(dp_metrics["replica_spread"]) == 0.0  # data-parallel replicas never drift
