"""popjax.stats: estimators against values computed by hand, bootstrap structure, and CI coverage on seeded
synthetic data whose truth is known."""

import json
from pathlib import Path

import numpy as np
import pytest

from popjax import stats

S = np.array([[0, .2, 1.5], [.4, .6, 2], [.8, 1, .1], [1.2, .4, .3]])  # 4 runs x 3 tasks


def test_iqm_trims_a_quarter_from_each_end_of_the_pooled_scores():
    assert stats.iqm(np.arange(1, 9)) == 4.5  # drops 1, 2 and 7, 8
    assert stats.iqm(np.arange(1, 11)) == 5.5  # 10 values: floor(2.5) = 2 per side
    assert stats.iqm(np.arange(1, 8)) == 4.0  # 7 values: 1 per side
    assert stats.iqm([0, 1, 10]) == pytest.approx(11 / 3)  # 3 values: nothing trimmed
    assert stats.iqm(S) == pytest.approx(7 / 12)  # pooled: the middle 6 of 12 are .3 .4 .4 .6 .8 1
    # not the mean of the per-task IQMs (.6, .5, .9)
    assert np.mean([stats.iqm(S[:, m]) for m in range(3)]) == pytest.approx(2 / 3)


def test_mean_median_and_optimality_gap_by_hand():
    assert stats.mean(S) == pytest.approx(17 / 24)
    assert stats.median(S) == pytest.approx(0.6)  # task means .6, .55, .975
    assert stats.optimality_gap(S) == pytest.approx(13 / 30)
    assert stats.optimality_gap(S, gamma=0.5) == pytest.approx(2 / 15)


def test_probability_of_improvement_counts_pairs_and_half_ties():
    assert stats.prob_improvement([3, 4], [1, 3]) == 0.875  # pairs: 1, .5, 1, 1
    assert stats.prob_improvement([1, 3], [3, 4]) == 0.125
    assert stats.prob_improvement([2, 5], [2, 5]) == 0.5
    # rliable's own test case, and a two-task case averaging 1/2 and 1/3
    assert stats.prob_improvement([[1, 2], [2, 2], [1, 1], [2, 1]], [[1, 1], [2, 2], [3, 3]]) == pytest.approx(1 / 3)
    assert stats.prob_improvement([[1, 10], [2, 20], [3, 30]], [[0, 25], [2, 26], [5, 27]]) == pytest.approx(5 / 12)


def test_performance_profiles_use_a_strict_greater_than():
    s = [[.1, .5], [.9, 1.2]]
    np.testing.assert_allclose(stats.score_profile(s, [0, .5, 1]), [1, .5, .25])
    np.testing.assert_allclose(stats.avg_score_profile(s, [0, .5, 1]), [1, .5, 0])


def test_curves_apply_each_estimator_per_step():
    curves = np.stack([S, S + 1], axis=-1)  # (4, 3, 2)
    np.testing.assert_allclose(stats.iqm(curves), [7 / 12, 19 / 12])
    np.testing.assert_allclose(stats.mean(curves), [17 / 24, 41 / 24])


@pytest.mark.parametrize("bad, word", [([1.0, np.nan], "NaN"), ([1.0, np.inf], "inf"), ([], "empty"),
                                       ([[1, 2], [3]], "rectangular")])
def test_bad_scores_are_one_line_errors(bad, word):
    with pytest.raises(ValueError, match=word):
        stats.iqm(bad)


def test_paired_bootstrap_by_hand_and_against_scipy_bca():
    a, b = [1, 2, 3, 4], [.5, 1.5, 2, 3]  # differences .5, .5, 1, 1
    diff = stats.paired_ci(a, b)
    assert (diff.point, diff.low, diff.high) == (0.75, 0.5, 1.0)  # all-.5 and all-1 resamples: 1/16 each
    ratio = stats.paired_ci(a, b, "ratio")
    assert ratio.point == pytest.approx(10 / 7)
    assert (ratio.low, ratio.high) == (pytest.approx(4 / 3), pytest.approx(5 / 3))
    bca = stats.paired_ci(a, b, method="bca")
    assert (bca.low, bca.high, bca.method) == (0.5, 1.0, "bca")


def test_paired_bootstrap_keeps_pairs_and_pairs_by_seed_id():
    base = np.linspace(0, 100, 8)  # a large spread between seeds, a constant gain of 1 within each pair
    diff = stats.paired_ci(base + 1, base, reps=500)
    assert (diff.point, diff.low, diff.high) == pytest.approx((1, 1, 1))  # pairs kept: zero width
    shuffled = stats.paired_ci(base + 1, base[::-1], seeds=(range(8), range(7, -1, -1)), reps=500)
    assert (shuffled.low, shuffled.high) == pytest.approx((1, 1))
    with pytest.raises(ValueError, match="same seeds"):
        stats.paired_ci([1, 2], [1, 2], seeds=([0, 1], [0, 2]))
    with pytest.raises(ValueError, match="one sign"):
        stats.paired_ci([1, 2], [-1, 2], "ratio")


def test_stratified_bootstrap_resamples_within_tasks_and_is_seeded():
    s = np.array([[0.0, 10.0], [1.0, 11.0], [2.0, 12.0]])
    reps = stats.bootstrap(s, lambda x: x, reps=50, seed=3)  # (50, 3, 2): the resampled arrays themselves
    assert set(np.unique(reps[:, :, 0])) <= {0, 1, 2} and set(np.unique(reps[:, :, 1])) <= {10, 11, 12}
    assert stats.stratified_ci(s, reps=300, seed=1) == stats.stratified_ci(s, reps=300, seed=1)
    flat = stats.stratified_ci(np.full((5, 2), 3.0), reps=100)
    assert (flat.point, flat.low, flat.high) == (3.0, 3.0, 3.0)
    curves = np.stack([s, s * 2], -1)  # each run's curve stays whole: step 2 is exactly twice step 1
    whole = stats.bootstrap(curves, lambda x: x, reps=20)
    np.testing.assert_allclose(whole[1], 2 * whole[0])


def test_profile_and_improvement_intervals_contain_their_point():
    prof = stats.profile_ci(S, [0, .5, 1], reps=300)
    assert np.all(prof.low <= prof.point) and np.all(prof.point <= prof.high)
    np.testing.assert_allclose(prof.point, [11 / 12, 6 / 12, 3 / 12])
    p = stats.prob_improvement_ci(S + 1, S, reps=300)
    assert p.point == pytest.approx(stats.prob_improvement(S + 1, S)) and p.low <= p.point <= p.high


def test_seed_summary_lists_few_seeds_instead_of_a_bootstrap():
    three = stats.seed_summary([1, 2, 3])
    assert three["sd"] == 1.0 and "ci" not in three  # ddof 1
    assert three["t_interval"] == pytest.approx([2 - 4.302653 / 3 ** .5, 2 + 4.302653 / 3 ** .5])
    four = stats.seed_summary([1, 2, 3, 5])
    assert four["iqm"] == 2.5 and four["ci"][0] <= 2.5 <= four["ci"][1]
    assert stats.seed_summary([7])["sd"] is None


# Coverage: 200 seeded datasets from N(0, 1) plus task offsets symmetric about 0, so the mean and the
# pooled IQM are both 0; a nominal 95 % interval must contain 0 in at least 90 % of them.
def _datasets(n_runs, n_tasks, draws=200, seed=0):
    rng = np.random.default_rng(seed)
    offsets = np.linspace(-2, 2, n_tasks)
    return rng.normal(size=(draws, n_runs, n_tasks)) + offsets


@pytest.mark.parametrize("stat", ["mean", "iqm"])
def test_stratified_intervals_cover_the_truth(stat):
    cis = [stats.stratified_ci(d, stat, reps=1000, seed=i) for i, d in enumerate(_datasets(10, 5))]
    coverage = np.mean([ci.low <= 0 <= ci.high for ci in cis])
    assert coverage >= 0.90, coverage


def test_paired_intervals_cover_the_true_difference():
    rng = np.random.default_rng(1)
    base = rng.normal(size=(200, 10, 1)) * 5  # large between-seed spread, shared by both arms
    gain = 0.5 + rng.normal(size=(200, 10, 1))
    cis = [stats.paired_ci(b + g, b, reps=1000, seed=i) for i, (b, g) in enumerate(zip(base, gain, strict=True))]
    assert np.mean([ci.low <= 0.5 <= ci.high for ci in cis]) >= 0.90
    unpaired = stats.stratified_ci(base[0] + gain[0], "mean", reps=1000).high - \
        stats.stratified_ci(base[0] + gain[0], "mean", reps=1000).low
    assert np.median([ci.high - ci.low for ci in cis]) < unpaired / 3  # pairing removes the seed spread


def test_few_seed_percentile_intervals_undercover_and_t_intervals_do_not():
    data = np.random.default_rng(2).normal(size=(200, 3))  # one task, n = 3, truth 0
    pct = np.mean([(lambda c: c.low <= 0 <= c.high)(stats.stratified_ci(d, "mean", reps=1000, seed=i))
                   for i, d in enumerate(data)])
    t = np.mean([(lambda lo_hi: lo_hi[0] <= 0 <= lo_hi[1])(stats.t_interval(d)) for d in data])
    assert pct <= 0.85 and t >= 0.90, (pct, t)


def test_estimators_and_intervals_match_rliable():
    """rliable 1.2.0 as the oracle, through its values on fixed inputs computed once (``tests/fixtures/
    make_rliable_reference.py``; rliable is not a popjax dependency): the estimators agree, and our kernels on
    rliable's own resamples (the global legacy ``np.random.choice`` per replicate, seed 0) give its CI exactly."""
    ref = json.loads((Path(__file__).parent / "fixtures" / "rliable_reference.json").read_text())
    s, x, y = np.array(ref["s"]), np.array(ref["x"]), np.array(ref["y"])
    assert stats.iqm(s) == pytest.approx(ref["iqm"], rel=1e-12)
    assert stats.mean(s) == pytest.approx(ref["mean"], rel=1e-12)
    assert stats.median(s) == pytest.approx(ref["median"], rel=1e-12)
    assert stats.optimality_gap(s) == pytest.approx(ref["optimality_gap"], rel=1e-12)
    assert stats.prob_improvement(x, y) == pytest.approx(ref["prob_improvement"], rel=1e-12)
    ci, (n, m) = ref["ci"], s.shape
    rng = np.random.RandomState(ci["seed"])  # the stream np.random.seed(0) gives rliable
    reps = [[stats.iqm(r), stats.mean(r)] for r in (s[rng.choice(n, (n, m)), np.arange(m)]
                                                    for _ in range(ci["reps"]))]
    np.testing.assert_allclose(np.percentile(reps, [2.5, 97.5], axis=0), ci["low_high"], rtol=1e-12)
    ours = stats.stratified_ci(s, "iqm", reps=ci["reps"])  # our own generator: the same interval up to noise
    low, high = ci["low_high"][0][0], ci["low_high"][1][0]
    assert ours.low == pytest.approx(low, abs=0.05) and ours.high == pytest.approx(high, abs=0.05)


def test_population_iqm_of_summary_json():
    four = stats.population_iqm([4.0, 1.0, 3.0, 2.0], reps=500)
    assert (four["n"], four["iqm"]) == (4, 2.5) and four["ci"][0] <= 2.5 <= four["ci"][1] and "values" not in four
    three = stats.population_iqm([1.0, 2.0, 6.0])
    assert (three["iqm"], three["ci"], three["values"]) == (3.0, None, [1.0, 2.0, 6.0])
    assert stats.population_iqm([1.0, float("nan")])["iqm"] is None  # a diverged member
    # members that are not independent samples (PBT, CEM-RL, DvD): the point value, its values, no interval
    coupled = stats.population_iqm([4.0, 1.0, 3.0, 2.0], not_independent="members interact")
    assert coupled == {"n": 4, "iqm": 2.5, "ci": None, "no_ci": "members interact", "values": [4.0, 1.0, 3.0, 2.0]}
