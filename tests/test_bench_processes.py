"""``popjax bench update --processes P``: the population update over P local processes (``jax.distributed``,
CPU collectives over loopback) against 1 process with as many devices, its checks, its report, and that
no worker outlives the study or its time limit."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from popjax_bench import report, update

ROOT = Path(__file__).resolve().parents[1]
LIMIT_S = 300  # any run still going by then is a hang: the test fails


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), str(ROOT / "benchmarks"),  # this checkout's popjax and popjax_bench
                            *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])])
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=path)
    env.pop("XLA_FLAGS", None)
    return env


def workers(parent: psutil.Process) -> list[psutil.Process]:
    """The ``update_worker`` processes among ``parent``'s descendants."""
    found = []
    for child in parent.children(recursive=True):
        try:
            if "popjax_bench.update_worker" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:  # gone meanwhile
            pass
    return found


def positive(x) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


@pytest.mark.processes
def test_update_over_two_processes_against_one(tmp_path):
    argv = [sys.executable, "-m", "popjax", "bench", "update", "--learner", "td3", "--pop", "4", "--processes", "2",
            "--impl", "vmap", "--hidden", "8,8", "--batch-size", "8", "--repeats", "10", "--min-time", "0",
            "--allow-busy", "--out", str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=LIMIT_S, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((tmp_path / "update.json").read_text())
    assert data["params"]["processes"] == 2 and data["params"]["devices_per_process"] == [1]
    rows = {r["processes"]: r for r in data["results"]}
    assert sorted(rows) == [1, 2] and all("skipped" not in r for r in rows.values()), data["results"]
    one, two = rows[1], rows[2]
    # the same split, 2 devices: 1 process × 2 devices against 2 processes × 1 device
    assert (one["devices"], one["devices_per_process"]) == (2, 2)
    assert (two["devices"], two["devices_per_process"]) == (2, 1)
    for r in (one, two):
        assert r["impl"] == "vmap" and r["pop"] == 4 and r["learner"] == "td3"
        assert positive(r["ms_per_pop_step"]) and r["ms_per_pop_step_iqr"] >= 0 and positive(r["compile_s"])
        assert r["timing"]["repeats"] >= 10 and len(r["timing"]["per_process_median_s"]) == r["processes"]
        assert r["hlo_collectives"] == {}  # independent members: nothing crosses devices during a step
        assert positive(r["fetch_ms"])
    assert two["vs_one_process"] == pytest.approx(two["ms_per_pop_step"] / one["ms_per_pop_step"])
    assert one["vs_one_process"] == 1.0 and two["one_process_ms"] == one["ms_per_pop_step"]
    share = (two["ms_per_pop_step"] - one["ms_per_pop_step"]) / two["ms_per_pop_step"]
    assert two["communication_share"] == pytest.approx(max(0.0, share))
    assert any(n.startswith("communication: the compiled update has no collective ops") for n in data["notes"])
    assert data["ceilings"]["layers"] and all(positive(r["gflops"]) for r in data["ceilings"]["layers"])
    assert (tmp_path / "update.png").stat().st_size > 1000
    text = report.write_report(tmp_path, tmp_path / "RESULTS.md").read_text()
    assert "could not summarise" not in text
    assert "| N | devices | processes | popjax |" in text and "| processes × devices |" in text
    assert "| 4 | 2 | vmap | 1 × 2 |" in text and "| 4 | 2 | vmap | 2 × 1 |" in text
    assert f"| {two['vs_one_process']:.2f}× |" in text


@pytest.mark.parametrize(("argv", "message"), [
    (["--processes", "0"], "--processes: must be >= 1, got 0"),
    (["--processes", "1.5"], "--processes: expected an integer, got '1.5'"),
    (["--processes", "2", "--impl", "vmap,jax_seq"], "--impl: jax_seq run(s) member after member on one device of "
                                                      "one process; with --processes 2 give vmap and/or vmap_scan"),
])
def test_bad_processes_options_are_one_line_errors(argv, message, tmp_path, capsys):
    from popjax import cli

    assert cli.main(["bench", "update", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.strip() == f"popjax bench update: error: {message}", err
    assert not list(tmp_path.iterdir())  # nothing measured or written


def test_processes_defaults():
    assert update.Options().implementations == update.IMPLS  # one process: every implementation
    assert update.Options(processes=2).implementations == ("vmap", "vmap_scan")
    assert update.Options(processes=2, devices=(1, 2)).devices_needed() == [1]  # the jobs force their own
    with pytest.raises(ValueError, match="--processes: must be >= 1"):
        update.run(processes=0)


def _payload(results: list[dict]) -> dict:
    return {"params": {"repeats": 10, "torch_threads": [1], "problems": {"td3": {"k": 2, "config": {}}}},
            "results": results, "notes": [], "started_utc": "-", "finished_utc": "-",
            "machine": {"backend": "cpu", "device_count": 1, "xla_flags": ""}}


def test_report_has_processes_columns_only_for_a_processes_study():
    row = {"learner": "td3", "impl": "vmap", "pop": 4, "devices": 2, "ms_per_pop_step": 1.0}
    plain = "\n".join(report.section_update(_payload([row])))
    assert "processes" not in plain and "| N | devices | popjax |" in plain
    rows = [row | {"processes": 1, "devices_per_process": 2, "vs_one_process": 1.0, "hlo_collectives": {}},
            row | {"processes": 2, "devices_per_process": 1, "ms_per_pop_step": 1.5, "vs_one_process": 1.5,
                   "communication_share": 1 / 3, "hlo_collectives": {"all-reduce": 2}, "fetch_ms": 0.5},
            {"learner": "td3", "impl": "vmap", "pop": 3, "devices": 2, "processes": 2, "skipped": "no"}]
    text = "\n".join(report.section_update(_payload(rows)))
    assert "| N | devices | processes | popjax |" in text
    assert "| 4 | 2 | vmap | 2 × 1 | 1.500 | — | 1.50× | 33% | 2 all-reduce | 0.500 |" in text
    assert "| 4 | 2 | vmap | 1 × 2 | 1.000 | — | 1.00× | — | none | — |" in text
    assert "vmap N=3 d=2 P=2 (no)" in text


@pytest.mark.processes
def test_no_worker_outlives_its_time_limit(tmp_path):
    options = update.Options(learners=("td3",), pops=(4,), impls=("vmap",), hidden=(8,), batch_size=4, processes=2)
    start = time.monotonic()
    data, failure = update.run_job(options, [4], 2, 1, False, tmp_path, timeout_s=2)
    assert failure == "the job of 2 process(es) did not finish within 2s" and data is None
    assert time.monotonic() - start < 30
    assert not workers(psutil.Process())


@pytest.mark.processes
def test_workers_stop_when_the_study_is_killed(tmp_path):
    """A study killed outright (no clean-up of its own) leaves no worker behind: they watch their parent."""
    code = ("import sys; from pathlib import Path; from popjax_bench import update; "
            "o = update.Options(learners=('td3',), pops=(4,), impls=('vmap',), hidden=(8,), batch_size=4, "
            "processes=2); update.run_job(o, [4], 2, 1, False, Path(sys.argv[1]))")
    study = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    started: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while len(started) < 2:
            assert time.monotonic() < deadline and study.poll() is None, "the workers did not start"
            started = workers(psutil.Process(study.pid))
            time.sleep(0.1)
        study.send_signal(signal.SIGKILL)
        study.wait(timeout=30)
        _, alive = psutil.wait_procs(started, timeout=20)
        assert not alive, [p.pid for p in alive]
    finally:
        for proc in [study, *started]:
            try:
                proc.kill()
            except (psutil.Error, ProcessLookupError):
                pass
