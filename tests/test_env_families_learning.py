"""Learning on the JAX env families (issue 46; ``make test-slow``): PPO solves gymnax's CartPole, PPO learns a
MinAtar game, a craftax and a jumanji run are killed with SIGKILL and resume exactly, PBT over PPO exploits on a
gymnax env. docs/environments.md quotes the thresholds."""

from __future__ import annotations

import jax
import pytest
from test_resume import kill_and_resume

import popjax

# rl-baselines3-zoo's CartPole-v1 PPO (popjax's preset for gym:CartPole-v1): 8 envs x 32 steps, 20 epochs of one
# minibatch, lr 1e-3, gamma 0.98, lambda 0.8, no entropy bonus.
PPO_CARTPOLE = dict(envs_per_member=8, rollout_len=32, learner_config={"epochs": 20, "minibatches": 1},
                    hparams={"lr": 1e-3, "clip": 0.2, "discount": 0.98, "gae_lambda": 0.8, "ent_coef": 0.0})


@pytest.mark.slow
def test_ppo_solves_gymnax_cartpole(tmp_path):
    jax.config.update("jax_disable_most_optimizations", False)  # a real run: optimized programs
    run = popjax.train(learner="ppo", env="gymnax:CartPole-v1", pop_size=2, total_env_steps=100_000,
                       eval_interval=10_240, eval_episodes=5, progress=False, out_dir=tmp_path, **PPO_CARTPOLE)
    print("ppo gymnax:CartPole-v1", run.summary["best_return"], run.summary["final_returns"], run.summary["wall_s"])
    assert run.summary["best_return"] == 500.0


# PPO on MinAtar Breakout (purejaxrl's MinAtar settings scaled to a CPU: 64 envs x 128 steps, 4 epochs x 8
# minibatches, lr 5e-4, gamma 0.99, lambda 0.95, entropy 0.01). A uniformly random policy scores about 0.3-1.
MINATAR_SCORE = 5.0


@pytest.mark.slow
def test_ppo_learns_breakout_minatar(tmp_path):
    jax.config.update("jax_disable_most_optimizations", False)
    run = popjax.train(learner="ppo", env="gymnax:Breakout-MinAtar", pop_size=2, total_env_steps=500_000,
                       envs_per_member=64, rollout_len=128, eval_interval=100_000, eval_episodes=8,
                       learner_config={"epochs": 4, "minibatches": 8, "hidden": [64, 64]},
                       hparams={"lr": 5e-4, "discount": 0.99, "gae_lambda": 0.95, "ent_coef": 0.01},
                       progress=False, out_dir=tmp_path)
    print("ppo Breakout-MinAtar", run.summary["best_return"], run.summary["final_returns"], run.summary["wall_s"])
    assert run.summary["best_return"] >= MINATAR_SCORE




@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.filterwarnings("ignore:.*taking over the lock")
@pytest.mark.parametrize("env", ["craftax:Craftax-Classic-Symbolic-v1", "jumanji:Snake-v1"])
def test_a_family_run_trains_300_iterations_and_resumes_exactly_after_sigkill(env, tmp_path):
    """300 PPO iterations (2 members x 4 envs x 16 steps each), a checkpoint every 20 iterations."""
    options = dict(learner="ppo", env=env, pop_size=2, envs_per_member=4, rollout_len=16, seed=3,
                   total_env_steps=300 * 64, eval_interval=100 * 64, eval_episodes=1, checkpoint_interval=20 * 64,
                   learner_config={"hidden": [64, 64], "epochs": 1, "minibatches": 2}, progress=False)
    full, _ = kill_and_resume(tmp_path, options, past_checkpoint=150)
    assert full.summary["updates"] == 300 * 2


@pytest.mark.slow
def test_pbt_over_ppo_on_gymnax_exploits(tmp_path):
    run = popjax.train(learner="ppo", env="gymnax:CartPole-v1", driver="pbt", pop_size=4, seed=1,
                       total_env_steps=8_192, envs_per_member=4, rollout_len=32, eval_interval=1_024, eval_episodes=2,
                       learner_config={"hidden": [32, 32], "minibatches": 2, "epochs": 2},
                       pbt={"interval": 1_024, "quantile": 0.25}, progress=False, out_dir=tmp_path)
    print("pbt", run.summary["lineage"], run.summary["final_returns"])
    assert len(run.summary["lineage"]) >= 1  # at least one exploit (a member copied another)
