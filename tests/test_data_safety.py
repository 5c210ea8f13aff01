"""A run's data is never lost: popjax refuses, rather than deletes or overwrites, what it did not create.

Every refusal is a one-line ``ConfigError`` and leaves the directory byte for byte as it was.
"""

import os
import subprocess
import sys
import time

import pytest
from rundir_helpers import TINY, killed_copy, snapshot

import popjax
from popjax import cli
from popjax.checkpoint import Checkpointer
from popjax.rundir import LOCK, MARKER


def refused(match, fn, *args, **kwargs):
    with pytest.raises(popjax.ConfigError, match=match) as err:
        fn(*args, **kwargs)
    assert "\n" not in str(err.value)


@pytest.mark.long
def test_train_over_an_existing_run_is_refused_and_changes_nothing(run_copy):
    before = snapshot(run_copy)
    refused("holds a run; continue it with `popjax resume", popjax.train, out_dir=run_copy, **TINY)
    assert snapshot(run_copy) == before


def test_overwrite_replaces_only_popjaxs_own_files(run_copy):
    (run_copy / "notes.txt").write_text("mine")
    (run_copy / "plots" / "my_figure.svg").write_text("<svg/>")
    run = popjax.train(out_dir=run_copy, overwrite=True, **{**TINY, "seed": 7})
    assert run.summary["seed"] == 7 and (run_copy / MARKER).is_file()
    assert (run_copy / "notes.txt").read_text() == "mine"  # not popjax's: kept
    assert (run_copy / "plots" / "my_figure.svg").read_text() == "<svg/>"
    assert (run_copy / "plots" / "learning_curves.png").stat().st_size > 10_000  # popjax's: redrawn
    rows = (run_copy / "metrics.csv").read_text().splitlines()
    assert len(rows) == 1 + 3 * 2  # header + 3 evaluations x 2 members of the new run only


def test_an_unrelated_directory_is_never_written_even_with_overwrite(tmp_path):
    mine = tmp_path / "myproject"
    (mine / "checkpoints").mkdir(parents=True)
    (mine / "checkpoints" / "model.pt").write_bytes(b"weights")
    (mine / "metrics.csv").write_text("a,b\n1,2\n")
    before = snapshot(mine)
    for overwrite in (False, True):
        refused("not empty and popjax did not create it", popjax.train, out_dir=mine, overwrite=overwrite, **TINY)
    assert snapshot(mine) == before


def test_out_dir_that_is_a_file_is_refused(tmp_path):
    target = tmp_path / "results.txt"
    target.write_text("keep me")
    refused("is a file, not a directory", popjax.train, out_dir=target, **TINY)
    assert target.read_text() == "keep me"


@pytest.mark.long
def test_a_run_in_use_is_refused_and_a_dead_owners_lock_is_taken_over(run_copy):
    (run_copy / "summary.json").unlink()  # as if still running
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (run_copy / LOCK).write_text(f"{owner.pid} {os.uname().nodename}\n")
        before = snapshot(run_copy)
        refused(f"in use by pid {owner.pid}", popjax.resume, run_copy)
        refused(f"in use by pid {owner.pid}", popjax.train, out_dir=run_copy, overwrite=True, **TINY)
        assert snapshot(run_copy) == before
    finally:
        owner.kill()
        owner.wait()
    with pytest.warns(RuntimeWarning, match=f"taking over the lock of pid {owner.pid}"):
        run = popjax.resume(run_copy)
    assert run.summary["env_steps"] == 300 and not (run_copy / LOCK).exists()


@pytest.mark.processes
def test_two_concurrent_resumes_one_is_refused(run_copy, tmp_path):
    """A real second process: the resume that comes second exits 2 and the run is not disturbed."""
    checkpoints = Checkpointer(run_copy / "checkpoints")
    for step in checkpoints.steps()[1:]:  # go back to the first checkpoint: the resume has work to do
        checkpoints.delete(step)
    checkpoints.close()
    script = ("import time, sys; from popjax.loop import Loop; step = Loop.step\n"
              "def slow(self, *a):\n    time.sleep(0.5)\n    return step(self, *a)\n"
              "Loop.step = slow\nimport popjax; popjax.resume(sys.argv[1])\n")
    first = subprocess.Popen([sys.executable, "-c", script, str(run_copy)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (run_copy / LOCK).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (run_copy / LOCK).exists()
        code = cli.main(["resume", str(run_copy), "--no-progress"])
        assert code == 2
    finally:
        assert first.wait(timeout=300) == 0, first.stderr.read()[-2000:]
    rows = (run_copy / "metrics.csv").read_text().splitlines()
    assert len(rows) == 1 + 3 * 2  # every row once: the refused resume wrote nothing


@pytest.mark.parametrize("damage, message", [
    ("cut_mid_line", "config.yaml cannot be read"),
    ("cut_between_lines", "differs from the run's checkpoints .*learner_config"),
    ("empty", "holds no configuration"),
    ("binary", "cannot be read"),
    ("edited", "differs from the run's checkpoints .*buffer_size: 999 vs 500"),
])
def test_resume_with_a_broken_or_edited_config_yaml_is_refused(run_copy, damage, message):
    config = run_copy / "config.yaml"
    lines = config.read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if line.startswith("learner_config"))
    config.write_bytes({"cut_mid_line": "".join(lines[:cut]) + "learner_config: {hidden: [8,",
                        "cut_between_lines": "".join(lines[:cut]), "empty": "",
                        "binary": "\x00\x01\xff", "edited": "".join(lines).replace("buffer_size: 500",
                                                                                "buffer_size: 999")}[damage]
                       .encode("latin-1"))
    before = snapshot(run_copy)
    refused(message, popjax.resume, run_copy)
    assert snapshot(run_copy) == before


def test_resume_may_extend_the_budget(run_copy, finished):
    run = popjax.resume(run_copy, total_env_steps=400)
    assert run.summary["env_steps"] == 400 and run.summary["updates"] > finished.summary["updates"]


def test_resume_of_a_finished_run_changes_nothing(run_copy, finished):
    before = snapshot(run_copy)
    run = popjax.resume(run_copy)
    assert run.summary == finished.summary
    assert snapshot(run_copy) == before


@pytest.mark.parametrize("damage, says", [
    ("cut_mid_line", "metrics.csv ends in a row cut mid-line (line 7), so it lacks the row of member 1 at the final "
                     "300 env steps"),
    ("last_row_gone", "metrics.csv lacks the row of member 1 at the final 300 env steps"),
    ("deleted", "metrics.csv is missing"),
])
def test_resume_of_a_finished_run_whose_metrics_lost_rows_says_so_and_changes_nothing(run_copy, damage, says,
                                                                                        capsys):
    metrics = run_copy / "metrics.csv"
    data = metrics.read_bytes()
    if damage == "deleted":
        metrics.unlink()
    else:
        metrics.write_bytes(data[:-5] if damage == "cut_mid_line" else data[:data.rstrip(b"\n").rfind(b"\n") + 1])
    before = snapshot(run_copy)
    assert cli.main(["resume", str(run_copy), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"popjax: error: resume: {run_copy} is finished (300 of 300 env "
                                                  f"steps) but {run_copy}/{says}; resume trained nothing and changed "
                                                  "nothing (summary.json holds the final returns)"), err
    assert err.endswith(f"popjax train --config {run_copy}/config.yaml --out {run_copy} --overwrite\n")
    assert snapshot(run_copy) == before  # the cut row, like every other byte, is kept


def test_resume_of_a_killed_run_whose_metrics_were_deleted_says_the_earlier_rows_are_lost(finished, tmp_path):
    cut, step = killed_copy(finished.out_dir, tmp_path / "cut")
    (cut / "metrics.csv").unlink()
    with pytest.warns(RuntimeWarning, match=rf"metrics.csv is missing: the rows up to {step * 50} env steps are lost"):
        run = popjax.resume(cut)
    assert run.summary["final_returns"] == finished.summary["final_returns"]
    rows = (cut / "metrics.csv").read_text().splitlines()
    assert [int(line.split(",")[0]) for line in rows[1:]] == [s for s in (100, 200, 300) if s > step * 50 for _ in "ab"]


def test_resume_with_every_checkpoint_damaged_refuses_and_keeps_them(run_copy):
    for step_dir in (run_copy / "checkpoints").iterdir():
        if step_dir.name.isdigit():
            (step_dir / "meta" / "metadata").write_text("{broken")
    metrics = (run_copy / "metrics.csv").read_bytes()
    with pytest.warns(UserWarning, match="is unusable"):
        refused("no usable checkpoint .* set aside as damaged", popjax.resume, run_copy)
    assert (run_copy / "metrics.csv").read_bytes() == metrics
    assert len(list((run_copy / "checkpoints").glob("damaged-*"))) == 3  # kept, under another name


def test_plot_of_something_that_is_not_a_run_creates_nothing(tmp_path, capsys):
    missing = tmp_path / "nothing-here"
    assert cli.main(["plot", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("popjax: error:") and "\n" not in err
    assert not missing.exists()
