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

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "plots").mkdir(exist_ok=True)

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.csv"

    def write_config(self, config: Mapping[str, Any]) -> None:
        _atomic_write(self.path / "config.yaml", yaml.safe_dump(dict(config), sort_keys=False))

    def read_config(self) -> dict[str, Any]:
        return yaml.safe_load((self.path / "config.yaml").read_text())

    def append_metrics(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Appends rows; the header (fixed by the first rows) is written once."""
        if not rows:
            return
        new = not self.metrics_path.exists() or self.metrics_path.stat().st_size == 0
        columns = list(rows[0]) if new else self.metric_columns()
        with self.metrics_path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
            if new:
                writer.writeheader()
            writer.writerows({k: _cell(v) for k, v in row.items()} for row in rows)
            f.flush()
            os.fsync(f.fileno())

    def metric_columns(self) -> list[str]:
        with self.metrics_path.open(newline="") as f:
            return next(csv.reader(f))

    def read_metrics(self) -> list[dict[str, float]]:
        if not self.metrics_path.exists():
            return []
        with self.metrics_path.open(newline="") as f:
            return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]

    def truncate_metrics(self, max_env_steps: int) -> None:
        """Drops rows logged after ``max_env_steps`` (used by resume to avoid duplicates)."""
        if not self.metrics_path.exists():
            return
        with self.metrics_path.open(newline="") as f:
            reader = csv.DictReader(f)
            columns, rows = reader.fieldnames, [r for r in reader if float(r["env_steps"]) <= max_env_steps]
        text_rows = [",".join(columns)] + [",".join(r[c] for c in columns) for r in rows]
        _atomic_write(self.metrics_path, "\n".join(text_rows) + "\n")

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
