"""bench/mixtures.py: the best mixture of weightings under the constraints, per user over the days or per
request, and how users are assigned to a mixture's candidates."""

from __future__ import annotations

import numpy as np
import pytest
from bench_scripts import load_bench_script

from recsys_rl import signals

K = len(signals.FEED_SIGNALS)
HATE = signals.FEED_SIGNALS.index("hate")


def _signals(watch: float, interactions: float = 1.0, hate: float = 1.0) -> np.ndarray:
    out = np.full(K, interactions)
    out[0], out[HATE] = watch, hate
    return out


def test_the_best_mixture_fills_in_the_frontier_between_the_candidates_that_hold():
    script = load_bench_script("mixtures")
    reference = _signals(10.0)
    totals = np.stack(
        [
            _signals(10.0),  # the behaviour's level
            _signals(14.0, interactions=0.8),  # more watch for fewer interactions
            _signals(8.0, interactions=1.2),  # less watch for more
            _signals(20.0, hate=1.5),  # the most watch, and more hate
        ]
    )
    weights = script.best_mixture(totals, np.ones(4), reference)
    assert weights == pytest.approx([0.0, 0.5, 0.5, 0.0], abs=1e-9)  # interactions 0.8 a + 1.2 (1 - a) >= 1
    assert script.mixture_watch_lift(weights, totals, np.ones(4), reference) == pytest.approx(0.1)
    assert script.best_mixture(totals, np.ones(4), _signals(10.0, interactions=2.0)) is None


def test_per_request_a_mixture_is_judged_by_its_pages_however_many_requests_it_brings():
    script = load_bench_script("mixtures")
    reference = _signals(10.0)  # per request
    # per user over the days, and each candidate's requests per user
    totals = np.stack(
        [
            _signals(10.0),
            _signals(40.0, interactions=1.5, hate=2.0),  # per request: 20 of watch, 0.75 interactions
            _signals(8.0, interactions=0.55, hate=0.5),  # per request: 16 of watch, 1.1 interactions
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


def test_two_mixtures_given_the_same_draws_differ_only_where_their_weights_do():
    script = load_bench_script("mixtures")
    uniforms = np.random.default_rng(0).random(100_000)
    first = script.mixture_assignment(np.array([0.5, 0.5, 0.0]), uniforms)
    second = script.mixture_assignment(np.array([0.4, 0.6, 0.0]), uniforms)
    assert np.bincount(first, minlength=3) / uniforms.size == pytest.approx([0.5, 0.5, 0.0], abs=0.01)
    assert np.mean(first != second) == pytest.approx(0.1, abs=0.01)  # the users drawn in [0.4, 0.5)
    edges = script.mixture_assignment(np.array([0.2, 0.0, 0.8]), np.array([0.1, 0.2, 0.5, 1.0]))
    assert edges.tolist() == [0, 2, 2, 2]


def test_every_mixture_on_a_world_draws_its_users_from_the_same_numbers():
    script = load_bench_script("mixtures")
    candidates, coef = np.zeros((3, K)), np.zeros((2, K))
    first = script.mixture_policy(candidates, coef, np.array([0.5, 0.5, 0.0]), users=10_000, world=7)
    again = script.mixture_policy(candidates, coef, np.array([0.5, 0.5, 0.0]), users=10_000, world=7)
    second = script.mixture_policy(candidates, coef, np.array([0.4, 0.6, 0.0]), users=10_000, world=7)
    elsewhere = script.mixture_policy(candidates, coef, np.array([0.5, 0.5, 0.0]), users=10_000, world=8)
    assert np.array_equal(first.groups, again.groups)
    assert np.mean(first.groups != second.groups) == pytest.approx(0.1, abs=0.015)
    assert np.mean(first.groups != elsewhere.groups) == pytest.approx(0.5, abs=0.03)
