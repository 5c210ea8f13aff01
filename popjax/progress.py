"""A rich progress bar for training: env steps, steps/s, best and median return, ETA."""

from __future__ import annotations

import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class TrainProgress:
    """Context manager; a no-op when ``enabled`` is False (tests, CI logs)."""

    def __init__(self, total_steps: int, enabled: bool = True, start: int = 0):
        self.enabled = enabled
        self.returns = "best –  median –"
        self._progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("env steps/member"),
            TextColumn("{task.fields[rate]}"), TextColumn("{task.fields[returns]}"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            disable=not enabled,
        )
        self._task = self._progress.add_task("train", total=total_steps, completed=start, rate="", returns=self.returns)

    def __enter__(self):
        self._progress.start()
        return self

    def __exit__(self, *exc):
        self._progress.stop()

    def advance_to(self, env_steps: int) -> None:
        task = self._progress.tasks[0]
        speed = task.speed
        rate = f"{speed:,.0f} steps/s" if speed else ""
        self._progress.update(self._task, completed=env_steps, rate=rate, returns=self.returns)

    def update_returns(self, returns: np.ndarray) -> None:
        finite = returns[np.isfinite(returns)]
        if finite.size:
            self.returns = f"best {finite.max():.1f}  median {np.median(finite):.1f}"
