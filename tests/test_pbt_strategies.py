"""PBT strategies (issue 28): σ-threshold selection, the fast-PBT release variants (parents, policy-only copy,
optimizer reset), PB2, multi-frequency PBT, constraints and the schedule replay; hand-checked values from the
strategies' reference code."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from rundir_helpers import killed_copy
from test_pbt import TD3_SPACE, population, run_exploit, toy_population

from popjax.config import ConfigError
from popjax.drivers.pbt_options import PBTConfig, parse_pbt_config
from popjax.drivers.pbt_round import exploit_and_explore
from popjax.population import pb2, selection
from popjax.population.hparams import Range

# --- σ-threshold selection (Isaac Lab) --------------------------------------------------------------


def sigma(fitness, k=0.1, margin=0.05):
    fitness = jnp.asarray(fitness, jnp.float32)
    loser, leaders = selection.sigma_threshold(fitness, jnp.ones(fitness.shape, bool), k, margin)
    order, _ = selection.rank_members(fitness, jnp.ones(fitness.shape, bool))
    return np.flatnonzero(np.asarray(loser)).tolist(), sorted(np.asarray(order)[: int(leaders)].tolist())


@pytest.mark.long
def test_sigma_threshold_selects_what_the_hand_computation_names():
    # o = 0..7: mean 3.5, std 2.291288; k = 0.1 -> cuts 3.729129 / 3.270871
    assert sigma(np.arange(8.0)) == ([0, 1, 2, 3], [4, 5, 6, 7])
    assert sigma(np.arange(8.0), k=1.0) == ([0, 1], [6, 7])  # cuts 5.791 / 1.209
    assert sigma([1.0, 1.0, 1.0, 1.0]) == ([], [])  # std 0: the band is ±A, nobody moves
    # mean 0.5425: A = 0.05 dominates k std = 0.0038 -> upper 0.5925, lower 0.4925
    assert sigma([0.50, 0.52, 0.55, 0.60]) == ([], [3])
    assert sigma([0.50, 0.52, 0.55, 0.60], margin=0.025) == ([0], [3])  # lower 0.5175


@pytest.mark.long
def test_sigma_losers_copy_a_leader_or_keep_their_weights():
    state, hp = toy_population(8)
    config = PBTConfig(selection="sigma", threshold_std=1.0, threshold_abs=0.05, search_space=TD3_SPACE)
    parents = set()
    for seed in range(12):
        new_state, _, info = run_exploit(state, hp, np.arange(8.0), config, seed)
        assert np.flatnonzero(info["loser"]).tolist() == [0, 1]
        parents |= set(info["parent"][[0, 1]].tolist())
        assert info["parent"][2:].tolist() == list(range(2, 8))
    assert parents == {6, 7}
    # all within the band but one far below: no leader, so the loser keeps its own weights (and is explored)
    new_state, new_hp, info = run_exploit(state, hp, [-100.0] + [0.0] * 7, config)
    assert info["loser"].tolist() == [True] + [False] * 7 and info["parent"].tolist() == list(range(8))
    np.testing.assert_array_equal(new_state["w"], np.asarray(state["w"]))
    assert float(new_hp.actor_lr[0]) != float(hp.actor_lr[0])


# --- release variants ----------------------------------------------------------------------------


def test_non_bottom_parents_are_every_member_not_replaced():
    state, hp = toy_population(10)
    config = PBTConfig(quantile=0.4, parents="non_bottom", search_space=TD3_SPACE)
    parents = set()
    for seed in range(30):  # returns 1..10 (member 0 worst): losers = the 4 lowest, parents = the 6 others
        _, _, info = run_exploit(state, hp, np.arange(1.0, 11.0), config, seed)
        assert np.flatnonzero(info["loser"]).tolist() == [0, 1, 2, 3]
        parents |= set(info["parent"][:4].tolist())
    assert parents == {4, 5, 6, 7, 8, 9}


def leaf_rows(tree, m):
    return [np.asarray(x)[m] for x in jax.tree.leaves(tree)]


def same(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def td3_states():
    learner, hp = population(4)
    buffer = {"obs": jnp.arange(4 * 3, dtype=jnp.float32).reshape(4, 3)}
    return {"learner": learner, "buffer": buffer}, hp


def release_config(**kw):
    return PBTConfig(quantile=0.25, search_space=TD3_SPACE, policy_state=("actor", "target_actor"),
                     optimizer_state=(("actor_opt", "actor"), ("critic_opt", "critic")), **kw)


@pytest.mark.long
@pytest.mark.parametrize("reset", [False, True])
def test_policy_copy_leaves_the_critic_and_buffer_untouched(reset):
    states, hp = td3_states()
    new, _, info = run_exploit(states, hp, [4.0, 3.0, 2.0, 1.0], release_config(copy="policy", reset_optimizer=reset))
    assert info["loser"].tolist() == [False, False, False, True] and info["parent"][3] == 0
    old_l, new_l = states["learner"], new["learner"]
    for field in ("actor", "target_actor"):  # the parent's policy
        assert same(leaf_rows(getattr(new_l, field), 3), leaf_rows(getattr(old_l, field), 0))
    for field in ("critic", "target_critic", "critic_opt", "steps"):  # the loser's own
        assert same(leaf_rows(getattr(new_l, field), 3), leaf_rows(getattr(old_l, field), 3))
    np.testing.assert_array_equal(new["buffer"]["obs"], np.asarray(states["buffer"]["obs"]))
    actor_opt = leaf_rows(new_l.actor_opt, 3)
    if reset:  # a fresh Adam for the copied policy; the critic's Adam is the loser's
        assert all(not x.any() for x in actor_opt)
    else:
        assert same(actor_opt, leaf_rows(old_l.actor_opt, 3))
    for m in range(3):  # the others are untouched
        assert same(leaf_rows(new_l, m), leaf_rows(old_l, m))


def test_full_copy_with_reset_starts_every_optimizer_afresh():
    states, hp = td3_states()
    new, _, _ = run_exploit(states, hp, [1.0, 3.0, 2.0, 4.0], release_config(reset_optimizer=True))
    old_l, new_l = states["learner"], new["learner"]
    assert same(leaf_rows(new_l.critic, 0), leaf_rows(old_l.critic, 3))  # copied from the best
    assert all(not x.any() for x in leaf_rows(new_l.actor_opt, 0) + leaf_rows(new_l.critic_opt, 0))
    assert same(leaf_rows(new_l.critic_opt, 1), leaf_rows(old_l.critic_opt, 1))


def parse(raw, learner="td3", pop=4):
    return parse_pbt_config(raw, learner=learner, pop_size=pop, total_env_steps=10_000, eval_interval=1_000,
                            rollout_len=50)


@pytest.mark.parametrize("raw, learner, message", [
    ({"selection": "tournament"}, "td3", "pbt.selection: 'tournament' unknown (allowed: truncation, sigma)"),
    ({"parents": "all"}, "td3", "pbt.parents: 'all' unknown (allowed: top, non_bottom)"),
    ({"copy": "critic"}, "td3", "pbt.copy: 'critic' unknown (allowed: full, policy)"),
    ({"copy": "policy"}, "dqn", "pbt.copy: the learner dqn declares no policy state to copy alone (allowed: full;"),
    ({"copy": "policy", "copy_buffer": True}, "td3", "pbt.copy_buffer: a policy-only copy keeps the member's buffer"),
    ({"reset_optimizer": True}, "dqn", "pbt.reset_optimizer: the learner dqn declares no optimizer state"),
    ({"threshold_std": -1}, "td3", "pbt.threshold_std: must lie in [0, 100], got -1"),
    ({"quantile": 0}, "td3", "pbt.quantile: must lie in (0, 0.5], got 0"),
])
def test_bad_strategy_options_are_one_line(raw, learner, message):
    with pytest.raises(ConfigError) as err:
        parse(raw, learner)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_release_options_resolve_from_the_learner():
    config = parse({"copy": "policy", "reset_optimizer": True, "parents": "non_bottom", "quantile": 0.5}, "sac")
    assert config.policy_state == ("actor",) and config.copy == "policy" and config.parents == "non_bottom"
    assert dict(config.optimizer_state) == {"actor_opt": "actor", "critic_opt": "critic", "alpha_opt": "log_alpha"}


# --- PB2 ------------------------------------------------------------------------------------------


def test_pb2_kernel_beta_scaling_and_data_match_hand_values():
    a, b = np.array([[0.0, 0.5, 0.2]]), np.array([[1.0, 0.5, 0.6]])
    # exp(-0.4^2 / 1) * 0.9^(1/2): ℓ divides d² (the 2ℓ² convention would give 0.875745)
    assert pb2.kernel(a, b, (1.0, 1.0, 0.1))[0, 0] == pytest.approx(0.808415, abs=1e-6)
    assert pb2.kernel(np.array([[0.0, 0.1, 0.1]]), np.array([[1.0, 0.1, 0.1]]), (1.0, 1.0, 0.5))[0, 0] == \
        pytest.approx(0.707107, abs=1e-6)
    assert pb2.kernel(a, a, (2.5, 0.3, 0.2))[0, 0] == pytest.approx(2.5)
    assert [round(pb2.beta(n), 6) for n in (1, 2, 3, 10)] == [0.2, 0.2, 0.382322, 1.586294]
    assert np.sqrt(pb2.beta(10)) == pytest.approx(1.259482, abs=1e-6)
    np.testing.assert_allclose(pb2.standardize(np.array([0.0] * 9 + [10.0])), [-1 / 3] * 9 + [2.0], rtol=1e-6)
    assert pb2.to_unit(5.05e-4, Range(1e-5, 1e-3)) == pytest.approx(0.5, abs=1e-5)
    assert pb2.to_unit(1e-4, Range(1e-5, 1e-3)) == pytest.approx(0.0909, abs=1e-4)
    assert pb2.to_unit(1e-4, Range(1e-5, 1e-3, log=True)) == pytest.approx(0.5, abs=1e-6)  # log ranges: log space
    assert pb2.from_unit(0.999, Range(1, 8, integer=True)) == 8.0  # rounded (Ray truncates to 7)
    assert pb2.from_unit(0.5, Range(1e-5, 1e-3, log=True)) == pytest.approx(1e-4)
    rows = np.array([[0, 100, 10, 0.3], [1, 100, 5, 0.1], [0, 150, 16, 0.3], [1, 150, 9, 0.2]])
    X, y = pb2.data_points(rows)  # member 1 changed h in between: no point
    np.testing.assert_allclose(X, [[150, 10, 0.3]])
    np.testing.assert_allclose(y, [0.12])


def test_pb2_likelihood_gradient_and_pending_variance():
    rng = np.random.default_rng(0)
    X, y = rng.uniform(size=(12, 4)), rng.normal(size=12)
    log_theta = np.log([0.7, 0.4, 0.2])
    _, grad = pb2.neg_log_likelihood(log_theta, X, y)
    numeric = [(pb2.neg_log_likelihood(log_theta + e, X, y)[0] - pb2.neg_log_likelihood(log_theta - e, X, y)[0])
               / 2e-6 for e in np.eye(3) * 1e-6]
    np.testing.assert_allclose(grad, numeric, rtol=1e-4, atol=1e-6)
    gp = pb2.GP(X, y, np.exp(log_theta))
    q = rng.uniform(size=(1, 4))
    assert gp.variance(q, q)[0] < 1e-3 * gp.variance(q)[0]  # a pending pick at q: (almost) no variance left


def toy_pbt(propose, seed, rounds=10, pop=8):
    """Simulated PBT on a known objective: each round a member's return grows by g(h), the peak at h* =
    (0.7, 0.3); the 2 worst copy the return of a top-2 member and take ``propose``'s hparams. Returns the mean
    g of every proposed point."""
    rng = np.random.default_rng(seed)
    g = lambda h: 1.0 - 4.0 * float(((np.asarray(h) - [0.7, 0.3]) ** 2).sum())
    h, returns, gains = rng.uniform(size=(pop, 2)), np.zeros(pop), []
    bandit = pb2.PB2((("a", Range(0.0, 1.0)), ("b", Range(0.0, 1.0))))
    for t in range(1, rounds + 1):
        returns = returns + np.array([g(x) for x in h]) + rng.normal(0, 0.02, pop)
        for m in range(pop):
            bandit.log(m, 100 * t, returns[m], h[m])
        order = np.argsort(-returns)
        losers, parents = order[-2:], order[rng.integers(0, 2, 2)]
        picks = propose(bandit, [bandit.context(int(p), 100 * t) for p in parents], rng)
        for m, p, x in zip(losers, parents, picks, strict=True):
            h[m], returns[m] = x, returns[p]
            bandit.log(int(m), 100 * t, returns[m], x)
            gains.append(g(x))
    return float(np.mean(gains[4:]))  # after the first two rounds (no data yet: both pick at random)


@pytest.mark.long
def test_pb2_proposes_better_points_than_random_resampling():
    random = lambda bandit, contexts, rng: [rng.uniform(size=2) for _ in contexts]
    gp = lambda bandit, contexts, rng: bandit.propose(contexts, rng)
    seeds = range(6)
    with_gp = np.array([toy_pbt(gp, s) for s in seeds])
    at_random = np.array([toy_pbt(random, s) for s in seeds])
    # uniform points average g = 1 - 4 (2/12 + 0.2² + 0.2²) = 0.013
    # seeded values: random 0.02, PB2 0.40 (better in 5 of 6)
    assert abs(at_random.mean() - 0.013) < 0.1
    assert with_gp.mean() - at_random.mean() > 0.3, (with_gp, at_random)
    assert (with_gp > at_random).sum() >= 4, (with_gp, at_random)


# --- multi-frequency PBT ------------------------------------------------------------------------------------


MF_CONFIG = PBTConfig(quantile=0.25, subpopulations=(4, 4), frequencies=(1, 2), search_space=TD3_SPACE)
mf_exploit = jax.jit(lambda k, s, h, f, r: exploit_and_explore(k, s, h, f, MF_CONFIG, r))


def mf_round(round_index):
    state, hp = toy_population(8)
    hp = hp.replace(tau=jnp.arange(1, 9, dtype=jnp.float32) / 100)  # not explored: shows whose hparams are taken
    fitness = [10.0, 20.0, 30.0, 40.0, 15.0, 25.0, 35.0, 45.0]  # P1 = members 0-3, P2 = members 4-7
    new_state, new_hp, info = jax.tree.map(np.asarray, mf_exploit(jax.random.key(0), state, hp, jnp.asarray(fitness),
                                                                  jnp.int32(round_index)))
    weights = [int(w) // 6 for w in new_state["w"][:, 0, 0]]  # member m's weights start at 6 m
    hparams_from = [int(round(t * 100)) - 1 for t in new_hp.tau]
    return weights, hparams_from, np.flatnonzero(info["explored"]).tolist(), info


def test_multi_frequency_groups_exploit_at_their_own_interval_and_migrate():
    # round 0: only P1 (frequency 1) evolves: member 0 (B4) takes member 3 (B1) and is explored; member 1 (B3)
    # meets the best other member, 7 (45 > 20): weights and hparams from the steadier P2
    assert mf_round(0)[:3] == ([3, 7, 2, 3, 4, 5, 6, 7], [3, 7, 2, 3, 4, 5, 6, 7], [0])
    # round 1: both evolve; in P2 member 4 takes 7; member 5 (25) takes member 3's weights (40) but, 3 being from
    # the more dynamic P1, the hparams of P2's best, 7
    weights, hparams_from, explored, info = mf_round(1)
    assert (weights, hparams_from, explored) == ([3, 7, 2, 3, 7, 3, 6, 7], [3, 7, 2, 3, 7, 7, 6, 7], [0, 4])
    assert info["loser"].tolist() == [True, True, False, False, True, True, False, False]
    assert mf_round(2)[:3] == mf_round(0)[:3]  # P2 evolves every second round only


def test_multi_frequency_replaces_broken_members_in_every_round():
    """Issue 37: a NaN member of a resting sub-population (5, in P2 at round 0), or one beyond B4 (0, in P1 with
    three NaN members and q = 1), takes its sub-population's best valid member and is explored."""
    state, hp = toy_population(8)
    nan = float("nan")
    fitness = jnp.asarray([nan, nan, nan, 40.0, 15.0, nan, 35.0, 45.0])
    new_state, _, info = jax.tree.map(np.asarray, mf_exploit(jax.random.key(0), state, hp, fitness, jnp.int32(0)))
    # P1 ranked [3, 0, 1, 2]: B4 = 2 takes 3; B3 = 1 migrates from 7; 0 (broken, in B2) takes 3. P2 rests: 5 takes 7
    assert info["parent"].tolist() == [3, 7, 3, 3, 4, 7, 6, 7]
    assert [int(w) // 6 for w in new_state["w"][:, 0, 0]] == [3, 7, 3, 3, 4, 7, 6, 7]
    assert np.flatnonzero(info["explored"]).tolist() == [0, 2, 5]
    assert np.flatnonzero(info["loser"]).tolist() == [0, 1, 2, 5]
    # a round with every member valid is unchanged by the rule (the hand-checked rounds above)
    assert mf_round(0)[:3] == ([3, 7, 2, 3, 4, 5, 6, 7], [3, 7, 2, 3, 4, 5, 6, 7], [0])


@pytest.mark.parametrize("raw, message", [
    ({"subpopulations": [4, 2], "frequencies": [1, 2]}, "pbt.subpopulations: sizes [4, 2] sum to 6, not pop_size 8"),
    ({"subpopulations": [4, 4]}, "pbt.frequencies: required with subpopulations"),
    ({"subpopulations": [4, 4], "frequencies": [2, 1]}, "pbt.frequencies: must be increasing, got [2, 1]"),
    ({"subpopulations": [4, 4], "frequencies": [1, 2, 3]}, "pbt.frequencies: 3 values for 2 sub-populations"),
    ({"subpopulations": [6, 2], "frequencies": [1, 2], "quantile": 0.25}, "pbt.subpopulations: a sub-population of 2"),
    ({"subpopulations": [4, 4], "frequencies": [1, 2], "selection": "sigma"}, "pbt.selection: multi-frequency PBT"),
])
def test_bad_multi_frequency_options_are_one_line(raw, message):
    with pytest.raises(ConfigError) as err:
        parse(raw, pop=8)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


# --- every strategy in the training loop: traced once, exact resume ------------------------------------------

STRATEGY_RUN = dict(learner="td3", env="probe:pendulum", driver="pbt", pop_size=4, seed=5, total_env_steps=1500,
                    warmup_steps=250, eval_interval=250, rollout_len=25, batch_size=16, buffer_size=2000,
                    eval_episodes=1, learner_config={"hidden": [8, 8]}, progress=False)
STRATEGIES = {
    "pb2": {"explore": "pb2", "quantile": 0.25},
    "sigma-release-constraints": {"selection": "sigma", "threshold_std": 0.5, "parents": "non_bottom",
                                  "copy": "policy", "reset_optimizer": True,
                                  "constraints": ["noise_clip >= target_noise"]},
    "multi-frequency": {"subpopulations": [3, 3], "frequencies": [1, 2], "quantile": 0.34, "pop_size": 6},
}


def kill_and_resume(run, tmp_path):
    """The run cut back to its oldest kept checkpoint (a kill before an exploit), resumed."""
    import popjax

    cut, step = killed_copy(run.out_dir, tmp_path / "cut")
    return popjax.resume(cut), step * 25


# PB2 (host state that must resume) runs by default; the others behind `slow` (make test-slow), to keep the
# default suite within its time.
@pytest.mark.long
@pytest.mark.parametrize("name", [name if name == "pb2" else pytest.param(name, marks=pytest.mark.slow)
                                  for name in STRATEGIES])
def test_strategy_runs_traced_once_and_resumes_exactly(name, tmp_path, compilers):
    from learner_helpers import use_shared_xla_cache

    import popjax

    use_shared_xla_cache()
    options = dict(STRATEGIES[name])
    run = popjax.train(out_dir=tmp_path / "full", **{**STRATEGY_RUN, "pop_size": options.pop("pop_size", 4)},
                       pbt={"interval": 250, **options})
    traces = compilers[-1].traces
    assert traces["iteration"] == 1 and set(traces.values()) == {1}, traces
    lineage = run.summary["lineage"]
    assert lineage and {e["env_steps"] for e in lineage} <= {250, 500, 750, 1000, 1250}
    if name == "pb2":  # the host's proposals were written (a compiled call, traced once) and differ from the parent's
        assert traces["set_hparams"] == 1
        assert all(e["new_hparams"] != e["old_hparams"] for e in lineage)
    if "constraints" in options:
        rows = csv_rows(run.out_dir / "lineage.csv")
        assert all(float(r["noise_clip"]) >= float(r["target_noise"]) for r in rows)
    resumed, at = kill_and_resume(run, tmp_path)
    assert any(e["env_steps"] > at for e in lineage)  # an exploit after the checkpoint resumed from
    assert set(compilers[-1].traces.values()) == {1}
    timing = ("wall_s", "compile_s")
    assert {k: v for k, v in resumed.summary.items() if k not in timing} == \
        {k: v for k, v in run.summary.items() if k not in timing}
    for a, b in zip(jax.tree.leaves(resumed.state), jax.tree.leaves(run.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# --- lineage.csv, pbt-schedule and the replay ------------------------------------------------------


@pytest.fixture(scope="module")
def pbt_run(tmp_path_factory):
    from learner_helpers import use_shared_xla_cache

    import popjax

    use_shared_xla_cache()
    return popjax.train(out_dir=tmp_path_factory.mktemp("pbt"), **STRATEGY_RUN,
                        pbt={"interval": 250, "quantile": 0.25, "explore": "perturb"})


def csv_rows(path):
    import csv

    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.long
def test_lineage_csv_has_every_member_at_every_round(pbt_run):
    rows = csv_rows(pbt_run.out_dir / "lineage.csv")
    assert list(rows[0])[:5] == ["round", "member", "parent", "fitness", "env_steps"] and "actor_lr" in rows[0]
    assert [(int(r["round"]), int(r["member"])) for r in rows] == [(k, m) for k in range(6) for m in range(4)]
    assert {int(r["env_steps"]) for r in rows if r["round"] != "0"} == {250, 500, 750, 1000, 1250}
    replaced = {(e["env_steps"], e["member"], e["parent"]) for e in pbt_run.summary["lineage"]}
    assert replaced == {(int(r["env_steps"]), int(r["member"]), int(r["parent"])) for r in rows
                        if r["member"] != r["parent"]}
    assert (pbt_run.out_dir / "plots" / "pbt_lineage.png").stat().st_size > 10_000


@pytest.mark.long
def test_schedule_replay_reproduces_the_best_members_hparams_at_every_round(pbt_run, tmp_path, capsys):
    import yaml

    from popjax import cli

    mine = tmp_path / "notes.yaml"
    mine.write_text("keep: me\n")  # a file popjax did not write: refused, left as it is
    assert cli.main(["pbt-schedule", str(pbt_run.out_dir), "--out", str(mine)]) == 2
    assert "is not a schedule popjax wrote" in capsys.readouterr().err and mine.read_text() == "keep: me\n"
    assert cli.main(["pbt-schedule", str(pbt_run.out_dir), "--out", str(tmp_path / "s.yaml")]) == 0
    assert cli.main(["pbt-schedule", str(pbt_run.out_dir), "--out", str(tmp_path / "s.yaml")]) == 0  # its own
    data = yaml.safe_load((tmp_path / "s.yaml").read_text())
    final = pbt_run.summary["final_returns"]
    assert data["member"] == int(np.argmax(final)) and data["learner"] == "td3"
    schedule = data["schedule"]
    assert [e["env_steps"] for e in schedule] == [0, 250, 500, 750, 1000, 1250]
    # independently of lineage.csv: follow the summary's exploits back from the best member; the hparams its
    # ancestor trained with up to the next round are the ones metrics.csv logged for it at that round
    metrics = {(int(float(r["env_steps"])), int(float(r["member"]))): r for r in csv_rows(pbt_run.out_dir /
                                                                                           "metrics.csv")}
    parents = {(e["env_steps"], e["member"]): e["parent"] for e in pbt_run.summary["lineage"]}
    member = data["member"]
    for entry, end in zip(schedule[::-1], [1500, 1250, 1000, 750, 500, 250], strict=True):
        logged = metrics[(end, member)]
        for name, value in entry["hparams"].items():
            assert float(logged[name]) == pytest.approx(value, rel=1e-6), (end, member, name)
        member = parents.get((entry["env_steps"], member), member)
    assert len(set(map(str, (e["hparams"] for e in schedule)))) > 1  # the winner's hparams changed

    out = tmp_path / "replay"
    flags = ["--learner", "td3", "--env", "probe:pendulum", "--pop", "2", "--steps", "1500", "--warmup", "250",
             "--eval-interval", "250", "--rollout-len", "25", "--batch-size", "16", "--buffer-size", "2000",
             "--eval-episodes", "1", "--learner-config", "hidden=[8, 8]", "--no-progress"]
    assert cli.main(["train", *flags, "--schedule", str(tmp_path / "s.yaml"), "--out", str(out)]) == 0
    rows = csv_rows(out / "metrics.csv")
    for row in rows:  # the hparams trained with up to this evaluation: the entry before it
        steps = int(float(row["env_steps"]))
        entry = [e for e in schedule if e["env_steps"] < steps][-1]
        for name, value in entry["hparams"].items():
            assert float(row[name]) == pytest.approx(value, rel=1e-6), (steps, name)
    assert {int(float(r["member"])) for r in rows} == {0, 1}

    # a schedule for another learner or env, or with PBT: one line, exit 2, nothing written
    capsys.readouterr()
    bad_cases = ((["--learner", "sac"], "independent.schedule.learner: the schedule is for td3, this run trains sac"),
                 (["--env", "gym:Pendulum-v1"], "independent.schedule.env: the schedule is for probe:pendulum"),
                 (["--driver", "pbt"], "driver: --schedule trains without PBT (allowed: independent)"))
    for extra, message in bad_cases:
        bad = tmp_path / "bad"
        code = cli.main(["train", *flags, *extra, "--schedule", str(tmp_path / "s.yaml"), "--out", str(bad)])
        err = capsys.readouterr().err
        assert code == 2 and message in err and err.count("\n") == 1 and not bad.exists(), err
    assert cli.main(["pbt-schedule", str(out)]) == 2  # not a PBT run: no lineage
    assert "has no lineage.csv" in capsys.readouterr().err


# --- constraints and categorical choices --------------------------------------------------------------------

CONSTRAINED_SPACE = {"noise_clip": {"low": 0.0, "high": 1.0}, "target_noise": {"low": 0.0, "high": 1.0},
                     "policy_delay": {"choices": [1, 2, 3, 4, 6]}, "actor_lr": {"low": 1e-4, "high": 1e-2, "log": True}}
CONSTRAINTS = ["noise_clip >= target_noise", "policy_delay divides 12", "policy_delay <= rollout_len",
               "actor_lr < 0.005"]


def constrained_config(explore, pop=10_000, **kw):
    return parse({"search_space": CONSTRAINED_SPACE, "constraints": CONSTRAINTS, "explore": explore,
                  "quantile": 0.5, **kw}, pop=pop)


def check_relations(hp):
    table = {n: np.asarray(getattr(hp, n)) for n in ("noise_clip", "target_noise", "policy_delay", "actor_lr")}
    assert (table["noise_clip"] >= table["target_noise"]).all()
    assert set(np.unique(table["policy_delay"]).tolist()) == {1, 2, 3, 4, 6}  # 12 % d == 0 and d <= 50
    assert (table["actor_lr"] < 0.005).all() and (table["actor_lr"] >= 1e-4).all()
    assert 0.3 < (table["noise_clip"] > 0.5).mean()  # redrawn from the prior, not collapsed to one point
    return table


@pytest.mark.long
@pytest.mark.parametrize("explore", ["resample", "perturb"])
def test_constraints_are_never_violated_in_10k_draws(explore):
    from popjax.drivers.pbt_round import initial_hparams
    from popjax.learners import td3
    from popjax.population.hparams import population_hparams

    config = constrained_config(explore, resample_probability=0.0)
    assert [str(c) for c in config.constraints] == ["noise_clip >= target_noise", "policy_delay divides 12",
                                                    "policy_delay <= 50", "actor_lr < 0.005"]
    start = jax.jit(lambda key: initial_hparams(key, population_hparams(td3.default_hparams(), 10_000),
                                                config.space, config=config))(jax.random.key(0))
    check_relations(start)
    fitness = jnp.asarray(np.random.default_rng(0).normal(size=10_000), jnp.float32)
    states = {"w": jnp.zeros((10_000, 1))}
    _, new_hp, info = jax.jit(exploit_and_explore, static_argnums=4)(jax.random.key(1), states, start, fitness, config)
    table = check_relations(new_hp)
    explored = np.asarray(info["explored"])
    assert explored.sum() == 5_000
    if explore == "perturb":  # categorical choices step to a neighbour (or reflect at the ends) unless a broken
        # relation redrew the member's constrained hparams jointly (a few percent)
        parent = np.asarray(info["parent"])
        old = np.asarray(start.policy_delay)[parent][explored].tolist()
        new = table["policy_delay"][explored].tolist()
        choices = [1, 2, 3, 4, 6]
        neighbours = [abs(choices.index(a) - choices.index(b)) == 1 for a, b in zip(old, new, strict=True)]
        assert 0.85 < np.mean(neighbours) < 1.0


@pytest.mark.parametrize("raw, message", [
    ({"constraints": ["noise_clip >= 2"]},
     "pbt.constraints[0]: no value of the search space satisfies noise_clip >= 2 (none of 10000 prior draws)"),
    ({"constraints": ["noise_clip >= target_noise + 1"]}, "pbt.constraints[0]: expected '<hparam> <op>"),
    ({"constraints": ["tau <= 0.5"]}, "pbt.constraints[0]: 'tau' is neither an explored hparam nor a number"),
    ({"constraints": ["1 <= 2"]}, "pbt.constraints[0]: '1 <= 2' relates no explored hparam"),
    ({"constraints": ["noise_clip >= target_noise", "target_noise > 0.9", "noise_clip < 0.1"]},
     "pbt.constraints: no values of the search space satisfy all of them together"),
    ({"explore": "pb2", "search_space": {"policy_delay": {"choices": [1, 2]}}},
     "pbt.search_space.policy_delay: pb2 needs a {low, high} bound for every explored hparam"),
    ({"search_space": {"policy_delay": {"choices": [1, 2.5]}}}, "pbt.search_space.policy_delay.choices[1]: expected"),
    ({"search_space": {"policy_delay": {"choices": [1, 2], "low": 1}}}, "pbt.search_space.policy_delay.low: choices"),
    ({"explore": "pb2", "search_space": {"actor_lr": {"low": 1e-4}}}, "pbt.search_space.actor_lr.high: required"),
])
def test_bad_constraints_are_one_line_before_anything_runs(raw, message):
    with pytest.raises(ConfigError) as err:
        parse({"search_space": "td3", **raw})
    assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)


def test_train_help_lists_the_strategy_options_from_the_schema(capsys):
    from popjax import cli

    assert cli.main(["train", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for text in ("one of resample, perturb, pb2", "one of truncation, sigma", "one of top, non_bottom",
                 "one of full, policy", "reset_optimizer", "subpopulations", "frequencies", "threshold_std",
                 "threshold_abs", "constraints", "--schedule FILE", "independent: schedule"):
        assert text in out, text


def test_pb2_fits_identical_inputs():
    X = np.array([[0.5, 0.2, 0.3, 0.3]] * 3 + [[1.0, 0.4, 0.6, 0.1]])  # three members copied from one parent
    gp = pb2.GP(X, np.array([1.0, 1.0, 1.0, -1.0]), np.array([1.0, 1e5, 1e-5]))
    assert np.isfinite(gp.mean(X)).all() and np.isfinite(gp.variance(X)).all()
