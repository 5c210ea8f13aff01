"""popjax.stats verdicts: one interval against a claim's margin, and the more conservative of two intervals."""

import math

import numpy as np
import pytest
from scipy.stats import ttest_1samp

from popjax import stats


def test_decide_puts_the_interval_against_the_margin():
    assert stats.decide(0.1, 0.5, 0.0) == "held"
    assert stats.decide(-0.5, -0.1, 0.0) == "refuted at this scale"
    assert stats.decide(-0.1, 0.1, 0.0) == "not resolved"
    # ReF-ER's non-inferiority margin: an interval crossing -0.1 decides nothing
    assert stats.decide(-0.59, 0.07, -0.1) == "not resolved"
    assert stats.decide(-0.09, 0.3, -0.1) == "held"


def test_two_seeds_give_the_t_interval_only():
    v = stats.paired_verdict([1.5, 1.2], [1.0, 1.0])
    assert v["percentile"] is None and v["n"] == 2
    assert v["t"] == pytest.approx([-1.556, 2.256], abs=1e-3)  # the spec's hand value for d = (0.5, 0.2)
    assert v["point"] == pytest.approx(0.35) and v["verdict"] == "not resolved"


def test_the_verdict_is_the_more_conservative_of_bootstrap_and_t():
    base = np.zeros(5)
    d = np.array([-0.13, -0.35, -0.14, -0.86, -0.15])  # one far seed: the percentile interval is the narrower
    v = stats.paired_verdict(d, base, margin=-0.1)
    assert v["percentile"][1] < -0.1  # the bootstrap alone would call it refuted
    assert v["t"][1] > -0.1  # t: mean -0.326, SD 0.3121, 2.776 x SD / sqrt 5 = 0.3876
    assert v["t"] == pytest.approx([-0.326 - 0.3876, -0.326 + 0.3876], abs=1e-3)
    assert v["verdict"] == "not resolved"
    clear = stats.paired_verdict([1.0, 1.1, 0.9, 1.05, 0.95], base)
    assert clear["verdict"] == "held" and clear["percentile"][0] > 0 and clear["t"][0] > 0
    assert stats.paired_verdict(-np.array([1.0, 1.1, 0.9, 1.05, 0.95]), base)["verdict"] == "refuted at this scale"


def test_fieller_is_where_the_paired_t_test_stops_rejecting():
    rng = np.random.default_rng(3)
    b = rng.normal(10, 1, 6)
    a = 0.9 * b + rng.normal(0, 0.5, 6)
    low, high = stats.fieller_interval(a, b)
    assert low < a.mean() / b.mean() < high
    for theta, inside in ((low + 1e-4, True), (high - 1e-4, True), (low - 1e-3, False), (high + 1e-3, False)):
        assert (ttest_1samp(a - theta * b, 0).pvalue >= 0.05) == inside
    # an exact multiple with a well-measured denominator: zero width
    assert stats.fieller_interval([20, 22, 24], [10, 11, 12]) == pytest.approx((2.0, 2.0))
    # a denominator indistinguishable from 0: no finite interval
    assert stats.fieller_interval([1, 2, 3], [-1, 0.5, 1]) == (-math.inf, math.inf)


def test_a_ratio_claim_uses_fieller_and_the_ratio_bootstrap():
    a, b = [0.95, 0.97, 0.9, 0.99, 0.93], [1.0, 1.0, 1.01, 0.99, 1.0]
    v = stats.paired_verdict(a, b, margin=0.85, kind="ratio")
    assert v["t"] == pytest.approx(list(stats.fieller_interval(a, b)))
    assert v["point"] == pytest.approx(np.mean(a) / np.mean(b)) and v["verdict"] == "held"
    assert stats.paired_verdict(a, b, margin=0.95, kind="ratio")["verdict"] == "not resolved"
