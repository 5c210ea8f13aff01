"""DvD (5 TD3 actors, shared critic, scheduled diversity) vs weight 0 vs plain TD3 on gym:HalfCheetah-v5.

    .venv/bin/python experiments/dvd_halfcheetah.py [--budget 100000] [--seeds 0]
        [--variants dvd,weight0] [--hidden 64,64] [--out runs/dvd_halfcheetah]

A 2-core budget: 100k env steps summed over the population (20k per member; the paper runs
3M on Humanoid), hidden (64, 64), batch 256. The TD3 baseline (same budget for one agent) is
shared with experiments/cemrl_halfcheetah.py. Results: experiments/RESULTS.md.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dvd_common import main  # noqa: E402

if __name__ == "__main__":
    main("halfcheetah", __doc__.splitlines()[0], budget=100_000, seeds="0", variants="dvd,weight0",
         env="gym:HalfCheetah-v5", hidden="64,64", td3_warmup=10_000)
