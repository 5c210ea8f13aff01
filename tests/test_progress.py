"""Training progress (issue 29, item 7): a rich bar on a terminal; complete plain lines anywhere else (CI logs,
``nohup``, output to a file), where the bar used to be cut to 80 columns (``train ━━ 16… … ETA 0:0…``)."""

import io
import re

import numpy as np
import pytest
import rich
from rich.console import Console

from popjax.progress import TrainProgress

RETURNS = np.array([-119.9, -174.5, -200.0, np.nan])  # best -119.9, median -174.5 (the diverged member ignored)


def _train(monkeypatch, console, **kwargs):
    """Drives a progress object through 3 evaluations and a last step without one, on ``console`` as the
    default console (where popjax's loop writes)."""
    monkeypatch.setattr(rich, "_console", console)
    with TrainProgress(100_000, **kwargs) as progress:
        for steps in (16_000, 32_000, 48_000):
            progress.update_returns(RETURNS)
            progress.advance_to(steps)
        progress.advance_to(50_000)
    return console.file.getvalue()


def test_a_non_terminal_gets_complete_plain_lines(monkeypatch):
    console = Console(file=io.StringIO(), width=80)  # not a terminal: a file, 80 columns
    assert not console.is_terminal
    lines = _train(monkeypatch, console).splitlines()  # the default interval (30 s) never passes here
    assert len(lines) == 4, lines  # one per evaluation, one at the end
    for line, steps in zip(lines, ("16,000", "32,000", "48,000", "50,000"), strict=True):
        assert "…" not in line and "━" not in line and "\x1b" not in line, line
        assert line.startswith(f"train: {steps}/100,000 env steps/member ("), line
        assert "best -119.9, median -174.5" in line, line
        rate = re.search(r", ([\d,]+) steps/s,", line)
        assert rate and int(rate.group(1).replace(",", "")) > 0, line
        assert re.search(r"elapsed \d+:\d\d:\d\d, ETA \d+:\d\d:\d\d$", line), line
    assert len(lines[0]) > 80  # the whole line, past the console's width


def test_plain_lines_between_evaluations_every_interval(monkeypatch):
    console = Console(file=io.StringIO(), width=80)
    monkeypatch.setattr(rich, "_console", console)
    with TrainProgress(1000, interval_s=0.0) as progress:
        progress.advance_to(100)
        progress.advance_to(200)
    lines = console.file.getvalue().splitlines()
    assert [line.split(" env")[0] for line in lines] == ["train: 100/1,000", "train: 200/1,000"]
    assert all("best –, median –" in line for line in lines)


def test_a_terminal_keeps_the_bar(monkeypatch):
    console = Console(file=io.StringIO(), width=200, force_terminal=True)
    out = _train(monkeypatch, console, interval_s=0.0)
    assert "env steps/member" in out and "━" in out and "train: " not in out


@pytest.mark.parametrize("force_terminal", [True, False])
def test_disabled_writes_nothing(monkeypatch, force_terminal):
    console = Console(file=io.StringIO(), width=80, force_terminal=force_terminal)
    assert _train(monkeypatch, console, enabled=False) == ""


@pytest.mark.long
def test_popjax_train_with_stdout_to_a_file_logs_complete_lines(tmp_path):
    """End to end: `popjax train > file` (as under nohup or CI) gets one complete line per evaluation."""
    import os
    import subprocess
    import sys

    argv = [sys.executable, "-m", "popjax", "train", "--env", "probe:pendulum", "--pop", "2", "--steps", "600",
            "--warmup", "100", "--rollout-len", "20", "--eval-interval", "200", "--eval-episodes", "1",
            "--batch-size", "16", "--buffer-size", "1000", "--learner-config", "hidden=[8, 8]",
            "--out", str(tmp_path / "run")]
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")}
    with (tmp_path / "log.txt").open("w") as log:
        done = subprocess.run(argv, stdout=log, stderr=subprocess.PIPE, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in (tmp_path / "log.txt").read_text().splitlines() if line.startswith("train")]
    assert [line.split(" env")[0] for line in lines] == ["train: 200/600", "train: 400/600", "train: 600/600"]
    for line in lines:
        assert "…" not in line and re.search(r"steps/s, best -?\d+\.\d, median -?\d+\.\d, elapsed .*, ETA ", line)
