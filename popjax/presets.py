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
  uses Adam where SB3's uses RMSProp. SB3's ``vf_coef`` weighs the mean squared value error, popjax's (CleanRL's,
  the PPO paper's) half of it: popjax's ``vf_coef`` is twice SB3's (its default 0.5 is popjax's 1.0). Under the
  shared gradient-norm clip the weight matters: at SB3's 0.5 popjax's PPO learnt CartPole more slowly than SB3.

brax and probe envs have no published table: they use the library defaults. Each learner carries its table
(``LearnerDef.presets``: env -> options, in the learner's module).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from popjax.config import ConfigError, check_options, make_config
from popjax.registry import DRIVERS, LEARNERS


def _table() -> dict[tuple[str, str], dict[str, Any]]:
    """Every registered learner's presets, keyed ``(learner, env)``."""
    return {(name, env): preset for name, d in LEARNERS.items() for env, preset in d.presets.items()}


class _Presets(Mapping):
    """``PRESETS[learner, env]``: the presets the registered learners carry (``LearnerDef.presets``)."""

    def __getitem__(self, key):
        return _table()[key]

    def __iter__(self):
        return iter(_table())

    def __len__(self):
        return len(_table())


PRESETS: Mapping[tuple[str, str], dict[str, Any]] = _Presets()

PRESET_MODES = ("auto", "none")
MERGED = ("hparams", "learner_config")  # merged key by key; other options are replaced whole


def find_preset(learner: str, env: str) -> dict[str, Any] | None:
    definition = LEARNERS.get(learner)
    return None if definition is None else definition.presets.get(env)


def apply_preset(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with the preset of its (learner, env) filled in where the user gave nothing. A preset's
    hparams are fixed values, so it leaves out those the run samples (``search_space``, or its driver's prior).

    ``options["preset"]``: ``"auto"`` (default) or ``"none"``; the key is consumed.
    """
    options = dict(options)
    mode = options.pop("preset", "auto")
    if not isinstance(mode, str) or mode not in PRESET_MODES:
        raise ConfigError(f"preset: {mode!r} unknown; allowed: {', '.join(PRESET_MODES)}")
    check_options(options)  # every option's type first: the lookup below reads learner and env
    preset = find_preset(options.get("learner", "td3"), options.get("env", "probe:pendulum"))
    if mode == "none" or preset is None:
        return options
    for name, value in preset.items():
        if name == "hparams":  # last: which of them the run samples depends on the other options
            continue
        given = options.get(name)
        if name in MERGED and isinstance(given, Mapping):
            options[name] = {**value, **given}
        elif given is None:
            options[name] = value
    if "hparams" in preset:  # fixed values: the preset leaves those the run samples to their prior
        sampled = set(options.get("search_space") or ()) | driver_searched(options)
        fixed = {k: v for k, v in preset["hparams"].items() if k not in sampled}
        options["hparams"] = {**fixed, **(options.get("hparams") or {})}
    return options


def driver_searched(options: Mapping[str, Any]) -> frozenset[str]:
    """The hparams the run's driver draws from a prior and changes (PBT: its search space)."""
    config = make_config(**options)
    return DRIVERS[config.driver].parse_options(config).searched_hparams()
