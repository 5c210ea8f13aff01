"""PBT vs best-of-N independent PPO on gym:HalfCheetah-v5 at a 2-core budget (the HTS-RL issue's PPO-PBT run).

    .venv/bin/python experiments/pbt_ppo_halfcheetah.py [--arm pbt|baseline|both|plot] [--steps 300000]

Defaults: pop 8, PPO with hidden (64, 64), 4 envs x 512 steps per member and iteration (2,048 transitions,
4 epochs x 4 minibatches), 300k env steps per member, PBT every 40,960 env steps over the popjax ``ppo``
prior (learning rate, entropy coefficient, clip range, GAE lambda, ...; a popjax choice, no paper gives one).
On-policy learners ignore the replay options (batch, warm-up).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pbt_common import main  # noqa: E402

if __name__ == "__main__":
    main("ppo", "ppo_halfcheetah", {"steps": 300_000, "hidden": [64, 64], "batch": 64, "warmup": 0,
                                    "eval_interval": 20_480, "interval": 40_960,
                                    "run": {"rollout_len": 512, "envs_per_member": 4}})
