"""bench/mixtures.py: the best mixture of weightings under the constraints, per user over the days or per
request, and how users are assigned to a mixture's candidates."""

from __future__ import annotations

import numpy as np
import pytest
from bench_scripts import load_bench_script
from feed_vectors import K, feed_signals

from recsys_rl import signals
from recsys_rl.sim.ground_truth import PolicyValues
from recsys_rl.state import FEED_STATE_FEATURES


def test_the_best_mixture_fills_in_the_frontier_between_the_candidates_that_hold():
    script = load_bench_script("mixtures")
    reference = feed_signals(10.0)
    totals = np.stack(
        [
            feed_signals(10.0),  # the behaviour's level
            feed_signals(14.0, interactions=0.8),  # more watch for fewer interactions
            feed_signals(8.0, interactions=1.2),  # less watch for more
            feed_signals(20.0, hate=1.5),  # the most watch, and more hate
        ]
    )
    weights = script.best_mixture(totals, np.ones(4), reference)
    assert weights == pytest.approx([0.0, 0.5, 0.5, 0.0], abs=1e-9)  # interactions 0.8 a + 1.2 (1 - a) >= 1
    assert script.mixture_watch_lift(weights, totals, np.ones(4), reference) == pytest.approx(0.1)
    assert script.best_mixture(totals, np.ones(4), feed_signals(10.0, interactions=2.0)) is None


def test_per_request_a_mixture_is_judged_by_its_pages_however_many_requests_it_brings():
    script = load_bench_script("mixtures")
    reference = feed_signals(10.0)  # per request
    # per user over the days, and each candidate's requests per user
    totals = np.stack(
        [
            feed_signals(10.0),
            feed_signals(40.0, interactions=1.5, hate=2.0),  # per request: 20 of watch, 0.75 interactions
            feed_signals(8.0, interactions=0.55, hate=0.5),  # per request: 16 of watch, 1.1 interactions
        ]
    )
    requests = np.array([1.0, 2.0, 0.5])
    # interactions per request 1.5 y1 + 0.55 y2 >= y0 + 2 y1 + 0.5 y2 = 1: y2 >= 10 y1, so y1 = 1/7
    weights = script.best_mixture(totals, requests, reference)
    assert weights == pytest.approx([0.0, 1 / 11, 10 / 11], abs=1e-9)
    assert script.mixture_watch_lift(weights, totals, requests, reference) == pytest.approx(120 / 7 / 10 - 1)
    # fewer, better pages win per request where more watch per user does not
    assert script.best_mixture(totals[[0, 2]], requests[[0, 2]], reference) == pytest.approx([0, 1], abs=1e-9)
    assert script.best_mixture(totals[[0, 2]], np.ones(2), reference) == pytest.approx([1, 0], abs=1e-9)


def _values(per_user: list[list[float]], per_request_watch: float, return_rate: float) -> PolicyValues:
    return PolicyValues(
        feed={},
        live={},
        per_request={**dict.fromkeys(signals.FEED_SIGNALS, 0.0), "watch_time": per_request_watch},
        episodes=4,
        return_rate=return_rate,
        per_user=np.array(per_user, dtype=np.float64),
    )


def test_a_mixtures_values_are_each_users_expectation_over_the_policy_serving_them():
    script = load_bench_script("mixtures")
    first = _values([[10.0] * K, [30.0] * K], per_request_watch=4.0, return_rate=0.5)  # 10 requests
    second = _values([[20.0] * K, [20.0] * K], per_request_watch=8.0, return_rate=1.0)  # 5 requests
    mixed = script.mixed_values(np.array([0.75, 0.25]), [first, second])
    assert mixed.per_user[:, 0].tolist() == [12.5, 27.5]
    assert mixed.return_rate == 0.625
    # per request: the pages' expected total over the expected requests, 40 / 8.75
    assert mixed.per_request["watch_time"] == pytest.approx(40.0 / 8.75)
    assert mixed.episodes == 4


def test_a_mixture_of_candidates_keeps_the_ones_it_weighs_and_runs_as_them():
    script = load_bench_script("mixtures")
    candidates = np.arange(3 * K, dtype=np.float64).reshape(3, K)
    coef = np.zeros((len(FEED_STATE_FEATURES), K))
    mixture = script.Mixture.of_candidates(np.array([0.5, 1e-12, 0.5]), candidates, coef)
    assert mixture.weights.tolist() == [0.5, 0.5]
    assert [p.logits[0].tolist() for p in mixture.policies] == [
        candidates[0].tolist(),
        candidates[2].tolist(),
    ]
    assert script.components(mixture) == mixture.policies and script.components("policy") == ("policy",)
    one = _values([[1.0] * K], 1.0, 1.0)
    assert script.combined("policy", [one]) is one
    two = script.combined(mixture, [one, _values([[3.0] * K], 1.0, 1.0)])
    assert two.per_user[0, 0] == 2.0


def test_a_linear_program_that_fails_otherwise_than_infeasible_says_so():
    script = load_bench_script("mixtures")
    # a candidate worth nothing in units has unbounded value per unit: no mixture is best
    totals = np.stack([feed_signals(10.0), feed_signals(12.0, hate=0.0)])
    with pytest.raises(RuntimeError, match="the mixture's linear program failed"):
        script.best_mixture(totals, np.array([1.0, 0.0]), feed_signals(10.0))
