"""Pop-4 TD3 on gym:HalfCheetah-v5 at a 2-core budget (independent seeds, paper defaults).

    .venv/bin/python experiments/td3_halfcheetah.py [--steps 100000] [--out runs/td3_halfcheetah]

Writes the run directory, copies its learning-curve plot to experiments/plots/ and prints the
summary; the measured numbers are recorded in experiments/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import popjax


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000, help="env steps per member")
    parser.add_argument("--pop", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/td3_halfcheetah")
    args = parser.parse_args()
    run = popjax.train(learner="td3", env="gym:HalfCheetah-v5", pop_size=args.pop, seed=args.seed,
                       total_env_steps=args.steps, warmup_steps=10_000, eval_interval=10_000, eval_episodes=5,
                       batch_size=256, buffer_size=args.steps, out_dir=args.out)
    plot = Path(__file__).parent / "plots" / "td3_halfcheetah.png"
    shutil.copy(Path(args.out) / "plots" / "learning_curves.png", plot)
    print(json.dumps(run.summary, indent=2))


if __name__ == "__main__":
    main()
