"""Fixtures the test modules share."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from rundir_helpers import TINY

from popjax import compile_cache
from popjax.loop import Compiler

# The suite leaves the user's compile cache alone and shares one of its own, new for each pytest session, between
# its workers and the subprocesses they start: most of the suite's time is XLA compiling the same tiny programs
# again (a run and its resume, the same learner in several tests), and a program loaded from JAX's persistent cache
# is the one XLA compiled, so results are unchanged. Tests of the cache give their own folder.
_SHARED = "POPJAX_TEST_SUITE_CACHE"  # set by the process that made the folder (xdist's controller); workers inherit it
_MADE_HERE = _SHARED not in os.environ
if _MADE_HERE:
    os.environ[_SHARED] = tempfile.mkdtemp(prefix="popjax-suite-xla-")
SUITE_CACHE = Path(os.environ[_SHARED])
os.environ[compile_cache.ENV] = str(SUITE_CACHE)  # never the user's cache, whatever they set
compile_cache.enable()  # for the programs tests compile themselves, outside popjax.train


def pytest_unconfigure(config):
    if _MADE_HERE:  # the folder this process made, once every worker is done
        shutil.rmtree(SUITE_CACHE, ignore_errors=True)


@pytest.fixture
def compilers(monkeypatch) -> list[Compiler]:
    """Every Compiler created while the test runs (a loop's compile cache and trace counts)."""
    made, init = [], Compiler.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(Compiler, "__init__", recording_init)
    return made


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A tiny finished run (``rundir_helpers.TINY``), trained once per test module."""
    import popjax

    return popjax.train(out_dir=tmp_path_factory.mktemp("runs") / "run", **TINY)


@pytest.fixture
def run_copy(finished, tmp_path):
    """A copy of ``finished`` that the test may damage."""
    out = tmp_path / "run"
    shutil.copytree(finished.out_dir, out)
    return out
