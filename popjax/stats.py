"""Statistics for comparing runs the way the field reports few-seed RL results (Agarwal et al., NeurIPS 2021).

Scores are a float array ``(N runs, M tasks)`` (a 1-D array is one task), or ``(N, M, T)`` for curves (each
estimator then applies per time index). A run is one independent seed. NaN, inf, empty and ragged input raise
``ValueError``. Every estimator follows rliable's definitions (``rliable.metrics``/``library``), reimplemented
on numpy: seeded, batched, and with a paired bootstrap for arms that share seeds, which rliable lacks.

Bootstraps are **stratified**: each replicate redraws N runs with replacement within every task (tasks stay
fixed); one ``(B, N, M)`` index array serves every time index of a curve, so each run's curve stays whole.
Intervals are percentile intervals (``np.percentile``, linear interpolation) from an explicit
``np.random.default_rng(seed)``. With fewer than 4 seeds a percentile bootstrap covers far less than its
nominal level (n = 3: about 75 % for a nominal 95 %): report the seeds themselves (``seed_summary``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

CHUNK = 5000  # bootstrap replicates drawn and reduced at a time (bounds memory)


def scores(values, name: str = "scores") -> np.ndarray:
    """``values`` as a float array ``(N, M)`` or ``(N, M, T)`` (1-D: one task); a one-line ValueError for
    empty, ragged, NaN or infinite input."""
    try:
        array = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: not a rectangular array of numbers") from None
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim not in (2, 3):
        raise ValueError(f"{name}: expected (runs,), (runs, tasks) or (runs, tasks, steps), got shape {array.shape}")
    if array.size == 0:
        raise ValueError(f"{name}: empty (shape {array.shape})")
    if not np.isfinite(array).all():
        raise ValueError(f"{name}: holds {'NaN' if np.isnan(array).any() else 'inf'} values")
    return array


def _batched(s: np.ndarray) -> np.ndarray:
    """``(N, M)`` as it is, ``(N, M, T)`` as ``(T, N, M)``: kernels reduce the last two axes."""
    return np.moveaxis(s, -1, 0) if s.ndim == 3 else s


def _value(x):
    x = np.asarray(x)
    return float(x) if x.ndim == 0 else x


# Kernels: reduce the last two axes (runs, tasks) of ``x`` [..., N, M].

def _iqm(x: np.ndarray) -> np.ndarray:
    flat = np.sort(x.reshape(*x.shape[:-2], -1), axis=-1)
    cut = int(0.25 * flat.shape[-1])  # floor, as scipy.stats.trim_mean
    return flat[..., cut:flat.shape[-1] - cut].mean(-1)


def _mean(x: np.ndarray) -> np.ndarray:
    return x.mean(-2).mean(-1)


def _median(x: np.ndarray) -> np.ndarray:
    return np.median(x.mean(-2), axis=-1)


def _gap(gamma: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: gamma - np.minimum(x, gamma).mean((-2, -1))


def iqm(s) -> float | np.ndarray:
    """Interquartile mean: the mean of the middle 50 % of all N·M scores pooled (``trim_mean(s, 0.25)`` of the
    flattened array: ⌊0.25·N·M⌋ values dropped from each end, no fractional weights; N·M ≤ 3 drops none)."""
    return _value(_iqm(_batched(scores(s))))


def mean(s) -> float | np.ndarray:
    """Mean over tasks of the per-task mean over runs."""
    return _value(_mean(_batched(scores(s))))


def median(s) -> float | np.ndarray:
    """Median over tasks of the per-task mean over runs (an even M averages the middle two)."""
    return _value(_median(_batched(scores(s))))


def optimality_gap(s, gamma: float = 1.0) -> float | np.ndarray:
    """γ − mean over all N·M scores of min(score, γ): how far below the target γ (lower is better)."""
    return _value(_gap(gamma)(_batched(scores(s))))


def _pairs(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) of ``x`` [..., Nx, M] against ``y`` [..., Ny, M]: all pairs per task, ties count ½, then the
    unweighted mean over tasks."""
    greater = x[..., :, None, :] > y[..., None, :, :]
    ties = x[..., :, None, :] == y[..., None, :, :]
    return (greater + 0.5 * ties).mean((-3, -2)).mean(-1)


def prob_improvement(x, y) -> float | np.ndarray:
    """P(X > Y), the Mann–Whitney form: per task U/(N_x·N_y) = the fraction of all (x_i, y_j) pairs with
    x_i > y_j, ties counting ½; averaged over tasks. P(X > Y) + P(Y > X) = 1. It compares all pairs even when
    the arms share seeds (the paired win rate P(A_s > B_s) is another quantity)."""
    x, y = _pair_shapes(x, y)
    return _value(_pairs(_batched(x), _batched(y)))


def _pair_shapes(x, y) -> tuple[np.ndarray, np.ndarray]:
    x, y = scores(x, "x"), scores(y, "y")
    if x.shape[1:] != y.shape[1:]:
        raise ValueError(f"y: tasks (and steps) must match x's: shapes {x.shape} and {y.shape}")
    return x, y


def score_profile(s, taus) -> np.ndarray:
    """Performance profile of run scores: for each τ, the fraction of all N·M scores strictly above τ."""
    return _profile(np.asarray(taus, dtype=float))(_batched(scores(s)))


def avg_score_profile(s, taus) -> np.ndarray:
    """Average-score profile: for each τ, the fraction of tasks whose mean over runs is strictly above τ."""
    taus = np.asarray(taus, dtype=float)
    return (scores(s).mean(0)[None] > taus[:, None]).mean(-1)


def _profile(taus: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """Run-score profile kernel: [..., N, M] -> [len(taus), ...]."""
    return lambda x: (x[None] > taus.reshape(-1, *([1] * x.ndim))).mean((-2, -1))


@dataclasses.dataclass(frozen=True)
class Interval:
    """A point estimate and its percentile bootstrap interval (``low``/``high``: floats, or arrays per step or
    per τ), with how it was computed."""

    point: float | np.ndarray
    low: float | np.ndarray
    high: float | np.ndarray
    level: float
    reps: int
    seed: int
    method: str = "percentile"

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in out.items()}


def bootstrap(s, stat: Callable[[np.ndarray], np.ndarray], reps: int, seed: int = 0) -> np.ndarray:
    """Stratified bootstrap replicates of ``stat`` (a kernel reducing the last two axes of [..., N, M]):
    shape ``(..., reps)``. Runs are redrawn with replacement within each task, the same indices at every step."""
    s = _batched(scores(s))
    rng = np.random.default_rng(seed)
    n, m = s.shape[-2:]
    out = []
    for start in range(0, reps, CHUNK):
        idx = rng.integers(0, n, (min(CHUNK, reps - start), n, m))
        out.append(stat(s[..., idx, np.arange(m)]))
    return np.concatenate(out, axis=-1)


def _percentiles(reps: np.ndarray, level: float) -> tuple:
    low, high = np.percentile(reps, [50 * (1 - level), 50 * (1 + level)], axis=-1)
    return _value(low), _value(high)


STATISTICS = {"iqm": _iqm, "mean": _mean, "median": _median}


def stratified_ci(s, stat: str | Callable = "iqm", reps: int = 50_000, level: float = 0.95,
                  seed: int = 0) -> Interval:
    """Point estimate and stratified percentile bootstrap interval of one algorithm's aggregate
    (``stat``: ``"iqm"``, ``"mean"``, ``"median"``, or a kernel reducing the last two axes of [..., N, M]).
    rliable's defaults: 50 000 replicates, 95 %."""
    kernel = STATISTICS[stat] if isinstance(stat, str) else stat
    point = _value(kernel(_batched(scores(s))))
    return Interval(point, *_percentiles(bootstrap(s, kernel, reps, seed), level), level, reps, seed)


def optimality_gap_ci(s, gamma: float = 1.0, reps: int = 50_000, level: float = 0.95, seed: int = 0) -> Interval:
    """``optimality_gap`` with its stratified percentile bootstrap interval."""
    return stratified_ci(s, _gap(gamma), reps, level, seed)


def profile_ci(s, taus, reps: int = 2000, level: float = 0.95, seed: int = 0) -> Interval:
    """``score_profile`` at each τ with stratified percentile bootstrap bands (rliable: 2 000 replicates)."""
    s = scores(s)
    kernel = _profile(np.asarray(taus, dtype=float))
    return Interval(kernel(_batched(s)), *_percentiles(bootstrap(s, kernel, reps, seed), level), level, reps, seed)


def prob_improvement_ci(x, y, reps: int = 2000, level: float = 0.95, seed: int = 0) -> Interval:
    """``prob_improvement(x, y)`` with a percentile interval from a stratified **independent** bootstrap: x's and
    y's runs are redrawn separately within each task (N may differ); rliable's ``StratifiedIndependentBootstrap``."""
    x, y = _pair_shapes(x, y)
    bx, by = _batched(x), _batched(y)
    rng = np.random.default_rng(seed)
    (nx, m), ny = bx.shape[-2:], by.shape[-2]
    out = []
    for start in range(0, reps, CHUNK // 4):
        b = min(CHUNK // 4, reps - start)
        ix, iy = rng.integers(0, nx, (b, nx, m)), rng.integers(0, ny, (b, ny, m))
        out.append(_pairs(bx[..., ix, np.arange(m)], by[..., iy, np.arange(m)]))
    return Interval(_value(_pairs(bx, by)), *_percentiles(np.concatenate(out, -1), level), level, reps, seed)


def paired_ci(a, b, kind: str = "difference", stat: str = "mean", reps: int = 9999, level: float = 0.95,
              seed: int = 0, seeds: tuple[Sequence, Sequence] | None = None, method: str = "percentile") -> Interval:
    """Paired bootstrap of two arms run with the same seeds: ``stat(A) − stat(B)`` (``kind="difference"``) or
    ``stat(A) / stat(B)`` (``"ratio"``, a ratio of aggregates, not a mean of per-seed ratios), with ``stat`` one
    of ``"mean"``, ``"iqm"``, ``"median"``. Each replicate draws one ``(N, M)`` index array and applies it to
    both arms, so seed s of A stays with seed s of B (and tasks stay fixed). ``seeds=(seeds_a, seeds_b)`` pairs
    rows by seed id (the sets must be equal); otherwise rows pair by position. A ratio is refused when B's
    scores are not all of one sign. ``method="bca"`` (one task only) uses ``scipy.stats.bootstrap(paired=True)``.
    """
    a, b = scores(a, "a"), scores(b, "b")
    if seeds is not None:
        a, b = _align_seeds(a, b, *seeds)
    if a.shape != b.shape:
        raise ValueError(f"b: paired arms need the same runs and tasks: shapes {a.shape} and {b.shape}")
    if kind not in ("difference", "ratio"):
        raise ValueError(f"kind: {kind!r} is not a paired estimand (allowed: difference, ratio)")
    if kind == "ratio" and not ((b > 0).all() or (b < 0).all()):
        raise ValueError("b: a ratio needs a baseline whose scores are all of one sign (use kind='difference')")
    kernel = STATISTICS[stat]
    combine = np.subtract if kind == "difference" else np.divide
    ba, bb = _batched(a), _batched(b)
    point = _value(combine(kernel(ba), kernel(bb)))
    if method == "bca":
        if a.shape[1] != 1 or a.ndim != 2:
            raise ValueError("method: bca is for one task (scipy cannot stratify; allowed: percentile)")
        from scipy.stats import bootstrap as scipy_bootstrap

        res = scipy_bootstrap((a[:, 0], b[:, 0]), lambda x, y, axis: combine(x.mean(axis), y.mean(axis)),
                              paired=True, vectorized=True, n_resamples=reps, confidence_level=level,
                              method="BCa", rng=np.random.default_rng(seed))
        return Interval(point, float(res.confidence_interval.low), float(res.confidence_interval.high), level,
                        reps, seed, "bca")
    if method != "percentile":
        raise ValueError(f"method: {method!r} (allowed: percentile, bca)")
    rng = np.random.default_rng(seed)
    n, m = a.shape[:2]
    out = []
    for start in range(0, reps, CHUNK):
        idx = rng.integers(0, n, (min(CHUNK, reps - start), n, m))
        out.append(combine(kernel(ba[..., idx, np.arange(m)]), kernel(bb[..., idx, np.arange(m)])))
    return Interval(point, *_percentiles(np.concatenate(out, -1), level), level, reps, seed)


def _align_seeds(a: np.ndarray, b: np.ndarray, seeds_a: Sequence, seeds_b: Sequence) -> tuple:
    seeds_a, seeds_b = list(seeds_a), list(seeds_b)
    if len(seeds_a) != len(a) or len(seeds_b) != len(b):
        raise ValueError("seeds: one seed id per run of each arm")
    if sorted(seeds_a) != sorted(seeds_b) or len(set(seeds_a)) != len(seeds_a):
        raise ValueError(f"seeds: paired arms need the same seeds once each (a: {seeds_a}, b: {seeds_b})")
    order = [seeds_b.index(s) for s in seeds_a]
    return a, b[order]


def t_interval(values, level: float = 0.95) -> tuple[float, float]:
    """Student-t interval of the mean of ``values`` (mean ± t_{n−1}·SD/√n, SD with ddof 1); needs n ≥ 2."""
    from scipy.stats import t

    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        raise ValueError(f"values: a t-interval needs at least 2 values, got {len(v)}")
    half = float(t.ppf(0.5 + level / 2, len(v) - 1)) * v.std(ddof=1) / math.sqrt(len(v))
    return float(v.mean() - half), float(v.mean() + half)


MIN_BOOTSTRAP_SEEDS = 4
MIN_COVERING_SEEDS = 10  # below this the percentile bootstrap under-covers (83 % at n = 5): a t-interval goes beside it
VERDICTS = ("held", "refuted at this scale", "not resolved")


def fieller_interval(a, b, level: float = 0.95) -> tuple[float, float]:
    """Student-t (Fieller) interval of mean(a) / mean(b) for paired samples: the ratios θ that a paired t-test of
    mean(a − θ·b) = 0 does not reject. ``(-inf, inf)`` when mean(b) is itself not distinguishable from 0."""
    from scipy.stats import t

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n = len(a)
    if n < 2 or len(b) != n:
        raise ValueError(f"b: a paired ratio interval needs n >= 2 pairs of equal length, got {len(a)} and {len(b)}")
    q = float(t.ppf(0.5 + level / 2, n - 1)) ** 2 / n
    cov = np.cov(a, b, ddof=1)
    # (ā − θ b̄)² ≤ q (s_aa − 2θ s_ab + θ² s_bb): a quadratic c2 θ² + c1 θ + c0 ≤ 0
    c2 = b.mean() ** 2 - q * cov[1, 1]
    c1 = -2 * (a.mean() * b.mean() - q * cov[0, 1])
    c0 = a.mean() ** 2 - q * cov[0, 0]
    disc = c1 * c1 - 4 * c2 * c0
    if c2 <= 0 or disc < 0:
        return -math.inf, math.inf
    root = math.sqrt(disc)
    return float((-c1 - root) / (2 * c2)), float((-c1 + root) / (2 * c2))


def decide(low: float, high: float, margin: float) -> str:
    """The verdict on a claim "the estimand exceeds ``margin``" from one interval of the estimand: **held** when
    the whole interval lies above the margin, **refuted at this scale** when it lies below, else **not resolved**."""
    if low > margin:
        return VERDICTS[0]
    if high < margin:
        return VERDICTS[1]
    return VERDICTS[2]


def paired_verdict(a, b, margin: float = 0.0, kind: str = "difference", level: float = 0.95, reps: int = 9999,
                   seed: int = 0) -> dict:
    """The verdict on "A beats B by more than ``margin``" (``kind="difference"``: mean(A) − mean(B) > margin;
    ``"ratio"``: mean(A) / mean(B) > margin) from per-seed scores paired by position. Two intervals: the
    percentile paired bootstrap (only with n ≥ 4 seeds) and a t-based one (t-interval of the paired differences,
    or Fieller's for the ratio); each decides with ``decide`` and the verdict is the more conservative: a claim
    is held (or refuted) only when every interval says so. Returns ``n``, ``point``, ``percentile`` (None below
    4 seeds), ``t``, ``margin``, ``kind`` and ``verdict``."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"b: paired arms need one score per seed each, shapes {a.shape} and {b.shape}")
    t_ci = t_interval(a - b, level) if kind == "difference" else fieller_interval(a, b, level)
    out = {"n": len(a), "kind": kind, "margin": margin, "t": list(t_ci), "percentile": None,
           "point": float(a.mean() - b.mean() if kind == "difference" else a.mean() / b.mean())}
    intervals = [t_ci]
    if len(a) >= MIN_BOOTSTRAP_SEEDS:
        ci = paired_ci(a, b, kind, reps=reps, level=level, seed=seed)
        out["percentile"] = [float(ci.low), float(ci.high)]
        intervals.append(out["percentile"])
    verdicts = {decide(low, high, margin) for low, high in intervals}
    out["verdict"] = verdicts.pop() if len(verdicts) == 1 else VERDICTS[2]
    return out


def seed_summary(values, level: float = 0.95, reps: int = 9999, seed: int = 0) -> dict:
    """What to report of one arm's per-seed scores on one task: ``n``, the ``values``, ``mean``, ``sd`` (ddof 1;
    None for n = 1), ``t_interval`` (n ≥ 2) and, only with n ≥ 4 seeds, ``iqm`` and its bootstrap ``ci``."""
    v = scores(values)[:, 0]
    out = {"n": len(v), "values": v.tolist(), "mean": float(v.mean()),
           "sd": float(v.std(ddof=1)) if len(v) > 1 else None,
           "t_interval": list(t_interval(v, level)) if len(v) > 1 else None}
    if len(v) >= MIN_BOOTSTRAP_SEEDS:
        ci = stratified_ci(v, "iqm", reps, level, seed)
        out.update(iqm=ci.point, ci=[ci.low, ci.high])
    return out


def normalize(raw, low, high) -> np.ndarray:
    """Normalised scores (raw − low)/(high − low), per task (``low``/``high``: one value or one per task);
    refuses high == low."""
    low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    if np.any(high == low):
        raise ValueError("high: equals low for some task; a reference needs two different scores")
    return (np.asarray(raw, dtype=float) - low) / (high - low)


def population_iqm(values, reps: int = 10_000, level: float = 0.95, seed: int = 0,
                   not_independent: str | None = None) -> dict:
    """The IQM of a population's members' scores with its bootstrap interval over members (summary.json's
    ``final_iqm``): ``iqm``, ``ci`` ([low, high]; None with fewer than 4 members, whose ``values`` then stand
    instead), ``n``, ``level``, ``reps``, ``seed``. Non-finite scores (a diverged member) give ``iqm`` None.

    The bootstrap treats members as independent samples; ``not_independent`` (why they are not: PBT copies,
    a shared critic) gives the point value only, with ``values`` and the reason as ``no_ci``."""
    v = np.asarray(values, dtype=float).ravel()
    out = {"n": int(v.size), "iqm": None, "ci": None, "level": level, "reps": reps, "seed": seed}
    if not_independent is not None:  # no interval: no level, reps or seed either
        out = {"n": int(v.size), "iqm": None, "ci": None, "no_ci": not_independent}
    if v.size == 0 or not np.isfinite(v).all():
        return out
    out["iqm"] = iqm(v)
    if v.size >= MIN_BOOTSTRAP_SEEDS and not_independent is None:
        ci = stratified_ci(v, "iqm", reps, level, seed)
        out["ci"] = [ci.low, ci.high]
    else:
        out["values"] = v.tolist()
    return out
