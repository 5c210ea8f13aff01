"""Every driver on several devices equals its one-device run (T12), on both parallel paths.

One subprocess with 4 forced CPU devices trains each registered driver on 1 device, then
split over 2 and 4 devices with ``parallel="sharding"`` (the compiler splits the member axis)
and, for the drivers that support it, ``parallel="pmap"`` (one program per device). The
results agree leaf for leaf within a float tolerance: with the member axis split, XLA runs
the same arithmetic in other batch shapes and sums the shared critic's mean gradient across
devices, so the rounding differs. Measured, relative to each leaf's scale: at most 6e-7 for
independent, PBT and DvD (~150 Adam steps); CEM-RL's actors differ by 2e-5 after training and
its 200-step fitness episodes amplify that in the shared buffer's transitions (pendulum
dynamics) to 3.5e-4, hence its looser bound. The gymnasium path is checked once
(independent, 2 devices, pmap).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.processes  # one subprocess with 4 forced devices (make test-processes)

SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    import popjax
    from popjax.drivers import DRIVERS
    assert len(jax.devices()) == 4, jax.devices()
    BASE = dict(learner="td3", env="probe:pendulum", pop_size=4, seed=2, total_env_steps=200, warmup_steps=50,
                rollout_len=25, eval_interval=100, eval_episodes=1, batch_size=16, buffer_size=1000,
                learner_config={"hidden": [8, 8]}, progress=False)
    OVERRIDES = {"pbt": {"pbt": {"interval": 100, "quantile": 0.25}},
                 "cemrl": {"total_env_steps": 400, "eval_interval": 200, "buffer_size": 2000, "update_ratio": 0.125,
                           "cemrl": {"updates_per_call": 25}},
                 "dvd": {"dvd": {"weight_source": "bandit", "bandit_random": 1}},
                 "hts": {"learner": "dqn", "env": "gym:popjax/HtsToy-v0", "hts": {"alpha": 25, "executors": 4}}}

    def compare(ref, run):
        def rel(a, b):
            a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
            return float(np.max(np.abs(a - b), initial=0.0) / max(1.0, float(np.max(np.abs(a), initial=0.0))))
        leaves = jax.tree.leaves(run.state)
        return {"devices_used": max(len(x.sharding.device_set) for x in leaves),
                "same_structure": jax.tree.structure(run.state) == jax.tree.structure(ref.state),
                "leaf_diff": max(rel(a, b) for a, b in zip(jax.tree.leaves(ref.state), leaves)),
                "return_diff": max(abs(a - b) for a, b in zip(ref.summary["final_returns"],
                                                              run.summary["final_returns"])),
                "same_counts": [run.summary[k] for k in ("env_steps", "updates")] ==
                               [ref.summary[k] for k in ("env_steps", "updates")]}

    out, report = sys.argv[1], {}
    for name in sorted(DRIVERS):
        opts = {**BASE, **OVERRIDES.get(name, {}), "driver": name}
        ref = popjax.train(out_dir=f"{out}/{name}-1", **opts)
        paths = ["sharding"] + (["pmap"] if DRIVERS[name].pmap else [])
        for parallel in paths:
            for d in (2, 4):
                run = popjax.train(out_dir=f"{out}/{name}-{parallel}{d}", devices=d, parallel=parallel, **opts)
                report[f"{name}/{parallel}/{d}"] = compare(ref, run)
    gym = {**BASE, "env": "gym:Pendulum-v1", "total_env_steps": 100, "eval_interval": 100}
    ref = popjax.train(out_dir=f"{out}/gym-1", **gym)
    report["independent-gym/pmap/2"] = compare(ref, popjax.train(out_dir=f"{out}/gym-2", devices=2, parallel="pmap",
                                                                **gym))
    print(json.dumps(report))
""")


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    out = tmp_path_factory.mktemp("devices")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(out)], capture_output=True, text=True, env=env,
                          timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_driver_runs_split_over_2_and_4_devices_on_each_path(report):
    from popjax.drivers import DRIVERS

    expected = {f"{name}/{path}/{d}" for name, definition in DRIVERS.items()
                for path in ("sharding", "pmap") if path == "sharding" or definition.pmap for d in (2, 4)}
    assert expected <= set(report)
    assert {k.split("/")[0] for k in report if k.endswith("pmap/2")} >= {"independent", "pbt", "dvd"}
    for key, result in report.items():
        assert result["devices_used"] == int(key.rsplit("/", 1)[1]), key  # the members really are split
        assert result["same_structure"] and result["same_counts"], key


TOLERANCE = {"cemrl": 2e-3}  # relative to the leaf's scale; see the module docstring


def test_results_equal_the_one_device_run_within_float_tolerance(report):
    for key, result in report.items():
        assert result["leaf_diff"] < TOLERANCE.get(key.split("/")[0], 1e-5), (key, result)
        assert result["return_diff"] < 1e-2, (key, result)  # returns of about -1500
