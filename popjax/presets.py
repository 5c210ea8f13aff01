"""Per-environment presets: published tuned hyperparameters, applied by ``popjax.train`` for known envs.

A preset fills every option the user did not give (``hparams`` and ``learner_config`` key by
key), so ``popjax train --learner dqn --env gym:CartPole-v1`` trains with tuned values; the
resolved values are written into the run's ``config.yaml``. ``preset="none"``
(``--preset none``) keeps the library's bare defaults; ``preset="auto"`` (the default) uses the
table below when it has the (learner, env) pair and the defaults otherwise.

Source: the RL Baselines3 Zoo tables (``DLR-RM/rl-baselines3-zoo``, ``hyperparams/*.yml``),
translated into popjax's units:

- SB3's ``learning_starts`` is popjax's ``warmup_steps`` (per member); ``gamma`` is ``discount``;
  ``learning_rate`` sets every learning rate of the learner; ``net_arch`` is ``hidden``.
- ``train_freq`` env steps followed by ``gradient_steps`` updates is ``rollout_len`` with
  ``update_ratio = gradient_steps / train_freq``; ``train_freq: 1`` with one update per step is
  popjax's default iteration of 50 env steps and 50 updates (the same number of updates).
- DQN: ``exploration_fraction`` of ``n_timesteps`` env steps becomes ``epsilon_decay_steps``
  counted in updates; the zoo copies the target network every 10 env steps, between bursts of
  128 updates, i.e. once per burst: ``target_update_period = 128`` updates (a copy every 5
  updates diverges, measured).
- The zoo's ``n_timesteps`` is the default budget (``total_env_steps``, per member).

- PPO and A2C: ``n_envs`` is ``envs_per_member``, ``n_steps`` is ``rollout_len``; PPO's ``batch_size`` (the
  minibatch) becomes ``minibatches = n_envs * n_steps / batch_size`` and ``n_epochs`` is ``epochs``. The zoo's
  linear schedules of the learning rate and clip range are not reproduced (constant values), and popjax's A2C
  uses Adam where SB3's uses RMSProp.

brax and probe envs have no published table: they use the library defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from popjax.config import ConfigError

# TD3 on the MuJoCo v5 tasks: zoo "mujoco-defaults" (SB3 TD3: lr 1e-3, batch 256, net [400, 300]).
_TD3_MUJOCO = {"total_env_steps": 1_000_000, "warmup_steps": 10_000, "batch_size": 256, "buffer_size": 1_000_000,
               "hparams": {"actor_lr": 1e-3, "critic_lr": 1e-3, "exploration_noise": 0.1},
               "learner_config": {"hidden": [400, 300]}}
# SAC on the MuJoCo v5 tasks: zoo "mujoco-defaults" (SB3 SAC: lr 3e-4, batch 256, net [256, 256]).
_SAC_MUJOCO = {"total_env_steps": 1_000_000, "warmup_steps": 10_000, "batch_size": 256, "buffer_size": 1_000_000,
               "learner_config": {"hidden": [256, 256]}}
_MUJOCO = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5")

PRESETS: dict[tuple[str, str], dict[str, Any]] = {
    **{("td3", f"gym:{env}"): _TD3_MUJOCO for env in _MUJOCO},
    **{("sac", f"gym:{env}"): _SAC_MUJOCO for env in _MUJOCO},
    ("sac", "gym:Humanoid-v5"): {**_SAC_MUJOCO, "total_env_steps": 2_000_000},
    ("td3", "gym:Pendulum-v1"): {
        "total_env_steps": 20_000, "warmup_steps": 10_000, "batch_size": 256, "buffer_size": 200_000,
        "hparams": {"actor_lr": 1e-3, "critic_lr": 1e-3, "discount": 0.98, "exploration_noise": 0.1},
        "learner_config": {"hidden": [400, 300]}},
    ("sac", "gym:Pendulum-v1"): {
        "total_env_steps": 20_000, "warmup_steps": 100, "batch_size": 256, "buffer_size": 1_000_000,
        "hparams": {"actor_lr": 1e-3, "critic_lr": 1e-3, "alpha_lr": 1e-3},
        "learner_config": {"hidden": [256, 256]}},
    ("dqn", "gym:CartPole-v1"): {
        "total_env_steps": 50_000, "warmup_steps": 1_000, "batch_size": 64, "buffer_size": 100_000,
        "rollout_len": 256, "update_ratio": 0.5,
        "hparams": {"lr": 2.3e-3, "discount": 0.99, "epsilon_end": 0.04, "epsilon_decay_steps": 4_000},
        "learner_config": {"hidden": [256, 256], "target_update_period": 128}},
    # zoo ppo.yml CartPole-v1: 8 envs x 32 steps, minibatch 256, 20 epochs, lr 1e-3 and clip 0.2 (both linearly
    # decayed there), gamma 0.98, lambda 0.8, no entropy bonus, 1e5 steps
    ("ppo", "gym:CartPole-v1"): {
        "total_env_steps": 100_000, "envs_per_member": 8, "rollout_len": 32,
        "hparams": {"lr": 1e-3, "clip": 0.2, "discount": 0.98, "gae_lambda": 0.8, "ent_coef": 0.0},
        "learner_config": {"epochs": 20, "minibatches": 1}},
    # zoo a2c.yml CartPole-v1: 8 envs, no entropy bonus, 5e5 steps (SB3 defaults otherwise: 5 steps, lr 7e-4)
    ("a2c", "gym:CartPole-v1"): {
        "total_env_steps": 500_000, "envs_per_member": 8, "rollout_len": 5, "hparams": {"ent_coef": 0.0}},
}
PRESET_MODES = ("auto", "none")
MERGED = ("hparams", "learner_config")  # merged key by key; other options are replaced whole


def find_preset(learner: str, env: str) -> dict[str, Any] | None:
    return PRESETS.get((learner, env))


def apply_preset(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with the preset of its (learner, env) filled in where the user gave nothing.

    ``options["preset"]``: ``"auto"`` (default) or ``"none"``; the key is consumed.
    """
    options = dict(options)
    mode = options.pop("preset", "auto")
    if mode not in PRESET_MODES:
        raise ConfigError(f"preset: {mode!r} unknown; allowed: {', '.join(PRESET_MODES)}")
    preset = find_preset(options.get("learner", "td3"), options.get("env", "probe:pendulum"))
    if mode == "none" or preset is None:
        return options
    for name, value in preset.items():
        given = options.get(name)
        if name in MERGED and isinstance(given, Mapping):
            options[name] = {**value, **given}
        elif given is None:
            options[name] = value
    return options
