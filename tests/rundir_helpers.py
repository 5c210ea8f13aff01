"""A tiny finished run and a snapshot of a directory, for the tests of run directories and their faults."""

from __future__ import annotations

TINY = dict(learner="td3", env="probe:pendulum", pop_size=2, total_env_steps=300, rollout_len=50, warmup_steps=100,
            eval_interval=100, eval_episodes=1, batch_size=16, buffer_size=500, learner_config={"hidden": [8, 8]},
            progress=False)


def snapshot(path):
    """Every file under ``path`` with its bytes (and the directories, so a new empty one shows)."""
    return {p.relative_to(path): (p.read_bytes() if p.is_file() else None) for p in sorted(path.rglob("*"))}
