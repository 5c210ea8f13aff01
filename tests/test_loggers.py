"""Loggers (``logger: [...]``): Weights & Biases in offline mode, read back from its own files; a missing package
refused before anything is written; run directories of older popjax (``tensorboard: true``)."""

from __future__ import annotations

import csv
import json
import struct
import sys

import pytest
from rundir_helpers import TINY, snapshot

import popjax
from popjax import cli

wandb = pytest.importorskip("wandb")
from wandb.proto import wandb_internal_pb2  # noqa: E402

PBT_RUN = dict(learner="td3", env="probe:pendulum", driver="pbt", pop_size=4, seed=5, total_env_steps=1000,
               warmup_steps=250, eval_interval=250, rollout_len=25, batch_size=16, buffer_size=2000, eval_episodes=1,
               learner_config={"hidden": [8, 8]}, progress=False, pbt={"interval": 250, "quantile": 0.25})


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """W&B offline (no network), its own files under tmp_path."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home"))
    monkeypatch.delenv("WANDB_PROJECT", raising=False)


def wandb_records(path):
    """The records of a W&B ``.wandb`` file: its header (``:W&B``, magic, version), then 32 KiB blocks of chunks
    (crc32, length, type: 1 full, 2 first, 3 middle, 4 last), each record a ``wandb_internal_pb2.Record``."""
    data, block = path.read_bytes(), 32 * 1024
    assert data[:4] == b":W&B"
    pos, parts = 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # too short for a chunk header: the block is padded
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if (length, kind) == (0, 0):
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            yield record


def read_wandb_run(folder):
    """``(run record, history rows, final summary)`` of the one offline W&B run in ``folder``."""
    (run_dir,) = folder.glob("offline-run-*")
    (log,) = run_dir.glob("run-*.wandb")
    run, history, summary = None, [], {}
    key = lambda item: item.key or "/".join(item.nested_key)  # noqa: E731 - "a/b" comes as the nested key [a, b]
    for record in wandb_records(log):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
        elif kind == "history":
            history.append({key(item): json.loads(item.value_json) for item in record.history.item})
        elif kind == "summary":
            summary.update({key(item): json.loads(item.value_json) for item in record.summary.update})
    return run, history, summary, run_dir


def csv_rows(path):
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.long
def test_a_pbt_population_is_one_wandb_run_with_its_members_hparams_and_exploits(offline, tmp_path):
    out = tmp_path / "pbt-td3"
    result = popjax.train(out_dir=out, logger=["wandb"], **PBT_RUN)
    run, history, summary, files = read_wandb_run(out / "wandb")
    assert (run.display_name, run.project, run.run_id) == ("pbt-td3", "popjax",
                                                           (out / "wandb" / "popjax-run-id").read_text().strip())
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert (config["driver"], config["pop_size"], config["logger"]) == ("pbt", 4, ["wandb"])

    # Every member's curve and hparams, at the env steps of metrics.csv, with the values of metrics.csv.
    rows = csv_rows(out / "metrics.csv")
    logged = {row["env_steps"]: row for row in history if "member_0/eval_return" in row}  # one log per evaluation
    for row in rows:
        point = logged[int(row["env_steps"])]
        for name in ("eval_return", "actor_lr", "critic_lr"):
            assert point[f"member_{row['member']}/{name}"] == pytest.approx(float(row[name]), rel=1e-6), name
    steps = sorted({int(r["env_steps"]) for r in rows})
    assert [row["env_steps"] for row in history if "member_0/eval_return" in row] == steps == [250, 500, 750, 1000]
    final = logged[1000]
    assert final["population/best_eval_return"] == pytest.approx(max(result.summary["final_returns"]))
    assert summary["final_returns"] == pytest.approx(result.summary["final_returns"])

    # PBT's exploits: a Table with one row per exploit (env steps, member, parent, old and new hparams), as in
    # summary.json; and lineage.csv (every member at every round) as a Table.
    exploits = json.loads(next((files / "files").rglob("lineage_*.table.json")).read_text())
    columns = exploits["columns"]
    assert {"env_steps", "member", "parent", "new_hparams.actor_lr", "old_hparams.actor_lr"} <= set(columns)
    lineage = result.summary["lineage"]
    assert len(lineage) >= 1 and len(exploits["data"]) == len(lineage)
    for entry, values in zip(lineage, exploits["data"], strict=True):
        row = dict(zip(columns, values, strict=True))
        assert (row["env_steps"], row["member"], row["parent"]) == (entry["env_steps"], entry["member"],
                                                                   entry["parent"])
        assert row["new_hparams.actor_lr"] == pytest.approx(entry["new_hparams"]["actor_lr"])
    rounds = json.loads(next((files / "files").rglob("lineage.csv_*.table.json")).read_text())
    assert len(rounds["data"]) == len(csv_rows(out / "lineage.csv"))

    # --overwrite replaces W&B's files of the run and keeps anything else in wandb/.
    (out / "wandb" / "notes.txt").write_text("mine")
    popjax.train(out_dir=out, overwrite=True, logger="wandb", **TINY)
    assert (out / "wandb" / "notes.txt").read_text() == "mine"
    again = read_wandb_run(out / "wandb")[0]
    assert again.run_id != run.run_id and not (files).exists()


def test_a_missing_logger_package_is_one_line_before_anything_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(popjax.ConfigError) as err:
        popjax.train(out_dir=tmp_path / "run", logger=["tensorboard", "wandb"], **TINY)
    assert str(err.value) == "logger: wandb is not installed (pip install 'popjax[wandb]')"
    assert not (tmp_path / "run").exists()
    argv = ["train", "--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run")]
    (tmp_path / "c.yaml").write_text("learner: td3\nenv: probe:pendulum\nlogger: [wandb]\n")
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == "popjax: error: logger: wandb is not installed (pip install 'popjax[wandb]')\n"
    assert not (tmp_path / "run").exists()


def test_resume_refuses_a_logger_whose_package_is_missing_and_changes_nothing(run_copy, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    before = snapshot(run_copy)
    with pytest.raises(popjax.ConfigError, match=r"^logger: wandb is not installed \(pip install 'popjax\[wandb\]'\)$"):
        popjax.resume(run_copy, logger=["wandb"], total_env_steps=400)
    assert snapshot(run_copy) == before


@pytest.mark.parametrize("value, message", [
    ("maybe", "logger: 'maybe' unknown (allowed: tensorboard, wandb)"),
    (["tensorboard", "tensorboard"], "logger: 'tensorboard' is given twice"),
    (3, "logger: expected a list of tensorboard, wandb (or one of them alone), got 3"),
])
def test_logger_values_are_checked_in_one_line(value, message):
    with pytest.raises(popjax.ConfigError) as err:
        popjax.make_config(logger=value)
    assert str(err.value) == message


def test_a_run_directory_of_older_popjax_with_tensorboard_true_resumes_with_that_logger(run_copy):
    config = run_copy / "config.yaml"
    assert "logger: []\n" in config.read_text()
    config.write_text(config.read_text().replace("logger: []\n", "tensorboard: true\n"))  # as older popjax wrote it
    run = popjax.resume(run_copy, total_env_steps=400)
    assert run.summary["env_steps"] == 400
    assert list((run_copy / "tensorboard").glob("events.out.tfevents.*"))  # the rows from 300 on
