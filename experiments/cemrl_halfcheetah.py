"""CEM-RL (pop 10 as in the paper, 5 trained, shared critic) vs plain TD3 on gym:HalfCheetah-v5.

    .venv/bin/python experiments/cemrl_halfcheetah.py [--budget 100000] [--seeds 0]
        [--orders vectorized] [--hidden 64,64] [--out runs/cemrl_halfcheetah]

A 2-core budget: 100k env steps summed over the population (10 generations of 10 one-episode
actors; the paper runs 1M steps with (400, 300) actors), hidden (64, 64), batch 256; the TD3
baseline gets the whole budget for one agent per seed with 10k random warm-up steps.
Results: experiments/RESULTS.md.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cemrl_common import main  # noqa: E402

if __name__ == "__main__":
    main("halfcheetah", __doc__.splitlines()[0], budget=100_000, seeds="0", orders="vectorized",
         env="gym:HalfCheetah-v5", hidden="64,64", td3_warmup=10_000)
