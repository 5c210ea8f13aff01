"""PBT vs best-of-N independent SAC on gym:HalfCheetah-v5 at a 2-core budget (fast-PBT §5.1 analogue).

    .venv/bin/python experiments/pbt_sac_halfcheetah.py [--arm pbt|baseline|both|plot] [--steps 30000]

Defaults: pop 8, hidden (64, 64), batch 128, 30k env steps per member, PBT every 5k env steps
(paper: 80 members, (256, 256), 3M steps, every 100k updates). Results: experiments/RESULTS.md.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pbt_common import main  # noqa: E402

if __name__ == "__main__":
    main("sac", "sac_halfcheetah", {"steps": 30_000, "hidden": [64, 64], "batch": 128, "warmup": 5_000,
                                    "eval_interval": 2_500, "interval": 5_000})
