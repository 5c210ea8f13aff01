"""MEMR on Pendulum: SAC vs MEMR (prioritized start states) vs MEMR (uniform start states), 5 seeds per arm.

    PYTHONPATH=. .venv/bin/python experiments/memr_pendulum.py [--configs sac,memr_oracle,memr_uniform,memr]
        [--steps 20000] [--seeds 5] [--out runs/memr_pendulum] [--tag issue38]

``probe:pendulum`` is the pure-JAX port of gymnasium's Pendulum-v1. Shared: hidden (64, 64), batch 128, lr 1e-3
(the SAC Pendulum preset's), 1k warm-up steps, an evaluation of 5 episodes every 1k env steps; MEMR: the learner's
defaults (7 normalised models, the 5 elites by held-out NLL roll out, a 1e5-rollout model buffer sampled across its
segments, fresh priorities, real_ratio 0) with models of (64, 64) taking 2 Adam steps per env step, pi_psi (32, 32)
with 2 Adam steps per rollout batch. (The first run, ``results.json``, fitted 5 raw-input models with 2 passes
every 50 env steps into 100 segments, each SAC batch from one segment.) The arms, pairing and scores:
``memr_common.py``.
"""

from memr_common import Setting, main

PENDULUM = Setting(
    name="pendulum", env="probe:pendulum", steps=20_000, warmup=1_000, eval_interval=1_000, eval_episodes=5,
    batch=128, hidden=[64, 64], rollout_len=50, hparams={"actor_lr": 1e-3, "critic_lr": 1e-3, "alpha_lr": 1e-3},
    memr={"model_hidden": [64, 64], "model_steps": 2, "psi_hidden": [32, 32], "psi_epochs": 2, "policy_updates": 1})

if __name__ == "__main__":
    main(PENDULUM, __doc__)
