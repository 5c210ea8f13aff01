"""MEMR on gym:Hopper-v5: SAC vs MEMR (prioritized start states) vs MEMR (uniform start states), 5 seeds per arm.

    PYTHONPATH=. .venv/bin/python experiments/memr_hopper.py [--configs sac,memr,memr_uniform]
        [--steps 60000] [--seeds 5] [--out runs/memr_hopper]

The host-stepped MuJoCo path: the 5 members' envs are stepped by gymnasium, the SAC update, the model fits and the
model rollouts run in one compiled call per iteration. Sized for a 2-core CPU (the three arms in about 70 min):
hidden (128, 128), batch 128, lr 3e-4 (SAC's MuJoCo default), 2k random warm-up steps, an evaluation of 3 episodes
every 2k env steps, 250 env steps then 250 updates per iteration; MEMR: the learner's defaults (7 normalised models,
5 elites, a 1e5-rollout model buffer, fresh priorities, the known termination rule) with models of (128, 128) taking
2 Adam steps per env step, pi_psi (64, 64) with 2 Adam steps per rollout batch. (The first run, ``results.json``,
fitted 5 raw-input models with 2 passes every 250 env steps into 100 segments.) The arms, pairing and scores:
``memr_common.py``; ``memr_oracle`` needs a pure-JAX env (not Hopper's arms).
"""

from memr_common import Setting, main

HOPPER = Setting(
    name="hopper", env="gym:Hopper-v5", steps=60_000, warmup=2_000, eval_interval=2_000, eval_episodes=3,
    batch=128, hidden=[128, 128], rollout_len=250, hparams={"actor_lr": 3e-4, "critic_lr": 3e-4, "alpha_lr": 3e-4},
    memr={"model_hidden": [128, 128], "model_steps": 2, "psi_hidden": [64, 64], "psi_epochs": 2, "policy_updates": 1})

if __name__ == "__main__":
    main(HOPPER, __doc__)
