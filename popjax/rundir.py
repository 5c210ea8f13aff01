"""The run directory: config.yaml, metrics.csv, summary.json, plots/ (format in DESIGN §9)."""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

BASE_COLUMNS = ("env_steps", "updates", "wall_s", "member", "eval_return")


class RunDir:
    """Writes one run's files; every write is atomic or append-only, so a kill loses nothing written."""

    def __init__(self, path: str | os.PathLike, tensorboard: bool = False):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "plots").mkdir(exist_ok=True)
        self._tensorboard = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tensorboard = SummaryWriter(str(self.path / "tensorboard"))

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.csv"

    def write_config(self, config: Mapping[str, Any]) -> None:
        _atomic_write(self.path / "config.yaml", yaml.safe_dump(dict(config), sort_keys=False))

    def read_config(self) -> dict[str, Any]:
        return yaml.safe_load((self.path / "config.yaml").read_text())

    def append_metrics(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Appends rows (fsynced). Columns seen for the first time (e.g. learner metrics, which
        start after warm-up) extend the header: the file is then rewritten atomically with
        empty cells in the older rows."""
        if not rows:
            return
        exists = self.metrics_path.exists() and self.metrics_path.stat().st_size > 0
        columns = self.metric_columns() if exists else []
        new_columns = [k for row in rows for k in row if k not in columns]
        if exists and new_columns:
            old_rows = self._read_raw()
            columns += list(dict.fromkeys(new_columns))
            self._rewrite(columns, old_rows)
        elif not exists:
            columns = list(dict.fromkeys(k for row in rows for k in row))
            self._rewrite(columns, [])
        with self.metrics_path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writerows({k: _cell(v) for k, v in row.items()} for row in rows)
            f.flush()
            os.fsync(f.fileno())
        if self._tensorboard is not None:
            self._write_tensorboard(rows)

    def _write_tensorboard(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Every numeric column as ``member_<m>/<column>`` at the row's env step."""
        for row in rows:
            step = int(row["env_steps"])
            for name, value in row.items():
                if name not in ("env_steps", "member") and isinstance(value, int | float):
                    self._tensorboard.add_scalar(f"member_{int(row['member'])}/{name}", value, step)
        self._tensorboard.flush()

    def metric_columns(self) -> list[str]:
        with self.metrics_path.open(newline="") as f:
            return next(csv.reader(f))

    def read_metrics(self) -> list[dict[str, float]]:
        if not self.metrics_path.exists():
            return []
        with self.metrics_path.open(newline="") as f:
            return [{k: float(v) if v != "" else math.nan for k, v in row.items()} for row in csv.DictReader(f)]

    def truncate_metrics(self, max_env_steps: int) -> None:
        """Drops rows logged after ``max_env_steps`` (used by resume to avoid duplicates)."""
        if not self.metrics_path.exists():
            return
        rows = [r for r in self._read_raw() if float(r["env_steps"]) <= max_env_steps]
        self._rewrite(self.metric_columns(), rows)

    def _read_raw(self) -> list[dict[str, str]]:
        with self.metrics_path.open(newline="") as f:
            return list(csv.DictReader(f))

    def _rewrite(self, columns: Sequence[str], rows: Sequence[Mapping[str, str]]) -> None:
        tmp = self.metrics_path.with_suffix(".csv.tmp")
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(columns))
            writer.writeheader()
            writer.writerows(rows)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.metrics_path)

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        _atomic_write(self.path / "summary.json", json.dumps(summary, indent=2, default=_json_default) + "\n")

    def read_summary(self) -> dict[str, Any]:
        return json.loads((self.path / "summary.json").read_text())


def _cell(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
