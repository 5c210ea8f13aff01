"""Fixtures the test modules share."""

from __future__ import annotations

import os
import shutil

import pytest
from rundir_helpers import TINY

from popjax.loop import Compiler

# The suite leaves the user's compile cache alone (and every test compiles afresh): tests of the cache give their
# own folder (popjax.compile_cache); subprocesses inherit this.
os.environ.setdefault("POPJAX_COMPILE_CACHE", "off")


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
