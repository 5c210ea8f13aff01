"""``make install ACCEL=cpu|cuda12|cuda13``: what can be checked without a GPU. Each accelerator resolves its own
pinned requirement set, every set pins the CPU lock's jax (and a CUDA plugin of that very version), the environment
remembers its accelerator so that later targets reuse it, another ACCEL installs afresh, and a bad ACCEL is one
line. ``make -n`` prints the commands without running them; a temporary VENV keeps the repository's alone."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def make_n(*args: str, venv: Path) -> subprocess.CompletedProcess:
    # Under `make test` the suite inherits the outer make's MAKEFLAGS/MAKELEVEL, which make a nested make print
    # "Entering directory" lines: run it as a user would, from a plain shell.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")}
    return subprocess.run(["make", "-n", *args, f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=env)


def pins(path: Path) -> dict[str, str]:
    """``{name: version}`` of a lock file, the files it includes with ``-r`` first (a name pinned twice fails)."""
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            included = pins(path.parent / line[3:].strip())
            assert not set(included) & set(found), path
            found |= included
        elif line:
            name, version = line.split("==")
            key = re.sub(r"[-_.]+", "-", name).lower()
            assert key not in found, f"{name} pinned twice in {path}"
            found[key] = version
    return found


@pytest.mark.parametrize("accel", ["cuda12", "cuda13"])
def test_each_accelerator_resolves_its_lock_with_the_cpu_locks_jax(accel, tmp_path):
    cpu, gpu = pins(ROOT / "requirements.lock"), pins(ROOT / f"requirements-{accel}.lock")
    assert {k: gpu[k] for k in cpu} == cpu  # the CPU set, unchanged, inside the GPU set
    assert gpu["jax"] == gpu["jaxlib"] == gpu[f"jax-{accel}-plugin"] == gpu[f"jax-{accel}-pjrt"] == cpu["jax"]
    assert any(k.startswith("nvidia-cudnn") for k in gpu)
    commands = make_n("install", f"ACCEL={accel}", venv=tmp_path / "venv")
    assert commands.returncode == 0, commands.stderr
    assert f"pip install -q -r requirements-{accel}.lock" in commands.stdout
    assert "requirements.lock\n" not in commands.stdout.replace(f"requirements-{accel}.lock", "")
    assert f"echo {accel} > {tmp_path / 'venv'}/.accelerator" in commands.stdout
    assert ("torch==2.13.0+cu128" in commands.stdout) == (accel == "cuda12")  # cuda13: torch is in its lock
    assert ("torch" in gpu) == (accel == "cuda13") and "torch==2.13.0+cpu" not in commands.stdout


def test_the_default_is_cpu_and_a_bad_accelerator_is_one_line(tmp_path):
    commands = make_n("install", venv=tmp_path / "venv")
    assert "pip install -q -r requirements.lock" in commands.stdout and "torch==2.13.0+cpu" in commands.stdout
    assert f"echo cpu > {tmp_path / 'venv'}/.accelerator" in commands.stdout
    # a known word beside another (its recipe starts by removing the environment) is refused like an unknown one
    for accel in ("rocm", "cpu bogus", "cuda12 cpu", " "):
        bad = make_n("install", f"ACCEL={accel}", venv=tmp_path / "venv")
        assert bad.returncode == 2 and bad.stdout == "" and "rm -rf" not in bad.stdout
        assert bad.stderr.strip().count("\n") == 0
        assert f"ACCEL: unknown accelerator '{accel.strip()}' (allowed: cpu, cuda12, cuda13)" in bad.stderr


def _installed(venv: Path, accel: str | None) -> None:
    """A venv as ``make install`` leaves it (newer than every file its stamp depends on)."""
    (venv / "bin").mkdir(parents=True)
    if accel is not None:
        (venv / ".accelerator").write_text(accel + "\n")
    (venv / ".installed").touch()


def test_later_targets_reuse_the_environments_accelerator_and_another_one_reinstalls(tmp_path):
    venv = tmp_path / "venv"
    _installed(venv, "cuda12")
    reuse = make_n("test", venv=venv)  # no ACCEL: the environment's own, nothing to install
    assert reuse.returncode == 0 and "pip install" not in reuse.stdout and "pytest" in reuse.stdout
    assert "pip install" not in make_n("bench-accelerator", "ACCEL=cuda12", venv=venv).stdout
    switch = make_n("test", "ACCEL=cpu", venv=venv)
    assert f'if [ -e {venv}/.installed ] && [ "cuda12" != "cpu" ]; then rm -rf {venv}; fi' in switch.stdout
    assert "pip install -q -r requirements.lock" in switch.stdout and "pytest" in switch.stdout
    old = tmp_path / "old"  # made before environments remembered their accelerator: a CPU one
    _installed(old, None)
    assert "pip install" not in make_n("test", venv=old).stdout
    assert "requirements-cuda13.lock" in make_n("install", "ACCEL=cuda13", venv=old).stdout
