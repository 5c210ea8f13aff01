"""``buffer: prioritized`` in a run: TD3, SAC and DQN train through the independent driver and write priorities."""

import shutil

import jax
import numpy as np
import pytest
from learner_helpers import assert_trees_equal, use_shared_xla_cache

import popjax
from popjax.buffers.prioritized import tree_leaves
from popjax.checkpoint import Checkpointer
from popjax.config import ConfigError, make_config, memory_estimate
from popjax.experiment import build
from popjax.learners import LEARNERS
from popjax.learners.base import one_update
from popjax.types import EnvSpec, Transition

BASE = dict(env="probe:pendulum", pop_size=2, seed=3, total_env_steps=300, warmup_steps=50, rollout_len=25,
            eval_interval=100, eval_episodes=1, batch_size=16, buffer_size=200, learner_config={"hidden": [8, 8]},
            progress=False, buffer="prioritized")


@pytest.fixture(autouse=True)
def xla_cache():
    """Compiled programs shared between runs (speed only; results are identical), as in test_drivers."""
    use_shared_xla_cache()


@pytest.mark.long
@pytest.mark.parametrize("learner", ["td3", "sac", "dqn"])
def test_prioritized_run_trains_and_priorities_change(learner):
    env = {"env": "probe:cartpole"} if learner == "dqn" else {}
    loop = build(make_config(learner=learner, per_beta=0.5, **{**BASE, **env}))
    state, env_state = loop.initial_state()
    for _ in range(4):  # 2 warm-up iterations, then 2 of training
        state, env_state, metrics = loop.step(state, env_state)
    state = loop.unpacked(state)  # the JAX path keeps the state packed between iterations
    assert loop.counters(state)[1] > 0
    assert np.isfinite(metrics["loss" if learner == "dqn" else "critic_loss"]).all() and (metrics["td_abs"] > 0).all()
    leaves = np.asarray(jax.vmap(lambda tree: tree_leaves(jax.tree.map(lambda x: x[0], tree), 100))(state.buffer.tree))
    assert (leaves[:, :100] > 0).all()  # 100 rows per member so far, all sampleable
    assert (state.buffer.max_priority > 1).any() or (leaves < 1).any()  # written priorities differ from the initial 1
    assert len(np.unique(leaves[0])) > 10  # priorities vary per row
    np.testing.assert_allclose(state.buffer.hyper.alpha, 0.6)  # the popjax default
    np.testing.assert_allclose(state.buffer.hyper.beta, 0.5)


@pytest.mark.long
@pytest.mark.parametrize("name", ["td3", "sac", "dqn"])
def test_weighted_update_with_unit_weights_equals_update(name):
    spec = (EnvSpec("t", (3,), num_actions=2) if name == "dqn"
            else EnvSpec("t", (3,), action_dim=1, action_low=(-1.0,), action_high=(1.0,)))
    definition = LEARNERS[name]
    made = definition.make(definition.config_cls(hidden=(8, 8)), spec)
    hp = definition.default_hparams()
    state = made.init(jax.random.key(0), hp)
    rng = np.random.default_rng(0)
    f32 = lambda *shape: rng.normal(size=shape).astype(np.float32)
    action = rng.integers(0, 2, 16).astype(np.int32) if name == "dqn" else np.tanh(f32(16, 1))
    batch = Transition(obs=f32(16, 3), action=action, reward=f32(16), next_obs=f32(16, 3),
                       terminated=np.zeros(16, np.float32))
    plain = jax.jit(one_update(made))(jax.random.key(1), state, batch, hp)
    one = lambda tree: jax.tree.map(lambda x: x[None], tree)  # a chunk of one step
    weighted, metrics, td_abs = jax.jit(made.step.update)(one(jax.random.key(1)), state, one(batch),
                                                          np.ones((1, 16), np.float32), hp)
    td_abs = td_abs[0]
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), plain, (weighted, metrics))
    assert td_abs.shape == (16,) and (np.asarray(td_abs) >= 0).all()


def test_prioritized_replay_is_refused_where_it_is_not_supported():
    with pytest.raises(ConfigError, match="buffer"):
        make_config(learner="td3", driver="cemrl", **BASE)


@pytest.mark.long
def test_pbt_with_prioritized_replay_resumes_exactly(tmp_path):
    """PBT copies prioritized buffers with their trees; a kill and ``resume`` restores them leaf for leaf."""
    opts = dict(BASE, learner="td3", pop_size=4, checkpoint_interval=50, driver="pbt",
                pbt={"interval": 100, "quantile": 0.25, "copy_buffer": True})
    full = popjax.train(out_dir=tmp_path / "full", **opts)
    assert full.summary["lineage"]
    cut = tmp_path / "cut"
    shutil.copytree(full.out_dir, cut)
    (cut / "summary.json").unlink()
    checkpoints = Checkpointer(cut / "checkpoints")
    for step in checkpoints.steps()[1:]:
        checkpoints.delete(step)
    checkpoints.close()
    resumed = popjax.resume(cut)
    assert_trees_equal(resumed.state, full.state)


def test_memory_estimate_counts_the_sum_tree():
    spec = EnvSpec("t", (3,), action_dim=1, action_low=(-1.0,), action_high=(1.0,))
    uniform = memory_estimate(make_config(learner="td3", **{**BASE, "buffer": "uniform"}), spec)
    prioritized = memory_estimate(make_config(learner="td3", **BASE), spec)
    assert prioritized["row"] == uniform["row"] + 6 and prioritized["replay"] > uniform["replay"]
