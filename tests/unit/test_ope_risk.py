"""Risk measures of the return distribution: weighted quantiles and CVaR by hand, and session weights."""

import math

import numpy as np
import pytest

from recsys_rl.ope.logged import LoggedSteps
from recsys_rl.ope.risk import (
    conditional_value_at_risk,
    return_distribution,
    session_weights,
    weighted_quantile,
)

VALUES = np.array([4.0, 1.0, 3.0, 2.0])


def test_quantile_is_the_smallest_value_whose_cumulative_weight_reaches_the_level():
    equal = np.ones(4)
    assert weighted_quantile(VALUES, equal, 0.25) == 1.0  # F(1) = 0.25 exactly
    assert weighted_quantile(VALUES, equal, 0.26) == 2.0
    # weight 3 on the value 4: F(3) = 0.5, so the 0.6 quantile is 4
    assert weighted_quantile(VALUES, np.array([3.0, 1.0, 1.0, 1.0]), 0.6) == 4.0


def test_cvar_takes_exactly_alpha_of_the_mass_from_the_bottom():
    equal = np.ones(4)
    assert conditional_value_at_risk(VALUES, equal, 0.1) == pytest.approx(1.0)
    assert conditional_value_at_risk(VALUES, equal, 0.5) == pytest.approx(1.5)
    # 0.375 of the mass: all of 1 (0.25) and half of 2's quarter
    assert conditional_value_at_risk(VALUES, equal, 0.375) == pytest.approx((0.25 * 1 + 0.125 * 2) / 0.375)
    assert conditional_value_at_risk(VALUES, equal, 1.0) == pytest.approx(VALUES.mean())


def _two_sessions() -> LoggedSteps:
    # session 0: rewards 1 then 2; session 1: reward 10
    n = 3
    return LoggedSteps(
        states=np.zeros((n, 1), np.float32),
        actions=np.zeros((n, 1), np.float32),
        rewards=np.array([[1.0], [2.0], [10.0]]),
        behaviour_log_prob=np.zeros(n),
        groups=np.zeros(n, np.int64),
        session=np.array([0, 0, 1]),
        step=np.array([0, 1, 0]),
        done=np.array([False, True, True]),
        next_states=np.zeros((n, 1), np.float32),
        signals=("watch_time",),
    )


def test_a_session_weighs_by_the_product_of_its_ratios():
    logged = _two_sessions()
    np.testing.assert_allclose(session_weights(logged, np.log([2.0, 1.5, 0.25])), [3.0, 0.25])
    np.testing.assert_allclose(session_weights(logged, None), [1.0, 1.0])


def test_the_target_distribution_reweights_the_logged_returns():
    from recsys_rl.signals import discounts

    logged = _two_sessions()
    gamma = discounts(("watch_time",))[0]
    returns = np.array([1.0 + gamma * 2.0, 10.0])
    weights = np.array([3.0, 1.0])  # session products 3 and 1
    result = return_distribution(logged, np.log([3.0, 1.0, 1.0]))["signals"]["watch_time"]
    mean = np.average(returns, weights=weights)
    assert result["mean"] == pytest.approx(mean)
    assert result["variance"] == pytest.approx(np.average((returns - mean) ** 2, weights=weights))
    assert result["lower_quartile"] == pytest.approx(returns[0])
    assert result["cvar"] == pytest.approx(returns[0])
    logged_only = return_distribution(logged, None)["signals"]["watch_time"]
    assert logged_only["mean"] == pytest.approx(returns.mean())
    assert math.isfinite(logged_only["variance"])


def test_unsupported_targets_are_refused():
    with pytest.raises(ValueError, match="do not support"):
        return_distribution(_two_sessions(), np.full(3, -2000.0))
