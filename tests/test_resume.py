"""Exact resume: a run killed with SIGKILL and resumed equals an uninterrupted run (JAX env path)."""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from learner_helpers import assert_trees_equal, use_shared_xla_cache

import popjax
from popjax.checkpoint import Checkpointer, CheckpointWarning
from popjax.experiment import resume

ROOT = Path(__file__).resolve().parents[1]
# PBT so that the driver state (fitness window, lineage) must survive too; the same run as in
# tests/test_pbt.py: 60 iterations of 25 env steps, evaluations (and checkpoints) every 10.
RUN = dict(learner="td3", env="probe:pendulum", driver="pbt", pop_size=2, seed=3, total_env_steps=1500,
           warmup_steps=250, eval_interval=250, rollout_len=25, batch_size=32, buffer_size=2000,
           eval_episodes=1, learner_config={"hidden": [16, 16]},
           pbt={"interval": 500, "quantile": 0.5}, progress=False)

CHILD = """
import json, sys, time
import jax
jax.config.update("jax_compilation_cache_dir", sys.argv[3])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
import popjax
from popjax.loop import Loop

step = Loop.step
def slow_step(self, *args):  # slow enough to be killed mid-run
    time.sleep(0.05)
    return step(self, *args)
Loop.step = slow_step
popjax.train(out_dir=sys.argv[1], **json.loads(sys.argv[2]))
"""


def kill_and_resume(tmp_path, options: dict, past_checkpoint: int):
    """Trains ``options`` uninterrupted, then in a child process killed with SIGKILL once a checkpoint past
    ``past_checkpoint`` iterations exists, resumes the killed run: it must equal the uninterrupted one (summary,
    every leaf of the state, the metrics rows). Returns ``(uninterrupted run, resumed run)``."""
    jax.config.update("jax_disable_most_optimizations", False)  # as in the child process
    full = popjax.train(out_dir=tmp_path / "full", **options)
    out, script = tmp_path / "killed", tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with (tmp_path / "child.log").open("w") as log:
        child = subprocess.Popen([sys.executable, str(script), str(out), json.dumps(options), use_shared_xla_cache()],
                                 env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and child.poll() is None:
            steps = [int(p.name) for p in (out / "checkpoints").glob("*") if p.name.isdigit()]
            if steps and max(steps) > past_checkpoint:
                break
            time.sleep(0.05)
        assert child.poll() is None, (tmp_path / "child.log").read_text()[-2000:]
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait() == -signal.SIGKILL
    assert not (out / "summary.json").exists()
    run = resume(out)
    for field in ("final_returns", "best_return", "env_steps", "updates"):
        assert run.summary[field] == full.summary[field], field
    assert_trees_equal(run.state, full.state)
    assert metric_rows(out) == metric_rows(full.out_dir)
    return full, run


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    use_shared_xla_cache()
    return popjax.train(out_dir=tmp_path_factory.mktemp("reference"), **RUN)


def metric_rows(run_dir: Path) -> list[dict]:
    with (run_dir / "metrics.csv").open(newline="") as f:
        return [{k: v for k, v in row.items() if k != "wall_s"} for row in csv.DictReader(f)]


def assert_same_run(run, reference, evaluations=6):
    for field in ("final_returns", "best_return", "env_steps", "updates", "hparams", "lineage", "pbt"):
        assert run.summary[field] == reference.summary[field], field
    assert json.loads((run.out_dir / "summary.json").read_text())["final_returns"] == \
        reference.summary["final_returns"]
    leaves, ref_leaves = jax.tree.leaves(run.state), jax.tree.leaves(reference.state)
    assert len(leaves) == len(ref_leaves)
    for a, b in zip(leaves, ref_leaves, strict=True):  # params, targets, Adam, counters, buffers, hparams
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    rows = metric_rows(run.out_dir)
    assert rows == metric_rows(reference.out_dir)  # nothing lost, nothing duplicated
    assert len(rows) == evaluations * 2


@pytest.mark.processes
def test_sigkill_mid_training_then_resume_equals_uninterrupted_run(reference, tmp_path):
    out = tmp_path / "killed"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with (tmp_path / "child.log").open("w") as log:
        # checkpoints also every 4 iterations (between evaluations): they do not change the results
        options = json.dumps({**RUN, "checkpoint_interval": 100})
        child = subprocess.Popen([sys.executable, str(script), str(out), options, use_shared_xla_cache()],
                                 env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and child.poll() is None:
            steps = [int(p.name) for p in (out / "checkpoints").glob("*") if p.name.isdigit()]
            if steps and max(steps) >= 24:  # past an exploit (iteration 20) and mid-way to the next one
                break
            time.sleep(0.02)
        assert child.poll() is None, (tmp_path / "child.log").read_text()[-2000:]
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait() == -signal.SIGKILL
    assert not (out / "summary.json").exists()
    killed_rows = len(metric_rows(out))
    assert 2 * 2 <= killed_rows < 12

    run = resume(out)
    assert_same_run(run, reference)
    assert Checkpointer(out / "checkpoints").steps()[-1] == 60


@pytest.mark.parametrize("damage", ["truncated_arrays", pytest.param("garbage_meta", marks=pytest.mark.slow)])
def test_damaged_latest_checkpoint_falls_back_to_the_previous_one(reference, tmp_path, damage):
    out = tmp_path / "run"
    shutil.copytree(reference.out_dir, out)
    (out / "summary.json").unlink()
    ckpts = out / "checkpoints"
    assert Checkpointer(ckpts).steps() == [40, 50, 60]  # the last 3 are kept
    if damage == "truncated_arrays":
        for f in (ckpts / "60" / "arrays").rglob("*"):
            if f.is_file() and f.parent.name == "d":
                f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    else:
        (ckpts / "60" / "meta" / "metadata").write_text('{"iteration": 60, "upd')
    # a kill in the middle of a save leaves a temporary directory behind: never a candidate
    (ckpts / "64.orbax-checkpoint-tmp-123").mkdir()
    # ... and a kill in the middle of a metrics append leaves a partial row
    with (out / "metrics.csv").open("a") as f:
        f.write("1500,1250,9.9,0,-12")

    with pytest.warns(CheckpointWarning, match="checkpoints/60 is unusable"):
        run = resume(out)
    assert_same_run(run, reference)  # continued from iteration 50: the same 10 iterations again
    assert Checkpointer(ckpts).steps()[-1] == 60


def test_resume_with_a_config_that_does_not_fit_the_checkpoints_changes_nothing(reference, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(reference.out_dir, out)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(popjax.ConfigError, match="differs from the run's checkpoints .*pop_size: 4 vs 2.*nothing was"):
        resume(out, pop_size=4, pbt={"interval": 500, "quantile": 0.25})
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


@pytest.mark.slow
def test_independent_driver_resume_is_exact(tmp_path):
    """The base loop without driver state: cut after the evaluation at 1000 steps, resume, compare."""
    use_shared_xla_cache()  # same compiled programs as the PBT run (the driver does not change them)
    cfg = {**RUN, "driver": "independent"}
    full = popjax.train(out_dir=tmp_path / "full", **cfg)
    out = tmp_path / "cut"
    shutil.copytree(full.out_dir, out)
    ckpts = Checkpointer(out / "checkpoints")
    for step in ckpts.steps()[-2:]:
        ckpts.delete(step)
    ckpts.close()
    run = resume(out)
    for field in ("final_returns", "best_return", "env_steps", "updates", "hparams"):
        assert run.summary[field] == full.summary[field], field
    for a, b in zip(jax.tree.leaves(run.state), jax.tree.leaves(full.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert metric_rows(out) == metric_rows(full.out_dir)


@pytest.mark.slow
def test_resume_on_the_gym_path_continues_without_lost_or_duplicate_rows(tmp_path):
    """Host envs restart their episodes on resume, so only the bookkeeping is compared exactly."""
    use_shared_xla_cache()
    cfg = {**RUN, "env": "gym:Pendulum-v1"}
    full = popjax.train(out_dir=tmp_path / "full", **cfg)
    out = tmp_path / "cut"
    shutil.copytree(full.out_dir, out)
    (out / "summary.json").unlink()
    ckpts = Checkpointer(out / "checkpoints")
    for step in ckpts.steps()[-2:]:  # as if killed right after the evaluation at 1000 env steps
        ckpts.delete(step)
    ckpts.close()
    run = resume(out)
    rows = metric_rows(out)
    keys = [(r["env_steps"], r["member"]) for r in rows]
    assert keys == [(r["env_steps"], r["member"]) for r in metric_rows(full.out_dir)]
    assert run.summary["env_steps"] == 1500 and len(run.summary["lineage"]) == 2
    # everything up to the checkpoint is the same run
    assert rows[:8] == metric_rows(full.out_dir)[:8]


@pytest.mark.slow
def test_resume_on_brax_is_exact(tmp_path):
    """Brax env state (physics pipeline state) is restored too: resumed == uninterrupted, bit for bit."""
    use_shared_xla_cache()
    cfg = {**RUN, "env": "brax:inverted_pendulum", "total_env_steps": 1000, "warmup_steps": 200,
           "eval_interval": 200, "pbt": {"interval": 400, "quantile": 0.5}}
    full = popjax.train(out_dir=tmp_path / "full", **cfg)
    out = tmp_path / "cut"
    shutil.copytree(full.out_dir, out)
    (out / "summary.json").unlink()
    ckpts = Checkpointer(out / "checkpoints")
    for step in ckpts.steps()[-2:]:  # as if killed after the evaluation at 600 env steps
        ckpts.delete(step)
    ckpts.close()
    assert_same_run(resume(out), full, evaluations=5)
