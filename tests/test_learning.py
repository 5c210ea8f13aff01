"""Learning reaches stated returns.

The probe tests are quick and run by default; the real-environment runs are `slow`
(`make test-slow`); experiments/RESULTS.md lists their thresholds.
"""

import pytest

import popjax

QUICK = dict(pop_size=2, rollout_len=10, warmup_steps=100, eval_episodes=4, batch_size=32, buffer_size=2000,
             learner_config={"hidden": [32, 32]}, progress=False)


@pytest.mark.long
@pytest.mark.parametrize("learner", ["td3", "sac"])
def test_continuous_learners_solve_the_bandit_probe(learner, tmp_path):
    # reward -(a - 0.5)^2: a uniform random policy averages -0.58, the optimum is 0
    run = popjax.train(learner=learner, env="probe:bandit", total_env_steps=1500, eval_interval=1500,
                       hparams={"actor_lr": 1e-3, "critic_lr": 1e-3}, out_dir=tmp_path, **QUICK)
    assert run.summary["best_return"] > -0.02


@pytest.mark.long
def test_dqn_solves_the_chain_probe(tmp_path):
    # reward 1 for action 2 of 3; a greedy policy that found it scores 1.0
    run = popjax.train(learner="dqn", env="probe:chain", total_env_steps=1000, eval_interval=1000,
                       out_dir=tmp_path, **QUICK)
    assert min(run.summary["final_returns"]) == 1.0


SLOW_PENDULUM = dict(env="gym:Pendulum-v1", pop_size=4, total_env_steps=20_000, warmup_steps=1_000,
                     eval_interval=2_000, eval_episodes=5, batch_size=256, buffer_size=20_000,
                     learner_config={"hidden": [64, 64]}, progress=False, preset="none")


@pytest.mark.slow
@pytest.mark.parametrize("learner", ["td3", "sac"])
def test_pendulum_best_member_reaches_minus_200(learner, tmp_path):
    run = popjax.train(learner=learner, out_dir=tmp_path, **SLOW_PENDULUM)
    print(learner, run.summary["best_return"], run.summary["final_returns"], run.summary["wall_s"])
    assert run.summary["best_return"] >= -200


# rl-baselines3-zoo's CartPole-v1 DQN settings, in popjax units: lr 2.3e-3, batch 64, 256 env steps
# then 128 updates (update_ratio 0.5), epsilon 1 -> 0.04 over 16% of a 50k-step run (8k env steps
# = 4k updates). The zoo's hard target copy "every 10 env steps" happens between training bursts,
# so the target is frozen for each burst of 128 updates: target_update_period 128 here (a copy
# every 5 updates instead diverged, Q ~ 1e10, measured). With the library's default
# (CleanRL-style) lr 2.5e-4 and a target copy every 500 updates, the 4 members peaked at 441 by
# 30k steps and then collapsed to ~100 by 150k (measured; DQN's well-known CartPole instability).
DQN_CARTPOLE = dict(hparams={"lr": 2.3e-3, "epsilon_end": 0.04, "epsilon_decay_steps": 4_000},
                    learner_config={"target_update_period": 128}, batch_size=64, rollout_len=256, update_ratio=0.5)


@pytest.mark.slow
def test_dqn_cartpole_best_member_reaches_475(tmp_path):
    run = popjax.train(learner="dqn", env="gym:CartPole-v1", pop_size=4, total_env_steps=61_440,
                       warmup_steps=1_024, eval_interval=5_120, eval_episodes=5, buffer_size=61_440,
                       progress=False, out_dir=tmp_path, preset="none", **DQN_CARTPOLE)
    print("dqn", run.summary["best_return"], run.summary["final_returns"], run.summary["wall_s"])
    assert run.summary["best_return"] >= 475


@pytest.mark.slow
def test_td3_brax_inverted_pendulum_reaches_900(tmp_path):
    # CPU budget: 50k env steps per member, ~2.5 min of training + ~40 s of compilation on 2 cores
    # (measured: both members at 1000 from 45k steps on, one from 40k)
    run = popjax.train(learner="td3", env="brax:inverted_pendulum", pop_size=2, total_env_steps=50_000,
                       warmup_steps=1_000, eval_interval=5_000, eval_episodes=2, batch_size=256,
                       buffer_size=50_000, learner_config={"hidden": [64, 64]}, progress=False, out_dir=tmp_path)
    print("brax", run.summary["best_return"], run.summary["final_returns"], run.summary["wall_s"],
          run.summary["compile_s"])
    assert run.summary["best_return"] >= 900


# --- the defaults a new user gets: nothing but learner and env (the presets of popjax/presets.py) ------
THRESHOLDS = {("dqn", "gym:CartPole-v1"): 475, ("td3", "gym:Pendulum-v1"): -200, ("sac", "gym:Pendulum-v1"): -200}


@pytest.mark.slow
@pytest.mark.parametrize("learner, env", sorted(THRESHOLDS))
def test_defaults_reach_the_threshold_with_nothing_but_learner_and_env(learner, env, tmp_path):
    run = popjax.train(learner=learner, env=env, out_dir=tmp_path / "run", progress=False)
    print(learner, env, run.summary["best_return"], run.summary["final_returns"], run.summary["env_steps"],
          run.summary["wall_s"], run.summary["compile_s"])
    assert run.summary["best_return"] >= THRESHOLDS[learner, env]
