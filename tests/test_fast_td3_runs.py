"""fast_td3 in whole runs: a PBT exploit copies the whole member (params, optimizer, replay, observation statistics,
exploration stds), PBT and the independent driver train it over several envs per member, and a killed run resumes
exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_resume import kill_and_resume

import popjax
from popjax.buffers.uniform import make_uniform_buffer
from popjax.drivers.pbt_options import PBTConfig
from popjax.drivers.pbt_round import exploit_and_explore
from popjax.learners import fast_td3
from popjax.population.hparams import Range
from popjax.types import EnvSpec, Transition

ROOT = Path(__file__).resolve().parents[1]
SPEC = EnvSpec("toy", obs_shape=(3,), action_dim=2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
TINY = fast_td3.FastTD3Config(critic_hidden=(8,), actor_hidden=(8,), num_atoms=5, batch_size=4, envs_per_member=2)
SPACE = tuple(sorted((name, Range.from_dict(r)) for name, r in fast_td3.SEARCH_SPACE.items()))


def checksum(tree) -> int:
    return zlib.crc32(b"".join(np.asarray(x).tobytes() for x in jax.tree.leaves(tree)))


def member(tree, m):
    return jax.tree.map(lambda x: x[m], tree)


def test_an_exploit_copies_params_optimizer_replay_statistics_and_stds():
    pop = 4
    learner = fast_td3.make_fast_td3(TINY, SPEC)
    hps = jax.tree.map(lambda x: jnp.stack([x] * pop), fast_td3.default_hparams(TINY))
    states = jax.vmap(learner.init)(jax.random.split(jax.random.key(0), pop), hps)
    # every member has seen different observations and ended different episodes
    obs = jax.random.normal(jax.random.key(1), (pop, 6, 3)) * jnp.arange(1.0, pop + 1.0)[:, None, None]
    transitions = Transition(obs, jnp.zeros((pop, 6, 2)), jnp.zeros((pop, 6)), obs, jnp.zeros((pop, 6)))
    ended = jnp.tile(jnp.array([False, False, True, False, False, True]), (pop, 1))
    states = jax.vmap(learner.observe)(jax.random.split(jax.random.key(2), pop), states, transitions, ended, hps)
    buffer = make_uniform_buffer(8, 4)
    replay = jax.vmap(lambda t: buffer.add(buffer.init(member(t, 0)), t))(transitions)
    before = {"learner": states, "buffer": replay}
    config = PBTConfig(quantile=0.25, copy_buffer=True, search_space=SPACE)
    after, _, info = jax.jit(exploit_and_explore, static_argnums=4)(jax.random.key(3), before, hps,
                                                                    jnp.array([4.0, 3.0, 2.0, 1.0]), config)
    assert info["loser"].tolist() == [False, False, False, True] and int(info["parent"][3]) == 0
    for part in ("actor", "critic", "target_critic", "actor_opt", "critic_opt", "obs_norm", "noise_level", "steps"):
        assert checksum(member(getattr(after["learner"], part), 3)) == checksum(member(getattr(states, part), 0)), part
        assert checksum(member(getattr(after["learner"], part), 1)) == checksum(member(getattr(states, part), 1)), part
    assert checksum(member(after["buffer"], 3)) == checksum(member(replay, 0))
    assert checksum(member(states.obs_norm, 3)) != checksum(member(states.obs_norm, 0))  # a real change


SMALL = dict(learner="fast_td3", env="probe:pendulum", envs_per_member=4, rollout_len=5, update_ratio=0.2,
             total_env_steps=1200, warmup_steps=200, eval_interval=200, batch_size=32, buffer_size=1200,
             eval_episodes=1, seed=2, progress=False,
             learner_config={"critic_hidden": [16], "actor_hidden": [16], "num_atoms": 11, "n_step": 3},
             hparams={"v_min": -600.0, "v_max": 10.0})


@pytest.mark.long
def test_pbt_over_fast_td3_exploits_and_keeps_the_members_apart(tmp_path):
    run = popjax.train(driver="pbt", pop_size=4, out_dir=tmp_path / "pbt",
                       pbt={"interval": 400, "quantile": 0.25, "copy_buffer": True}, **SMALL)
    assert run.summary["lineage"], "no exploit round ran"
    assert np.isfinite(run.summary["final_returns"]).all()
    counts = np.asarray(run.state.learner.obs_norm.count)
    assert (counts == 1200).all()  # every observation of every env (1,200 env steps per member) was seen
    assert np.asarray(run.state.learner.noise_level).shape == (4, 4)


@pytest.mark.processes
def test_sigkill_then_resume_equals_the_uninterrupted_run(tmp_path):
    options = {**SMALL, "driver": "pbt", "pop_size": 2, "pbt": {"interval": 400, "quantile": 0.5},
               "checkpoint_interval": 100}
    full, run = kill_and_resume(tmp_path, options, past_checkpoint=35)  # past the first exploit (iteration 20)
    assert run.summary["hparams"] == full.summary["hparams"] and run.summary["lineage"] == full.summary["lineage"]
    assert full.summary["lineage"]


@pytest.mark.slow
def test_four_members_of_sixteen_envs_learn_the_pendulum(tmp_path):
    """pop 4 x 16 envs at small widths: the best member's final return passes -400 (random: about -1,200)."""
    run = popjax.train(learner="fast_td3", env="probe:pendulum", pop_size=4, envs_per_member=16, rollout_len=1,
                       update_ratio=2 / 16, total_env_steps=48_000, warmup_steps=1_600, eval_interval=8_000,
                       batch_size=512, buffer_size=48_000, eval_episodes=3, seed=0, progress=False,
                       learner_config={"critic_hidden": [128, 64], "actor_hidden": [64, 32], "n_step": 3},
                       hparams={"v_min": -600.0, "v_max": 10.0}, out_dir=tmp_path / "learn")
    assert max(run.summary["final_returns"]) > -400, run.summary["final_returns"]


@pytest.mark.long
def test_the_guide_plans_without_writing(tmp_path, monkeypatch, capsys):
    """docs/large-batch.md, "Plan before you compile": the command prints the plan and writes nothing."""
    from docs_blocks import block, commands

    from popjax import cli

    monkeypatch.chdir(tmp_path)
    (command,) = commands(block("docs/large-batch.md", "Plan before you compile", 0))
    assert cli.main(command.argv) == 0
    printed = capsys.readouterr().out
    assert "replay" in printed and "fits" in printed and "16 members x 1024 envs" in printed
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.processes
def test_the_gpu_study_dry_runs_on_the_cpu(tmp_path):
    """benchmarks/frontier_study.sh with SMALL=1: the plan, both throughput studies and the MF-PBT curve."""
    env = {**os.environ, "SMALL": "1", "PY": sys.executable}
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "frontier_study.sh"), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=1_800)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "fits" in (tmp_path / "plan.txt").read_text()
    for precision, points in (("bf16", 4), ("tf32", 2)):
        rows = json.loads((tmp_path / f"frontier_{precision}.json").read_text())["results"]
        assert len(rows) == points and all(r["agent_steps_per_s"] > 0 for r in rows), rows
        assert all(r["config"]["matmul_precision"] == precision for r in rows)
    curve = json.loads((tmp_path / "pbt_curve.json").read_text())["evaluations"]
    assert len(curve) >= 5 and all(np.isfinite(point["best_return"]) for point in curve)
