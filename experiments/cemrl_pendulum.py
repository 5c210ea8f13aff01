"""CEM-RL (pop 10, 5 trained, shared critic) vs plain TD3 on Pendulum at one env-step budget (R3).

    .venv/bin/python experiments/cemrl_pendulum.py [--budget 50000] [--seeds 0,1,2]
        [--orders vectorized,sequential] [--env probe:pendulum] [--out runs/cemrl_pendulum]

Hidden (64, 64); the TD3 baseline warms up for 1k steps. Results: experiments/RESULTS.md.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cemrl_common import main  # noqa: E402

if __name__ == "__main__":
    main("pendulum", __doc__.splitlines()[0], budget=50_000, seeds="0,1,2", orders="vectorized,sequential",
         env="probe:pendulum", hidden="64,64", td3_warmup=1_000)
