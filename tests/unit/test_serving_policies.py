"""Decisions are a function of (state, seed): the per-thread generator draws the same for the same seed."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from recsys_rl import gaussian
from recsys_rl.serving.policies import GaussianDecider, feed_fallback, request_seed, seeded_generator
from recsys_rl.sim.behaviour import behaviour_feed_policy
from recsys_rl.state import FEED_STATE_FEATURES


def test_the_same_seed_draws_the_same_on_any_thread_and_another_seed_differs():
    seed = request_seed("request-1")
    here = seeded_generator(seed).standard_normal(7)
    seeded_generator(request_seed("request-2")).standard_normal(3)  # the thread's generator moves on
    np.testing.assert_array_equal(seeded_generator(seed).standard_normal(7), here)
    with ThreadPoolExecutor(1) as pool:
        there = pool.submit(lambda: seeded_generator(seed).standard_normal(7)).result()
    np.testing.assert_array_equal(there, here)
    assert not np.allclose(seeded_generator(request_seed("request-2")).standard_normal(7), here)


def test_draws_over_many_request_ids_are_standard_normal():
    draws = np.concatenate([seeded_generator(request_seed(f"r{i}")).standard_normal(7) for i in range(2_000)])
    assert abs(draws.mean()) < 0.05 and abs(draws.std() - 1.0) < 0.05  # 14k draws: ~0.01 standard error


def test_a_feed_decision_is_a_function_of_state_and_seed():
    decider = feed_fallback()
    state = np.linspace(0.0, 1.0, len(FEED_STATE_FEATURES))
    seed = request_seed("request-1")
    first, second = decider.decide(state, seed, True), decider.decide(state, seed, True)
    np.testing.assert_array_equal(first[0], second[0])
    assert first[1] == second[1]
    assert not np.array_equal(decider.decide(state, request_seed("request-2"), True)[0], first[0])


def _closed_form_log_density(action: np.ndarray, mean: np.ndarray, sigma: np.ndarray) -> float:
    """Independent reference: the univariate normal log-pdf, term by term, summed over the dimensions."""
    return sum(
        -0.5 * ((a - m) / s) ** 2 - math.log(s) - 0.5 * math.log(2.0 * math.pi)
        for a, m, s in zip(action, mean, sigma, strict=True)
    )


@pytest.mark.parametrize("explore", [True, False])
def test_a_feed_decision_logs_the_gaussian_density_of_the_action_it_served(explore):
    policy = behaviour_feed_policy(sigma=0.4)  # sigma != 1, so a dropped -sum(log sigma) shows
    decider = GaussianDecider(policy, "test")
    state = np.linspace(0.0, 1.0, len(FEED_STATE_FEATURES))
    action, log_propensity = decider.decide(state, request_seed("request-1"), explore)
    mean = policy.mean(state[None, :])[0]
    if not explore:
        np.testing.assert_array_equal(action, mean)
    assert log_propensity == pytest.approx(_closed_form_log_density(action, mean, policy.sigma), abs=1e-9)
    assert policy.log_prob(state[None, :], action[None, :])[0] == pytest.approx(log_propensity, abs=1e-9)


def test_the_shared_log_density_matches_the_closed_form_on_random_points():
    rng = np.random.default_rng(5)
    sigma = rng.uniform(0.1, 3.0, 6)
    for _ in range(20):
        mean, action = rng.normal(size=6), rng.normal(size=6) * 2
        expected = _closed_form_log_density(action, mean, sigma)
        assert gaussian.log_density(action, mean, sigma) == pytest.approx(expected, abs=1e-9)
