"""End-to-end `popjax.train` on the JAX path: run directory contents and determinism."""

import csv
import json

import numpy as np
import pytest
import yaml

import popjax

TINY = dict(learner="td3", env="probe:pendulum", pop_size=2, total_env_steps=600, rollout_len=50,
            warmup_steps=200, eval_interval=200, eval_episodes=2, batch_size=32, buffer_size=1000,
            learner_config={"hidden": [16, 16]}, progress=False)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    return popjax.train(out_dir=out, logger=["tensorboard"], **TINY)


@pytest.mark.long
def test_run_directory_has_the_documented_files(tiny_run):
    out = tiny_run.out_dir
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["pop_size"] == 2 and config["learner_config"] == {"hidden": [16, 16]}
    summary = json.loads((out / "summary.json").read_text())
    for field in ("learner", "env", "driver", "pop_size", "seed", "env_steps", "updates", "wall_s", "compile_s",
                  "best_return", "final_returns", "hparams"):
        assert field in summary
    assert summary["env_steps"] == 600
    # 600 steps in iterations of 50; warm-up = 4 iterations without updates, then K=50 per iteration
    assert summary["updates"] == (600 - 200) // 50 * 50
    assert summary == tiny_run.summary
    with (out / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["env_steps"]) for r in rows] == [200, 200, 400, 400, 600, 600]
    assert [int(r["member"]) for r in rows] == [0, 1] * 3
    assert {"eval_return", "actor_lr", "critic_loss", "wall_s", "updates"} <= set(rows[0])
    finals = [float(r["eval_return"]) for r in rows[-2:]]
    assert finals == summary["final_returns"]
    assert summary["best_return"] == max(float(r["eval_return"]) for r in rows)
    assert (out / "plots" / "learning_curves.png").stat().st_size > 10_000


def test_summary_has_the_population_iqm_and_compare_reads_the_run(tiny_run, tmp_path):
    final = tiny_run.summary["final_returns"]
    iqm = tiny_run.summary["final_iqm"]  # 2 members: nothing trimmed, no interval, the values instead
    assert (iqm["n"], iqm["ci"], iqm["values"]) == (2, None, final) and iqm["iqm"] == pytest.approx(np.mean(final))
    result = popjax.compare([tiny_run.out_dir], label="name", out=tmp_path / "cmp")
    row = result.rows[0]
    assert (row["runs"], row["values"], result.final_step) == (2, pytest.approx(final), 600)  # members are seeds
    assert (tmp_path / "cmp" / "curves_wall_time.png").exists()


@pytest.mark.long
def test_same_seed_gives_identical_results_and_other_seed_differs(tiny_run, tmp_path):
    again = popjax.train(out_dir=tmp_path / "again", logger=["tensorboard"], **TINY)
    assert again.summary["final_returns"] == tiny_run.summary["final_returns"]
    for a, b in zip(popjax_leaves(again.state), popjax_leaves(tiny_run.state), strict=True):
        np.testing.assert_array_equal(a, b)
    other = popjax.train(out_dir=tmp_path / "other", **{**TINY, "seed": 1})
    assert other.summary["final_returns"] != tiny_run.summary["final_returns"]


def popjax_leaves(state):
    import jax

    return jax.tree.leaves(state.learner)


def read_scalars(event_dir):
    """(tag, step, value) of every scalar in tensorboard event files (TFRecord framing, Event protos)."""
    import struct

    from tensorboardX.proto import event_pb2

    scalars = []
    for path in sorted(event_dir.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            scalars += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
    return scalars


def test_tensorboard_logs_every_member_eval_return(tiny_run):
    scalars = read_scalars(tiny_run.out_dir / "tensorboard")
    returns = sorted((tag, step, value) for tag, step, value in scalars if tag.endswith("/eval_return"))
    with (tiny_run.out_dir / "metrics.csv").open() as f:
        expected = sorted((f"member_{r['member']}/eval_return", int(r["env_steps"]), float(r["eval_return"]))
                          for r in csv.DictReader(f))
    assert [(t, s) for t, s, _ in returns] == [(t, s) for t, s, _ in expected]
    np.testing.assert_allclose([v for *_, v in returns], [v for *_, v in expected], rtol=1e-6)


def test_a_diverged_member_is_reported_and_logged_as_nan(tiny_run, tmp_path):
    from popjax.config import make_config
    from popjax.experiment import build
    from popjax.rundir import RunDir

    loop = build(make_config(**TINY))
    returns = np.array([-100.0, np.nan])
    with pytest.warns(RuntimeWarning, match="member 1 diverged"):
        loop._warn_diverged(returns, 600)
    RunDir(tmp_path).append_metrics(loop.driver.host.rows(tiny_run.state, {}, returns))
    rows = RunDir(tmp_path).read_metrics()
    assert rows[0]["eval_return"] == -100.0 and np.isnan(rows[1]["eval_return"])


def test_train_takes_a_mapping_of_options_like_a_config_file(tiny_run, tmp_path):
    """``popjax.train({...})``: the dict is validated as a config file's options; keywords override it."""
    options = {**TINY, "pop_size": 3}
    run = popjax.train(options, out_dir=tmp_path / "dict", pop_size=2)
    assert run.summary["final_returns"] == tiny_run.summary["final_returns"]  # the same run as the keywords'
    assert yaml.safe_load((tmp_path / "dict" / "config.yaml").read_text())["pop_size"] == 2
    assert options["pop_size"] == 3  # the caller's dict is not changed


@pytest.mark.parametrize("config, message", [
    ({**TINY, "pop_size": 0}, "pop_size: must lie in [1, 65536], got 0"),
    ({**TINY, "popsize": 2}, "popsize: unknown option (allowed: learner, env"),
    ({1: 2}, "config: option names are strings, got 1"),
    ([("learner", "td3")], "config: expected a RunConfig or a mapping of options (as in a config file), got list"),
])
def test_train_refuses_a_bad_config_argument_in_one_line(config, message, tmp_path):
    with pytest.raises(popjax.ConfigError) as err:
        popjax.train(config, out_dir=tmp_path / "run")
    assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("out_dir", [None, 3, ["runs"]])
def test_train_refuses_an_out_dir_that_is_not_a_path_in_one_line(out_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(popjax.ConfigError) as err:
        popjax.train(out_dir=out_dir, **TINY)
    assert str(err.value) == (f"out_dir: expected a directory path (a str or os.PathLike), got "
                              f"{type(out_dir).__name__} {out_dir!r}")
    assert not any(tmp_path.iterdir())  # nothing written, not even runs/latest
