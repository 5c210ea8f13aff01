"""A tiny finished run, a snapshot of a directory and a simulated kill, for the tests of run directories."""

from __future__ import annotations

import shutil
from pathlib import Path

TINY = dict(learner="td3", env="probe:pendulum", pop_size=2, total_env_steps=300, rollout_len=50, warmup_steps=100,
            eval_interval=100, eval_episodes=1, batch_size=16, buffer_size=500, learner_config={"hidden": [8, 8]},
            progress=False)


def snapshot(path):
    """Every file under ``path`` with its bytes (and the directories, so a new empty one shows)."""
    return {p.relative_to(path): (p.read_bytes() if p.is_file() else None) for p in sorted(path.rglob("*"))}


def killed_copy(run_dir, dest) -> tuple[Path, int]:
    """A copy of ``run_dir`` at ``dest`` as a kill would leave it: no summary.json and only the oldest kept
    checkpoint (later metrics rows stay); returns the copy and that checkpoint's step."""
    from popjax.checkpoint import Checkpointer

    shutil.copytree(run_dir, dest)
    (Path(dest) / "summary.json").unlink()
    checkpoints = Checkpointer(Path(dest) / "checkpoints")
    kept = checkpoints.steps()
    for step in kept[1:]:
        checkpoints.delete(step)
    checkpoints.close()
    return Path(dest), kept[0]
