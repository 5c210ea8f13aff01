"""Training progress: env steps, steps/s, best and median return, ETA.

On a terminal (or in Jupyter) a rich progress bar; elsewhere (CI logs, ``nohup``, output to a file), where a bar
would be cut to the console's 80 columns, complete plain lines: one after every evaluation and at least one every
``interval_s`` seconds, and a last one when training stops.
"""

from __future__ import annotations

import time
from datetime import timedelta

import numpy as np
from rich import get_console
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def _clock(seconds: float | None) -> str:
    return "-:--:--" if seconds is None else str(timedelta(seconds=round(seconds)))


class TrainProgress:
    """Context manager; a no-op when ``enabled`` is False (tests, ``--no-progress``).

    ``console``: where it writes (default rich's console, on stdout); a bar when it is a terminal or Jupyter,
    plain lines otherwise. ``interval_s``: the most seconds between two plain lines.
    """

    def __init__(self, total_steps: int, enabled: bool = True, start: int = 0, console: Console | None = None,
                 interval_s: float = 30.0):
        self.enabled = enabled
        self.total = total_steps
        self.returns = "best –  median –"
        self.console = console or get_console()
        self.plain = enabled and not (self.console.is_terminal or self.console.is_jupyter)
        self.interval_s = interval_s
        self._best_median: tuple[float, float] | None = None
        self._evaluated = False
        self._steps = self._start = start
        self._t0 = self._last_t = time.monotonic()
        self._last_steps = start
        self._progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("env steps/member"),
            TextColumn("{task.fields[rate]}"), TextColumn("{task.fields[returns]}"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=self.console, disable=not enabled or self.plain,
        )
        self._task = self._progress.add_task("train", total=total_steps, completed=start, rate="", returns=self.returns)

    def __enter__(self):
        self._t0 = self._last_t = time.monotonic()
        self._progress.start()
        return self

    def __exit__(self, *exc):
        self._progress.stop()
        if self.plain and (self._steps != self._last_steps or self._evaluated):
            self._line()

    def advance_to(self, env_steps: int) -> None:
        self._steps = env_steps
        if self.plain:
            if self._evaluated or time.monotonic() - self._last_t >= self.interval_s:
                self._line()
            return
        task = self._progress.tasks[0]
        speed = task.speed
        rate = f"{speed:,.0f} steps/s" if speed else ""
        self._progress.update(self._task, completed=env_steps, rate=rate, returns=self.returns)

    def update_returns(self, returns: np.ndarray) -> None:
        finite = returns[np.isfinite(returns)]
        if finite.size:
            self._best_median = float(finite.max()), float(np.median(finite))
            self.returns = f"best {self._best_median[0]:.1f}  median {self._best_median[1]:.1f}"
        self._evaluated = True

    def _line(self) -> None:
        """One complete plain line (never wrapped or cut): steps, rate since the last line, returns, times."""
        now = time.monotonic()
        steps, dt = self._steps - self._last_steps, now - self._last_t
        if steps <= 0 or dt <= 0:  # nothing new since the last line: the average since the start
            steps, dt = self._steps - self._start, now - self._t0
        rate = steps / dt if steps > 0 and dt > 0 else None
        eta = max(self.total - self._steps, 0) / rate if rate else (0.0 if self._steps >= self.total else None)
        percent = 100.0 * self._steps / self.total if self.total else 100.0
        best, median = (f"{v:.1f}" for v in self._best_median) if self._best_median else ("–", "–")
        line = (f"train: {self._steps:,}/{self.total:,} env steps/member ({percent:.0f}%), "
                f"{'–' if rate is None else f'{rate:,.0f}'} steps/s, best {best}, median {median}, "
                f"elapsed {_clock(now - self._t0)}, ETA {_clock(eta)}")
        self.console.file.write(line + "\n")
        self.console.file.flush()
        self._last_t, self._last_steps, self._evaluated = now, self._steps, False
