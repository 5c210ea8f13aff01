"""Every command of the README's quickstart runs (at tiny sizes: the same commands plus size flags)."""

import re
import shlex
from pathlib import Path

import pytest

import popjax
from popjax import cli

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
QUICKSTART = README[README.index("## Quickstart"):README.index("## What is inside")]
PYTHON = re.search(r"```python\n(.*?)```", QUICKSTART, re.S).group(1)
COMMANDS = [shlex.split(line.split("  #")[0]) for line in re.search(r"```bash\n(.*?)```", QUICKSTART, re.S)
            .group(1).splitlines() if line.startswith("popjax ")]
# Appended to every `train`: tiny networks and budgets; everything else is the README's.
TINY = {"total_env_steps": 300, "warmup_steps": 100, "rollout_len": 25, "eval_interval": 300,
        "eval_episodes": 1, "batch_size": 16, "buffer_size": 1000}
TINY_FLAGS = ["--steps", "300", "--warmup", "100", "--rollout-len", "20", "--eval-interval", "300",
              "--eval-episodes", "1", "--batch-size", "16", "--buffer-size", "1000",
              "--learner-config", "hidden=[8, 8]", "--no-progress"]
# --allow-busy: the test may run beside others (the result is stamped busy instead of refused).
TINY_BENCH = ["--hidden", "8,8", "--batch-size", "8", "--k", "2", "--repeats", "10", "--min-time", "0",
              "--impl", "vmap,vmap_scan,jax_seq", "--allow-busy", "--out", "bench"]


def test_the_quickstart_has_the_commands_this_test_runs():
    assert [c[:2] for c in COMMANDS] == [["popjax", "train"]] * 6 + [["popjax", "resume"], ["popjax", "plot"],
                                                                      ["popjax", "bench"]]
    assert "popjax.train(" in PYTHON


def test_the_python_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train = popjax.train
    monkeypatch.setattr(popjax, "train", lambda **kw: train(**{**kw, **TINY, "learner_config": {"hidden": [8, 8]},
                                                               "progress": False}))
    exec(compile(PYTHON, "README.md", "exec"), {})
    assert (tmp_path / "runs" / "td3-pendulum" / "summary.json").exists()


@pytest.mark.processes
def test_the_cli_examples_run_in_order(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "default.yaml").write_text(
        (Path(__file__).resolve().parents[1] / "experiments" / "default.yaml").read_text())
    for command in COMMANDS:
        argv = command[1:]
        if argv[0] == "train":
            # the README's dueling flag must survive the tiny network flag: merge the two
            argv = argv + TINY_FLAGS
        elif argv[0] == "resume":
            argv = argv + ["--no-progress"]
        elif argv[0] == "bench":
            argv = argv + TINY_BENCH
        code = cli.main(argv)
        assert code == 0, (command, capsys.readouterr().err[-2000:])
    runs = tmp_path / "runs"
    assert {p.name for p in runs.iterdir()} == {"td3-pendulum", "td3-probe_pendulum", "dqn-gym_CartPole-v1",
                                                "dqn-bare", "ppo-cartpole", "ppo-gym_CartPole-v1"}
    assert all((p / "summary.json").exists() for p in runs.iterdir())
    assert (tmp_path / "bench" / "update.json").exists()
    assert "dueling: true" in (runs / "dqn-gym_CartPole-v1" / "config.yaml").read_text()


@pytest.mark.parametrize("width", [40, 300])
def test_the_results_table_never_cuts_numbers(width, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", str(width))
    hparams = {"actor_lr": [1.2345e-4, 6.789e-3], "critic_lr": [2.5e-4, 3.5e-4], "discount": [0.9, 0.95],
               "exploration_noise": [0.15, 0.25], "target_noise": [0.1, 0.3], "noise_clip": [0.4, 0.6],
               "tau": [0.001, 0.01]}
    run = popjax.train(out_dir=tmp_path / "run", learner="td3", env="probe:pendulum", pop_size=2, hparams=hparams,
                       **TINY, learner_config={"hidden": [8, 8]}, progress=False)
    cli._print_results(run)
    out = capsys.readouterr().out
    assert "0.0001234" in out and "0.006789" in out and "exploration_noise" in out and "…" not in out


TUNING = README[README.index("## Tuning with PBT"):README.index("## Several devices")]
TUNING_COMMANDS = [shlex.split(line.split("  #")[0]) for line in re.search(r"```bash\n(.*?)```", TUNING, re.S)
                   .group(1).splitlines() if line.startswith("popjax ")]
# Tiny sizes for the tuning commands (pop 8 and the strategies are the README's).
TUNING_FLAGS = ["--steps", "1200", "--warmup", "200", "--rollout-len", "20", "--eval-interval", "200",
                "--eval-episodes", "1", "--batch-size", "16", "--buffer-size", "1200",
                "--learner-config", "hidden=[8, 8]", "--no-progress"]


@pytest.mark.processes
def test_the_tuning_with_pbt_commands_run_in_order(tmp_path, monkeypatch, capsys):
    from test_pbt import enable_xla_cache

    enable_xla_cache()
    monkeypatch.chdir(tmp_path)
    assert [c[1] for c in TUNING_COMMANDS] == ["train"] * 7 + ["pbt-schedule", "train"]
    for command in TUNING_COMMANDS:
        argv = command[1:] + (TUNING_FLAGS if command[1] == "train" else [])
        code = cli.main(argv)
        assert code == 0, (command, capsys.readouterr().err[-2000:])
    runs = tmp_path / "runs"
    assert all((runs / name / "lineage.csv").exists() for name in ("pbt", "pb2", "sigma", "mfpbt", "release"))
    assert (runs / "pbt" / "schedule.yaml").exists() and (runs / "replay" / "summary.json").exists()
