"""File-system faults end in one line naming the path and the problem, never a traceback, and lose nothing.

A read-only folder is made with ``chattr +i`` (which stops root too) when running as root, and with
``chmod`` otherwise; where neither takes effect (a file system without the flag) those tests are skipped
with the reason.
"""

import contextlib
import errno
import os
import shutil
import subprocess

import pytest
from rundir_helpers import snapshot

import popjax
from popjax import cli
from popjax.rundir import RunDir


@contextlib.contextmanager
def read_only(*paths):
    """``paths`` (folders, with the files directly inside them) cannot be written while the block runs."""
    targets = [p for path in paths for p in (path, *sorted(path.iterdir()))]
    root = os.geteuid() == 0
    try:
        for target in targets:
            if root:
                subprocess.run(["chattr", "+i", str(target)], check=True, capture_output=True)
            else:
                target.chmod(target.stat().st_mode & ~0o222)
    except (OSError, subprocess.CalledProcessError) as err:
        _restore(targets, root)
        pytest.skip(f"cannot make a folder read-only here ({err})")
    try:
        probe = paths[0] / ".probe"
        try:
            probe.write_text("")
        except OSError:
            pass
        else:
            probe.unlink()
            pytest.skip("folders made read-only can still be written here")
        yield
    finally:
        _restore(targets, root)


def _restore(targets, root):
    for target in targets:
        if root:
            subprocess.run(["chattr", "-i", str(target)], capture_output=True)
        else:
            target.chmod(target.stat().st_mode | 0o200)


def one_line_error(argv, capsys, code=2):
    """Runs the CLI; asserts the exit code and a single ``popjax: error:`` line; returns that line."""
    assert cli.main(argv) == code
    err = capsys.readouterr().err.strip()
    assert err.startswith("popjax: error:") and "\n" not in err, err
    return err


def damage_row(run, line=3, text="garbage,,x"):
    lines = (run / "metrics.csv").read_text().splitlines(keepends=True)
    lines[line - 1] = text + "\n"
    (run / "metrics.csv").write_text("".join(lines))


@pytest.mark.long
def test_plot_when_the_plots_folder_is_a_file(run_copy, capsys):
    shutil.rmtree(run_copy / "plots")
    (run_copy / "plots").write_text("my notes")
    err = one_line_error(["plot", str(run_copy)], capsys)
    assert f"{run_copy / 'plots'} is a file where popjax keeps a folder" in err
    assert (run_copy / "plots").read_text() == "my notes"


def test_plot_into_a_read_only_plots_folder(run_copy, capsys):
    before = snapshot(run_copy)
    with read_only(run_copy / "plots"):
        err = one_line_error(["plot", str(run_copy)], capsys)
    assert f"{run_copy / 'plots' / 'learning_curves.png'} cannot be written" in err
    assert err.endswith("(plots drawn: none)")
    assert snapshot(run_copy) == before


def test_plot_draws_from_the_readable_rows_and_names_the_others(run_copy, capsys):
    damage_row(run_copy, 3)
    damage_row(run_copy, 5, "100,7,0.5,0,not-a-return" + ",1" * 11)
    (run_copy / "plots" / "learning_curves.png").unlink()
    err = one_line_error(["plot", str(run_copy)], capsys)
    header = (run_copy / "metrics.csv").read_text().splitlines()[0].split(",")
    assert f"metrics.csv line 3 (3 cells, the header has {len(header)}) and 1 more cannot be read" in err
    assert err.endswith("(plots drawn: learning_curves.png)")
    assert (run_copy / "plots" / "learning_curves.png").stat().st_size > 10_000
    rows, problems = RunDir(run_copy).scan_metrics()
    assert len(rows) == 6 - 2 and problems[1] == "line 5 (eval_return: 'not-a-return' is not a number)"


@pytest.mark.parametrize("content, problem", [(b"\xff\xfe\x00garbage\n", "has no readable header"),
                                              (b",\n1,2\n", "has no readable header"),
                                              (b"env_steps,member\n1,2\n", "has no column eval_return")])
def test_plot_with_an_unreadable_header(run_copy, capsys, content, problem):
    (run_copy / "metrics.csv").write_bytes(content)
    err = one_line_error(["plot", str(run_copy)], capsys)
    assert f"{run_copy / 'metrics.csv'} {problem}" in err


def test_a_row_cut_by_a_kill_is_neither_read_nor_a_problem(run_copy):
    rows = RunDir(run_copy).read_metrics()
    with (run_copy / "metrics.csv").open("a") as f:
        f.write("400,12,0.")  # an append cut short
    after, problems = RunDir(run_copy).scan_metrics()
    assert repr(after) == repr(rows) and len(rows) == 6 and problems == []  # repr: NaN cells compare equal


def test_resume_refuses_unreadable_metrics_rows_and_changes_nothing(run_copy, capsys):
    damage_row(run_copy, 4)
    before = snapshot(run_copy)
    with pytest.raises(popjax.ConfigError, match=r"metrics.csv line 4 \(3 cells.*\) cannot be read; repair or "
                                                 "remove those lines, then resume; nothing was changed"):
        popjax.resume(run_copy, total_env_steps=400)
    one_line_error(["resume", str(run_copy), "--no-progress"], capsys)
    assert snapshot(run_copy) == before


def test_resume_of_a_read_only_run_directory(run_copy, capsys):
    (run_copy / "summary.json").unlink()  # unfinished: the resume has work to do
    before = snapshot(run_copy)
    with read_only(run_copy):
        err = one_line_error(["resume", str(run_copy), "--no-progress"], capsys)
    assert f"run_dir: {run_copy} cannot be written" in err
    assert snapshot(run_copy) == before


@pytest.mark.parametrize("name, message", [("checkpoints", "is a file where popjax keeps a folder"),
                                           ("metrics.csv", "is a folder where popjax keeps a file")])
def test_resume_with_a_file_or_folder_in_the_way(run_copy, capsys, name, message):
    target = run_copy / name
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    target.mkdir() if name.endswith(".csv") else target.write_text("x")
    before = snapshot(run_copy)
    err = one_line_error(["resume", str(run_copy), "--no-progress"], capsys)
    assert f"{target} {message}" in err
    assert snapshot(run_copy) == before


def test_train_under_a_file_or_a_read_only_folder_writes_nothing(tmp_path, capsys):
    (tmp_path / "notes").write_text("keep")
    flags = ["--learner", "td3", "--env", "probe:pendulum", "--steps", "300", "--warmup", "100", "--no-progress"]
    err = one_line_error(["train", *flags, "--out", str(tmp_path / "notes" / "run")], capsys)
    assert f"out_dir: {tmp_path / 'notes'} is a file, not a directory" in err
    locked = tmp_path / "locked"
    locked.mkdir()
    with read_only(locked):
        err = one_line_error(["train", *flags, "--out", str(locked / "run")], capsys)
    assert "locked" in err and "writable" in err
    assert list(locked.iterdir()) == [] and (tmp_path / "notes").read_text() == "keep"


@pytest.mark.long
def test_a_write_that_fails_mid_run_is_one_line(run_copy, capsys, monkeypatch):
    def full(self, rows):
        raise OSError(errno.ENOSPC, "No space left on device", str(self.metrics_path))

    monkeypatch.setattr(RunDir, "append_metrics", full)
    out = run_copy.parent / "new"
    flags = ["--learner", "td3", "--env", "probe:pendulum", "--steps", "300", "--warmup", "100",
             "--eval-interval", "100", "--batch-size", "16", "--no-progress"]
    err = one_line_error(["train", *flags, "--out", str(out)], capsys, code=1)
    assert err == (f"popjax: error: {out / 'metrics.csv'}: No space left on device; the last checkpoint is kept: "
                   "`popjax resume` continues once this is fixed")


def test_plots_that_cannot_be_written_at_the_end_of_a_run_do_not_lose_it(run_copy):
    with read_only(run_copy / "plots"), pytest.warns(RuntimeWarning, match="plot: .*cannot be written.*the run's "
                                                                            "data is complete"):
        run = popjax.resume(run_copy, total_env_steps=400)
    assert run.summary["env_steps"] == 400
    assert popjax.rundir.RunDir(run_copy).read_summary()["env_steps"] == 400


def test_a_damaged_summary_is_one_line(run_copy):
    (run_copy / "summary.json").write_text("{cut")
    with pytest.raises(popjax.ConfigError, match=r"^run_dir: .*summary.json cannot be read \(Expecting") as err:
        RunDir(run_copy).read_summary()
    assert "\n" not in str(err.value)
