"""Bootstrap and concentration intervals: known answers, hand-computed formulas, and the resampling layout."""

import math
import warnings
from statistics import NormalDist

import numpy as np
import pytest

from recsys_rl.ope.intervals import (
    Resampled,
    bca_interval,
    bias_correction,
    bootstrap_interval,
    empirical_bernstein_interval,
    hoeffding_interval,
    jackknife_acceleration,
    percentile_interval,
    resample_sums,
)
from recsys_rl.ope.terms import RatioTerms


def _mean_statistic(sums: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):  # a zero baseline is an outcome under test
        return sums[..., :1] / sums[..., 1:]


def test_intervals_of_a_normal_mean_match_the_textbook_interval():
    rng = np.random.default_rng(0)
    n = 2000
    x = rng.normal(3.0, 2.0, n)
    terms = RatioTerms.mean(x[:, None]).flat()
    sums = resample_sums(terms, np.zeros(n, dtype=int), resamples=2000, seed=1).overall()
    half = 1.96 * x.std(ddof=1) / math.sqrt(n)
    for method in ("percentile", "bca"):
        result = bootstrap_interval(_mean_statistic, sums, method, alpha=0.05)
        assert result.value[0] == pytest.approx(x.mean())
        assert result.low[0] == pytest.approx(x.mean() - half, abs=0.1 * half), method
        assert result.high[0] == pytest.approx(x.mean() + half, abs=0.1 * half), method


def test_bca_moves_the_interval_of_a_right_skewed_mean_to_the_right():
    rng = np.random.default_rng(3)
    x = rng.exponential(1.0, 60)
    sums = resample_sums(RatioTerms.mean(x[:, None]).flat(), np.zeros(60, int), resamples=4000, seed=2)
    overall = sums.overall()
    assert jackknife_acceleration(_mean_statistic(overall.jackknife))[0] > 0
    percentile = bootstrap_interval(_mean_statistic, overall, "percentile", 0.05)
    bca = bootstrap_interval(_mean_statistic, overall, "bca", 0.05)
    assert bca.low[0] > percentile.low[0] and bca.high[0] > percentile.high[0]


def test_jackknife_acceleration_by_hand():
    jack = np.array([[1.0], [2.0], [4.0]])
    # mean 7/3, d = mean - jack = [4/3, 1/3, -5/3]: sum d^2 = 42/9, sum d^3 = (64 + 1 - 125) / 27
    expected = (-60 / 27) / (6 * (42 / 9) ** 1.5)
    assert jackknife_acceleration(jack)[0] == pytest.approx(expected)
    assert jackknife_acceleration(np.ones((5, 1)))[0] == 0.0


def test_bias_correction_counts_ties_as_half_and_stays_finite():
    boot = np.array([[1.0], [2.0], [3.0], [4.0]])
    # one resample below 2 and one tie: share (1 + 0.5) / 4
    assert bias_correction(np.array([2.0]), boot)[0] == pytest.approx(NormalDist().inv_cdf(0.375))
    # an estimate below every resample is kept at share 1 / (2 B)
    assert bias_correction(np.array([0.0]), boot)[0] == pytest.approx(NormalDist().inv_cdf(1 / 8))


def test_bca_without_bias_or_skew_is_the_percentile_interval():
    boot = np.arange(1.0, 100.0)[:, None]  # 99 values, 49 below 50 and one tie: z0 = 0
    jack = np.ones((10, 1))  # no spread: a = 0
    low, high = bca_interval(np.array([50.0]), boot, jack, alpha=0.1)
    assert (low[0], high[0]) == pytest.approx(tuple(v[0] for v in percentile_interval(boot, 0.1)))


def _reference_bca(x: np.ndarray, boot: np.ndarray, alpha: float) -> tuple[float, float, float, float]:
    """BCa of a sample mean as scipy.stats.bootstrap(method="BCa") computes it (scipy/stats/_resampling.py
    ``_bca_interval``), written from Efron & Tibshirani (1993) eq. 14.9-14.15 with no library code:
    z0 from the share of resamples below the estimate (ties half), a from the delete-one jackknife of the
    raw sample, levels Phi(z0 + (z0 + z) / (1 - a (z0 + z))), linear-interpolated quantiles."""
    normal = NormalDist()
    share = (np.sum(boot < x.mean()) + np.sum(boot <= x.mean())) / (2 * boot.size)
    z0 = normal.inv_cdf(share)
    leave_one_out = np.array([np.delete(x, i).mean() for i in range(x.size)])
    d = leave_one_out.mean() - leave_one_out
    a = (d**3).sum() / (6 * ((d**2).sum()) ** 1.5)
    levels = [
        normal.cdf(z0 + (z0 + z) / (1 - a * (z0 + z)))
        for z in (normal.inv_cdf(alpha / 2), normal.inv_cdf(1 - alpha / 2))
    ]
    low, high = np.quantile(boot, levels)
    return low, high, z0, a


@pytest.mark.parametrize("alpha", [0.05, 0.2])
def test_bca_with_bias_and_skew_matches_the_textbook_bca_on_the_same_resamples(alpha):
    # 40 units, fewer than the 200 jackknife blocks: the grouped jackknife is the delete-one jackknife
    rng = np.random.default_rng(7)
    x = rng.lognormal(0.0, 1.0, 40)
    sums = resample_sums(
        RatioTerms.mean(x[:, None]).flat(), np.zeros(40, int), resamples=999, seed=5
    ).overall()
    boot = _mean_statistic(sums.bootstrap)[:, 0]
    low, high, z0, a = _reference_bca(x, boot, alpha)
    # both corrections are large enough here that dropping or doubling either moves the interval
    assert abs(z0) > 0.05 and a > 0.02, (z0, a)
    np.testing.assert_allclose(jackknife_acceleration(_mean_statistic(sums.jackknife))[0], a, rtol=1e-9)
    result = bootstrap_interval(_mean_statistic, sums, "bca", alpha)
    assert (result.low[0], result.high[0]) == pytest.approx((low, high), rel=1e-9)


def test_bca_levels_by_hand_with_a_non_zero_bias_and_acceleration():
    boot = np.arange(1.0, 101.0)[:, None]  # 100 resamples; 30 lie below the estimate 30.5
    jack = np.array([[1.0], [2.0], [4.0]])  # a = (-60/27) / (6 (42/9)^1.5) = -0.036739
    normal = NormalDist()
    z0, a = normal.inv_cdf(0.30), (-60 / 27) / (6 * (42 / 9) ** 1.5)  # z0 = -0.52440
    levels = []
    for z in (normal.inv_cdf(0.05), normal.inv_cdf(0.95)):  # -/+ 1.64485
        levels.append(normal.cdf(z0 + (z0 + z) / (1 - a * (z0 + z))))
    # z0 + z = -2.16925: -2.16925 / (1 - 0.079698) = -2.35711, + z0 = -2.88151, Phi = 0.0019789
    # z0 + z = +1.12045: 1.12045 / (1 + 0.041164) = 1.07615, + z0 = 0.55175, Phi = 0.70944
    assert levels == pytest.approx([0.0019789, 0.70944], abs=2e-6)
    low, high = bca_interval(np.array([30.5]), boot, jack, alpha=0.1)
    # quantile q of 1..100 (linear) is 1 + 99 q
    assert (low[0], high[0]) == pytest.approx((1 + 99 * levels[0], 1 + 99 * levels[1]), rel=1e-9)


def test_hoeffding_by_hand():
    x = np.array([[0.0], [1.0], [1.0], [0.0], [1.0]])
    low, high = hoeffding_interval(x, np.array([0.0]), np.array([1.0]), alpha=0.05)
    half = math.sqrt(math.log(2 / 0.05) / (2 * 5))  # sqrt(ln 40 / 10) = 0.6074
    assert (low[0], high[0]) == pytest.approx((0.6 - half, 0.6 + half))
    assert half == pytest.approx(0.6074, abs=1e-4)
    # a range twice as wide doubles the half-width
    low2, high2 = hoeffding_interval(2 * x, np.array([0.0]), np.array([2.0]), alpha=0.05)
    assert high2[0] - low2[0] == pytest.approx(2 * (high[0] - low[0]))


def test_empirical_bernstein_by_hand():
    x = np.array([[0.0], [1.0], [1.0], [0.0], [1.0]])
    low, high = empirical_bernstein_interval(x, np.array([0.0]), np.array([1.0]), alpha=0.05)
    variance = (3 * 0.4**2 + 2 * 0.6**2) / 4  # 0.3, the unbiased sample variance
    log_term = math.log(4 / 0.05)  # ln 80
    half = math.sqrt(2 * variance * log_term / 5) + 7 * log_term / (3 * 4)
    assert (low[0], high[0]) == pytest.approx((0.6 - half, 0.6 + half))
    assert half == pytest.approx(0.72515 + 2.55615, abs=1e-4)
    # with zero variance only the range term is left
    _, flat_high = empirical_bernstein_interval(np.ones((5, 1)), np.array([0.0]), np.array([1.0]), 0.05)
    assert flat_high[0] == pytest.approx(1.0 + 7 * log_term / 12)


def test_bernstein_beats_hoeffding_when_the_variance_is_small():
    x = np.random.default_rng(0).uniform(0.45, 0.55, (5000, 1))
    h = hoeffding_interval(x, np.array([0.0]), np.array([1.0]), 0.05)
    b = empirical_bernstein_interval(x, np.array([0.0]), np.array([1.0]), 0.05)
    assert b[1][0] - b[0][0] < 0.5 * (h[1][0] - h[0][0])


def test_resamples_per_group_add_up_and_jackknife_blocks_leave_units_out():
    rng = np.random.default_rng(5)
    terms = rng.normal(size=(11, 3))
    groups = np.array([2, 0, 2, 0, 0, 2, 2, 2, 0, 2, 2])
    draws = resample_sums(terms, groups, resamples=7, seed=4, blocks=4, chunk_units=2)
    assert draws.groups.tolist() == [0, 2]
    overall = draws.overall()
    np.testing.assert_allclose(overall.observed, terms.sum(axis=0))
    np.testing.assert_allclose(overall.bootstrap, draws.bootstrap.sum(axis=0))
    # group 0 has units 1, 3, 4, 8: four blocks of one unit each, the exact delete-one jackknife
    group0 = draws.group(0)
    np.testing.assert_allclose(
        np.sort(group0.jackknife, axis=0), np.sort(terms[[1, 3, 4, 8]].sum(0) - terms[[1, 3, 4, 8]], axis=0)
    )
    # group 2 has 7 units dealt round-robin into 4 blocks: block 0 holds its 1st and 5th unit
    units2 = np.flatnonzero(groups == 2)
    np.testing.assert_allclose(draws.blocks[1, 0], terms[units2[[0, 4]]].sum(axis=0))
    assert draws.block_sizes[1].tolist() == [2, 2, 2, 1]
    assert overall.jackknife.shape == (8, 3)


def test_bootstrap_counts_are_poisson_one_per_unit():
    # with identity terms each resample's column sums are the counts themselves
    counts = resample_sums(np.eye(500), np.zeros(500, int), resamples=40, seed=1, chunk_units=64).bootstrap[0]
    assert np.array_equal(counts, np.round(counts)) and counts.min() >= 0
    assert counts.mean() == pytest.approx(1.0, abs=0.03)
    assert counts.var() == pytest.approx(1.0, abs=0.06)


def test_resampling_is_seeded():
    terms = np.random.default_rng(0).normal(size=(50, 2))
    groups = np.zeros(50, int)
    a = resample_sums(terms, groups, resamples=20, seed=9).bootstrap
    b = resample_sums(terms, groups, resamples=20, seed=9).bootstrap
    c = resample_sums(terms, groups, resamples=20, seed=10).bootstrap
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def test_unknown_interval_method_is_refused():
    terms = np.ones((3, 2))
    sums = resample_sums(terms, np.zeros(3, int), resamples=5, seed=0).overall()
    with pytest.raises(ValueError, match="interval method"):
        bootstrap_interval(_mean_statistic, sums, "normal", 0.05)


def test_a_clusters_units_share_one_count_in_every_resample_whichever_group_they_are_in():
    # identity terms: a resample's column sums are each unit's count; units 0-1 and 2-4 are two users, and
    # user 1's sessions fall in two groups; chunks of 2 units must not split a user
    clusters = np.array([7, 7, 3, 3, 3, 9])
    groups = np.array([0, 0, 0, 1, 1, 1])
    draws = resample_sums(np.eye(6), groups, resamples=50, seed=2, clusters=clusters, chunk_units=2)
    counts = draws.overall().bootstrap
    np.testing.assert_array_equal(counts[:, 0], counts[:, 1])
    np.testing.assert_array_equal(counts[:, 2], counts[:, 3])
    np.testing.assert_array_equal(counts[:, 2], counts[:, 4])
    assert not np.array_equal(counts[:, 0], counts[:, 2]) and not np.array_equal(counts[:, 0], counts[:, 5])
    # per group: group 1 holds user 3's last two sessions, drawn with the count of its first
    np.testing.assert_array_equal(draws.group(1).bootstrap[:, 3], draws.group(0).bootstrap[:, 2])


def test_jackknife_blocks_leave_whole_clusters_out():
    clusters = np.array([5, 1, 5, 2, 1, 2, 3])
    terms = np.random.default_rng(1).normal(size=(7, 2))
    draws = resample_sums(terms, np.zeros(7, int), resamples=3, seed=0, clusters=clusters, blocks=2)
    # clusters in order of first appearance 5, 1, 2, 3 are dealt to blocks 0, 1, 0, 1
    np.testing.assert_allclose(draws.blocks[0, 0], terms[[0, 2, 3, 5]].sum(axis=0))
    np.testing.assert_allclose(draws.blocks[0, 1], terms[[1, 4, 6]].sum(axis=0))
    assert draws.block_sizes[0].tolist() == [2, 2]


def test_clustering_widens_the_interval_of_correlated_units():
    # 200 users of 10 sessions each: a user effect (sd 1) and session noise (sd 1); the mean's standard
    # error is sqrt((1 + 1/10) / 200) when users are resampled, sqrt(2 / 2000) when sessions are
    rng = np.random.default_rng(4)
    user = np.repeat(np.arange(200), 10)
    x = rng.normal(size=200)[user] + rng.normal(size=2000)
    terms = RatioTerms.mean(x[:, None]).flat()
    widths = {}
    for name, clusters in (("user", user), ("session", None)):
        sums = resample_sums(terms, np.zeros(2000, int), resamples=1000, seed=5, clusters=clusters).overall()
        result = bootstrap_interval(_mean_statistic, sums, "percentile", 0.05)
        widths[name] = result.high[0] - result.low[0]
    assert widths["user"] == pytest.approx(2 * 1.96 * math.sqrt(1.1 / 200), rel=0.1)
    assert widths["session"] == pytest.approx(2 * 1.96 * math.sqrt(2 / 2000), rel=0.1)


@pytest.mark.parametrize("method", ["percentile", "bca"])
@pytest.mark.parametrize(("zero_baselines", "refused"), [(2, False), (3, True)])
def test_non_finite_resamples_are_counted_and_past_one_percent_refuse_the_interval(
    method, zero_baselines, refused
):
    # 200 resamples of a ratio; some drew a baseline of 0 (no session of a small group, say)
    rng = np.random.default_rng(0)
    boot = np.column_stack([rng.normal(10.0, 1.0, 200), rng.normal(5.0, 0.5, 200)])
    boot[:zero_baselines, 1] = 0.0
    jack = np.column_stack([rng.normal(10.0, 0.1, 20), rng.normal(5.0, 0.05, 20)])
    sums = Resampled(np.array([10.0, 5.0]), boot, jack)
    result = bootstrap_interval(_mean_statistic, sums, method, 0.05)
    assert result.dropped.tolist() == [zero_baselines]
    assert result.value[0] == pytest.approx(2.0)
    if refused:
        assert np.isnan(result.low[0]) and np.isnan(result.high[0])
    else:
        assert 1.0 < result.low[0] < 2.0 < result.high[0] < 3.0


def test_resample_sums_needs_at_least_one_resample():
    terms = np.ones((3, 2))
    with pytest.raises(ValueError, match="resamples should be at least 1, but is 0"):
        resample_sums(terms, np.zeros(3, int), resamples=0, seed=0)
    # one resample is the smallest allowed
    assert resample_sums(terms, np.zeros(3, int), resamples=1, seed=0).bootstrap.shape == (1, 1, 2)


def test_a_group_with_fewer_clusters_than_blocks_gets_the_delete_one_jackknife():
    # 4 blocks; group 0 has 3 units and group 1 has 2: their empty blocks must not count as leave-outs
    terms = np.array([[1.0, 1.0], [2.0, 1.0], [4.0, 1.0], [8.0, 1.0], [16.0, 1.0]])
    draws = resample_sums(terms, np.array([0, 0, 0, 1, 1]), resamples=3, seed=0, blocks=4)
    assert draws.block_sizes.tolist() == [[1, 1, 1, 0], [1, 1, 0, 0]]
    assert np.issubdtype(draws.block_sizes.dtype, np.integer)  # counts of clusters
    np.testing.assert_allclose(draws.group(0).jackknife, [[6.0, 2.0], [5.0, 2.0], [3.0, 2.0]])
    np.testing.assert_allclose(draws.group(1).jackknife, [[16.0, 1.0], [8.0, 1.0]])
    # overall: each of the 5 units left out once, the total being [31, 5]
    np.testing.assert_allclose(np.sort(draws.overall().jackknife[:, 0]), [15.0, 23.0, 27.0, 29.0, 30.0])
    np.testing.assert_allclose(draws.overall().jackknife[:, 1], 4.0)


def test_jackknife_acceleration_is_per_column_and_leaves_non_finite_estimates_out():
    a = (-60 / 27) / (6 * (42 / 9) ** 1.5)  # of [1, 2, 4], as in test_jackknife_acceleration_by_hand
    # mirrored values flip the sign of every d and so of a; a constant column has a = 0
    jack = np.array([[1.0, -1.0, 3.0], [2.0, -2.0, 3.0], [4.0, -4.0, 3.0]])
    np.testing.assert_allclose(jackknife_acceleration(jack), [a, -a, 0.0], rtol=1e-12)
    nan, inf = np.nan, np.inf
    jack = np.array([[1.0, nan, nan], [2.0, 5.0, nan], [nan, nan, nan], [4.0, nan, nan], [inf, nan, nan]])
    # column 0 is [1, 2, 4] once NaN and inf are left out; one finite estimate has no spread: a = 0
    np.testing.assert_allclose(jackknife_acceleration(jack), [a, 0.0, 0.0], rtol=1e-12)


def test_jackknife_acceleration_of_agreeing_estimates_is_zero_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert jackknife_acceleration(np.full((5, 2), 7.0)).tolist() == [0.0, 0.0]


def test_bias_correction_is_per_column_over_finite_resamples_and_clipped_on_both_sides():
    normal = NormalDist()
    boot = np.array([[1.0, 10.0, np.nan], [2.0, 20.0, 7.0], [3.0, np.nan, np.nan], [4.0, 40.0, np.nan]])
    z0 = bias_correction(np.array([2.0, 25.0, 5.0]), boot)
    # column 0: (1 + 0.5 tie) / 4; column 1: 2 of its 3 finite resamples below;
    # column 2: one finite resample, share kept in [1/2, 1/2], so no correction
    np.testing.assert_allclose(z0, [normal.inv_cdf(0.375), normal.inv_cdf(2 / 3), 0.0], atol=1e-12)
    # an estimate above every resample is kept at share 1 - 1 / (2 B)
    assert bias_correction(np.array([5.0]), boot[:, :1])[0] == pytest.approx(normal.inv_cdf(7 / 8))


def test_percentile_interval_of_a_column_without_finite_resamples_is_nan():
    boot = np.column_stack([np.arange(1.0, 102.0), np.full(101, np.nan)])
    low, high = percentile_interval(boot, 0.1)
    assert low.dtype == np.float64 and high.dtype == np.float64
    # quantile q of 1..101 (linear) is 1 + 100 q
    assert (low[0], high[0]) == pytest.approx((6.0, 96.0))
    assert np.isnan(low[1]) and np.isnan(high[1])


def test_hoeffding_uses_each_columns_own_range_and_mean():
    x = np.array([[2.0, 0.0], [4.0, 1.0], [4.0, 1.0], [2.0, 0.0], [4.0, 1.0]])
    low, high = hoeffding_interval(x, np.array([2.0, 0.0]), np.array([4.0, 1.0]), alpha=0.05)
    half = math.sqrt(math.log(40) / 10)  # 0.6074 per unit of range
    # column 0: mean 3.2 within [2, 4], R = 2; column 1: mean 0.6 within [0, 1], R = 1
    np.testing.assert_allclose(low, [3.2 - 2 * half, 0.6 - half])
    np.testing.assert_allclose(high, [3.2 + 2 * half, 0.6 + half])


def test_empirical_bernstein_by_hand_with_two_terms_per_column():
    # the smallest n allowed; column 0 within [1, 5] (R = 4), column 1 within [0, 1]
    x = np.array([[2.0, 0.0], [4.0, 1.0]])
    low, high = empirical_bernstein_interval(x, np.array([1.0, 0.0]), np.array([5.0, 1.0]), alpha=0.05)
    log_term = math.log(80)  # 4.38203
    # unbiased variances 2 and 0.5; n - 1 = 1
    half = [
        math.sqrt(2 * 2.0 * log_term / 2) + 7 * 4 * log_term / 3,  # 2.96042 + 40.89895
        math.sqrt(2 * 0.5 * log_term / 2) + 7 * 1 * log_term / 3,  # 1.48021 + 10.22474
    ]
    assert half == pytest.approx([43.85937, 11.70495], abs=1e-4)
    np.testing.assert_allclose(low, [3.0 - half[0], 0.5 - half[1]])
    np.testing.assert_allclose(high, [3.0 + half[0], 0.5 + half[1]])
    with pytest.raises(ValueError, match=r"^the empirical Bernstein bound needs at least 2 terms$"):
        empirical_bernstein_interval(x[:1], np.array([1.0, 0.0]), np.array([5.0, 1.0]), alpha=0.05)


@pytest.mark.parametrize("scale", [1.0, 1e-110, 1e-108, 1e103, -1e50])
def test_the_acceleration_does_not_depend_on_the_scale_of_the_estimates(scale):
    """Leave-out estimates 1, 2, 4: d = (4/3, 1/3, -5/3), sum d^2 = 42/9, sum d^3 = -60/27."""
    expected = (-60 / 27) / (6 * (42 / 9) ** 1.5) * np.sign(scale)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow or underflow on the way
        a = jackknife_acceleration(np.array([[1.0], [2.0], [4.0]]) * scale)
    np.testing.assert_allclose(a, [expected], rtol=1e-12)


def test_each_columns_acceleration_is_scaled_by_its_own_deviations():
    """Watch time in seconds and a rate per million side by side: neither column may vanish for the other."""
    jack = np.array([[1.0, 1.0], [2.0, 2.0], [4.0, 4.0]]) * np.array([1e100, 1e-100])
    expected = (-60 / 27) / (6 * (42 / 9) ** 1.5)
    np.testing.assert_allclose(jackknife_acceleration(jack), [expected, expected], rtol=1e-12)
