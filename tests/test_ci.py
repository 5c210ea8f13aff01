"""``.ci/run`` (issue 49): `make test-long`, the central checks, runs after `make test` whatever the time and
whatever `make test` gave; `make test-processes` runs while the job has time, and a skip is printed."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ci(tmp_path, failing="", **env):
    """Runs .ci/run with a ``make`` that only records its target (and fails for ``failing``)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "make"
    fake.write_text(f'#!/usr/bin/env bash\necho "$1" >> {tmp_path / "targets"}\n[ "$1" != "{failing}" ]\n')
    fake.chmod(0o755)
    (tmp_path / "targets").unlink(missing_ok=True)
    done = subprocess.run(["bash", str(ROOT / ".ci" / "run")], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", **env})
    return done, (tmp_path / "targets").read_text().split()


def test_ci_always_runs_the_long_group_and_says_when_it_skips_one(tmp_path):
    done, targets = _ci(tmp_path)
    assert done.returncode == 0 and targets == ["test", "test-long", "test-processes"]
    done, targets = _ci(tmp_path, PROCESSES_IF_UNDER_S="0", LONG_IF_UNDER_S="0")  # no time left: long still runs
    assert done.returncode == 0 and targets == ["test", "test-long"]
    assert ".ci/run: SKIPPED make test-processes" in done.stdout
    done, targets = _ci(tmp_path, failing="test")  # a failed default group: the others still run, the job fails
    assert done.returncode == 1 and targets == ["test", "test-long", "test-processes"]
    done, targets = _ci(tmp_path, failing="test-long")
    assert done.returncode == 1 and targets == ["test", "test-long", "test-processes"]
