"""The driver contract, checked on every registered driver and on the guide's example driver.

For each driver in ``DRIVERS`` (JAX env path, tiny sizes): the state and its counters, the
shapes of metrics and evaluation returns, one trace per compiled program over a whole run
(PBT exploits, CEM tells and bandit draws included), and a kill followed by ``resume`` that
equals the uninterrupted run leaf for leaf with every metrics row exactly once. A random-search
driver written in the guide (docs/extending.md) registers with one line and trains: a driver is an addition.
"""

import csv
import json
from typing import Any

import jax
import numpy as np
import pytest
import yaml
from docs_blocks import block, run_python
from learner_helpers import assert_trees_equal, use_shared_xla_cache
from rundir_helpers import killed_copy

import popjax
from popjax.config import make_config
from popjax.drivers import DRIVERS
from popjax.experiment import build

BASE = dict(learner="td3", env="probe:pendulum", pop_size=4, seed=5, total_env_steps=300, warmup_steps=100,
            rollout_len=25, eval_interval=100, eval_episodes=1, batch_size=16, buffer_size=1000,
            checkpoint_interval=50, learner_config={"hidden": [8, 8]}, progress=False)
# Per-driver settings that make every mechanism act within the tiny budget.
OVERRIDES: dict[str, dict[str, Any]] = {
    "pbt": {"pbt": {"interval": 100, "quantile": 0.25}},
    "cemrl": {"total_env_steps": 600, "eval_interval": 200, "buffer_size": 2000, "cemrl": {"updates_per_call": 25}},
    "dvd": {"dvd": {"weight_source": "bandit", "bandit_random": 1}},
    # HTS steps gymnasium envs in threads: the toy env (snapshotted, so a resume is exact), 3 executors
    "hts": {"learner": "dqn", "env": "gym:popjax/HtsToy-v0", "learner_config": {"hidden": [8, 8]},
            "hts": {"alpha": 25, "executors": 3, "actors": 2}},
}


INDEPENDENT_MEMBERS = {"independent", "hts"}  # members never interact: each one an independent sample


def options(name: str) -> dict[str, Any]:
    return {**BASE, **OVERRIDES.get(name, {}), "driver": name}


@pytest.fixture(autouse=True)
def xla_cache():
    use_shared_xla_cache()


def metric_rows(run_dir) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open(newline="") as f:
        return [{k: v for k, v in row.items() if k != "wall_s"} for row in csv.DictReader(f)]


@pytest.mark.long
@pytest.mark.parametrize("name", sorted(DRIVERS))
def test_state_counters_metrics_and_evaluation_shapes(name):
    loop = build(make_config(**options(name)))
    pop = loop.config.pop_size
    state, env_state = loop.initial_state()
    assert loop.counters(state) == (0, 0)
    assert jax.tree.structure(state) == jax.tree.structure(jax.eval_shape(loop.driver.init, jax.random.key(0)))
    state, env_state, metrics = loop.step(state, env_state)
    steps, updates = loop.counters(state)
    assert steps > 0 and updates >= 0
    assert all(m.shape == (pop,) for m in metrics.values()), {k: m.shape for k, m in metrics.items()}
    returns = loop.evaluate(state)
    actors = loop.driver.evaluation.actors
    assert returns.shape == ((pop,) if actors is None else (actors,)) and np.isfinite(returns).all()


def test_members_are_independent_only_where_the_driver_and_its_options_say_so():
    """``DriverDef.independent_members`` for every driver and HTS's ``population: pbt`` coupling its members (a
    driver that declares nothing: test_the_guide_driver_declares_dependent_members)."""
    def independent(name, **extra):
        definition = DRIVERS[name]
        return definition.members_independent(definition.parse_options(make_config(**{**options(name), **extra})))

    assert {name for name in DRIVERS if independent(name)} == INDEPENDENT_MEMBERS
    assert not independent("hts", hts={"alpha": 25, "executors": 3, "population": "pbt"}, pbt={"interval": 100})


@pytest.mark.long
@pytest.mark.parametrize("name", sorted(DRIVERS))
def test_every_program_traces_once_and_kill_then_resume_is_exact(name, compilers, tmp_path):
    full = popjax.train(out_dir=tmp_path / "full", **options(name))
    traces = compilers[-1].traces
    # HTS runs its iteration itself (an OwnInteraction): its own programs, each traced once too
    assert traces["iteration" if name != "hts" else "hts_update"] == 1 and set(traces.values()) == {1}, traces
    summary = full.summary
    if name == "pbt":  # exploits happened, and did not retrace
        assert summary["lineage"] and traces["after_eval"] == 1
    if name == "cemrl":
        assert len(summary["cem_mean_returns"]) == 3 and int(full.state.cem.generation) == 3
    if name == "dvd":
        assert summary["dvd_bandit"]["draws"] == 3 and traces["after_eval"] == 1
    iqm = summary["final_iqm"]  # an interval over members only where they are independent samples (issue 37)
    assert np.isfinite(iqm["iqm"])
    if name in INDEPENDENT_MEMBERS:
        assert iqm["ci"][0] <= iqm["iqm"] <= iqm["ci"][1] and "no_ci" not in iqm
    else:
        assert iqm["ci"] is None and iqm["no_ci"].startswith(f"members of a {name} run interact")

    # A kill: the newest checkpoints and the summary are gone, later metrics rows are not.
    cut, _ = killed_copy(full.out_dir, tmp_path / "cut")
    assert len(metric_rows(cut)) == len(metric_rows(full.out_dir))

    resumed = popjax.resume(cut)
    assert_trees_equal(resumed.state, full.state)
    timing = ("wall_s", "compile_s")
    assert {k: v for k, v in resumed.summary.items() if k not in timing} == \
        {k: v for k, v in summary.items() if k not in timing}
    rows = metric_rows(cut)
    assert rows == metric_rows(full.out_dir)  # nothing lost, nothing duplicated
    keys = [(r["env_steps"], r["member"]) for r in rows]
    assert len(keys) == len(set(keys))


# --- a driver defined outside popjax: the guide's (docs/extending.md, "Writing a driver") ----------------------
GUIDE = "docs/extending.md"


@pytest.fixture
def guide_driver():
    """The guide's random-search driver: its first block defines and registers it."""
    try:
        yield run_python(block(GUIDE, "Writing a driver", 0))
    finally:
        DRIVERS.pop("random_search", None)


def test_the_guide_driver_declares_dependent_members(guide_driver):
    """A driver that declares nothing: its members are not taken as independent samples."""
    assert not guide_driver["RANDOM_SEARCH"].members_independent(guide_driver["RandomSearchOptions"]())


@pytest.mark.long
def test_the_guide_driver_registers_and_trains(guide_driver, tmp_path, monkeypatch):
    """The guide's random-search driver, run as written (its second block): it trains 4 generations of one episode
    per member; a misspelt option is one line; the same seed gives the same state."""
    monkeypatch.chdir(tmp_path)
    run = run_python(block(GUIDE, "Writing a driver", 1), guide_driver)["run"]
    out = tmp_path / "runs" / "random-search"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["driver"] == "random_search" and summary["env_steps"] == 800  # 4 generations of 200 steps
    assert summary["search_best_return"] == float(run.state.best_return) > -2000
    rows = metric_rows(out)
    assert [int(r["env_steps"]) for r in rows] == [400] * 4 + [800] * 4
    assert "fitness" in rows[0] and (out / "plots" / "learning_curves.png").exists()
    options = yaml.safe_load((out / "config.yaml").read_text())  # the resolved options of the guide's run
    with pytest.raises(popjax.ConfigError, match=r"random_search\.sgima: unknown key \(allowed: sigma\)"):
        popjax.train(out_dir=tmp_path / "bad", **{**options, "random_search": {"sgima": 0.1}})
    again = popjax.train(out_dir=tmp_path / "again", **options)
    assert_trees_equal(again.state, run.state)  # same seed, same results
