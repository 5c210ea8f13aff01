"""PBT search spaces as data: hparam name -> {low, high, log, integer} (see ``hparams.Range``).

The TD3 and SAC spaces are the fast-PBT paper's priors (Flajolet et al. 2022, App. B.1); the DQN
space is a popjax choice (the paper trains no DQN). Names match the learners' HParams fields, so
a space can be checked before anything is compiled. Users pass their own space as a dict of the same form.

Notes on the TD3 space:
  * The paper's "policy-update frequency U[0.2, 1]" is the authors' ``delay ~ randint{1..5}``
    (frequency 1/d). popjax's TD3 has ``policy_delay`` as a traced int32 hparam (the policy
    is updated on steps where ``steps % d == 0``), so PBT tunes it without recompiling. The
    integer range [1, 5] is sampled uniformly over {1, ..., 5}.
  * "noise parameters U[0, 1]": exploration sigma, target-policy-smoothing sigma and the
    noise clip, each U[0, 1] (authors' code). tau stays fixed at 0.005.

Notes on the SAC space:
  * ``target_entropy_scale`` multiplies the default target entropy -|A| (paper: U[0.2, 2] x
    default). The authors' code does not resample it; popjax follows the paper.
  * ``reward_scale`` is U[0.1, 10] as in the paper (the code samples it log-uniformly; use
    the ``sac_code`` space for that).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from popjax.population.hparams import Range

_LR = {"low": 3e-5, "high": 3e-3, "log": True}

SEARCH_SPACES: dict[str, dict[str, dict[str, Any]]] = {
    "td3": {
        "actor_lr": _LR,
        "critic_lr": _LR,
        "policy_delay": {"low": 1, "high": 5, "integer": True},
        "exploration_noise": {"low": 0.0, "high": 1.0},
        "target_noise": {"low": 0.0, "high": 1.0},
        "noise_clip": {"low": 0.0, "high": 1.0},
        "discount": {"low": 0.9, "high": 1.0},
    },
    "sac": {
        "actor_lr": _LR,
        "critic_lr": _LR,
        "alpha_lr": _LR,
        "target_entropy_scale": {"low": 0.2, "high": 2.0},
        "reward_scale": {"low": 0.1, "high": 10.0},
        "discount": {"low": 0.9, "high": 1.0},
    },
    # The authors' code: reward scale log-uniform, target entropy fixed.
    "sac_code": {
        "actor_lr": _LR,
        "critic_lr": _LR,
        "alpha_lr": _LR,
        "reward_scale": {"low": 0.1, "high": 10.0, "log": True},
        "discount": {"low": 0.9, "high": 1.0},
    },
    # popjax choice (no paper values): around the CleanRL defaults (lr 2.5e-4, eps 1 -> 0.05
    # over 10k updates). discount stops at 0.999: undiscounted bootstrapping on 500-step
    # CartPole episodes that end by truncation makes Q diverge.
    "dqn": {
        "lr": {"low": 3e-5, "high": 3e-3, "log": True},
        "discount": {"low": 0.9, "high": 0.999},
        "epsilon_end": {"low": 0.01, "high": 0.2},
        "epsilon_decay_steps": {"low": 1_000.0, "high": 50_000.0, "log": True},
    },
    # popjax choice (no paper values): around the CleanRL PPO and SB3 A2C defaults.
    "ppo": {
        "lr": {"low": 3e-5, "high": 3e-3, "log": True},
        "ent_coef": {"low": 1e-4, "high": 0.1, "log": True},
        "clip": {"low": 0.05, "high": 0.4},
        "gae_lambda": {"low": 0.8, "high": 1.0},
    },
    "a2c": {
        "lr": {"low": 1e-4, "high": 3e-3, "log": True},
        "ent_coef": {"low": 1e-4, "high": 0.1, "log": True},
        "gae_lambda": {"low": 0.8, "high": 1.0},
    },
}


def get_search_space(space: str | Mapping[str, Any], hparam_names: tuple[str, ...] | None = None
                     ) -> dict[str, Range]:
    """Resolves a space name (a key of ``SEARCH_SPACES``) or a dict into Ranges.

    Args:
      space: a name from ``SEARCH_SPACES`` or ``{hparam: {low, high, log?, integer?}}``.
      hparam_names: if given, every hparam of the space must be one of these.

    Raises:
      ValueError: unknown name, malformed range, or an hparam the learner does not have.
    """
    if isinstance(space, str):
        if space not in SEARCH_SPACES:
            raise ValueError(f"search space {space!r} unknown; allowed: {', '.join(SEARCH_SPACES)} "
                             "or a dict {hparam: {low, high, log, integer}}")
        space = SEARCH_SPACES[space]
    if not isinstance(space, Mapping) or not space:
        raise ValueError(f"a search space is a name or a non-empty dict, got {space!r}")
    out = {}
    for name, r in space.items():
        if hparam_names is not None and name not in hparam_names:
            raise ValueError(f"search space hparam {name!r} unknown; allowed: {', '.join(hparam_names)}")
        if not isinstance(r, Mapping):
            raise ValueError(f"search space {name!r}: expected {{low, high, log, integer}}, got {r!r}")
        try:
            out[name] = Range.from_dict(r)
        except (TypeError, ValueError) as err:
            raise ValueError(f"search space {name!r}: {err}") from None
    return out
