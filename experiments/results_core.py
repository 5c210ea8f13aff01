"""What every topic module of experiments/results.py shares: the paths of the committed JSON, the registry of
generated tables (``TABLES``, filled by ``@table``), the readers (``load``, ``runs``), the cell formats (``md``,
``num``, ``seeds``, ``mean_sd``, ``paired_ratio``, ``t_beside``, ``verdict_text``) and the paired comparisons a
scoreboard claim is decided with (``paired_evidence``, ``both_evidence``, ``paired_difference``). It imports no
topic module."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import verdicts

from popjax import stats

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
BENCH = ROOT / "benchmarks" / "results"
REPS = 10_000

TABLES: dict[str, Callable[[], list[str]]] = {}


def table(function: Callable[[], list[str]]) -> Callable[[], list[str]]:
    TABLES[function.__name__] = function
    return function


def load(path: Path | str) -> dict:
    return json.loads((RESULTS / path if not Path(path).is_absolute() else Path(path)).read_text())


def runs(folder: str | Path, key: Callable[[dict], Any], pattern: str = "*.json") -> dict[Any, dict]:
    """``key(record) -> record`` of every one-run JSON file in ``folder`` (under results/) matching ``pattern``."""
    return {key(r): r for r in (json.loads(path.read_text()) for path in sorted((RESULTS / folder).glob(pattern)))}


def md(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + \
        ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def num(x: float | None, digits: int = 0) -> str:
    """``x`` with ``digits`` decimals ("-" for None or NaN; no "-0")."""
    if x is None or not np.isfinite(x):
        return "-"
    text = f"{x:.{digits}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def seeds(values: Sequence[float], digits: int = 0) -> str:
    return ", ".join(num(v, digits) for v in values)


def mean_sd(values: Sequence[float], digits: int = 0) -> str:
    """mean ± SD (ddof 1); one value: the value alone."""
    v = np.asarray(values, dtype=float)
    return num(v.mean(), digits) if len(v) == 1 else f"{num(v.mean(), digits)} ± {num(v.std(ddof=1), digits)}"


def paired_ratio(values: Sequence[float], base: Sequence[float], digits: int = 2) -> str:
    """The 95 % paired bootstrap interval of mean(values) / mean(base) (seed i of both arms drawn together), or
    "n<4" when there are fewer than 4 seeds; below 10 seeds Fieller's t-based interval beside it."""
    if len(values) < stats.MIN_BOOTSTRAP_SEEDS:
        return f"n<{stats.MIN_BOOTSTRAP_SEEDS}"
    ci = stats.paired_ci(values, base, "ratio", reps=REPS)
    text = f"{num(ci.low, digits)}-{num(ci.high, digits)}"
    if len(values) < stats.MIN_COVERING_SEEDS:
        low, high = stats.fieller_interval(values, base)
        text += f" (t: {num(low, digits)}-{num(high, digits)})"
    return text


def t_beside(values: Sequence[float], base: Sequence[float], digits: int = 1) -> str:
    """"; t [low, high]": the t-interval of the paired differences, for seeds too few for the bootstrap to cover."""
    if len(values) >= stats.MIN_COVERING_SEEDS:
        return ""
    low, high = stats.t_interval(np.asarray(values, dtype=float) - np.asarray(base, dtype=float))
    return f"; t [{num(low, digits)}, {num(high, digits)}]"


def at_or_before(curve: Sequence[Sequence[float]], x: float) -> float:
    """The last evaluation of a [step, value] curve at or before step x."""
    return [v for s, v in curve if s <= x][-1]


def verdict_text(v: dict, digits: int = 1) -> str:
    """"Δ [percentile] / t [..], n = ..: **verdict**" of ``stats.paired_verdict``."""
    pct = v["percentile"]
    pct = f"percentile [{num(pct[0], digits)}, {num(pct[1], digits)}], " if pct else "n<4, "
    return (f"{num(v['point'], digits + (v['kind'] == 'ratio') * 2)} ({pct}t [{num(v['t'][0], digits)}, "
            f"{num(v['t'][1], digits)}], n = {v['n']}) against {num(v['margin'], digits)}: **{v['verdict']}**")


def paired_evidence(a: Sequence[float], b: Sequence[float], margin: float = 0.0, kind: str = "difference",
                    digits: int = 1) -> tuple[str, str]:
    v = stats.paired_verdict(a, b, margin, kind, reps=REPS)
    return v["verdict"], verdict_text(v, digits).rsplit(":", 1)[0]


def both_evidence(final: tuple, speed: tuple, margin: float, env: str | None = None, base_raw=None,
                  digits: int = 1) -> tuple[str, str]:
    """A learning claim decided on both measures (``verdicts.both_measures``): the verdict and "final ...; speed
    ..." with each measure's own interval and verdict."""
    verdict, v_final, v_speed = verdicts.both_measures(final, speed, margin, env, base_raw)
    text = lambda v: verdict_text(v, digits).replace("**", "")
    return verdict, f"final {text(v_final)}; speed {text(v_speed)}"


def paired_difference(values: Sequence[float], base: Sequence[float]) -> str:
    """Δ of means [95 % percentile paired bootstrap], and below 10 seeds the t-interval beside it."""
    ci = stats.paired_ci(values, base, reps=REPS)
    return f"{num(ci.point, 1)} [{num(ci.low, 1)}, {num(ci.high, 1)}]{t_beside(values, base)}"
