"""Presets: tuned values fill only what the user did not give; ``none`` keeps the bare defaults."""

import jax.numpy as jnp
import pytest
import yaml

import popjax
from popjax.presets import PRESETS, apply_preset


def test_a_preset_fills_only_what_is_not_given():
    resolved = apply_preset({"learner": "dqn", "env": "gym:CartPole-v1", "batch_size": 32,
                             "hparams": {"lr": 1e-3}, "learner_config": {"dueling": True}})
    preset = PRESETS["dqn", "gym:CartPole-v1"]
    assert resolved["batch_size"] == 32 and resolved["total_env_steps"] == preset["total_env_steps"] == 50_000
    assert resolved["hparams"] == {**preset["hparams"], "lr": 1e-3}  # merged key by key, the user's value wins
    assert resolved["learner_config"] == {"hidden": [256, 256], "target_update_period": 128, "dueling": True}
    assert "preset" not in resolved


def test_a_preset_leaves_the_hparams_the_user_samples():
    space = {"actor_lr": {"low": 1e-4, "high": 1e-3, "log": True}}
    resolved = apply_preset({"learner": "td3", "env": "gym:HalfCheetah-v5", "search_space": space})
    assert resolved["hparams"] == {"critic_lr": 1e-3, "exploration_noise": 0.1}  # the preset's, less actor_lr
    assert popjax.make_config(**resolved).search_space == space  # no "fixed or sampled" conflict


def test_pbt_draws_its_initial_hparams_from_its_prior_not_the_preset():
    resolved = apply_preset({"learner": "td3", "env": "gym:HalfCheetah-v5", "driver": "pbt",
                             "hparams": {"critic_lr": 5e-4}})
    assert resolved["hparams"] == {"critic_lr": 5e-4}  # the user's value stays; the preset's searched lrs go
    resolved = apply_preset({"learner": "td3", "env": "gym:HalfCheetah-v5", "driver": "pbt",
                             "pbt": {"search_space": {"actor_lr": {"low": 1e-4, "high": 1e-3}}}})
    assert resolved["hparams"] == {"critic_lr": 1e-3, "exploration_noise": 0.1}


def test_none_unknown_pairs_and_bad_names():
    bare = {"learner": "dqn", "env": "gym:CartPole-v1", "preset": "none"}
    assert apply_preset(bare) == {"learner": "dqn", "env": "gym:CartPole-v1"}
    assert apply_preset({"learner": "td3", "env": "probe:pendulum"}) == {"learner": "td3", "env": "probe:pendulum"}
    with pytest.raises(popjax.ConfigError, match="preset: 'zoo' unknown; allowed: auto, none"):
        apply_preset({"preset": "zoo"})


@pytest.mark.parametrize("learner", ["ppo", "a2c"])
def test_the_zoo_value_weight_is_translated_into_popjax_units(learner):
    """SB3's value term is vf_coef * mean((V - R)^2) at its default 0.5; popjax's preset gives the same term."""
    from popjax.learners import onpolicy

    value, ret = jnp.array([1.0, -2.0, 0.5]), jnp.array([0.0, 1.0, 2.5])
    sb3_term = 0.5 * jnp.mean((value - ret) ** 2)  # (1 + 9 + 4) / 3 / 2 = 7 / 3
    vf_coef = PRESETS[learner, "gym:CartPole-v1"]["hparams"]["vf_coef"]
    assert float(vf_coef * onpolicy.value_loss(value, ret)) == pytest.approx(7 / 3) == float(sb3_term)


def test_every_preset_is_a_valid_config():
    for (learner, env), preset in PRESETS.items():
        popjax.make_config(learner=learner, env=env, **preset)


@pytest.mark.long
def test_the_resolved_preset_is_written_into_config_yaml(tmp_path):
    popjax.train(learner="dqn", env="gym:CartPole-v1", out_dir=tmp_path / "run", total_env_steps=600,
                 warmup_steps=256, eval_interval=600, eval_episodes=1, pop_size=2, progress=False)
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["hparams"]["lr"] == 2.3e-3 and config["rollout_len"] == 256 and config["batch_size"] == 64
    assert config["learner_config"]["target_update_period"] == 128 and config["total_env_steps"] == 600
