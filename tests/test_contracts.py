"""The extension contracts: a learner and a replay source written here, outside popjax, register and train.

The toy learner estimates the mean reward of its batches (``v += lr * mean(w * (r - v))``, TD magnitudes
``|r - v|``); the toy source always serves the newest ``B`` rows and keeps what the learner writes back. With K
updates per iteration on the same newest rows, ``v`` converges to their mean reward and the last write-back is
``|r - v|`` of the last update: both are checked against values computed here from the final replay.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from pydantic import Field

import popjax
from popjax import schema
from popjax.buffers import SOURCES, ReplaySource, SourceDef, make_uniform_buffer, register_source
from popjax.learners import LEARNERS, register
from popjax.learners.base import BatchSize, Learner, LearnerDef, replay_step, scalar
from popjax.population.hparams import hparam
from popjax.types import dummy_transition


@schema.dataclass
class MeanConfig:
    batch_size: BatchSize = Field(8, description="transitions per update")


@struct.dataclass
class MeanHParams:
    lr: jax.Array = hparam("step size of the mean estimate", ge=0, le=1)


def make_mean(config: MeanConfig, spec) -> Learner:
    def init(key, hp):
        del key, hp
        return {"v": jnp.zeros((), jnp.float32), "steps": jnp.zeros((), jnp.int32)}

    def update(key, state, batch, weights, hp):
        del key
        err = batch.reward - state["v"]
        w = jnp.ones_like(err) if weights is None else weights
        new = {"v": state["v"] + hp.lr * jnp.mean(w * err), "steps": state["steps"] + 1}
        return new, {"loss": jnp.mean(err**2)}, jnp.abs(err)

    def policy(state, obs):
        del state
        return jnp.zeros(obs.shape[:-len(spec.obs_shape)] + spec.action_shape, spec.action_dtype)

    return Learner(init=init, act=lambda key, state, obs, hp: policy(state, obs), policy=policy,
                   step=replay_step(update))


MEAN = LearnerDef(name="mean_test", config_cls=MeanConfig, hparams_cls=MeanHParams, make=make_mean,
                  default_hparams=lambda config=None: MeanHParams(lr=scalar(1.0)), action_kind="any")


def make_newest(config, spec, step) -> ReplaySource:
    """The newest ``batch_size`` rows, unweighted-by-one; remembers the values written back."""
    del step
    b, capacity = config.batch_size, config.buffer_size
    ring = make_uniform_buffer(capacity, b)

    def sample(key, state):
        del key
        rows = (state["ring"].insert_pos - 1 - jnp.arange(b)) % capacity
        return jax.tree.map(lambda x: x[rows], state["ring"].data), jnp.ones((b,), jnp.float32), rows

    return ReplaySource(
        init=lambda: {"ring": ring.init(dummy_transition(spec)), "written": jnp.zeros((b,), jnp.float32)},
        add=lambda state, transitions, ended: {**state, "ring": ring.add(state["ring"], transitions)},
        sample=sample,
        write_back=lambda state, rows, values: {**state, "written": values})


NEWEST = SourceDef("newest_test", make_newest, "the newest rows (a test source)", writes_back=True)


@pytest.fixture
def registered():
    register(MEAN)
    register_source(NEWEST)
    yield
    del LEARNERS[MEAN.name], SOURCES[NEWEST.name]


RUN = dict(learner="mean_test", env="probe:pendulum", pop_size=2, total_env_steps=96, rollout_len=32,
           update_ratio=0.5, warmup_steps=0, batch_size=8, buffer_size=64, eval_interval=96, eval_episodes=1,
           progress=False)


@pytest.mark.parametrize("driver, extra", [
    ("independent", {}),
    ("pbt", {"hparams": {"lr": [0.9, 1.0]}, "pbt": {"interval": 32, "quantile": 0.5,
                                                   "search_space": {"lr": {"low": 0.9, "high": 1.0}},
                                                   "copy_buffer": True}}),
])
def test_a_learner_and_a_source_written_outside_popjax_train(registered, tmp_path, driver, extra):
    run = popjax.train(driver=driver, buffer="newest_test", out_dir=tmp_path / driver, **RUN, **extra)
    assert run.summary["updates"] == 3 * 16  # K = 16 updates in each of 3 iterations, no warm-up
    state = run.state
    ring = state.buffer["ring"]
    for m in range(2):
        rows = (int(ring.insert_pos[m]) - 1 - np.arange(8)) % 64
        reward = np.asarray(ring.data.reward[m])[rows]
        v = float(state.learner["v"][m])
        np.testing.assert_allclose(v, reward.mean(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(state.buffer["written"][m], np.abs(reward - v), rtol=1e-4, atol=1e-5)
        assert int(state.learner["steps"][m]) == 3 * 16


def test_a_registered_source_is_refused_by_a_driver_that_does_not_take_it(registered, tmp_path):
    with pytest.raises(popjax.ConfigError, match=r"^buffer: the hts driver has no newest_test replay"):
        popjax.make_config(**{**RUN, "driver": "hts", "env": "gym:Pendulum-v1", "buffer": "newest_test"})
    assert not list(tmp_path.iterdir())


def test_register_refuses_a_taken_name():
    with pytest.raises(ValueError, match="taken"):
        register(LEARNERS["td3"])
    with pytest.raises(ValueError, match="taken"):
        register_source(SOURCES["uniform"])


def test_every_source_declares_what_it_writes_back_for_every_replay_learner():
    """``SourceDef.writes_back_for(step)`` equals whether the source made for that learner writes back, for every
    registered source and replay learner it serves (issue 37: ``uniform`` writes ReF-ER's ratios back)."""
    from popjax.config import ConfigError, make_config, make_learner_config
    from popjax.envs import registry
    from popjax.learners.base import ReplayStep

    checked = set()
    for source_name, source_def in SOURCES.items():
        for name, definition in LEARNERS.items():
            if definition.step_kind is not ReplayStep:
                continue
            env = "probe:pendulum" if definition.action_kind == "continuous" else "probe:cartpole"
            try:
                config = make_config(learner=name, env=env, buffer=source_name)
                step = definition.make(make_learner_config(config), registry.env_spec(env)).step
                source = source_def.make(config, registry.env_spec(env), step)
            except ConfigError:
                continue  # a pair the run refuses
            assert source_def.writes_back_for(step) == (source.write_back is not None), (source_name, name)
            checked.add((source_name, name))
    assert {("uniform", "td3"), ("uniform", "refer_td3"), ("prioritized", "td3")} <= checked
    refer_step = LEARNERS["refer_td3"].make(make_learner_config(make_config(learner="refer_td3", env="probe:pendulum")),
                                            registry.env_spec("probe:pendulum")).step
    assert SOURCES["uniform"].writes_back_for(refer_step) and not SOURCES["uniform"].writes_back
