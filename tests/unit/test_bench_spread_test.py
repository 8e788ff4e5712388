"""The allocation benchmark's stability test: is one policy's spread over training seeds smaller than
another's (bench/allocation_quality.py ``spread_test``, the one-sided F test of two variances)?"""

from __future__ import annotations

import math

import numpy as np
import pytest
from bench_scripts import load_bench_script


@pytest.fixture(scope="module")
def spread_test():
    return load_bench_script("allocation_quality").spread_test


def _with_variance(variance: float, n: int) -> list[float]:
    """``n`` values whose sample variance is exactly ``variance``."""
    z = np.arange(n, dtype=np.float64)
    z = (z - z.mean()) / z.std(ddof=1)
    return (10.0 + math.sqrt(variance) * z).tolist()


@pytest.mark.parametrize(
    ("ratio", "n", "p"),
    [
        # upper 5% and 1% points of F(4, 4) and F(9, 9), from the standard tables
        pytest.param(6.388, 5, 0.05, id="F(4,4) 5%"),
        pytest.param(15.977, 5, 0.01, id="F(4,4) 1%"),
        pytest.param(3.179, 10, 0.05, id="F(9,9) 5%"),
        pytest.param(1.0, 5, 0.5, id="equal spreads"),
    ],
)
def test_the_p_value_is_the_f_distributions_upper_tail_at_the_variance_ratio(spread_test, ratio, n, p):
    result = spread_test(_with_variance(1.0, n), _with_variance(ratio, n))
    assert result["variance_ratio"] == pytest.approx(ratio)
    assert result["p"] == pytest.approx(p, abs=2e-4)


def test_a_wider_spread_of_ours_is_no_evidence_for_it(spread_test):
    result = spread_test(_with_variance(4.0, 5), _with_variance(1.0, 5))
    assert result["variance_ratio"] == pytest.approx(0.25)
    assert result["p"] > 0.8


def test_unequal_numbers_of_seeds_use_each_samples_own_degrees_of_freedom(spread_test):
    # F(9, 4) upper 5% point 6.00: theirs has 10 seeds, ours 5
    result = spread_test(_with_variance(1.0, 5), _with_variance(6.00, 10))
    assert result["p"] == pytest.approx(0.05, abs=5e-4)


def test_no_spread_of_ours_against_some_of_theirs_is_certain_and_none_against_none_says_nothing(spread_test):
    assert spread_test([3.0] * 5, _with_variance(1.0, 5)) == {"variance_ratio": math.inf, "p": 0.0}
    tied = spread_test([3.0] * 5, [4.0] * 5)
    assert math.isnan(tied["variance_ratio"]) and tied["p"] == 1.0
