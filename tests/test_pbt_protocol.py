"""experiments/pbt_random_search.py --protocol: what each protocol hands popjax.train (no training here)."""

import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
import pbt_random_search as r2  # noqa: E402

sys.path.remove(str(ROOT / "experiments"))


def args(protocol: str, **kw) -> types.SimpleNamespace:
    settings = r2.PROTOCOLS[protocol]
    return types.SimpleNamespace(env="gym:HalfCheetah-v5", protocol=protocol, steps=settings["steps"],
                                 interval=settings["interval"], **kw)


def test_paper_protocol_resamples_the_bottom_30_percent_on_a_two_evaluation_fitness():
    o = r2.options("pbt", 3, args("paper"))
    pbt = o["pbt"]
    assert (pbt["explore"], pbt["quantile"], pbt["fitness_window"], pbt["interval"]) == ("resample", 0.3, 2, 10_000)
    assert (o["eval_interval"], o["eval_episodes"], o["total_env_steps"], o["seed"]) == (5_000, 5, 60_000, 3)
    assert o["learner_config"] == {"hidden": [64, 64]} and o["pop_size"] == 8
    assert int(pbt["quantile"] * o["pop_size"]) == 2  # 30 % of 8 replaces 2 members


@pytest.mark.parametrize("arm", ["defaults", "random"])
def test_paper_protocol_changes_only_the_evaluation_of_the_control_arms(arm):
    paper, spec = r2.options(arm, 0, args("paper")), r2.options(arm, 0, args("spec"))
    assert "pbt" not in paper
    changed = {k for k in paper if paper[k] != spec[k]}
    assert changed == {"eval_interval", "eval_episodes", "total_env_steps", "buffer_size"}


def test_spec_protocol_is_what_the_committed_runs_used():
    o = r2.options("pbt", 0, args("spec"))
    assert (o["pbt"]["explore"], o["pbt"]["quantile"], o["pbt"]["interval"]) == ("perturb", 0.25, 5_000)
    assert "fitness_window" not in o["pbt"] and (o["eval_interval"], o["eval_episodes"]) == (2_500, 3)
    assert r2.results_dir("gym:HalfCheetah-v5").name == "pbt_random_search_halfcheetah-v5"
    assert r2.results_dir("gym:HalfCheetah-v5", "paper").name == "pbt_paper_halfcheetah-v5"


def test_the_paper_options_pass_popjax_validation():
    from popjax.config import make_config
    from popjax.presets import apply_preset

    config = make_config(**apply_preset(r2.options("pbt", 0, args("paper"))))
    assert config.driver == "pbt"
