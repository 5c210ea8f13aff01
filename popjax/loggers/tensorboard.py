"""TensorBoard: every numeric metrics column as ``member_<m>/<column>`` at the row's env step, in
``<run_dir>/tensorboard/``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from popjax.loggers.base import Logger, LoggerDef

FOLDER = "tensorboard"


class TensorBoardLogger(Logger):
    def __init__(self, path: Path, config: Mapping[str, Any]):
        del config
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(str(path / FOLDER))

    def rows(self, rows: Sequence[Mapping[str, Any]]) -> None:
        for row in rows:
            step = int(row["env_steps"])
            for name, value in row.items():
                if name not in ("env_steps", "member") and isinstance(value, int | float):
                    self.writer.add_scalar(f"member_{int(row['member'])}/{name}", value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


DEFINITION = LoggerDef(name="tensorboard", make=TensorBoardLogger, package="tensorboardX",
                       install="pip install tensorboardX", outputs={FOLDER: ("events.out.tfevents.*",)})
