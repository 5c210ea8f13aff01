"""Every user error of `popjax train` is one line on stderr and exit code 2, before any compilation."""

import subprocess
import sys

import pytest

from popjax import cli
from popjax.config import ConfigError, make_config
from popjax.learners import LEARNERS


def run_cli(argv, capsys):
    code = cli.main(argv)
    err = capsys.readouterr().err.strip()
    return code, err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--learner", "ppo3"], f"learner: 'ppo3' unknown (allowed: {', '.join(LEARNERS)})"),
        (["--env", "gym:NoSuchEnv-v0"], "env:"),
        (["--env", "atari:Pong"], "prefix 'atari' unknown; allowed: gym, brax, probe"),
        (["--env", "brax:nope"], "allowed brax names"),
        (["--driver", "magic"], "driver: 'magic' unknown (allowed: independent, pbt"),
        (["--pop", "0"], "pop_size: must lie in [1, 65536], got 0"),
        (["--pop", "2.5"], "pop_size: expected an integer in [1, 65536], got 2.5"),
        (["--steps", "ten"], "total_env_steps: expected an integer in [1, 1073741824], got 'ten'"),
        (["--batch-size", "-4"], "batch_size: must lie in [1, 1048576], got -4"),
        (["--seed", "-1"], "seed: must lie in [0, 2147483647], got -1"),
        (["--pop", "3", "--devices", "2"], "pop_size: 3 members do not divide over devices=2"),
        (["--hparam", "discount=1.5"], "hparams.discount: must lie in [0, 1], got 1.5"),
        (["--hparam", "actor_lr=[0.1, 0.2]", "--pop", "4"],
         "hparams.actor_lr: a list needs 4 values (one per member), got 2"),
        (["--hparam", "nope=1"], "hparams.nope: unknown hparam (allowed: actor_lr, critic_lr"),
        (["--learner-config", "widths=[3]"],
         "learner_config.widths: unknown key (allowed: hidden, fixed_policy_delay)"),
        (["--set", "colour=red"], "colour: unknown option (allowed: learner, env"),
        (["--warmup", "5000", "--steps", "1000"], "warmup_steps: 5000 leaves no training"),
        (["--parallel", "mpi"], "parallel: 'mpi' unknown (allowed: sharding, pmap)"),
        (["--driver", "cemrl", "--parallel", "pmap"], "parallel: the cemrl driver does not run as one program per"),
        (["--set", "pbt=[1, 2]"], "pbt: expected a mapping of options {key: value}, got [1, 2]"),
        # a multi-process job: checked before joining (nothing waits for other processes)
        (["--coordinator", "127.0.0.1:1234"], "coordinator: --coordinator, --num-processes and --process-id go "
                                              "together"),
        (["--coordinator", "localhost", "--num-processes", "2", "--process-id", "0"],
         "coordinator: expected HOST:PORT, got 'localhost'"),
        (["--coordinator", "h:1", "--num-processes", "2", "--process-id", "2"], "process_id: must be in [0, 2), got 2"),
        (["--coordinator", "h:1", "--num-processes", "0", "--process-id", "0"], "num_processes: must be at least 1"),
        (["--coordinator", "h:1", "--num-processes", "2", "--process-id", "0", "--timeout", "0"],
         "timeout: must be at least 1 second, got 0"),
        (["--timeout", "30"], "timeout: only for a run over several processes"),
        (["--distributed", "--coordinator", "h:1", "--num-processes", "2", "--process-id", "0"],
         "distributed: give either --distributed"),
    ],
)
def test_user_errors_exit_2_with_one_line(argv, message, capsys, tmp_path):
    code, err = run_cli(["train", "--out", str(tmp_path / "run"), "--no-progress", *argv], capsys)
    assert code == 2
    assert err.startswith("popjax: error: ")
    assert message in err
    assert "\n" not in err
    assert not (tmp_path / "run").exists()  # failed before writing anything


def test_a_gymnasium_env_whose_extra_is_missing_names_the_extra(capsys, tmp_path):
    pytest.importorskip("gymnasium")
    try:
        import Box2D  # noqa: F401
        pytest.skip("Box2D is installed here")  # the error cannot be produced
    except ImportError:
        pass
    code, err = run_cli(["train", "--env", "gym:LunarLanderContinuous-v3", "--out", str(tmp_path / "run")], capsys)
    assert code == 2 and "\n" not in err
    assert err.startswith("popjax: error: env: gym:LunarLanderContinuous-v3 needs an optional dependency")
    assert 'gymnasium[box2d]' in err and not (tmp_path / "run").exists()


def test_continuous_learner_on_discrete_env_is_rejected(capsys, tmp_path):
    code, err = run_cli(["train", "--env", "probe:cartpole", "--learner", "td3", "--out", str(tmp_path)], capsys)
    assert code == 2
    assert "td3 needs continuous actions but probe:cartpole has 2 discrete actions" in err


def test_discrete_learner_on_continuous_env_is_rejected(capsys, tmp_path):
    pytest.importorskip("popjax.learners.dqn")
    code, err = run_cli(["train", "--env", "probe:pendulum", "--learner", "dqn", "--out", str(tmp_path)], capsys)
    assert code == 2
    assert "dqn needs discrete actions but probe:pendulum has continuous actions of dimension 1" in err


def test_config_file_errors(capsys, tmp_path):
    missing = tmp_path / "missing.yaml"
    assert run_cli(["train", "--config", str(missing)], capsys) == (2, f"popjax: error: --config: file {missing} "
                                                                        "not found")
    bad = tmp_path / "bad.yaml"
    bad.write_text("pop_size: [1,\n")
    code, err = run_cli(["train", "--config", str(bad)], capsys)
    assert code == 2 and "is not valid YAML" in err
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    code, err = run_cli(["train", "--config", str(listing)], capsys)
    assert code == 2 and "must hold a mapping of options, got list" in err


def test_flags_override_config_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("learner: td3\npop_size: 8\nhparams: {discount: 0.9}\nlearner_config: {hidden: [8, 8]}\n")
    args = cli.build_parser().parse_args(["train", "--config", str(path), "--pop", "2", "--steps", "1e4",
                                          "--hparam", "tau=[0.1, 0.2]"])
    config = make_config(**cli.train_options(args))
    assert config.pop_size == 2 and config.total_env_steps == 10_000
    assert dict(config.hparams) == {"discount": 0.9, "tau": [0.1, 0.2]}
    assert dict(config.learner_config) == {"hidden": [8, 8]}


def test_make_config_rejects_wrong_types_from_python():
    with pytest.raises(ConfigError, match="progress: expected true or false, got 'maybe'"):
        make_config(progress="maybe")
    with pytest.raises(ConfigError, match=r"hparams: expected a mapping \{name: value\}, got \[1, 2\]"):
        make_config(hparams=[1, 2])


def test_console_script_prints_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "popjax.cli", "train", "--pop", "-3", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip() == "popjax: error: pop_size: must lie in [1, 65536], got -3"


@pytest.mark.long
def test_importing_popjax_starts_no_jax_backend():
    # jax.distributed and the overlap's extra CPU device must be set up before JAX starts: no module may
    # create an array at import time (e.g. a default hyperparameter as a module constant).
    code = ("import popjax, popjax.cli, popjax.loop, popjax.experiment, popjax.drivers, popjax.learners, "
            "popjax_bench, popjax.export\n"
            "from jax._src import xla_bridge\n"
            "assert not xla_bridge.backends_are_initialized()")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bench_is_found_when_installed_and_its_parser_imports_no_study():
    # `popjax bench` comes from the separate popjax-bench distribution (benchmarks/ in the repository);
    # building the parser imports its option tables only, no study module (and so no JAX of its own).
    code = ("import sys; from popjax import cli; cli.build_parser(); "
            "assert sorted(m for m in sys.modules if m.startswith('popjax_bench')) == ['popjax_bench'], "
            "sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("argv", [["bench"], ["bench", "--help"], ["bench", "update", "--pop", "1,2"]])
def test_bench_without_the_benchmarks_distribution_is_one_line(argv, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "popjax_bench", None)  # not installed: `import popjax_bench` fails
    assert cli.bench_plugin() is None
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"popjax bench: error: {cli.BENCH_MISSING}\n"
    assert "pip install -e benchmarks" in captured.err
    assert cli.main(["plot", "--help"]) == 0  # the other commands are unaffected


# --- issue 29, item 6: commands that did nothing and said nothing ---------------------------------------------
def test_popjax_alone_lists_the_commands_and_exits_2(capsys):
    """A missing command is a usage error (argparse's exit 2), but the message lists every command with its help."""
    assert cli.main([]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == ""
    assert lines[0] == ("popjax: error: command: missing (allowed: train, resume, sweep, plot, export, compare, "
                        "export-returns, pbt-schedule, bench)")
    for command, help_start in [("train", "train a population"), ("resume", "continue a killed"),
                                ("plot", "(re)draw the plots"), ("export", "write a member's actor"),
                                ("pbt-schedule", "write the best PBT member's"), ("bench", "speed benchmarks")]:
        assert any(line.split()[:1] == [command] and help_start in line for line in lines[1:]), (command, lines)


def test_popjax_bench_alone_lists_the_studies_and_exits_2(capsys):
    pytest.importorskip("popjax_bench")
    import popjax_bench

    assert cli.main(["bench"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"popjax bench: error: study: missing (allowed: {', '.join(popjax_bench.STUDIES)})"
    for study in popjax_bench.STUDIES:
        assert any(line.split()[:1] == [study] and popjax_bench._HELP[study][:30] in line for line in lines[1:])


def test_a_bench_study_that_times_nothing_exits_1_with_one_line(tmp_path, monkeypatch, capsys):
    """Every point skipped (here: by the time budget) is a failed run, not a result: exit 1 and one line why."""
    pytest.importorskip("popjax_bench")
    import types

    import popjax_bench

    rows = [{"learner": "td3", "impl": "vmap", "pop": n, "devices": 1,
             "skipped": "estimated 10 timed calls > --max-seconds 1e-06"} for n in (1, 2)]
    fake = types.SimpleNamespace(main=lambda options: {"study": "update", "results": rows})
    monkeypatch.setattr(popjax_bench, "_module", lambda study: fake)
    argv = ["bench", "update", "--learner", "td3", "--pop", "1,2", "--allow-busy", "--no-plot", "--out", str(tmp_path)]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("popjax bench update: error: nothing was timed: all 2 points were skipped (estimated 10")
    fake.main = lambda options: {"study": "update", "results": []}
    assert cli.main(argv) == 1
    assert "nothing was timed: the study produced no rows" in capsys.readouterr().err
    fake.main = lambda options: {"study": "update", "results": [rows[0], {"pop": 1, "ms_per_pop_step": 1.0}]}
    assert cli.main(argv) == 0  # one timed point is a result


@pytest.mark.parametrize("study", ["update", "accelerator"])
def test_bench_memory_fit_has_one_spelling_in_every_study(study):
    """The memory-fit search is `--memory-fit` / `--no-memory-fit` in both studies that have it (it was
    `--memory-fit` in `update` and `--no-memory-fit` in `accelerator`); off unless asked for."""
    pytest.importorskip("popjax_bench")
    from popjax_bench import options_class
    from popjax_bench.options import from_namespace

    parser = cli.build_parser()
    options = options_class(study)
    given = lambda *flags: from_namespace(options, parser.parse_args(["bench", study, *flags])).memory_fit
    assert given() is False and options().memory_fit is False
    assert given("--memory-fit") is True
    assert given("--no-memory-fit") is False
    assert given("--memory-fit", "--no-memory-fit") is False  # the last one given wins
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", study, "--memory-fit=yes"])


def test_bench_devices_that_split_no_population_are_one_line_and_nothing_runs(tmp_path, monkeypatch, capsys):
    """`--pop 1 --devices 3`: every point would be skipped; the command line refuses before timing or writing."""
    pytest.importorskip("popjax_bench")
    import types

    import popjax_bench

    called = []
    study = types.SimpleNamespace(main=lambda options: called.append(options) or {"study": "x", "results": []})
    monkeypatch.setattr(popjax_bench, "_module", lambda name: study)
    argv = ["bench", "update", "--pop", "1", "--devices", "3", "--allow-busy", "--out", str(tmp_path / "out")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err == ("popjax bench update: error: --devices: 1 member cannot be split over 3 devices (allowed: "
                   "device counts that divide a --pop value: 1)\n")
    assert called == [] and not (tmp_path / "out").exists()
    argv = ["bench", "drivers", "--pop", "4", "--devices", "1,3", "--allow-busy", "--out", str(tmp_path / "out")]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.startswith("popjax bench drivers: error: --devices: 4 members cannot be split "
                                              "over 3 devices (allowed: device counts that divide a --pop value: "
                                              "1, 2, 4)")
    argv = ["bench", "update", "--pop", "2,3", "--devices", "4", "--allow-busy", "--out", str(tmp_path / "out")]
    assert cli.main(argv) == 2
    assert "--devices: none of --pop 2, 3 can be split over 4 devices" in capsys.readouterr().err
    assert called == [] and not (tmp_path / "out").exists()


def test_bench_report_names_a_damaged_result_file_and_the_results_flag(tmp_path, capsys):
    pytest.importorskip("popjax_bench")
    (tmp_path / "update.json").write_text('{"study": "update", "results": [')  # cut mid-write
    argv = ["bench", "report", "--results", str(tmp_path), "--output", str(tmp_path / "R.md")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"popjax bench report: error: --results: {tmp_path / 'update.json'} "
                                                   "cannot be read (Expecting value"), err
    assert "repair or remove it" in err and not (tmp_path / "R.md").exists()
    (tmp_path / "update.json").write_text("[1, 2]")  # JSON, but not a study's result
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == (f"popjax bench report: error: --results: {tmp_path / 'update.json'} is not a "
                                       "study's result (a JSON object), got list; repair or remove it\n")
    (tmp_path / "update.json").write_bytes(b"\xff\xfe{")
    assert cli.main(argv) == 2
    assert f"--results: {tmp_path / 'update.json'} cannot be read (" in capsys.readouterr().err
