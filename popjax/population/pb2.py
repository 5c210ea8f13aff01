"""PB2 (Parker-Holder, Nguyen & Roberts, NeurIPS 2020): the hparams of replaced members from a time-varying GP
bandit, on the host (numpy/scipy, float64), as Ray Tune's ``pb2.py`` / ``pb2_utils.py`` compute it.

At every PBT round each member logs a row (member, T = env steps, R = fitness, h = its hparams in the unit cube).
Successive rows of one member with the *same* h give a data point: y = ΔR/ΔT at X = (T, R_before, h). The GP
(kernel ``σ_f² exp(-|z - z'|² / ℓ) (1 - ε)^{|T - T'| / 2}``, z = (R_before, h), one isotropic ℓ) is fitted by
L-BFGS-B on the log marginal likelihood with analytic gradients; each replaced member then gets
``argmax_h μ(h) + κ σ²_pending(h)`` at its parent's context (T, R_before of the parent's last data point), where
the variance is conditioned on the picks already made this round (GP-BUCB) and κ = √(0.2 + max(0, ln(0.4 n))).

Differences from Ray, all documented choices: the UCB search evaluates 1000 uniform points and polishes the best 3
with L-BFGS-B (Ray: L-BFGS-B from 10 uniform starts; this is faster); log-uniform hparams are scaled in log space
and integers are rounded (not truncated); the pending-variance GP reuses the fitted kernel instead of fitting a
second one; a jitter of 1e-8 keeps the Cholesky factor finite; with fewer than two data points (the first round)
a pick is uniform in the box.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
from collections.abc import Iterator, Sequence

import numpy as np
from scipy.linalg import cho_solve, cholesky, solve_triangular
from scipy.optimize import minimize

from popjax.population.hparams import Range

MAX_ROWS = 1000  # Ray keeps the last 1000 data points
WINDOW = 200  # with more, the window of the last 200, 210, ... points with the best likelihood is used
CANDIDATES = 1000  # uniform points the UCB is evaluated at (vectorised) ...
STARTS = 3  # ... and the best of them that L-BFGS-B polishes
JITTER = 1e-8
INIT = (1.0, 1.0, 0.1)  # sigma_f^2, lengthscale, epsilon
BOUNDS = ((1e-5, 1e5), (1e-5, 1e5), (1e-5, 0.5))


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """OpenBLAS (numpy's and scipy's wheels) on one thread while PB2 computes: its matrices are at most
    1000 x 1000, and more threads only contend with JAX's (a toy PB2 run took 12 s instead of 0.7 s on a busy
    2-core machine). Best effort: nothing changes where the libraries do not expose the calls."""
    libraries = []
    with open("/proc/self/maps") as maps:  # the OpenBLAS copies loaded in this process (Linux)
        paths = {line.split()[-1] for line in maps if "openblas" in line and line.rstrip().endswith(".so")}
    for path in sorted(paths):
        lib = ctypes.CDLL(path)
        for suffix in ("64_", ""):
            get = getattr(lib, f"scipy_openblas_get_num_threads{suffix}", None)
            set_ = getattr(lib, f"scipy_openblas_set_num_threads{suffix}", None)
            if get is not None and set_ is not None:
                libraries.append((set_, get()))
                set_(1)
                break
    try:
        yield
    finally:
        for set_, threads in libraries:
            set_(threads)


def to_unit(value: float, r: Range) -> float:
    """An hparam value in [0, 1] over its range (log ranges in log space)."""
    if r.log:
        return (math.log(value) - math.log(r.low)) / (math.log(r.high) - math.log(r.low) + 1e-8)
    return (value - r.low) / (r.high - r.low + 1e-8)


def from_unit(x: float, r: Range) -> float:
    """The inverse of ``to_unit``, clipped to the range; integers rounded."""
    x = min(max(float(x), 0.0), 1.0)
    value = math.exp(math.log(r.low) + x * (math.log(r.high) - math.log(r.low))) if r.log \
        else r.low + x * (r.high - r.low)
    return float(min(max(round(value) if r.integer else value, r.low), r.high))


def beta(n: int) -> float:
    """UCB's β for ``n`` data points (Ray's heuristic); κ = √β."""
    return 0.2 + max(0.0, math.log(0.4 * n))


def standardize(y: np.ndarray) -> np.ndarray:
    """Zero mean, unit (population) std, clipped to [-2, 2]."""
    return np.clip((y - y.mean()) / (y.std() + 1e-8), -2.0, 2.0)


def data_points(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(X [n, 2 + d] = (T, R_before, h), y [n])`` from rows ``[member, T, R, h...]`` (in order of logging):
    successive rows of a member with the same h and a later T."""
    X, y, last = [], [], {}
    for row in rows:
        member, t, r, h = int(row[0]), row[1], row[2], row[3:]
        prev = last.get(member)
        if prev is not None and t > prev[1] and np.array_equal(h, prev[3:]):
            X.append(np.concatenate([[t, prev[2]], h]))
            y.append((r - prev[2]) / (t - prev[1]))
        last[member] = row
    d = rows.shape[1] - 3
    return np.asarray(X, float).reshape(-1, 2 + d)[-MAX_ROWS:], np.asarray(y, float)[-MAX_ROWS:]


def kernel(A: np.ndarray, B: np.ndarray, theta: Sequence[float]) -> np.ndarray:
    """K[i, j] for rows (T, R_before, h...) scaled to the unit box; ``theta`` = (σ_f², ℓ, ε)."""
    var, length, eps = theta
    sq = ((A[:, None, 1:] - B[None, :, 1:]) ** 2).sum(-1)
    dt = np.abs(A[:, None, 0] - B[None, :, 0])
    return var * np.exp(-sq / length) * (1.0 - eps) ** (dt / 2.0)


def neg_log_likelihood(log_theta: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """-log p(y | X, θ) and its gradient in log θ (noise-free GP plus jitter)."""
    var, length, eps = np.exp(log_theta)
    K = kernel(X, X, (var, length, eps))
    try:
        L = cholesky(K + JITTER * np.eye(len(y)), lower=True)
    except np.linalg.LinAlgError:
        return 1e25, np.zeros(3)
    alpha = cho_solve((L, True), y)
    nll = 0.5 * y @ alpha + np.log(np.diag(L)).sum() + 0.5 * len(y) * math.log(2 * math.pi)
    inner = np.outer(alpha, alpha) - cho_solve((L, True), np.eye(len(y)))
    sq = ((X[:, None, 1:] - X[None, :, 1:]) ** 2).sum(-1)
    dt = np.abs(X[:, None, 0] - X[None, :, 0])
    grads = (K, K * sq / length, K * (-dt / 2.0) * eps / (1.0 - eps))  # dK / d log θ
    return float(nll), np.array([-0.5 * (inner * g).sum() for g in grads])


def fit(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """``(θ, log likelihood)``: the GP's (σ_f², ℓ, ε) by L-BFGS-B from Ray's initial values."""
    result = minimize(neg_log_likelihood, np.log(INIT), args=(X, y), jac=True, method="L-BFGS-B",
                      bounds=np.log(BOUNDS))
    return np.exp(result.x), -float(result.fun)


def robust_cholesky(K: np.ndarray) -> np.ndarray:
    """The lower Cholesky factor of ``K`` plus a jitter, raised tenfold (up to 1e-2) while ``K`` is not positive
    definite (identical inputs: members copied from one parent)."""
    jitter = JITTER
    while True:
        try:
            return cholesky(K + jitter * np.eye(len(K)), lower=True)
        except np.linalg.LinAlgError:
            if jitter >= 1e-2:
                raise
            jitter *= 10


class GP:
    """A fitted GP: posterior mean (from the data) and variance (from the data plus pending inputs)."""

    def __init__(self, X: np.ndarray, y: np.ndarray, theta: np.ndarray):
        self.X, self.theta = X, theta
        self.L = robust_cholesky(kernel(X, X, theta))
        self.alpha = cho_solve((self.L, True), y)

    def mean(self, Xq: np.ndarray) -> np.ndarray:
        return kernel(Xq, self.X, self.theta) @ self.alpha

    def variance(self, Xq: np.ndarray, pending: np.ndarray | None = None) -> np.ndarray:
        X = self.X if pending is None or not len(pending) else np.vstack([self.X, pending])
        L = self.L if X is self.X else robust_cholesky(kernel(X, X, self.theta))
        v = solve_triangular(L, kernel(X, Xq, self.theta), lower=True)
        return np.maximum(self.theta[0] - (v ** 2).sum(0), 0.0)


def fit_window(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(X, y, θ)`` of the window of recent points whose fit has the highest likelihood (Ray's search)."""
    sizes = range(WINDOW, len(y) + 1, 10) if len(y) >= WINDOW else [len(y)]
    best = None
    for n in sizes:
        Xw, yw = X[-n:], standardize(y[-n:])
        theta, ll = fit(Xw, yw)
        if best is None or ll > best[3]:
            best = (Xw, yw, theta, ll)
    return best[:3]


class PB2:
    """The bandit over ``space`` (``((name, Range), ...)``); ``rows`` is its whole state (checkpointed)."""

    def __init__(self, space: Sequence[tuple[str, Range]]):
        self.space = tuple(space)
        self.rows: list[list[float]] = []  # [member, T, R, h_1..h_d (unit cube)]

    def log(self, member: int, t: float, reward: float, unit: Sequence[float]) -> None:
        if math.isfinite(reward):
            self.rows.append([float(member), float(t), float(reward), *map(float, unit)])

    def unit(self, values: dict[str, float]) -> list[float]:
        return [to_unit(values[name], r) for name, r in self.space]

    def values(self, unit: Sequence[float]) -> dict[str, float]:
        return {name: from_unit(x, r) for (name, r), x in zip(self.space, unit, strict=True)}

    def propose(self, contexts: Sequence[tuple[float, float]], rng: np.random.Generator) -> list[np.ndarray]:
        """One point of the unit cube per ``(T, R_before)`` context, picked in order (each pending for the next)."""
        with single_threaded_blas():
            return self._propose(contexts, rng)

    def _propose(self, contexts, rng):
        d = len(self.space)
        rows = np.asarray(self.rows, float).reshape(-1, 3 + d)
        X, y = data_points(rows)
        if len(y) < 2:  # nothing to fit yet
            return [rng.uniform(size=d) for _ in contexts]
        low, high = X[:, :2].min(0), X[:, :2].max(0)
        scale = lambda tr: (np.asarray(tr, float) - low) / (high - low + 1e-8)
        X = np.hstack([scale(X[:, :2]), X[:, 2:]])
        X, y, theta = fit_window(X, y)
        gp, kappa = GP(X, y, theta), math.sqrt(beta(len(y)))
        picks, pending = [], np.zeros((0, 2 + d))
        for context in contexts:
            c = scale(context)

            def ucb(h, c=c, pending=pending):
                q = np.hstack([np.broadcast_to(c, (len(h), 2)), h])
                return gp.mean(q) + kappa * gp.variance(q, pending)

            # The best of CANDIDATES uniform points, polished by L-BFGS-B from the best STARTS of them.
            candidates = rng.uniform(size=(CANDIDATES, d))
            best = candidates[np.argsort(-ucb(candidates))[:STARTS]]
            runs = [minimize(lambda h, ucb=ucb: -float(ucb(h[None])[0]), s, method="L-BFGS-B",
                             bounds=[(0.0, 1.0)] * d, options={"maxiter": 50}) for s in best]
            h = np.clip(min(runs, key=lambda r: r.fun).x, 0.0, 1.0)
            picks.append(h)
            pending = np.vstack([pending, np.concatenate([c, h])])
        return picks

    def context(self, member: int, t: float) -> tuple[float, float]:
        """The parent's context: (T, R_before) of its last data point, or (T, its last reward) without one."""
        rows = [r for r in self.rows if int(r[0]) == member]
        if len(rows) >= 2 and rows[-1][3:] == rows[-2][3:] and rows[-1][1] > rows[-2][1]:
            return rows[-1][1], rows[-2][2]
        return t, rows[-1][2] if rows else 0.0
