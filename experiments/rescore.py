"""Re-scores a run's chosen member on fresh episodes (against the winner's curse of "best of 8 noisy means").

The member is picked on the training-time evaluations; its score is then measured again on ``episodes``
deterministic episodes in envs seeded apart from training and evaluation (``RESCORE_SEED`` + run seed), from the
run's newest checkpoint (the final state: popjax checkpoints at every evaluation). gymnasium envs only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from popjax.envs.registry import make_host_env
from popjax.export import export_policy, load_policy

RESCORE_SEED = 7_000_000  # training envs use the run seed, evaluation envs the seed plus a small offset


def episode_returns(policy, env: str, episodes: int, seed: int) -> list[float]:
    """Undiscounted returns of ``episodes`` deterministic episodes of ``policy`` (obs -> action in [-1, 1])."""
    vec = make_host_env(env, episodes, RESCORE_SEED + seed)
    obs = vec.reset()
    returns = []
    for i, gym_env in enumerate(vec.envs):
        o, total, done = obs[i], 0.0, False
        while not done:
            native = vec.to_native(np.asarray(policy(np.asarray(o, np.float32)))[None])[0]
            o, r, terminated, truncated, _ = gym_env.step(native)
            total, done = total + float(r), bool(terminated or truncated)
        returns.append(total)
    return returns


def rescore(run_dir: Path, member: int, env: str, episodes: int, seed: int) -> list[float]:
    """Returns of member ``member`` of the run in ``run_dir`` on ``episodes`` fresh episodes (its actor exported
    next to the run as ``policy-member<m>.npz``, reused if it is there)."""
    path = Path(run_dir) / f"policy-member{member}.npz"
    if not path.exists():
        export_policy(run_dir, path, member)
    return episode_returns(load_policy(path), env, episodes, seed)
