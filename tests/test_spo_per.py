"""SPO replicas reading banked prioritized replay (replica r <- bank r), through the independent driver."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from learner_helpers import (
    SPECS,
    assert_trees_close,
    assert_trees_equal,
    fast_compile,  # noqa: F401  (autouse fixture)
    random_batch,
    train_cut_and_resume,
    with_values,
)

from popjax.buffers import make_prioritized_buffer, per_hyperparams
from popjax.buffers.prioritized import priority_from_td
from popjax.config import ConfigError, make_config
from popjax.experiment import build
from popjax.learners import LEARNERS
from popjax.learners.base import chunk_update
from popjax.population.tree import member, stack
from popjax.types import dummy_transition

HIDDEN = (8,)
B = 8
RUN = dict(env="probe:cartpole", pop_size=2, seed=1, total_env_steps=200, warmup_steps=40, rollout_len=10,
           eval_interval=200, eval_episodes=1, batch_size=B, buffer_size=400, progress=False, buffer="prioritized")


def make(name: str, **config):
    definition = LEARNERS[name]
    config = definition.config_cls(**{"hidden": HIDDEN, "batch_size": B, **config})
    spec = SPECS[definition.action_kind]
    return definition, config, spec, definition.make(config, spec)


@pytest.mark.long
@pytest.mark.parametrize("name", ["spo_dqn", "spo_td3"])
def test_unit_weights_equal_the_unweighted_round_and_td_abs_per_row(name):
    definition, config, spec, learner = make(name, replicas=2, local_steps=3, target_rounds=1)
    hp = definition.default_hparams(config)
    state = learner.init(jax.random.key(0), hp)
    keys = jax.random.split(jax.random.key(1), 3)
    batches = stack([random_batch(jax.random.key(10 + i), spec, B) for i in range(3)])
    plain = jax.jit(chunk_update(learner))(keys, state, batches, hp)
    new, metrics, td_abs = jax.jit(learner.step.update)(keys, state, batches, jnp.ones((3, B)), hp)
    assert_trees_close((new, metrics), plain, atol=1e-6, rtol=1e-6)
    assert td_abs.shape == (3, B) and (np.asarray(td_abs) > 0).all()
    # Weights change the round (uneven within each replica's slice: Adam ignores a common scale).
    half = jnp.tile(jnp.array([1.0, 0.1]), (3, B // 2))
    weighted = jax.jit(learner.step.update)(keys, state, batches, half, hp)[0]
    params = (lambda s: s.params) if name == "spo_dqn" else (lambda s: s.critic)
    assert not np.allclose(jax.tree.leaves(params(weighted))[0], jax.tree.leaves(params(new))[0])
    assert learner.step.banks == 2 and learner.step.chunk == 3


@pytest.mark.parametrize("naive", [False, True])
def test_spo_td3_importance_weights_never_enter_the_actor_loss(naive):
    """With the critic frozen (critic lr 0), any weights give the same actors: they weight the critic loss only."""
    definition, config, spec, learner = make("spo_td3", replicas=2, local_steps=2, target_rounds=1, naive=naive)
    hp = with_values(definition.default_hparams(config), critic_lr=0.0, actor_lr=0.01)
    state = learner.init(jax.random.key(0), hp)
    keys = jax.random.split(jax.random.key(1), 2)
    batches = stack([random_batch(jax.random.key(20 + i), spec, B) for i in range(2)])
    update = jax.jit(learner.step.update)
    ones = update(keys, state, batches, jnp.ones((2, B)), hp)[0]
    uneven = update(keys, state, batches, jax.random.uniform(jax.random.key(2), (2, B), minval=0.05), hp)[0]
    assert_trees_equal(uneven.actor, ones.actor)
    assert_trees_equal(uneven.actor_opt, ones.actor_opt)
    assert not np.allclose(jax.tree.leaves(ones.actor)[0], jax.tree.leaves(state.actor)[0])  # the actor did move


@pytest.mark.long
def test_one_replica_one_local_step_spo_dqn_per_equals_dqn_per():
    """R = 1, H = 1, a target copy every F = 25 rounds: SPO-DQN + PER is DQN + PER (period 25) step for step."""
    options = dict(RUN, learner="spo_dqn", per_delay=2, hparams={"lr": 0.01},
                   learner_config={"hidden": [8], "replicas": 1, "local_steps": 1, "target_rounds": 25})
    spo_loop = build(make_config(**options))
    dqn_loop = build(make_config(**{**options, "learner": "dqn",
                                    "learner_config": {"hidden": [8], "target_update_period": 25}}))
    spo_state, spo_env = spo_loop.initial_state()
    dqn_state, dqn_env = dqn_loop.initial_state()
    for _ in range(10):  # 4 warm-up iterations, then 6 x 10 updates
        spo_state, spo_env, spo_metrics = spo_loop.step(spo_state, spo_env)
        dqn_state, dqn_env, dqn_metrics = dqn_loop.step(dqn_state, dqn_env)
    spo_state, dqn_state = spo_loop.unpacked(spo_state), dqn_loop.unpacked(dqn_state)  # packed between iterations
    assert int(spo_state.learner.steps[0]) == 60
    learner = spo_state.learner
    assert_trees_close(jax.tree.map(lambda x: x[:, 0], learner.params), dqn_state.learner.params, atol=1e-5)
    assert_trees_close(learner.target_params, dqn_state.learner.target_params, atol=1e-5)
    # the same rows sampled and the same priorities written (to float rounding)
    np.testing.assert_array_equal(spo_state.buffer.pending.indices, dqn_state.buffer.pending.indices)
    assert_trees_close(spo_state.buffer.tree, dqn_state.buffer.tree, atol=1e-5)
    np.testing.assert_allclose(spo_metrics["td_abs"], dqn_metrics["td_abs"], rtol=1e-4)


def td_of(batch):
    """A per-row value the spy learner reports as |TD|: below 1 so the max priority (1) never moves."""
    return 0.01 + 0.1 * jnp.abs(batch.obs[..., 0]) / (1.0 + jnp.abs(batch.obs[..., 0]))


@pytest.mark.long
def test_replica_r_reads_and_writes_only_bank_r(monkeypatch):
    """A spy SPO-DQN reports |TD| as a function of each row's own data: every leaf of bank r is then either the
    insertion priority 1 or exactly the priority of bank r's row there, and each replica's slice matches its bank."""
    replicas = 2
    definition = LEARNERS["spo_dqn"]

    def make_spy(config, spec):
        learner = definition.make(config, spec)

        def update_round(keys, state, batches, weights, hp):
            state, metrics, _ = learner.step.update(keys, state, batches, weights, hp)
            return state, metrics, td_of(batches)

        return learner._replace(step=learner.step._replace(update=update_round))

    monkeypatch.setitem(LEARNERS, "spo_dqn", dataclasses.replace(definition, make=make_spy))
    options = dict(RUN, learner="spo_dqn", batch_size=16, pop_size=1,
                   learner_config={"hidden": [8], "replicas": replicas, "local_steps": 2, "target_rounds": 2})
    loop = build(make_config(**options))
    state, env_state = loop.initial_state()
    for _ in range(8):
        state, env_state, _ = loop.step(state, env_state)
    state = loop.unpacked(state)  # the JAX path keeps the state packed between iterations
    buffer = jax.tree.map(lambda x: x[0], state.buffer)  # member 0: data [R, rows, ...], leaves [R, K**h]
    leaves = np.asarray(buffer.tree.levels[-1])
    rows = int(buffer.size[0])
    assert buffer.size.tolist() == [40, 40]
    written = 0
    for bank in range(replicas):
        own = np.asarray(priority_from_td(td_of(jax.tree.map(lambda x, bank=bank: x[bank, :rows], buffer.data)),
                                          buffer.hyper.alpha, buffer.hyper.eps))
        hit = leaves[bank, :rows] != 1.0
        np.testing.assert_allclose(leaves[bank, :rows][hit], own[hit], rtol=1e-6)
        written += hit.sum()
        assert hit.sum() > 5  # both banks were sampled and written
        assert (leaves[bank, rows:] == 0).all()  # nothing past the bank's valid rows
    np.testing.assert_array_equal(buffer.max_priority, 1.0)
    assert written > 20


@pytest.mark.long
@pytest.mark.parametrize("name", ["spo_dqn", "spo_td3"])
def test_vmapped_spo_per_round_equals_per_member_loop(name):
    """Sample H batches from R banks, one weighted round, H delayed priority writes: vmap == loop leaf for leaf."""
    replicas, h, n = 2, 2, 3
    definition, config, spec, learner = make(name, replicas=replicas, local_steps=h, target_rounds=1)
    buf = make_prioritized_buffer(capacity=32, batch_size=B, banks=replicas, delay=3)
    lr = {"lr": [1e-2, 1e-3, 3e-3]} if name == "spo_dqn" else {"critic_lr": [1e-2, 1e-3, 3e-3]}
    hparams = stack([with_values(definition.default_hparams(config), **{k: v[i] for k, v in lr.items()})
                     for i in range(n)])
    hyper = per_hyperparams(alpha=jnp.array([0.6, 1.0, 0.3]), beta=jnp.array([0.4, 1.0, 0.7]), eps=jnp.full(n, 1e-6))

    def one_member(key, hp, hyper):
        state = learner.init(key, hp)
        buffer = buf.init(dummy_transition(spec), hyper)
        buffer = buf.add(buffer, random_batch(jax.random.fold_in(key, 1), spec, 32))
        for t in range(3):
            round_key = jax.random.fold_in(key, 10 + t)
            batches, info = jax.vmap(buf.sample, in_axes=(0, None))(jax.random.split(round_key, h), buffer)
            state, _, td_abs = learner.step.update(jax.random.split(round_key, h), state, batches,
                                                             info.weights.reshape(h, -1), hp)
            for i in range(h):
                buffer = buf.update(buffer, info.indices[i], td_abs[i])
        return state, buffer

    keys = jax.random.split(jax.random.key(5), n)
    vmapped = jax.jit(jax.vmap(one_member))(keys, hparams, hyper)
    looped = [jax.jit(one_member)(keys[m], member(hparams, m), member(hyper, m)) for m in range(n)]
    assert_trees_close(vmapped, stack(looped), atol=1e-6, rtol=1e-6)
    assert int(vmapped[1].pending.count[0]) == 2 and (np.asarray(vmapped[1].max_priority) != 1.0).any()


@pytest.mark.long
@pytest.mark.parametrize("learner,env,delay", [("spo_dqn", "probe:cartpole", 3), ("spo_td3", "probe:pendulum", 1),
                                               ("dqn", "probe:cartpole", 7)])
def test_resume_with_prioritized_buffers_is_bit_identical(learner, env, delay, tmp_path):
    config = {"hidden": [8]} if learner == "dqn" else {"hidden": [8], "local_steps": 5, "target_rounds": 2}
    options = dict(RUN, learner=learner, env=env, per_delay=delay, learner_config=config)
    full, resumed = train_cut_and_resume(tmp_path, options, cut_env_steps=100)
    assert resumed.summary["final_returns"] == full.summary["final_returns"]
    assert_trees_equal(resumed.state, full.state)
    if delay > 1:  # writes were pending at the cut and at the end
        assert (np.asarray(full.state.buffer.pending.count) == delay - 1).all()


@pytest.mark.parametrize("overrides,field", [
    (dict(buffer_size=401), "buffer_size"),
    (dict(rollout_len=5), "rollout_len"),
    (dict(learner_config={"replicas": 3}), "learner_config.replicas"),
])
def test_banks_must_divide_the_buffer_the_rollout_and_the_batch(overrides, field, tmp_path):
    import popjax

    options = {**RUN, "learner": "spo_dqn", **overrides}
    options["learner_config"] = {"hidden": [8], "replicas": 2, "local_steps": 5, **overrides.get("learner_config", {})}
    with pytest.raises(ConfigError) as err:
        popjax.train(out_dir=tmp_path / "run", **options)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{field}:"), message
    assert not (tmp_path / "run").exists()
