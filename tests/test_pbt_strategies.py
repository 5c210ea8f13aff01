"""PBT strategies (issue 28): σ-threshold selection, the fast-PBT release variants (parents, policy-only copy,
optimizer reset), PB2, multi-frequency PBT, constraints and the schedule replay; hand-checked values from the
strategies' reference code."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_pbt import TD3_SPACE, population, run_exploit, toy_population

from popjax.config import ConfigError
from popjax.drivers.pbt import PBTConfig, parse_pbt_config
from popjax.population import selection

# --- σ-threshold selection (Isaac Lab) --------------------------------------------------------------


def sigma(fitness, k=0.1, margin=0.05):
    fitness = jnp.asarray(fitness, jnp.float32)
    loser, leaders = selection.sigma_threshold(fitness, jnp.ones(fitness.shape, bool), k, margin)
    order, _ = selection.rank_members(fitness, jnp.ones(fitness.shape, bool))
    return np.flatnonzero(np.asarray(loser)).tolist(), sorted(np.asarray(order)[: int(leaders)].tolist())


def test_sigma_threshold_selects_what_the_hand_computation_names():
    # o = 0..7: mean 3.5, std 2.291288; k = 0.1 -> cuts 3.729129 / 3.270871
    assert sigma(np.arange(8.0)) == ([0, 1, 2, 3], [4, 5, 6, 7])
    assert sigma(np.arange(8.0), k=1.0) == ([0, 1], [6, 7])  # cuts 5.791 / 1.209
    assert sigma([1.0, 1.0, 1.0, 1.0]) == ([], [])  # std 0: the band is ±A, nobody moves
    # mean 0.5425: A = 0.05 dominates k std = 0.0038 -> upper 0.5925, lower 0.4925
    assert sigma([0.50, 0.52, 0.55, 0.60]) == ([], [3])
    assert sigma([0.50, 0.52, 0.55, 0.60], margin=0.025) == ([0], [3])  # lower 0.5175


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
    return parse_pbt_config(raw, learner=learner, pop_size=pop, total_env_steps=10_000, eval_interval=1_000)


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
