"""Decisions are a function of (state, seed): the per-thread generator draws the same for the same seed."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from recsys_rl.serving.policies import feed_fallback, request_seed, seeded_generator
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
