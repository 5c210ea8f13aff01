"""Acting overlapped with learning on the gymnasium path: one iteration of policy lag, deterministic.

With ``overlap`` the envs of iteration t+1 are stepped with a snapshot of the acting parameters
taken before the update of iteration t, on a device of their own (a device runs one program at
a time), so the update runs while the host steps the envs. Runs in a subprocess: the extra host
device must exist before JAX starts.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import popjax

SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    import popjax
    from popjax.loop import Loop
    opts = dict(learner="td3", env="gym:Pendulum-v1", pop_size=2, total_env_steps=300, warmup_steps=100,
                rollout_len=50, eval_interval=150, eval_episodes=1, batch_size=16, buffer_size=1000,
                learner_config={"hidden": [8, 8]}, progress=False, preset="none")
    # Which parameters did each rollout act with? The sum of the first actor kernel, per iteration.
    acted = []
    interact = Loop._host_interact
    def recording(self, key, act, state):
        acted.append(float(np.asarray(jax.tree.leaves(state.learner.actor)[0]).sum()))
        return interact(self, key, act, state)
    Loop._host_interact = recording
    learner_after = []
    step = Loop.step
    def stepping(self, state, env_state):
        out = step(self, state, env_state)
        learner_after.append(float(np.asarray(jax.tree.leaves(out[0].learner.actor)[0]).sum()))
        return out
    Loop.step = stepping
    out = sys.argv[1]
    results = {}
    # overlap first: its acting device must be added before anything starts JAX
    for name, overlap in (("overlap", True), ("again", True), ("plain", False)):
        acted.clear(); learner_after.clear()
        run = popjax.train(out_dir=f"{out}/{name}", overlap=overlap, **opts)
        leaves = [np.asarray(x).tolist() for x in jax.tree.leaves(run.state.learner)]
        results[name] = {"acted": list(acted), "after": list(learner_after), "leaves_hash": hash(str(leaves)),
                         "updates": run.summary["updates"], "env_steps": run.summary["env_steps"],
                         "devices": len(jax.devices())}
    extended = popjax.resume(f"{out}/overlap", total_env_steps=400)  # the snapshot comes from the checkpoint
    results["extended"] = {"env_steps": extended.summary["env_steps"], "updates": extended.summary["updates"]}
    print(json.dumps(results))
""")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)  # popjax itself asks for the acting device
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path_factory.mktemp("overlap"))],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.processes
def test_overlap_acts_with_the_parameters_of_one_iteration_earlier(runs):
    plain, overlap = runs["plain"], runs["overlap"]
    assert overlap["devices"] == 2  # the acting device was added before JAX started
    # without overlap iteration t acts with the parameters after update t-1; with overlap, after update t-2
    assert plain["acted"][1:] == plain["after"][:-1]
    assert overlap["acted"][2:] == overlap["after"][:-2] and overlap["acted"][1] == overlap["acted"][0]
    assert overlap["updates"] == plain["updates"] and overlap["env_steps"] == plain["env_steps"] == 300


@pytest.mark.processes
def test_an_overlapped_run_resumes_and_extends(runs):
    assert runs["extended"] == {"env_steps": 400, "updates": runs["overlap"]["updates"] + 100}


@pytest.mark.processes
def test_overlap_is_deterministic(runs):
    assert runs["overlap"]["leaves_hash"] == runs["again"]["leaves_hash"]
    assert runs["overlap"]["acted"] == runs["again"]["acted"]
    assert runs["overlap"]["leaves_hash"] != runs["plain"]["leaves_hash"]  # the lag changes the run


def test_overlap_on_a_jax_env_is_a_one_line_error(tmp_path):
    with pytest.raises(popjax.ConfigError, match="overlap: only the gymnasium path"):
        popjax.train(out_dir=tmp_path / "run", env="probe:pendulum", overlap=True)
    assert not (tmp_path / "run").exists()
