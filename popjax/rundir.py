"""The run directory: config.yaml, metrics.csv, summary.json, checkpoints/, plots/.

A run's data is never lost: popjax writes into a directory only after every check has
passed, marks the directories it creates as its own (``.popjax-run``), replaces one only when
asked (``overwrite``) and only if it carries that mark, deletes no file it did not create, and
lets one process at a time write a run (``.popjax-lock`` with the owner's pid).
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import os
import shutil
import socket
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from popjax.config import ConfigError, saved_options
from popjax.registry import LOGGERS

BASE_COLUMNS = ("env_steps", "updates", "wall_s", "member", "eval_return")
MARKER = ".popjax-run"  # popjax created this directory: it may be replaced with overwrite
LOCK = ".popjax-lock"  # the process writing the run: "<pid> <host>"
# What popjax writes into a run directory (files, and patterns inside its folders); overwrite removes
# these and nothing else.
OUTPUT_FILES = ("config.yaml", "metrics.csv", "metrics.csv.tmp", "summary.json", MARKER, "lineage.csv",
                "schedule.yaml")
OUTPUT_PATTERNS = {"checkpoints": ("[0-9]*", "damaged-*", "*.orbax-checkpoint-tmp-*"), "plots": ("*.png",)}


def output_patterns() -> dict[str, tuple[str, ...]]:
    """``OUTPUT_PATTERNS`` and what each registered logger writes (``LoggerDef.outputs``)."""
    patterns = dict(OUTPUT_PATTERNS)
    for definition in LOGGERS.values():
        for folder, globs in definition.outputs.items():
            patterns[folder] = (*patterns.get(folder, ()), *globs)
    return patterns


def _writing(method):
    """A RunDir method that writes: skipped where the RunDir does not write (``writes=False``)."""
    @functools.wraps(method)
    def write(self, *args, **kwargs):
        return method(self, *args, **kwargs) if self.writes else None

    return write


class RunDir:
    """One run's files; every write is atomic or append-only, so a kill loses nothing written.

    Constructing it touches nothing on disk: the directory is created by the first write. With
    ``writes=False`` (the processes besides process 0 of a multi-process run) every write is skipped.
    ``loggers`` (``popjax.loggers``) get every row appended to metrics.csv.
    """

    def __init__(self, path: str | os.PathLike, writes: bool = True):
        self.path = Path(path)
        self.writes = writes
        self.loggers: list = []

    def _ensure(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.csv"

    @property
    def is_run(self) -> bool:
        """A directory popjax created for a run (it carries the mark)."""
        return (self.path / MARKER).is_file()

    @_writing
    def start(self) -> None:
        """Marks the directory as a popjax run (locked by the caller), removing an earlier run's outputs.

        Only popjax's own outputs go (``OUTPUT_FILES``, ``output_patterns()``); any other file stays.
        """
        for name in OUTPUT_FILES:
            (self.path / name).unlink(missing_ok=True)
        for folder, patterns in output_patterns().items():
            for pattern in patterns:
                for target in (self.path / folder).glob(pattern):
                    shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
            if (self.path / folder).is_dir() and not any((self.path / folder).iterdir()):
                (self.path / folder).rmdir()
        self.path.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.path / MARKER, json.dumps({"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                                      "pid": os.getpid()}) + "\n")

    @_writing
    def write_config(self, config: Mapping[str, Any]) -> None:
        self._ensure()
        _atomic_write(self.path / "config.yaml", yaml.safe_dump(dict(config), sort_keys=False))

    def read_config(self) -> dict[str, Any]:
        """The run's config.yaml; a missing, unreadable or cut file is a one-line ConfigError."""
        path = self.path / "config.yaml"
        if not path.is_file():
            raise ConfigError(f"run_dir: {self.path} is not a run directory (no config.yaml)")
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ConfigError(f"run_dir: {path} cannot be read ({first})") from None
        if not isinstance(data, dict) or not data:
            raise ConfigError(f"run_dir: {path} holds no configuration (empty or cut?); nothing was changed")
        return saved_options(data)

    @_writing
    def append_metrics(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Appends rows (fsynced). Columns seen for the first time (e.g. learner metrics, which
        start after warm-up) extend the header: the file is then rewritten atomically with
        empty cells in the older rows."""
        if not rows:
            return
        self._ensure()
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
        for logger in self.loggers:
            logger.rows(rows)

    def metric_columns(self) -> list[str]:
        with self.metrics_path.open(newline="") as f:
            return next(csv.reader(f))

    def read_metrics(self) -> list[dict[str, float]]:
        """The rows of metrics.csv that can be read (``scan_metrics`` also says which cannot)."""
        return self.scan_metrics()[0]

    def scan_metrics(self) -> tuple[list[dict[str, float]], list[str]]:
        """The readable rows of metrics.csv, and one note per line that cannot be read (``line N (why)``).

        A last line without its newline is what a kill in the middle of an append leaves: it is neither a
        row nor a problem (resume drops it). An unreadable header, or a metrics.csv that is not a file, is a
        one-line ConfigError naming the path.
        """
        path = self.metrics_path
        if not path.exists():
            return [], []
        try:
            data = path.read_bytes()
        except OSError as err:
            raise ConfigError(f"run_dir: {path} cannot be read ({err.strerror or err})") from None
        lines = data.split(b"\n")[:-1]  # the part after the last newline is an append cut short
        if not lines:
            return [], []
        header = _csv_line(lines[0])
        if not header or "" in header:
            raise ConfigError(f"run_dir: {path} has no readable header (a line of column names)")
        rows, problems = [], []
        for number, line in enumerate(lines[1:], start=2):
            row, why = _metrics_row(header, line)
            if why is None:
                rows.append(row)
            else:
                problems.append(f"line {number} ({why})")
        return rows, problems

    def missing_final_rows(self, env_steps: int, pop_size: int) -> str | None:
        """What metrics.csv of a run that finished at ``env_steps`` lacks (the file, or rows of the final
        evaluation: every driver logs one per member there), or None when nothing is missing."""
        path = self.metrics_path
        if not path.is_file():
            return f"{path} is missing"
        rows = self.read_metrics()
        members = {int(r["member"]) for r in rows if r.get("env_steps") == env_steps and "member" in r
                   and math.isfinite(r["member"])}
        lost = [m for m in range(pop_size) if m not in members]
        if not lost:
            return None
        rows_of = f"row{'s' if len(lost) > 1 else ''} of member{'s' if len(lost) > 1 else ''}"
        what = f"the {rows_of} {', '.join(map(str, lost))} at the final {env_steps} env steps"
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            line = data.count(b"\n") + 1
            return f"{path} ends in a row cut mid-line (line {line}), so it lacks {what}"
        return f"{path} lacks {what}"

    @_writing
    def drop_partial_metrics_row(self) -> None:
        """Cuts a last line left incomplete by a kill in the middle of an append."""
        path = self.metrics_path
        if path.exists() and path.stat().st_size:
            data = path.read_bytes()
            if not data.endswith(b"\n"):
                data = data[: data.rfind(b"\n") + 1]
                if data:
                    path.write_bytes(data)
                else:  # not even a complete header
                    path.unlink()

    @_writing
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

    @_writing
    def write_table(self, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """``name`` (a CSV file of the run's outputs, e.g. lineage.csv) with ``rows``, written atomically."""
        self._ensure()
        columns = list(dict.fromkeys(key for row in rows for key in row))
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: "" if v is None else _cell(v) for k, v in row.items()} for row in rows)
        _atomic_write(self.path / name, text.getvalue())

    @_writing
    def write_summary(self, summary: Mapping[str, Any]) -> None:
        self._ensure()
        _atomic_write(self.path / "summary.json", json.dumps(summary, indent=2, default=_json_default) + "\n")

    def read_summary(self) -> dict[str, Any]:
        """summary.json; one that cannot be read or parsed is a one-line ConfigError naming it."""
        path = self.path / "summary.json"
        try:
            summary = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            why = err.strerror if isinstance(err, OSError) else str(err).splitlines()[0]
            raise ConfigError(f"run_dir: {path} cannot be read ({why})") from None
        if not isinstance(summary, dict):
            raise ConfigError(f"run_dir: {path} holds no summary (a JSON object), got {type(summary).__name__}")
        return summary

    def check_layout(self) -> None:
        """A one-line ConfigError when a file popjax writes is a folder here, or a folder it writes is a file."""
        for name in OUTPUT_FILES:
            if (self.path / name).is_dir():
                raise ConfigError(f"run_dir: {self.path / name} is a folder where popjax keeps a file")
        for name in output_patterns():
            if (self.path / name).exists() and not (self.path / name).is_dir():
                raise ConfigError(f"run_dir: {self.path / name} is a file where popjax keeps a folder")


def _csv_line(line: bytes) -> list[str] | None:
    """The cells of one line of metrics.csv, or None when it is not text."""
    try:
        return next(csv.reader([line.decode().rstrip("\r")]), [])
    except (UnicodeDecodeError, csv.Error):
        return None


def _metrics_row(header: list[str], line: bytes) -> tuple[dict[str, float] | None, str | None]:
    """One metrics row as numbers (an empty cell is NaN), or why it cannot be read."""
    cells = _csv_line(line)
    if cells is None:
        return None, "not text"
    if len(cells) != len(header):
        return None, f"{len(cells)} cells, the header has {len(header)}"
    row = {}
    for name, cell in zip(header, cells, strict=True):
        try:
            row[name] = float(cell) if cell != "" else math.nan
        except ValueError:
            return None, f"{name}: {cell[:20]!r} is not a number"
    return row, None


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


def check_new_run(path: Path, overwrite: bool) -> None:
    """Raises ConfigError unless ``path`` can receive a new run (nothing is written here).

    Free: it does not exist, or it is an empty directory. A popjax run directory: only with
    ``overwrite``. Anything else (a file, a directory of other files, not writable): never.
    """
    if path.exists() and not path.is_dir():
        raise ConfigError(f"out_dir: {path} is a file, not a directory")
    if path.is_dir() and any(path.iterdir()):
        if not RunDir(path).is_run:
            raise ConfigError(f"out_dir: {path} is not empty and popjax did not create it; choose another --out "
                              "(popjax never deletes files it did not write)")
        if not overwrite:
            raise ConfigError(f"out_dir: {path} holds a run; continue it with `popjax resume {path}`, or replace it "
                              "with --overwrite")
    parent = path if path.is_dir() else next(p for p in path.absolute().parents if p.exists())
    if not parent.is_dir():
        raise ConfigError(f"out_dir: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"out_dir: {parent} is not writable")


class RunLock:
    """One writer per run directory: ``.popjax-lock`` holds ``<pid> <host>`` of the process writing it.

    A second ``train``/``resume`` of the same directory gets a ConfigError naming the owner; a
    lock left by a process that no longer runs (killed) is taken over with a warning.
    """

    def __init__(self, path: Path):
        self.path = Path(path) / LOCK
        self.owned = False

    def acquire(self) -> RunLock:
        """Takes the lock; a directory that cannot be written (read-only, a file in its path) is a one-line
        ConfigError, raised before anything is written."""
        me = f"{os.getpid()} {socket.gethostname()}"
        for _ in range(2):
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if not self.path.parent.is_dir():  # mkdir met a file where a folder belongs
                    raise ConfigError(f"run_dir: {_first_file(self.path.parent)} is a file, not a directory") \
                        from None
                pid, host = _read_lock(self.path)
                if pid is not None and (host != socket.gethostname() or _alive(pid)):
                    where = "" if host == socket.gethostname() else f" on {host}"
                    raise ConfigError(f"run_dir: {self.path.parent} is in use by pid {pid}{where} "
                                      f"(remove {self.path} if that process is gone)") from None
                warnings.warn(f"{self.path.parent}: taking over the lock of pid {pid}, which no longer runs",
                              RuntimeWarning, stacklevel=3)
                self.path.unlink(missing_ok=True)
                continue
            except OSError as err:
                if isinstance(err, NotADirectoryError):
                    raise ConfigError(f"run_dir: {_first_file(self.path.parent)} is a file, not a directory") \
                        from None
                raise ConfigError(f"run_dir: {self.path.parent} cannot be written ({err.strerror or err})") from None
            with os.fdopen(fd, "w") as f:
                f.write(me + "\n")
            self.owned = True
            return self
        raise ConfigError(f"run_dir: could not lock {self.path.parent}")

    def release(self) -> None:
        if self.owned and _read_lock(self.path)[0] == os.getpid():
            self.path.unlink(missing_ok=True)
        self.owned = False

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _first_file(path: Path) -> Path:
    """The first of ``path``'s ancestors (or itself) that exists and is not a directory."""
    return next((p for p in (*reversed(path.parents), path) if p.exists() and not p.is_dir()), path)


def _read_lock(path: Path) -> tuple[int | None, str]:
    try:
        pid, host = path.read_text().split()
        return int(pid), host
    except (OSError, ValueError):
        return None, ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True
