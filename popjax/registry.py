"""The registries: name -> definition of every learner, driver, replay source and logger.

They live here, below every module that reads them (the run configuration checks names and combinations against
them), and are filled from above: ``popjax.learners``, ``popjax.drivers``, ``popjax.buffers`` and
``popjax.loggers`` add the built-in entries when imported (``import popjax`` imports them all), and their
``register`` functions add one from a script. Entries are data (``LearnerDef``, ``DriverDef``, ``SourceDef``,
``LoggerDef``): what a run may combine is read from
them, never from names.
"""

from __future__ import annotations

from typing import Any

LEARNERS: dict[str, Any] = {}  # name -> popjax.learners.base.LearnerDef
DRIVERS: dict[str, Any] = {}  # name -> popjax.drivers.base.DriverDef
SOURCES: dict[str, Any] = {}  # name -> popjax.buffers.sources.SourceDef
LOGGERS: dict[str, Any] = {}  # name -> popjax.loggers.base.LoggerDef


def add(table: dict[str, Any], definition: Any, what: str, taken: frozenset[str] = frozenset()) -> Any:
    """Adds ``definition`` to ``table`` under its ``name``, which must be new (and not in ``taken``)."""
    if definition.name in table or definition.name in taken:
        raise ValueError(f"{what} name {definition.name!r} is taken")
    table[definition.name] = definition
    return definition
