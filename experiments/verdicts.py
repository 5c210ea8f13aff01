"""What results.py's scoreboard decides with (issue 48): a learning claim on both measures under the one margin
(``margins.py``), the order of a rule's commit and its data's, and the SPO fails-to-learn count.

A claim's rule is named by exact lines of the files that state it (``[file, text]``); its time is the last commit
that added or removed that text (``git log -S``), and the text must be in the committed file. Its data's time is the
first commit of each data file (the earliest of a folder's files). ``rule_precedes_data`` says whether every rule
line is older than all of its data; a claim whose rule was fixed after its data says so (``post_hoc``) and is shown
so, and results.py refuses the claim when what it says is not what git says.
"""

from __future__ import annotations

import functools
import math
import subprocess
from collections.abc import Sequence
from pathlib import Path

import margins
import numpy as np

from popjax import stats

ROOT = Path(__file__).resolve().parents[1]
NOW = math.inf  # an uncommitted file's time: after every commit


@functools.cache
def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def git_history() -> bool:
    """A full git history is here (not a shallow clone, not an export): rule and data times can be read."""
    return (_git("rev-parse", "--is-shallow-repository") or "").strip() == "false"


def rule_time(file: str, text: str) -> float:
    """The commit time of the last change to ``text``'s presence in ``file``; NOW when the committed file does
    not hold it yet. Refuses text the working file does not hold."""
    if text not in (ROOT / file).read_text():
        raise ValueError(f"scoreboard.json: rule text {text!r} is not in {file} (the rule changed)")
    if text not in (_git("show", f"HEAD:{file}") or ""):
        return NOW
    out = _git("log", "--format=%ct", "-S", text, "--", file)
    return float(out.split()[0]) if out and out.split() else NOW


def data_time(path: str) -> float:
    """The first commit time of ``path`` (a file, or the earliest file of a folder); NOW when uncommitted."""
    out = _git("log", "--diff-filter=A", "--format=%ct", "--", path)
    times = [float(t) for t in (out or "").split()]
    return min(times) if times else NOW


def rule_precedes_data(rule: Sequence[Sequence[str]], data: Sequence[str]) -> bool:
    return max(rule_time(f, t) for f, t in rule) < min(data_time(p) for p in data)


def measure(a, b, margin: float) -> dict:
    """``stats.paired_verdict`` of a − b against ``margin`` (seeds paired by position)."""
    return stats.paired_verdict(np.asarray(a, float), np.asarray(b, float), margin, reps=10_000)


def both_measures(final: tuple, speed: tuple, margin: float, env: str | None = None,
                  base_final_raw: Sequence[float] | None = None) -> tuple[str, dict, dict]:
    """The verdict of a learning claim "a − b > margin" on the final return and on the learning speed (each a pair
    ``(a, b)`` of per-seed scores): ``margins.combine``; with ``env`` and the baseline's raw final returns
    (``base_final_raw``), a held verdict becomes not resolved when the baseline has not learnt (``margins.learnt``)
    and held (ceiling) when it ends within one margin of solved (``margins.at_ceiling``)."""
    v_final, v_speed = measure(*final, margin), measure(*speed, margin)
    verdict = margins.combine(v_final["verdict"], v_speed["verdict"])
    if verdict == stats.VERDICTS[0] and env and base_final_raw is not None:
        base = float(np.mean(base_final_raw))
        verdict = stats.VERDICTS[2] if not margins.learnt(env, base) else \
            margins.CEILING if margins.at_ceiling(env, base) else verdict
    return verdict, v_final, v_speed


def fisher_fails(naive_final: Sequence[float], two_phase_final: Sequence[float]) -> dict:
    """SPO's pre-registered count (``margins.spo_fails``): seeds that fail to learn per arm, the one-sided Fisher
    exact p (naive fails more often) and the verdict by ``margins.SPO_ALPHA``."""
    from scipy.stats import fisher_exact

    n_fail = sum(margins.spo_fails(f) for f in naive_final)
    t_fail = sum(margins.spo_fails(f) for f in two_phase_final)
    table = [[n_fail, len(naive_final) - n_fail], [t_fail, len(two_phase_final) - t_fail]]
    p = float(fisher_exact(table, alternative="greater")[1])
    verdict = stats.VERDICTS[0] if p < margins.SPO_ALPHA else \
        stats.VERDICTS[1] if n_fail <= t_fail else stats.VERDICTS[2]
    return {"naive": n_fail, "two_phase": t_fail, "n": (len(naive_final), len(two_phase_final)), "p": p,
            "verdict": verdict}
