"""Single-decision estimators against their textbook formulas, on four rows worked out by hand."""

import math

import numpy as np
import pytest

from recsys_rl.ope import estimators as est
from recsys_rl.ope.terms import RatioTerms, ratio_value

# four logged decisions, two signals; weights 0.5, 2, 1, 4 come from log-densities
REWARDS = np.array([[1.0, 0.0], [2.0, 1.0], [0.0, 1.0], [4.0, 0.0]])
BEHAVIOUR_LOG_PROB = np.array([-1.0, -2.0, -3.0, -4.0])
TARGET_LOG_PROB = BEHAVIOUR_LOG_PROB + np.log([0.5, 2.0, 1.0, 4.0])
Q = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])  # model at the logged action
V = np.array([[2.0, 0.0], [2.0, 1.0], [1.0, 1.0], [1.0, 0.0]])  # model's expectation under the target


@pytest.fixture
def weights() -> np.ndarray:
    return est.importance_weights(est.log_importance_ratio(TARGET_LOG_PROB, BEHAVIOUR_LOG_PROB))


def test_weights_are_the_density_ratios(weights):
    np.testing.assert_allclose(weights, [0.5, 2.0, 1.0, 4.0])


def test_ips_family_by_hand(weights):
    # w r = [[0.5, 0], [4, 2], [0, 1], [16, 0]]: sums 20.5 and 3 over 4 rows
    np.testing.assert_allclose(est.ips(REWARDS, weights).value(), [20.5 / 4, 3 / 4])
    # min(w, 3) = [0.5, 2, 1, 3]: w r sums 0.5 + 4 + 0 + 12 = 16.5 and 0 + 2 + 1 + 0 = 3; weights sum 6.5
    np.testing.assert_allclose(est.clipped_ips(REWARDS, weights, cap=3.0).value(), [16.5 / 4, 3 / 4])
    np.testing.assert_allclose(est.ncis(REWARDS, weights, cap=3.0).value(), [16.5 / 6.5, 3 / 6.5])
    # self-normalised by the weights' sum 7.5
    np.testing.assert_allclose(est.snips(REWARDS, weights).value(), [20.5 / 7.5, 3 / 7.5])


def test_model_based_estimators_by_hand(weights):
    # DM: mean of v = [(2 + 2 + 1 + 1) / 4, (0 + 1 + 1 + 0) / 4]
    np.testing.assert_allclose(est.dm(V).value(), [1.5, 0.5])
    # residuals r - q = [[0, 0], [1, 0], [-1, 0], [3, 0]]; w (r - q) = [[0, 0], [2, 0], [-1, 0], [12, 0]]
    np.testing.assert_allclose(est.dr(REWARDS, weights, Q, V).value(), [1.5 + 13 / 4, 0.5])
    np.testing.assert_allclose(est.sndr(REWARDS, weights, Q, V).value(), [1.5 + 13 / 7.5, 0.5])
    # tau = 3 drops the correction of the row with weight 4: 0 + 2 - 1 = 1
    np.testing.assert_allclose(est.switch_dr(REWARDS, weights, Q, V, tau=3.0).value(), [1.5 + 1 / 4, 0.5])
    # tau above every weight is DR; tau below every weight is DM
    np.testing.assert_allclose(
        est.switch_dr(REWARDS, weights, Q, V, tau=10.0).value(), est.dr(REWARDS, weights, Q, V).value()
    )
    np.testing.assert_allclose(est.switch_dr(REWARDS, weights, Q, V, tau=0.1).value(), est.dm(V).value())


EXACT_WEIGHTS = np.array([0.5, 2.0, 1.0, 4.0])  # exactly representable: a tie at tau is a real tie


@pytest.mark.parametrize(
    ("tau", "kept_correction"),
    [
        # w (r - q) = [0, 2, -1, 12] for the first signal; the row of weight 2 is the one at the edge
        pytest.param(math.nextafter(2.0, 0.0), 0 - 1, id="tau-just-below-a-weight"),
        pytest.param(2.0, 0 + 2 - 1, id="tau-equal-to-a-weight-keeps-its-correction"),
        pytest.param(math.nextafter(2.0, 3.0), 0 + 2 - 1, id="tau-just-above-a-weight"),
        pytest.param(4.0, 0 + 2 - 1 + 12, id="tau-equal-to-the-largest-weight-is-dr"),
    ],
)
def test_switch_dr_keeps_the_dr_correction_of_a_weight_exactly_at_tau(tau, kept_correction):
    value = est.switch_dr(REWARDS, EXACT_WEIGHTS, Q, V, tau=tau).value()
    np.testing.assert_allclose(value, [1.5 + kept_correction / 4, 0.5])


def test_summing_terms_over_sessions_keeps_every_value(weights):
    starts = np.array([0, 1, 3])  # sessions {0}, {1, 2}, {3}
    for terms in (
        est.snips(REWARDS, weights),
        est.sndr(REWARDS, weights, Q, V),
        est.ncis(REWARDS, weights, cap=3.0),
    ):
        summed = terms.sum_by(starts)
        assert summed.numerator.shape[0] == 3
        np.testing.assert_allclose(summed.value(), terms.value())


def test_ratio_value_reads_resample_sums_in_the_flat_layout(weights):
    terms = est.sndr(REWARDS, weights, Q, V)
    counts = np.array([[2.0, 0.0, 1.0, 1.0]])  # a resample: row 0 twice, row 1 never
    resampled = ratio_value(counts @ terms.flat(), terms.parts, terms.signals)
    # by hand: v part (2*v0 + v2 + v3) / 4, correction part (2*0 + (-1) + 12) / (2*0.5 + 1 + 4)
    np.testing.assert_allclose(resampled[0], [(4 + 1 + 1) / 4 + 11 / 6, (0 + 1 + 0) / 4])


def test_weights_stay_finite_for_extreme_log_ratios():
    log_ratio = est.log_importance_ratio(np.array([5000.0, -np.inf, 0.0]), np.zeros(3))
    weights = est.importance_weights(log_ratio)
    assert np.isfinite(weights).all() and weights[1] == 0.0 and weights[2] == 1.0
    assert np.isfinite(weights.sum() * 1e6)


def test_nan_densities_are_refused():
    with pytest.raises(ValueError, match="1 of 2 log importance ratios"):
        est.log_importance_ratio(np.array([0.0, np.nan]), np.zeros(2))
    with pytest.raises(ValueError, match=r"NaN or \+inf: .* a logged log-propensity is -inf or NaN$"):
        est.log_importance_ratio(np.zeros(1), np.array([-np.inf]))


def test_ratio_terms_check_their_shapes():
    with pytest.raises(ValueError, match="RatioTerms"):
        RatioTerms(np.zeros((3, 2)), np.zeros((3, 1)))
