"""The extension contracts: the learner and the replay source of the guide (docs/extending.md), written outside
popjax, register and train.

The guide's learner estimates the mean reward of its batches (``v += lr * mean(w * (r - v))``, TD magnitudes
``|r - v|``); its source always serves the newest ``B`` rows and keeps what the learner writes back. With K
updates per iteration on the same newest rows, ``v`` converges to their mean reward and the last write-back is
``|r - v|`` of the last update: both are checked against values computed here from the final replay.
"""

from __future__ import annotations

import numpy as np
import pytest
from docs_blocks import block, run_python

import popjax
from popjax.buffers import SOURCES, register_source
from popjax.learners import LEARNERS, register

GUIDE = "docs/extending.md"


def exec_guide_block(section: str, index: int, namespace: dict | None = None) -> dict:
    return run_python(block(GUIDE, section, index), namespace)


@pytest.fixture
def registered():
    """The guide's learner ("Writing a learner") and source ("Writing a replay source"), registered as it does."""
    try:
        namespace = exec_guide_block("Writing a learner", 0)
        yield exec_guide_block("Writing a replay source", 0, namespace)
    finally:
        LEARNERS.pop("mean", None)
        SOURCES.pop("newest", None)


RUN = dict(learner="mean", env="probe:pendulum", pop_size=2, total_env_steps=96, rollout_len=32,
           update_ratio=0.5, warmup_steps=0, batch_size=8, buffer_size=64, eval_interval=96, eval_episodes=1,
           progress=False)


@pytest.mark.parametrize("driver, extra", [
    ("independent", {}),
    ("pbt", {"hparams": {"lr": [0.9, 1.0]}, "pbt": {"interval": 32, "quantile": 0.5,
                                                   "search_space": {"lr": {"low": 0.9, "high": 1.0}},
                                                   "copy_buffer": True}}),
])
@pytest.mark.long
def test_a_learner_and_a_source_written_outside_popjax_train(registered, tmp_path, driver, extra):
    run = popjax.train(driver=driver, buffer="newest", out_dir=tmp_path / driver, **RUN, **extra)
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
    with pytest.raises(popjax.ConfigError, match=r"^buffer: the hts driver has no newest replay"):
        popjax.make_config(**{**RUN, "driver": "hts", "env": "gym:Pendulum-v1", "buffer": "newest"})
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


def test_the_guide_learner_and_source_train(registered, tmp_path, monkeypatch, capsys):
    """The guide's third block trains both under independent and pbt; v is the mean reward of the newest rows."""
    monkeypatch.chdir(tmp_path)
    namespace = exec_guide_block("Writing a replay source", 1, registered)
    for run in (namespace["run"], namespace["tuned"]):
        ring = run.state.buffer["ring"]
        for m in range(2):
            rows = (int(ring.insert_pos[m]) - 1 - np.arange(8)) % 64
            np.testing.assert_allclose(float(run.state.learner["v"][m]), np.asarray(ring.data.reward[m])[rows].mean(),
                                       rtol=1e-5, atol=1e-6)
    assert namespace["tuned"].summary["lineage"] and "[" in capsys.readouterr().out
