"""What a logger is: where a run's metrics rows, summary and tables also go, besides its run directory's files.

A run names its loggers in its config (``logger: [tensorboard, wandb]``). Each is a ``LoggerDef`` in
``popjax.registry.LOGGERS``: the package it needs (a missing one is refused before anything is written), how to
install it, the files it writes inside the run directory (``overwrite`` removes them, and nothing else), and
``make``, which opens a ``Logger`` for one run. Only the process that writes the run (process 0) logs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


class Logger:
    """One run's logger; the loop calls ``rows`` after each append to metrics.csv, then ``finish`` and ``close``."""

    def rows(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """The rows just appended to metrics.csv (``env_steps``, ``updates``, ``wall_s``, ``member``, ...)."""

    def finish(self, summary: Mapping[str, Any], tables: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
        """The run's summary (as in summary.json) and tables (``{file name: rows}``, e.g. lineage.csv)."""

    def close(self) -> None:
        """Flushes and releases what the logger holds (also after a failed run)."""


@dataclasses.dataclass(frozen=True)
class LoggerDef:
    """A logger a run config may name.

    Attributes:
      name: the name in ``logger: [...]``.
      make: ``(run directory, the run's config as plain values) -> Logger``; imports ``package``.
      package: the module the logger imports.
      install: what installs ``package`` (shown when it is missing).
      outputs: ``{folder of the run directory: glob patterns}`` of what the logger writes there.
      check: ``(the run's config as plain values) -> None``, raising a one-line ``ConfigError`` for settings the
        logger cannot start with (read only: it runs before anything is written); None: nothing to check.
    """

    name: str
    make: Callable[[Path, Mapping[str, Any]], Logger]
    package: str
    install: str
    outputs: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    check: Callable[[Mapping[str, Any]], None] | None = None
