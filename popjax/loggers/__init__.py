"""The loggers a run config may name (``logger: [tensorboard, wandb]``); the registry is
``popjax.registry.LOGGERS``. A new logger is a module with a ``Logger`` and its ``LoggerDef``, and one
``register`` line (see ``popjax.loggers.base``)."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from popjax import registry
from popjax.config import ConfigError
from popjax.loggers import tensorboard, wandb
from popjax.loggers.base import Logger, LoggerDef
from popjax.registry import LOGGERS


def register(definition: LoggerDef) -> LoggerDef:
    """Adds a logger defined outside popjax; its name must be new."""
    return registry.add(LOGGERS, definition, "logger")


for _definition in (tensorboard.DEFINITION, wandb.DEFINITION):
    register(_definition)


def check_installed(names: Iterable[str], config: Mapping[str, Any] | None = None) -> None:
    """A one-line ConfigError for a logger whose package cannot be imported, or whose settings it cannot start with
    (``LoggerDef.check``, given the run's config); run before anything is written."""
    for name in names:
        definition = LOGGERS[name]
        try:
            importlib.import_module(definition.package)
        except ImportError:
            raise ConfigError(f"logger: {name} is not installed ({definition.install})") from None
        if definition.check is not None:
            definition.check(dict(config or {}))


def open_loggers(names: Iterable[str], path: Path, config: Mapping[str, Any]) -> list[Logger]:
    """The run's loggers, opened in the order named (a failure closes the ones already open)."""
    opened: list[Logger] = []
    try:
        for name in names:
            opened.append(LOGGERS[name].make(Path(path), config))
    except BaseException:
        close_loggers(opened)
        raise
    return opened


def close_loggers(loggers: Iterable[Logger]) -> None:
    for logger in loggers:
        logger.close()


__all__ = ["LOGGERS", "Logger", "LoggerDef", "check_installed", "close_loggers", "open_loggers", "register"]
