"""T12: the population sharded over 2 (forced host) devices trains exactly like one device."""

import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    import popjax
    assert len(jax.devices()) == 2, jax.devices()
    common = dict(learner="td3", env="probe:pendulum", pop_size=4, total_env_steps=300, rollout_len=50,
                  warmup_steps=100, eval_interval=300, eval_episodes=1, batch_size=16, buffer_size=500,
                  learner_config={"hidden": [8, 8]}, progress=False)
    one = popjax.train(out_dir=sys.argv[1] + "/one", devices=1, **common)
    two = popjax.train(out_dir=sys.argv[1] + "/two", devices=2, **common)
    leaf = jax.tree.leaves(two.state.learner)[0]
    diffs = [float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
             for a, b in zip(jax.tree.leaves(one.state.learner), jax.tree.leaves(two.state.learner))]
    print(json.dumps({"devices_used": len(leaf.sharding.device_set), "max_diff": max(diffs),
                      "one": one.summary["final_returns"], "two": two.summary["final_returns"]}))
""")


def test_two_devices_match_one_device(tmp_path):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["devices_used"] == 2  # the member axis really is split
    assert result["max_diff"] < 1e-4
    assert len(result["one"]) == len(result["two"]) == 4
    assert max(abs(a - b) for a, b in zip(result["one"], result["two"], strict=True)) < 1e-2
