"""The runtime and latency models of HTS-RL (Liu, Yeh & Schwing 2020, Sec. 4.2 and App. A-B).

Claim 1: ``n`` envs whose ``alpha``-step sums of step times are Gamma(shape ``alpha``, rate ``beta``)
synchronize every ``alpha`` steps; one synchronization waits for the slowest env, whose expected
time has the extreme-value approximation (Eq. 7)

    E[max_n Gamma(alpha, beta)] ~ (gamma_E / beta) (1 + (alpha - 1) / (beta q)) + q,   q = F^-1(1 - 1/n)

with F the Gamma(alpha, beta) CDF and gamma_E the Euler-Mascheroni constant. For alpha = 1 the exact
value is H_n / beta. Adding a learner time ``L`` per segment (the paper's model has none):
the lock-step baseline needs ``alpha E[max_n X] + L`` per segment (a barrier every step, a blocking
update), HTS ``max(E[max_n Gamma(alpha)], L)`` (one barrier per segment, the update overlapped).

Claim 2: an asynchronous learner fed by ``n`` actors (Poisson, rate ``lambda_0`` each) and serving at
exponential rate ``mu`` is an M/M/1 queue: the mean number of waiting batches (the policy lag) is
``n rho_0 / (1 - n rho_0)``, ``rho_0 = lambda_0 / mu`` (stable for ``n rho_0 < 1``); HTS's lag is 1.
"""

from __future__ import annotations

import numpy as np

EULER_GAMMA = 0.5772156649015329


def expected_max_gamma(n: int, alpha: float, beta: float) -> float:
    """Eq. 7's approximation of ``E[max of n i.i.d. Gamma(alpha, rate beta)]``."""
    from scipy.stats import gamma

    q = float(gamma.ppf(1.0 - 1.0 / n, alpha, scale=1.0 / beta))
    return EULER_GAMMA / beta * (1.0 + (alpha - 1.0) / (beta * q)) + q


def expected_max_exponential(n: int, beta: float) -> float:
    """Exact ``E[max of n Exp(beta)]`` = H_n / beta."""
    return float(np.sum(1.0 / np.arange(1, n + 1))) / beta


def monte_carlo_max_gamma(n: int, alpha: float, beta: float, samples: int = 200_000, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    return float(rng.gamma(alpha, 1.0 / beta, size=(samples, n)).max(axis=1).mean())


def claim1_total_time(n: int, k: int, alpha: float, beta: float, c: float = 0.0) -> float:
    """Eq. 7: expected time to collect ``k`` states with ``n`` envs, sync interval ``alpha``, actor cost ``c``."""
    return k / (n * alpha) * expected_max_gamma(n, alpha, beta) + k * c / n


def segment_times(n: int, alpha: int, step_kind: str, mean_s: float, learner_s: float,
                  gamma_shape: float = 2.0) -> tuple[float, float]:
    """Predicted seconds per segment ``(lock-step, HTS)`` of ``alpha`` steps in each of ``n`` envs."""
    if step_kind == "constant":
        max_step, max_segment = mean_s, alpha * mean_s
    elif step_kind == "exponential":  # alpha-step sums are Gamma(alpha, 1 / mean)
        max_step = expected_max_exponential(n, 1.0 / mean_s)
        max_segment = expected_max_gamma(n, alpha, 1.0 / mean_s) if alpha > 1 else max_step
    elif step_kind == "gamma":  # steps Gamma(shape k, mean m): alpha-step sums Gamma(alpha k, k / m)
        beta = gamma_shape / mean_s
        max_step = expected_max_gamma(n, gamma_shape, beta)
        max_segment = expected_max_gamma(n, alpha * gamma_shape, beta)
    else:
        raise ValueError(f"step kind {step_kind!r} unknown")
    return alpha * max_step + learner_s, max(max_segment, learner_s)


def mm1_mean_length(load: float) -> float:
    """Mean number in an M/M/1 system at load ``n rho_0 < 1``."""
    if not 0 <= load < 1:
        raise ValueError(f"the queue is unstable at load {load}")
    return load / (1.0 - load)


def simulate_mm1(arrival_rate: float, service_rate: float, events: int, seed: int = 0) -> float:
    """Time-average number in an M/M/1 system, simulated event by event (competing exponential clocks)."""
    rng = np.random.default_rng(seed)
    length, area, clock = 0, 0.0, 0.0
    waits = rng.exponential(size=events)
    coins = rng.random(events)
    for i in range(events):
        rate = arrival_rate + (service_rate if length else 0.0)
        dt = waits[i] / rate
        area += length * dt
        clock += dt
        length += 1 if coins[i] * rate < arrival_rate else -1
    return area / clock
