"""Fixtures the test modules share."""

from __future__ import annotations

import pytest

from popjax.loop import Compiler


@pytest.fixture
def compilers(monkeypatch) -> list[Compiler]:
    """Every Compiler created while the test runs (a loop's compile cache and trace counts)."""
    made, init = [], Compiler.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(Compiler, "__init__", recording_init)
    return made
