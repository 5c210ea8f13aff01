"""The user guide (docs/) builds, its option reference is current, and every code block of it and of the README
is run by a test: the CLI blocks here at tiny sizes (the same commands plus size flags), the others by the tests
named in RUN_BY."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from docs_blocks import ROOT, TINY_OPTIONS, TINY_TRAIN, Block, block, blocks, commands, guide_pages, out_dir, tiny_argv

import popjax
from popjax import cli

# Blocks run by tests in other modules (their file must name the page and the section).
RUN_BY = {
    ("README.md", "Install and test", 0): "test_docs.py::test_the_make_commands_exist",
    ("docs/index.md", "Install and test", 0): "test_docs.py::test_the_make_commands_exist",
    ("README.md", "Quickstart", 0): "test_readme.py::test_the_python_example_runs",
    ("README.md", "Quickstart", 1): "test_readme.py::test_the_cli_examples_run_in_order",
    ("docs/runs.md", "From Python", 0): "test_docs.py::test_the_python_run_example",
    ("docs/large-batch.md", "Plan before you compile", 0):
        "test_fast_td3_runs.py::test_the_guide_plans_without_writing",
    ("docs/runs.md", "From the CLI, and YAML files", 0): "test_docs.py::test_the_cli_block_runs",  # the YAML file
    ("docs/learners.md", "RLx2: sparse training, and exporting sparse actors", 1):
        "test_docs.py::test_the_cli_block_runs",
    ("docs/learners.md", "ReF-ER: remember and forget experience replay", 0):
        "test_refer.py::test_the_guide_commands_run",
    ("docs/devices.md", "Many machines", 0): "test_distributed.py::test_the_guide_two_process_example_runs_and_resumes",
    ("docs/devices.md", "Many machines", 1): "test_distributed.py::test_the_guide_two_process_example_runs_and_resumes",
    ("docs/devices.md", "Many machines", 2):
        "test_distributed.py::test_the_guide_slurm_script_runs_under_a_stand_in_srun",
    ("docs/experiments.md", "Comparing runs", 1): "test_compare.py::test_the_guide_compare_command_runs_on_three_runs",
    ("docs/gpu.md", "Install", 0): "test_docs.py::test_the_gpu_page_refusals_print_what_it_shows",
    ("docs/gpu.md", "Precision: `matmul_precision`", 1): "test_docs.py::test_the_gpu_page_refusals_print_what_it_shows",
    ("docs/tuning.md", "Sweeps", 0): "test_sweeps.py::test_the_guide_sweep_commands_run",
    ("docs/tuning.md", "Sweeps", 1): "test_sweeps.py::test_the_guide_sweep_commands_run",
    ("docs/tuning.md", "Sweeps", 2): "test_sweeps.py::test_the_guide_sweep_commands_run",
    ("docs/tuning.md", "Comparing the top trials", 0):
        "test_sweeps.py::test_the_top_trials_are_retrained_as_runs_and_compared",
    ("docs/planning.md", "Planning a run: memory and work before anything runs", 0):
        "test_planning.py::test_the_guide_plan_examples_print_what_they_show",
    ("docs/planning.md", "A run that cannot fit", 0):
        "test_planning.py::test_the_guide_plan_examples_print_what_they_show",
    ("docs/errors.md", "Bad input", 0): "test_docs.py::test_the_bad_input_examples_are_one_line_and_write_nothing",
    ("docs/errors.md", "Bad input", 1): "test_docs.py::test_the_config_error_example_prints_its_line",
    ("docs/extending.md", "Writing a learner", 0): "test_contracts.py::test_the_guide_learner_and_source_train",
    ("docs/extending.md", "Writing a replay source", 0): "test_contracts.py::test_the_guide_learner_and_source_train",
    ("docs/extending.md", "Writing a replay source", 1): "test_contracts.py::test_the_guide_learner_and_source_train",
    ("docs/extending.md", "Writing a driver", 0): "test_drivers.py::test_the_guide_driver_registers_and_trains",
    ("docs/extending.md", "Writing a driver", 1): "test_drivers.py::test_the_guide_driver_registers_and_trains",
}
# The contributors' map lists signatures, not commands: its blocks are not run.
NOT_RUN = {"docs/design.md"}


@dataclasses.dataclass(frozen=True)
class Spec:
    """How test_the_cli_block_runs runs a CLI block: more tiny flags for `train`, files first, checks after."""

    train: tuple[str, ...] = ()
    setup: Callable[[Path], None] | None = None
    check: Callable[[Path], None] | None = None
    slow: bool = False
    process: bool = False  # each command in a process of its own (it needs JAX to start with its own devices)


def _sweep_yaml(cwd: Path) -> None:
    (cwd / "sweep.yaml").write_text(block("docs/runs.md", "From the CLI, and YAML files", 0).text)


def _sweep_check(cwd: Path) -> None:
    config = (cwd / "runs" / "sweep" / "config.yaml").read_text()
    assert "seed: 1" in config and "discount: 0.98" in config and "critic_lr:" in config
    # --overwrite replaced the first run (with TensorBoard) by the second (without): its event files went too
    assert not list((cwd / "runs" / "sweep").glob("tensorboard/events.out.tfevents.*"))
    assert (cwd / "runs" / "sweep" / "plots" / "learning_curves.png").exists()


def _run_the_load_policy_block(cwd: Path) -> None:
    code = block("docs/learners.md", "RLx2: sparse training, and exporting sparse actors", 1).text
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/learners.md", "exec"), {})
    first, second = out.getvalue().splitlines()
    assert re.fullmatch(r"\[\s*-?[\d.e+-]+\]", first) and second == "(5, 1)", out.getvalue()


def _bench_targets(cwd: Path) -> None:
    (cwd / "benchmarks").mkdir()
    shutil.copy(ROOT / "benchmarks" / "targets.yaml", cwd / "benchmarks" / "targets.yaml")


def _lineage_check(cwd: Path) -> None:
    runs = cwd / "runs"
    assert all((runs / name / "lineage.csv").exists() for name in ("pbt", "pb2", "sigma", "mfpbt", "release"))
    assert (runs / "pbt" / "schedule.yaml").exists() and (runs / "replay" / "summary.json").exists()


# Tiny sizes for the tuning commands (pop 8 and the strategies are the guide's); enough env steps for rounds.
TUNING = ("--steps", "1200", "--warmup", "200", "--eval-interval", "200", "--buffer-size", "1200")

CLI_BLOCKS: dict[tuple[str, str, int], Spec] = {
    ("docs/runs.md", "From the CLI, and YAML files", 1): Spec(setup=_sweep_yaml, check=_sweep_check),
    ("docs/learners.md", "RLx2: sparse training, and exporting sparse actors", 0):
        Spec(check=_run_the_load_policy_block),
    ("docs/learners.md", "MEMR: model rollouts with SAC", 0): Spec(),
    ("docs/learners.md", "Replay sources", 0): Spec(),
    ("docs/drivers.md", "Tuning with PBT", 0): Spec(train=TUNING, check=_lineage_check),
    ("docs/drivers.md", "HTS-RL", 0): Spec(),
    ("docs/environments.md", "Environments", 0): Spec(slow=True),  # brax compiles for minutes on a CPU
    ("docs/environments.md", "Overlapping acting and learning", 0): Spec(process=True),  # adds a host device
    ("docs/devices.md", "Several devices", 0): Spec(),
    ("docs/benchmarks.md", "Benchmarks", 0): Spec(setup=_bench_targets),
    ("docs/experiments.md", "Comparing runs", 0): Spec(),
    ("docs/gpu.md", "Precision: `matmul_precision`", 0): Spec(),
    # three runs of the accelerator study (tiny sizes, vmap, vmap_scan and jax_seq only): minutes on a CPU
    ("docs/gpu.md", "The speed studies compare equal arithmetic", 0): Spec(setup=_bench_targets, slow=True),
}


def all_blocks() -> list[Block]:
    return [b for page in ["README.md", *guide_pages()] if page not in NOT_RUN for b in blocks(page)]


def test_every_block_of_the_readme_and_the_guide_is_run_by_a_test():
    claimed = {**RUN_BY, **{key: "test_docs.py::test_the_cli_block_runs" for key in CLI_BLOCKS}}
    keys = {b.key for b in all_blocks()}
    assert keys - set(claimed) == set(), "blocks no test runs"
    assert set(claimed) - keys == set(), "tests claim blocks that are gone"
    for (page, section, _), where in claimed.items():
        file, test = where.split("::")
        source = (ROOT / "tests" / file).read_text()
        assert f"def {test}(" in source, where
        assert page in source and section in source, f"{file} does not read {page} '{section}'"


def test_the_guide_builds_strict(tmp_path):
    """Every page in the nav, every link and anchor resolving (mkdocs.yml's validation, as errors)."""
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "site" / "options" / "index.html").exists()


def test_the_option_reference_is_generated_from_the_schema():
    from docs_reference import PAGE, render

    assert PAGE.read_text() == render(), "docs/options.md is stale: run `make docs`"
    page = PAGE.read_text()
    assert "| `quantile` | fraction replaced at the bottom" in page and "### `memr_sac` keys" in page
    assert "| `td3` | continuous | yes | yes | yes | yes | yes |" in page  # every driver takes TD3


def test_the_make_commands_exist():
    """`make` lines of the README and the guide: each target exists (a dry run; the suite itself is `make test`)."""
    lines = [line.split("  #")[0].split() for page, section in (("README.md", "Install and test"),
                                                                ("docs/index.md", "Install and test"))
             for line in block(page, section).text.splitlines() if line.startswith("make ")]
    assert ["make", "install", "ACCEL=cuda12"] in lines and ["make", "test"] in lines
    for words in lines:
        result = subprocess.run([*words[:1], "-n", "-C", str(ROOT), *words[1:]], capture_output=True, text=True)
        assert result.returncode == 0, (words, result.stderr)


def test_the_gpu_page_refusals_print_what_it_shows(tmp_path, monkeypatch, capsys):
    """docs/gpu.md's two refusals, each followed by the line it prints: a misspelt ACCEL (make, exit 2) and a
    misspelt matmul_precision (popjax, exit 2, nothing written)."""
    shown = block("docs/gpu.md", "Install", 0).text.splitlines()
    assert shown[0] == "$ make install ACCEL=rocm"
    result = subprocess.run(["make", "-n", "-C", str(ROOT), "install", "ACCEL=rocm"], capture_output=True, text=True)
    assert result.returncode == 2 and shown[1].split(" *** ")[1] in result.stderr, result.stderr
    monkeypatch.chdir(tmp_path)
    example = block("docs/gpu.md", "Precision: `matmul_precision`", 1)
    (command,) = commands(example)
    assert cli.main(command.argv) == 2
    assert capsys.readouterr().err == example.text.splitlines()[1] + "\n"
    assert not list(tmp_path.iterdir())


@pytest.mark.long
def test_the_python_run_example(tmp_path, monkeypatch, capsys):
    from learner_helpers import use_shared_xla_cache

    use_shared_xla_cache()
    monkeypatch.chdir(tmp_path)
    make_config = popjax.make_config
    monkeypatch.setattr(popjax, "make_config", lambda **kw: make_config(**{**kw, **TINY_OPTIONS}))
    exec(compile(block("docs/runs.md", "From Python", 0).text, "docs/runs.md", "exec"), {})
    summary = json.loads((tmp_path / "runs" / "sac-search" / "summary.json").read_text())
    assert summary["env_steps"] == 2 * TINY_OPTIONS["total_env_steps"]  # resumed to twice the steps
    lrs = summary["hparams"]["actor_lr"]
    assert len(set(lrs)) == 4 and all(3e-5 <= x <= 3e-3 for x in lrs)  # sampled per member from the prior


def test_the_bad_input_examples_are_one_line_and_write_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    examples = commands(block("docs/errors.md", "Bad input", 0))
    assert len(examples) == 4
    for command in examples:
        code, _, message = command.comment.partition(": ")
        assert cli.main(command.argv) == int(code.removeprefix("exit ")), command
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("popjax: error: " + message.split("...")[0].rstrip(" ,")), err
    assert not list(tmp_path.iterdir())


def test_the_config_error_example_prints_its_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = block("docs/errors.md", "Bad input", 1).text
    exec(compile(code, "docs/errors.md", "exec"), {})
    assert capsys.readouterr().out == code.split("# ")[-1]  # the line its comment shows
    assert not list(tmp_path.iterdir())


def _popjax(command, cwd: Path, train: list[str], process: bool = False) -> tuple[int, str]:
    argv = tiny_argv(command.argv, train)
    if command.env or process:  # XLA_FLAGS and the like act before JAX starts: a process of its own
        env = dict(os.environ, **command.env, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "benchmarks"),
                                                                           os.environ.get("PYTHONPATH", "")]))
        result = subprocess.run([sys.executable, "-m", "popjax", *argv], cwd=cwd, env=env, capture_output=True,
                                text=True, timeout=540)
        return result.returncode, result.stderr
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as stop:  # --help
            code = stop.code
    return code, err.getvalue()


@pytest.mark.processes  # CLI runs of whole examples
@pytest.mark.parametrize("key", [pytest.param(key, id=f"{key[0]}:{key[1]}:{key[2]}",
                                              marks=[pytest.mark.slow] if spec.slow else [])
                                 for key, spec in CLI_BLOCKS.items()])
def test_the_cli_block_runs(key, tmp_path, monkeypatch):
    """The block's commands in order, each with the tiny flags; every run it names is complete."""
    from learner_helpers import use_shared_xla_cache

    use_shared_xla_cache()
    spec = CLI_BLOCKS[key]
    monkeypatch.chdir(tmp_path)
    if spec.setup:
        spec.setup(tmp_path)
    found = commands(block(*key))
    assert found, key
    for command in found:
        code, err = _popjax(command, tmp_path, TINY_TRAIN + list(spec.train), spec.process)
        assert code == 0, (command.argv, err[-3000:])
        if command.argv[0] == "train" and out_dir(command.argv):
            assert (tmp_path / out_dir(command.argv) / "summary.json").exists(), command.argv
    if spec.check:
        spec.check(tmp_path)
