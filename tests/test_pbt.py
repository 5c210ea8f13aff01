"""PBT: exploit/explore with fixed fitness, exploration bounds, config checks, no retrace, lineage."""

import csv
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from learner_helpers import use_shared_xla_cache

from popjax.config import ConfigError
from popjax.drivers.base import Counters
from popjax.drivers.pbt_host import PBTHost
from popjax.drivers.pbt_options import PBTConfig, parse_pbt_config
from popjax.drivers.pbt_round import (
    PBTState,
    exploit_and_explore,
    initial_hparams,
    initial_record,
    pbt_after_eval,
    perturb_value,
    window_fitness,
)
from popjax.envs.registry import make_jax_env
from popjax.learners import dqn, sac, td3
from popjax.population.hparams import Range, hparam_names, hparams_table, population_hparams
from popjax.population.search_spaces import SEARCH_SPACES, get_search_space

SPEC = make_jax_env("probe:pendulum").spec
LEARNER = td3.make_td3(td3.TD3Config(hidden=(8, 8)), SPEC)
TD3_SPACE = tuple(sorted(get_search_space("td3").items()))


@functools.lru_cache
def population(pop: int, seed: int = 0):
    """A TD3 population with prior-sampled hparams (one jitted call: eager init is slow)."""

    def make(key):
        hp = population_hparams(td3.default_hparams(), pop)
        hp = initial_hparams(jax.random.fold_in(key, 1), hp, dict(TD3_SPACE))
        state = jax.vmap(LEARNER.init)(jax.random.split(key, pop), hp)
        # distinct counters too, so a copied counter is visible
        return state.replace(steps=jnp.arange(pop, dtype=jnp.int32) * 10), hp

    return jax.jit(make)(jax.random.key(seed))


@functools.lru_cache
def prior_hparams(pop: int, seed: int = 0):
    def make(key):
        return initial_hparams(key, population_hparams(td3.default_hparams(), pop), dict(TD3_SPACE))

    return jax.jit(make)(jax.random.key(seed))


def toy_population(pop: int):
    """A small state (cheap to compile) whose members all differ, with prior-sampled TD3 hparams."""
    state = {"w": jnp.arange(pop * 6, dtype=jnp.float32).reshape(pop, 2, 3),
             "steps": jnp.arange(pop, dtype=jnp.int32)}
    return state, prior_hparams(pop)


def run_exploit(state, hp, fitness, config, seed=1):
    fn = jax.jit(exploit_and_explore, static_argnums=4)
    out = fn(jax.random.key(seed), state, hp, jnp.asarray(fitness, jnp.float32), config)
    return jax.tree.map(np.asarray, out)


def member_leaves(tree, m):
    return [np.asarray(x)[m] for x in jax.tree.leaves(tree)]


def assert_same_member(tree_a, a, tree_b, b):
    for x, y in zip(member_leaves(tree_a, a), member_leaves(tree_b, b), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.long
def test_bottom_quantile_copies_full_state_of_a_top_parent():
    state, hp = population(8)
    # ranks (ties: lower index ranks higher): 4, 7, 0, 2, 3, 5, 6, 1 -> losers {6, 1}, winners {4, 7}
    fitness = [5.0, 1.0, 3.0, 2.0, 7.0, 2.0, 2.0, 6.0]
    config = PBTConfig(quantile=0.25, explore="resample", search_space=TD3_SPACE)
    new_state, new_hp, info = run_exploit(state, hp, fitness, config)
    assert np.flatnonzero(info["loser"]).tolist() == [1, 6]
    assert info["rank"].tolist() == [2, 7, 3, 4, 0, 5, 6, 1]
    old_table, new_table = hparams_table(hp), hparams_table(new_hp)
    for m in range(8):
        p = int(info["parent"][m])
        if m in (1, 6):
            assert p in (4, 7)
            assert_same_member(new_state, m, state, p)  # params, targets, Adam states, counter
            assert int(new_state.steps[m]) == 10 * p
            for name in hparam_names(hp):
                r = dict(TD3_SPACE).get(name)
                if r is None:  # not explored: the parent's value
                    assert new_table[name][m] == old_table[name][p]
                else:
                    assert r.low <= new_table[name][m] <= r.high
                    if not r.integer:  # resampled continuous values differ almost surely
                        assert new_table[name][m] != old_table[name][p]
            assert np.asarray(new_hp.policy_delay).dtype == np.int32
        else:
            assert p == m
            assert_same_member(new_state, m, state, m)
            assert all(new_table[n][m] == old_table[n][m] for n in old_table)


def test_parents_are_drawn_from_the_top_quantile_only():
    state, hp = toy_population(10)
    fitness = np.arange(10, dtype=np.float32)[::-1]  # member 0 best ... 9 worst
    config = PBTConfig(quantile=0.3, search_space=TD3_SPACE)
    parents = set()
    for seed in range(20):
        _, _, info = run_exploit(state, hp, fitness, config, seed)
        assert np.flatnonzero(info["loser"]).tolist() == [7, 8, 9]
        parents |= set(info["parent"][[7, 8, 9]].tolist())
    assert parents == {0, 1, 2}


def test_copy_buffer_copies_the_replay_buffer_too():
    state, hp = toy_population(4)
    buffers = {"obs": jnp.arange(4 * 5, dtype=jnp.float32).reshape(4, 5)}
    config = PBTConfig(quantile=0.25, copy_buffer=True, search_space=TD3_SPACE)
    (new_state, new_buf), _, info = run_exploit((state, buffers), hp, [4.0, 3.0, 2.0, 1.0], config)
    assert info["loser"].tolist() == [False, False, False, True] and info["parent"][3] == 0
    np.testing.assert_array_equal(new_buf["obs"][3], np.asarray(buffers["obs"])[0])
    np.testing.assert_array_equal(new_buf["obs"][:3], np.asarray(buffers["obs"])[:3])


@pytest.mark.long
def test_nan_fitness_and_non_finite_params_are_always_replaced():
    state, hp = toy_population(6)
    # member 1 has an inf parameter: broken although its fitness is the best
    state = {**state, "w": state["w"].at[1, 0, 2].set(jnp.inf)}
    fitness = [np.nan, 9.0, 5.0, 4.0, 3.0, 1.0]
    config = PBTConfig(quantile=0.2, search_space=TD3_SPACE)  # int(0.2 * 6) = 1 loser by rank
    new_state, _, info = run_exploit(state, hp, fitness, config)
    assert info["valid"].tolist() == [False, False, True, True, True, True]
    # both broken members are replaced although only one loser slot exists; they rank last
    assert np.flatnonzero(info["loser"]).tolist() == [0, 1]
    assert info["rank"].tolist() == [4, 5, 0, 1, 2, 3]
    for m in (0, 1):
        assert info["parent"][m] == 2
        assert_same_member(new_state, m, state, 2)
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(new_state))
    # with fewer broken members than loser slots, the broken one fills a slot first
    config = PBTConfig(quantile=0.34, search_space=TD3_SPACE)  # 2 losers, parents among the top 2
    _, _, info = run_exploit(state, hp, [5.0, np.nan, 9.0, 4.0, 3.0, 1.0], config)
    assert np.flatnonzero(info["loser"]).tolist() == [1, 5]
    assert set(info["parent"][[1, 5]].tolist()) <= {0, 2}


@pytest.mark.long
def test_perturb_moves_by_the_factors_inside_the_space():
    state, hp = toy_population(8)
    config = PBTConfig(quantile=0.5, explore="perturb", perturb_factors=(0.8, 1.2), resample_probability=0.0,
                       search_space=TD3_SPACE)
    _, new_hp, info = run_exploit(state, hp, np.arange(8.0), config)  # losers 0..3
    old, new = hparams_table(hp), hparams_table(new_hp)
    space = dict(TD3_SPACE)
    for m in np.flatnonzero(info["loser"]).tolist():
        p = int(info["parent"][m])
        for name, r in space.items():
            x, y = old[name][p], new[name][m]
            assert r.low <= y <= r.high and y != x, (name, x, y)
            if r.log:  # multiplicative in log space: log y = log x +- log 1.2 (or reflected)
                assert np.isclose(abs(np.log(y / x)), [-np.log(0.8), np.log(1.2)], rtol=1e-4, atol=0).any() \
                    or y in (r.low, r.high)
            elif r.integer:
                assert abs(y - x) >= 1
    # the value-level rule: reflected at the upper bound, nudged for integers
    r = Range(0.9, 1.0)
    key = jax.random.key(0)
    for v in (0.91, 0.95, 0.99, 1.0):
        y = float(perturb_value(key, jnp.float32(v), r, (1.2,)))
        assert 0.9 <= y <= 1.0 and y != pytest.approx(v)
    assert int(perturb_value(key, jnp.int32(5), Range(1, 5, integer=True), (1.2,))) == 4
    assert int(perturb_value(key, jnp.int32(2), Range(1, 5, integer=True), (1.2,))) == 3


@pytest.mark.long
def test_samplers_stay_in_the_space_and_integers_are_uniform():
    key = jax.random.key(0)
    ints = np.asarray(Range(1, 5, integer=True).sample(key, (20_000,)))
    counts = np.bincount(ints.astype(int), minlength=6)[1:]
    assert set(np.unique(ints).tolist()) == {1, 2, 3, 4, 5}
    assert np.all(np.abs(counts / 20_000 - 0.2) < 0.015)
    lr = np.asarray(Range(3e-5, 3e-3, log=True).sample(key, (20_000,)))
    assert lr.min() >= 3e-5 and lr.max() <= 3e-3
    assert abs(np.mean(np.log10(lr)) - np.log10(3e-4)) < 0.02  # log-uniform: median at the geometric middle
    defaults = population_hparams(td3.default_hparams(), 16)
    hp = initial_hparams(key, defaults, dict(TD3_SPACE), keep={"discount"})
    table = hparams_table(hp)
    assert table["discount"] == [0.99] * 16 and table["tau"] == [0.005] * 16
    assert len(set(table["actor_lr"])) == 16 and np.asarray(hp.policy_delay).dtype == np.int32


def test_search_spaces_match_the_learners_hparams():
    for name, defaults in (("td3", td3.default_hparams()), ("sac", sac.default_hparams()),
                           ("sac_code", sac.default_hparams()), ("dqn", dqn.default_hparams())):
        space = get_search_space(name, hparam_names(defaults))
        assert space
    assert SEARCH_SPACES["td3"]["policy_delay"] == {"low": 1, "high": 5, "integer": True}
    assert get_search_space("sac")["target_entropy_scale"] == Range(0.2, 2.0)
    assert get_search_space("sac")["reward_scale"] == Range(0.1, 10.0)
    assert get_search_space("td3")["actor_lr"] == Range(3e-5, 3e-3, log=True)


@pytest.mark.parametrize("raw, message", [
    ({"intervall": 5}, "pbt.intervall: unknown key (allowed: interval, quantile"),
    ({"quantile": 0.6}, "pbt.quantile: must lie in (0, 0.5]"),
    ({"quantile": 0.1}, "pbt.quantile: int(0.1 x pop_size 4) = 0"),
    ({"explore": "mutate"}, "pbt.explore: 'mutate' unknown (allowed: resample, perturb, pb2)"),
    ({"perturb_factors": [0.8, -1]}, "pbt.perturb_factors"),
    ({"resample_probability": 2}, "pbt.resample_probability: must lie in [0, 1]"),
    ({"fitness_window": 0}, "pbt.fitness_window: must lie in [1, 1000], got 0"),
    ({"fitness_window": 1.5}, "pbt.fitness_window: expected an integer in [1, 1000], got 1.5"),
    ({"copy_buffer": "yes"}, "pbt.copy_buffer: expected true or false"),
    ({"interval": 0}, "pbt.interval: must lie in [1, 1073741824], got 0"),
    ({"search_space": "ppo3"}, "pbt.search_space: 'ppo3' unknown (allowed: td3, sac, sac_code, dqn"),
    ({"search_space": {"lr": {"low": 1e-4, "high": 1e-3}}}, "pbt.search_space.lr: unknown hparam (allowed: actor_lr"),
    ({"search_space": {"actor_lr": {"low": 0, "high": 1e-3, "log": True}}},
     "pbt.search_space.actor_lr.low: a log-uniform range needs low > 0, got 0"),
])
def test_bad_pbt_config_fails_with_one_line_message(raw, message):
    with pytest.raises(ConfigError) as err:
        parse_pbt_config(raw, learner="td3", hparams_names=hparam_names(td3.default_hparams()), pop_size=4,
                         total_env_steps=10_000, eval_interval=1_000)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_good_pbt_config_is_resolved():
    config = parse_pbt_config({"interval": "2e3", "explore": "perturb", "perturb_factors": [0.5, 2],
                               "search_space": {"actor_lr": {"low": 1e-4, "high": 1e-3, "log": True}}},
                              learner="td3", hparams_names=hparam_names(td3.default_hparams()), pop_size=8,
                              total_env_steps=10_000, eval_interval=1_000)
    assert config.interval == 2000 and config.perturb_factors == (0.5, 2.0) and config.num_losers(8) == 2
    assert config.space == {"actor_lr": Range(1e-4, 1e-3, log=True)}
    assert parse_pbt_config({}, learner="sac", hparams_names=hparam_names(sac.default_hparams()), pop_size=8,
                            total_env_steps=100_000, eval_interval=5_000).interval == 10_000


def counted_td3(monkeypatch) -> list:
    """Replaces the registered TD3 by one whose ``update`` appends to the returned list when traced."""
    import dataclasses

    from popjax.learners import LEARNERS

    traces = []
    definition = LEARNERS["td3"]

    def make(config, spec):
        learner = definition.make(config, spec)
        inner = learner.step.update

        def update(*args):
            traces.append(1)
            return inner(*args)

        return learner._replace(step=learner.step._replace(update=update))

    monkeypatch.setitem(LEARNERS, "td3", dataclasses.replace(definition, make=make))
    return traces


@pytest.mark.long
def test_no_retrace_after_exploit(monkeypatch):
    """The iteration is traced once although PBT changed every hparam value (incl. int32 delay)."""
    from popjax.config import make_config
    from popjax.experiment import build

    traces = counted_td3(monkeypatch)
    loop = build(make_config(learner="td3", env="probe:pendulum", driver="pbt", pop_size=8, total_env_steps=100,
                             warmup_steps=0, rollout_len=2, eval_interval=2, batch_size=8, buffer_size=64,
                             learner_config={"hidden": [8, 8]}, pbt={"interval": 1, "quantile": 0.25},
                             progress=False))
    state, env_state = loop.initial_state()
    hp = jax.tree.map(np.asarray, state.hparams)
    for _ in range(3):
        state, env_state, _ = loop.step(state, env_state)
        state = loop.unpacked(state)  # the JAX path keeps the state packed between iterations
        before = hparams_table(state.hparams)
        state, info = loop.after_eval(state, np.arange(8.0))
        assert info["ready"] and hparams_table(state.hparams) != before
    state, env_state, _ = loop.step(state, env_state)
    state = loop.unpacked(state)
    assert len(traces) == 1 and loop.compiler.traces["iteration"] == 1 and loop.compiler.traces["after_eval"] == 1
    assert int(state.pbt.rounds) == 3
    assert jax.tree.map(lambda x: x.dtype, state.hparams) == jax.tree.map(lambda x: x.dtype, hp)
    assert int(state.learner.steps.min()) >= 2  # members trained between exploits


def test_driver_readiness_fitness_window_and_lineage():
    toy, hp = toy_population(4)
    config = PBTConfig(interval=200, quantile=0.25, fitness_window=2, search_space=TD3_SPACE)
    after_eval = jax.jit(pbt_after_eval, static_argnums=(3, 4))
    host = PBTHost()
    state = PBTState(learner=toy, buffer={"x": jnp.zeros((4, 2))}, hparams=hp, counters=Counters.zeros(),
                     pbt=initial_record(2, 4))
    evals = {100: [0.0, 5.0, 1.0, 9.0], 200: [10.0, 5.0, 2.0, -1.0], 300: [0, 0, 0, 0],
             400: [3.0, 1.0, 8.0, 8.0], 500: [3.0, 1.0, 8.0, 8.0], 600: [0, 0, 0, 0]}
    snapshots = {}
    for steps, returns in evals.items():
        state = state.replace(counters=Counters(env_steps=jnp.int32(steps), updates=jnp.int32(0)))
        before = jax.tree.map(np.array, state)  # host copy: after_eval donates the state it replaces
        state, info = after_eval(jax.random.key(steps), state, jnp.asarray(returns, jnp.float32), config, 600)
        host.record(state, steps, np.asarray(returns), jax.device_get(info))
        snapshots[steps] = (before, jax.tree.map(np.array, state))
        if steps == 200:  # the loser's window restarts
            assert state.pbt.count.tolist() == [2, 2, 0, 2]
    # ready at 200 and 400 (every 200 env steps); not at 600 = the end of training
    assert [e["env_steps"] for e in host.lineage] == [200, 400] and int(state.pbt.rounds) == 2
    first, second = host.lineage
    # at 200, fitness = mean of the last 2 evals = [5, 5, 1.5, 4]: member 2 loses; 0 and 1 tie, 0 ranks higher
    assert (first["member"], first["parent"], first["fitness"], first["parent_fitness"]) == (2, 0, 1.5, 5.0)
    # at 400: [1.5, 0.5, 4, 4] (member 2 counts only its evals since its exploit: 0 and 8)
    assert (second["member"], second["parent"]) == (1, 2)
    assert (second["fitness"], second["parent_fitness"]) == (0.5, 4.0)
    for entry in host.lineage:
        before, after = snapshots[entry["env_steps"]]
        m, p = entry["member"], entry["parent"]
        assert entry["old_hparams"] == {n: v[m] for n, v in hparams_table(before.hparams).items()}
        assert entry["new_hparams"] == {n: v[m] for n, v in hparams_table(after.hparams).items()}
        assert_same_member(after.learner, m, before.learner, p)
    # after 600: windows [3, 1, 8, 8] and [0, 0, 0, 0], every member with >= 2 evaluations since its exploit
    assert state.pbt.count.tolist() == [6, 2, 4, 6]
    np.testing.assert_array_equal(window_fitness(state.pbt.window, state.pbt.count), [1.5, 0.5, 4.0, 4.0])
    json.dumps(host.summary(state), allow_nan=False)  # strict JSON

    # a restored host continues identically
    clone = PBTHost()
    clone.load_state_dict(json.loads(json.dumps(host.state_dict())))
    assert clone.state_dict() == host.state_dict() and clone.summary(state) == host.summary(state)


# --- end to end in the training loop ----------------------------------------------------------

# shared with tests/test_resume.py so that the persistent XLA cache serves both
PBT_RUN = dict(learner="td3", env="probe:pendulum", driver="pbt", pop_size=2, seed=3, total_env_steps=1500,
               warmup_steps=250, eval_interval=250, rollout_len=25, batch_size=32, buffer_size=2000,
               eval_episodes=1, learner_config={"hidden": [16, 16]},
               pbt={"interval": 500, "quantile": 0.5}, progress=False)


@pytest.mark.long
def test_pbt_run_records_lineage_hparams_and_plots(tmp_path, monkeypatch):
    import popjax

    use_shared_xla_cache()
    traces = counted_td3(monkeypatch)
    run = popjax.train(out_dir=tmp_path, **PBT_RUN)
    lineage = run.summary["lineage"]
    # ready at 500 and 1000 (not at 1500 = the end); one loser per round with pop 2
    assert [(e["env_steps"], e["member"] != e["parent"]) for e in lineage] == [(500, True), (1000, True)]
    assert len(traces) == 1  # one trace of the update for the whole run, across two exploits
    with (tmp_path / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    by_step = {}
    for row in rows:
        by_step.setdefault(int(row["env_steps"]), {})[int(row["member"])] = row
    for entry in lineage:
        t, m, p = entry["env_steps"], entry["member"], entry["parent"]
        # the row logged at the exploit holds the old hparams; the next evaluation shows the new ones
        for name, value in entry["old_hparams"].items():
            assert float(by_step[t][m][name]) == pytest.approx(value, rel=1e-6)
        for name, value in entry["new_hparams"].items():
            assert float(by_step[t + 250][m][name]) == pytest.approx(value, rel=1e-6)
        assert entry["fitness"] == float(by_step[t][m]["eval_return"])
        assert entry["parent_fitness"] == float(by_step[t][p]["eval_return"])
    final = {n: [float(by_step[1500][m][n]) for m in range(2)] for n in run.summary["hparams"]}
    for name, values in run.summary["hparams"].items():
        assert final[name] == pytest.approx(values, rel=1e-6)
    for name in ("learning_curves.png", "pbt_hparams.png", "pbt_lineage.png"):
        assert (tmp_path / "plots" / name).stat().st_size > 10_000
