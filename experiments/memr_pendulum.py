"""MEMR on Pendulum: SAC vs MEMR (prioritized start states) vs MEMR (uniform start states), 5 seeds per arm.

    PYTHONPATH=. .venv/bin/python experiments/memr_pendulum.py [--configs sac,memr,memr_uniform]
        [--steps 20000] [--seeds 5] [--out runs/memr_pendulum]

``probe:pendulum`` is the pure-JAX port of gymnasium's Pendulum-v1. Shared: hidden (64, 64), batch 128, lr 1e-3
(the SAC Pendulum preset's), 1k warm-up steps, an evaluation of 5 episodes every 1k env steps; MEMR: 5 models of
(64, 64), 2 fitting passes every 50 env steps, pi_psi (32, 32) with 2 Adam steps per rollout batch, 100 segments.
The arms, pairing and scores: ``memr_common.py``.
"""

from memr_common import Setting, main

PENDULUM = Setting(
    name="pendulum", env="probe:pendulum", steps=20_000, warmup=1_000, eval_interval=1_000, eval_episodes=5,
    batch=128, hidden=[64, 64], rollout_len=50, hparams={"actor_lr": 1e-3, "critic_lr": 1e-3, "alpha_lr": 1e-3},
    memr={"ensemble": 5, "model_hidden": [64, 64], "model_epochs": 2, "psi_hidden": [32, 32], "psi_epochs": 2,
          "segments": 100, "policy_updates": 1, "model_update_every": 50})

if __name__ == "__main__":
    main(PENDULUM, __doc__)
