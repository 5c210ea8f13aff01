"""DvD (5 TD3 actors, shared critic, scheduled diversity) vs weight 0 vs plain TD3 on Pendulum (R4).

    .venv/bin/python experiments/dvd_pendulum.py [--budget 50000] [--seeds 0,1]
        [--variants dvd,dvd_release_kernel,weight0] [--env probe:pendulum] [--out runs/dvd_pendulum]

Hidden (64, 64); the TD3 baseline comes from experiments/results/cemrl_pendulum.json.
Results: experiments/RESULTS.md.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dvd_common import main  # noqa: E402

if __name__ == "__main__":
    main("pendulum", __doc__.splitlines()[0], budget=50_000, seeds="0,1", variants="dvd,dvd_release_kernel,weight0",
         env="probe:pendulum", hidden="64,64", td3_warmup=1_000)
