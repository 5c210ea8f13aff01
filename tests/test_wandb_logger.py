"""W&B (issue 49): settings it cannot start with are one line before anything is written; a run that fails is
marked failed; a resumed run logs each row once. Offline (no network): W&B writes its records to a local file."""

import sys

import pytest
from rundir_helpers import TINY

import popjax
from popjax.cli import main
from popjax.loop import Loop

wandb = pytest.importorskip("wandb")
from test_loggers import offline, wandb_records  # noqa: E402, F401 (the fixture is used by name)


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """No W&B credentials anywhere it looks, its own files under tmp_path."""
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    for name in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home"))


@pytest.mark.parametrize(("mode", "expected"), [
    ("bogus", "logger: wandb: WANDB_MODE='bogus' is not a W&B mode (allowed: online, offline, "),
    (None, "logger: wandb is not logged in; log in with `wandb login` (or set WANDB_API_KEY), or set "
           "WANDB_MODE=offline (allowed: online when logged in, offline, dryrun, disabled)"),
])
def test_wandb_settings_it_cannot_start_with_are_one_line_before_anything_is_written(isolated, monkeypatch, tmp_path,
                                                                                   capsys, mode, expected):
    if mode is not None:
        monkeypatch.setenv("WANDB_MODE", mode)
    out = tmp_path / "run"
    with pytest.raises(popjax.ConfigError) as err:
        popjax.train(out_dir=out, logger=["wandb"], **TINY)
    assert str(err.value).startswith(expected) and "\n" not in str(err.value)
    assert not out.exists()
    (tmp_path / "c.yaml").write_text("learner: td3\nenv: probe:pendulum\nlogger: [wandb]\n")
    code = main(["train", "--config", str(tmp_path / "c.yaml"), "--out", str(out)])
    printed = capsys.readouterr().err
    assert code == 2 and printed.count("\n") == 1 and expected in printed and not out.exists()


def _runs(folder):
    """``[(logged env steps, exit code)]`` of each offline W&B run in ``folder``, oldest first."""
    found = []
    for run_dir in sorted(folder.glob("offline-run-*")):
        (log,) = run_dir.glob("run-*.wandb")
        steps, exit_code = [], None
        for record in wandb_records(log):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                items = {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
                if "member_0/eval_return" in items:
                    steps.append(int(float(items["env_steps"])))
            elif kind == "exit":
                exit_code = record.exit.exit_code
        found.append((steps, exit_code))
    return found


@pytest.mark.long
def test_a_failed_run_is_marked_failed_and_its_resume_logs_each_row_once(offline, tmp_path, monkeypatch):  # noqa: F811
    saves, save = [], Loop.save_checkpoint

    def failing_save(self, state, env_state):  # killed after the rows of 200 env steps, before their checkpoint
        saves.append(self.iteration)
        if len(saves) == 2:
            raise RuntimeError("killed")
        save(self, state, env_state)

    monkeypatch.setattr(Loop, "save_checkpoint", failing_save)
    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="killed"):
        popjax.train(out_dir=out, logger=["wandb"], **TINY)
    ((steps, exit_code),) = _runs(out / "wandb")
    assert steps == [100, 200] and exit_code == 1  # failed, not finished
    monkeypatch.setattr(Loop, "save_checkpoint", save)
    popjax.resume(out)  # from the checkpoint of 100 env steps: metrics.csv logs 200 again
    (_, first_exit), (steps, exit_code) = _runs(out / "wandb")
    assert steps == [300] and exit_code == 0  # W&B had 200 already
    assert sys.modules["wandb"] is wandb
