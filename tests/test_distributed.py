"""Runs over several processes (``jax.distributed``) equal the one-process run on as many devices.

Every job here is 2 processes × 2 forced CPU devices on 127.0.0.1 (CPU collectives over
loopback, gloo), started as subprocesses of ``tests/distributed_job.py``; the reference is one
process with 4 forced devices. Every subprocess is bounded in time.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from popjax.distributed import free_local_port

pytestmark = pytest.mark.processes  # every test starts a job of subprocesses (make test-processes)

JOB = str(Path(__file__).with_name("distributed_job.py"))
LIMIT_S = 240  # any process still running by then is a hang: the test fails


def _env():
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    env.pop("XLA_FLAGS", None)
    return env


def start_job(out: Path, mode: str, driver: str, *extra_per_process, timeout_s: int = 30,
              started=(0, 1)) -> list[subprocess.Popen]:
    """Starts the ``started`` processes of a 2-process job; ``extra_per_process``: more argv of process 0, then 1."""
    out.mkdir(parents=True, exist_ok=True)
    port = free_local_port()
    procs = []
    for i in started:
        extra = list(extra_per_process[i]) if i < len(extra_per_process) else []
        argv = [sys.executable, JOB, str(out), mode, driver, "--devices", "2", "--job", f"127.0.0.1:{port}", "2",
                str(i), "--timeout", str(timeout_s), *extra]
        log = open(out / f"process{i}.{mode}.log", "w")  # noqa: SIM115 - closed with the process
        procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=_env()))
    return procs


def finish(procs: list[subprocess.Popen], out: Path, mode: str) -> list[int]:
    deadline = time.monotonic() + LIMIT_S
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"a process of the job hung ({mode}); logs in {out}")
    return codes


def log_of(out: Path, i: int, mode: str) -> str:
    return (out / f"process{i}.{mode}.log").read_text()


def run_job(out: Path, mode: str, driver: str) -> None:
    codes = finish(start_job(out, mode, driver), out, mode)
    assert codes == [0, 0], f"{codes}\n{log_of(out, 0, mode)[-3000:]}\n{log_of(out, 1, mode)[-3000:]}"


def run_single(out: Path, mode: str, driver: str, devices: int = 4, extra=()) -> subprocess.CompletedProcess:
    out.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, JOB, str(out), mode, driver, "--devices", str(devices), *extra],
                          capture_output=True, text=True, env=_env(), timeout=LIMIT_S)


def leaves(out: Path) -> list[np.ndarray]:
    with np.load(out / "state.npz") as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


def assert_same_state(a: Path, b: Path, tolerance: float = 0.0) -> None:
    """Leaf for leaf: the same programs on the same 4-device split, collectives over loopback instead of
    between the devices of one process, give the same bits, except where a collective sums floats (DvD's
    kernel): gloo adds in another order. ``tolerance``: the largest difference relative to the leaf's scale."""
    left, right = leaves(a), leaves(b)
    assert len(left) == len(right)
    for i, (x, y) in enumerate(zip(left, right, strict=True)):
        if tolerance == 0.0:
            np.testing.assert_array_equal(x, y, err_msg=f"leaf {i}")
        else:
            x, y = x.astype(np.float64), y.astype(np.float64)
            scale = max(1.0, float(np.nanmax(np.abs(x), initial=0.0)))
            np.testing.assert_allclose(x, y, rtol=0.0, atol=tolerance * scale, equal_nan=True, err_msg=f"leaf {i}")


# Measured: bit-identical for independent, PBT and CEM-RL; DvD within 2.2e-7 of the leaf scale.
DRIVERS = {"independent": 0.0, "pbt": 0.0, "cemrl": 0.0, "dvd": 1e-6}


class References(dict):
    """One process, 4 devices: the run of each driver the jobs are compared with (run when first asked for)."""

    def __init__(self, factory):
        super().__init__()
        self.factory = factory

    def __missing__(self, driver: str) -> Path:
        out = self.factory.mktemp(f"one-process-{driver}")
        done = run_single(out, "train", driver)
        assert done.returncode == 0, done.stderr[-3000:]
        self[driver] = out
        return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return References(tmp_path_factory)


# CEM-RL and DvD (about 40 s each) run with `make test-slow`; independent and PBT cover the job in the default suite.
@pytest.mark.parametrize("driver", [pytest.param(d, marks=[pytest.mark.slow] if d in ("cemrl", "dvd") else [])
                                    for d in DRIVERS])
def test_two_processes_equal_one_process(driver, reference, tmp_path):
    run_job(tmp_path, "train", driver)
    assert_same_state(reference[driver], tmp_path, DRIVERS[driver])
    summary = json.loads((tmp_path / "summary.out.json").read_text())
    expected = json.loads((reference[driver] / "summary.out.json").read_text())
    np.testing.assert_allclose(summary["final_returns"], expected["final_returns"], rtol=DRIVERS[driver] * 10)
    # process 0 wrote the run's files, once; the checkpoints are whole orbax steps
    run = tmp_path / "run"
    assert json.loads((run / "summary.json").read_text())["final_returns"] == expected["final_returns"]
    rows = (run / "metrics.csv").read_text().splitlines()
    assert len(rows) - 1 == len((reference[driver] / "run" / "metrics.csv").read_text().splitlines()) - 1 > 0
    steps = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert steps and all(name.isdigit() for name in steps), steps
    if driver == "pbt":  # members 0, 1 live on process 0 and 2, 3 on process 1: some copies cross over
        lineage = summary["lineage"]
        assert lineage == expected["lineage"]
        assert any(e["member"] // 2 != e["parent"] // 2 for e in lineage), lineage


def test_kill_and_resume_over_two_processes_is_exact(reference, tmp_path):
    procs = start_job(tmp_path, "train", "independent")
    checkpoints = tmp_path / "run" / "checkpoints"
    deadline = time.monotonic() + LIMIT_S
    while not (checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir())):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "no checkpoint before the end"
        time.sleep(0.05)
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    summary = tmp_path / "run" / "summary.json"
    assert not summary.exists()  # killed before the end
    run_job(tmp_path, "resume", "independent")
    assert_same_state(reference["independent"], tmp_path)
    # another number of processes cannot resume it: one line, nothing changed
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*") if p.is_file()}
    done = subprocess.run([sys.executable, "-m", "popjax", "resume", str(tmp_path / "run"), "--no-progress"],
                          capture_output=True, text=True, env=dict(_env(), XLA_FLAGS="--xla_force_host_platform_"
                                                                         "device_count=4"), timeout=LIMIT_S)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "written by 2 process(es); resume it with 2, not 1" in done.stderr
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*") if p.is_file()} == before


def test_a_process_that_dies_stops_the_other(tmp_path):
    start = time.monotonic()
    procs = start_job(tmp_path, "train", "independent", [], ["--exit-after-join"], timeout_s=5)
    codes = finish(procs, tmp_path, "train")
    elapsed = time.monotonic() - start
    assert codes[1] == 3 and codes[0] != 0, codes
    assert elapsed < 60, elapsed  # noticed by the heartbeats (5 s here), not a hang
    log = log_of(tmp_path, 0, "train")
    assert "another task died" in log, log[-2000:]
    assert not (tmp_path / "run" / "summary.json").exists()


def test_gymnasium_envs_are_stepped_by_each_process_for_its_members(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    gym = ["--env", "gym:Pendulum-v1", "--steps", "200"]
    done = run_single(one, "train", "independent", extra=gym)
    assert done.returncode == 0, done.stderr[-3000:]
    codes = finish(start_job(two, "train", "independent", gym, gym), two, "train")
    assert codes == [0, 0], log_of(two, 0, "train")[-3000:]
    assert_same_state(one, two)  # the same envs, seeded by their index in the job, give the same transitions
    returns = [json.loads((out / "summary.out.json").read_text())["final_returns"] for out in (one, two)]
    assert returns[0] == returns[1]


def test_a_process_whose_peers_never_join_stops(tmp_path):
    start = time.monotonic()
    procs = start_job(tmp_path, "train", "independent", timeout_s=5, started=(0,))  # process 1 never comes
    codes = finish(procs, tmp_path, "train")
    assert codes[0] != 0 and time.monotonic() - start < 60, codes
    log = log_of(tmp_path, 0, "train")
    assert "joining the job at 127.0.0.1" in log and "Terminating process" in log, log[-2000:]
    assert not (tmp_path / "run").exists()  # nothing written


def guide_job(index: int) -> tuple[dict[str, str], list[str]]:
    """Block ``index`` of the guide's "Many machines" (docs/devices.md), a loop starting one process per ``$i``:
    its environment assignments and its popjax argv, with ``$i`` left in, as written."""
    from docs_blocks import block, commands

    text = block("docs/devices.md", "Many machines", index).text
    assert text.startswith("for i in 0 1; do\n") and text.endswith("&\ndone\nwait\n"), text
    (command,) = commands(block("docs/devices.md", "Many machines", index))
    assert command.argv[-1] == "&", command.argv
    return command.env, command.argv[:-1]


def run_guide_job(tmp_path: Path, index: int, port: int, budget: list[str]) -> None:
    env, argv = guide_job(index)
    procs = []
    for i in (0, 1):
        words = [w.replace("$i", str(i)).replace("127.0.0.1:29500", f"127.0.0.1:{port}")
                 .replace("runs/pbt-two-processes", str(tmp_path / "run")) for w in argv]
        log = open(tmp_path / f"process{i}.guide{index}.log", "w")  # noqa: SIM115 - closed with the process
        procs.append(subprocess.Popen([sys.executable, "-m", "popjax", *words, *budget], stdout=log,
                                      stderr=subprocess.STDOUT, env=dict(_env(), **env), cwd=tmp_path))
    codes = finish(procs, tmp_path, f"guide{index}")
    logs = [log_of(tmp_path, i, f"guide{index}")[-3000:] for i in (0, 1)]
    assert codes == [0, 0], f"{codes}\n{logs[0]}\n{logs[1]}"


def test_the_guide_two_process_example_runs_and_resumes(tmp_path):
    """docs/devices.md "Many machines": the two-process train (with the job's devices as the default), then the
    resume of the same job; the resume of a finished run changes none of its rows."""
    _, argv = guide_job(0)
    assert "--devices" not in argv  # the job's devices are the default
    budget = ["--steps", "400", "--warmup", "100", "--eval-interval", "200", "--eval-episodes", "1",
              "--batch-size", "32", "--buffer-size", "1000", "--rollout-len", "20", "--timeout", "30"]  # last wins
    run_guide_job(tmp_path, 0, free_local_port(), budget)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert len(summary["final_returns"]) == 4
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert "devices: 4" in config, config
    rows = (tmp_path / "run" / "metrics.csv").read_text()
    run_guide_job(tmp_path, 1, free_local_port(), ["--timeout", "30"])
    assert (tmp_path / "run" / "metrics.csv").read_text() == rows
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["final_returns"] == summary["final_returns"]


STAND_IN_SRUN = """#!/bin/bash
# SLURM's srun on one machine: two tasks of one job, each with SLURM's variables and 4 forced CPU devices
# (8 in the job, as the script's --devices 8), the guide's command followed by the tiny flags in $TINY.
pids=()
for i in 0 1; do
  SLURM_JOB_ID=$JOB_ID SLURM_STEP_NODELIST=127.0.0.1 SLURM_NTASKS=2 SLURM_PROCID=$i SLURM_LOCALID=$i \
  XLA_FLAGS=--xla_force_host_platform_device_count=4 "$@" $TINY > "task$i.log" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
exit $status
"""


def slurm_job_id_with_a_free_port() -> int:
    """A SLURM job id whose coordinator port (JAX: job id % 4096 + 61440) is free on 127.0.0.1 now."""
    import socket

    for offset in range(4096):
        job_id = (os.getpid() + offset) % 4096  # apart from a job of another test process
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", job_id + 61440))
            except OSError:
                continue
            return job_id
    pytest.fail("no free port in JAX's SLURM range")


def test_the_guide_slurm_script_runs_under_a_stand_in_srun(tmp_path):
    """docs/devices.md's SLURM script, run by bash as written; srun is a stand-in that starts its two tasks on
    this machine, and the tiny flags put probe:pendulum in place of brax:halfcheetah (minutes of compilation)."""
    from docs_blocks import block

    script = block("docs/devices.md", "Many machines", 2).text
    assert script.startswith("#!/bin/bash\n#SBATCH") and "--distributed" in script
    (tmp_path / "job.sh").write_text(script)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(STAND_IN_SRUN)
    (bin_dir / "srun").chmod(0o755)
    job_id = slurm_job_id_with_a_free_port()
    tiny = ("--env probe:pendulum --steps 200 --warmup 50 --eval-interval 100 --eval-episodes 1 --batch-size 16 "
            "--buffer-size 200 --rollout-len 25 --learner-config hidden=[8] --timeout 60")
    env = dict(_env(), PATH=os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]]),
               JOB_ID=str(job_id), TINY=tiny)
    result = subprocess.run(["bash", "job.sh"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=LIMIT_S)
    logs = [(tmp_path / f"task{i}.log").read_text()[-3000:] for i in (0, 1)]
    assert result.returncode == 0, f"{result.stderr}\n{logs[0]}\n{logs[1]}"
    summary = json.loads((tmp_path / "runs" / "pbt-cheetah" / "summary.json").read_text())
    assert len(summary["final_returns"]) == 64 and summary["env"] == "probe:pendulum"
    assert "devices: 8" in (tmp_path / "runs" / "pbt-cheetah" / "config.yaml").read_text()
    assert "joined as process 1 of 2, 4 of the job's 8 devices here" in logs[1]
