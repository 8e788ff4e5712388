"""Keyed draws: uniform, independent across keys and purposes, and a pure function of the key."""

import numpy as np
import pytest

from recsys_rl.sim.draws import KeyedDraws, KeyedExploration, Purpose


def _draws(seed: int = 0) -> KeyedDraws:
    return KeyedDraws(np.random.SeedSequence(seed))


def test_a_draw_is_a_function_of_its_key_alone():
    draws = _draws()
    rows = draws.rows(np.arange(50), np.full(50, 3))
    once = draws.uniform(rows, Purpose.EXIT, (6,))
    # the same rows in another order and batch give the same numbers, row by row
    again = draws.uniform(rows[::-1][:20], Purpose.EXIT, (6,))
    np.testing.assert_array_equal(again, once[::-1][:20])
    assert not np.array_equal(
        once, _draws(1).uniform(_draws(1).rows(np.arange(50), np.full(50, 3)), Purpose.EXIT, (6,))
    )


def test_uniforms_are_uniform_and_purposes_and_positions_independent():
    draws = _draws(2)
    rows = draws.rows(np.arange(20_000), np.zeros(20_000, np.int64))
    u = draws.uniform(rows, Purpose.VIDEO_RESPONSE, (3,))
    assert u.min() > 0.0 and u.max() < 1.0
    counts = np.histogram(u[:, 0], bins=10, range=(0, 1))[0]
    assert np.all(np.abs(counts - 2000) < 4 * np.sqrt(2000))
    other = draws.uniform(rows, Purpose.EXIT, (3,))
    for a, b in ((u[:, 0], u[:, 1]), (u[:, 0], other[:, 0])):
        assert abs(np.corrcoef(a, b)[0, 1]) < 0.03
    # neighbouring keys (user 0 day 1 against user 1 day 0) are unrelated too
    swapped = draws.uniform(
        draws.rows(np.zeros(20_000, np.int64), np.arange(20_000)), Purpose.VIDEO_RESPONSE, (3,)
    )
    assert abs(np.corrcoef(u[:, 0], swapped[:, 0])[0, 1]) < 0.03


def test_normals_and_poisson_counts_have_their_moments():
    draws = _draws(3)
    rows = draws.rows(np.arange(40_000))
    z = draws.normal(rows, Purpose.PREDICTION_NOISE, (3,))
    assert z.shape == (40_000, 3)
    assert abs(z.mean()) < 0.02 and abs(z.std() - 1.0) < 0.02
    mean = np.where(np.arange(40_000) % 2 == 0, 2.0, 0.1)
    counts = draws.poisson(rows, Purpose.EXTRA_SESSIONS, mean)
    for m in (2.0, 0.1):
        picked = counts[mean == m]
        assert picked.mean() == pytest.approx(m, abs=4 * np.sqrt(m / picked.size))
        assert picked.var() == pytest.approx(m, rel=0.1)


def test_a_policys_exploration_is_drawn_per_row_and_anew_on_each_call():
    draws = _draws(3)
    rows = draws.rows(np.arange(40), np.full(40, 1))

    def explore(subset):
        rng = KeyedExploration(draws, rows[subset], Purpose.FEED_EXPLORATION)
        return rng.standard_normal((subset.size, 4)), rng.random(subset.size)

    normals, uniforms = explore(np.arange(40))
    # a row's exploration whatever the other rows of its page
    part = np.arange(10, 30, 3)
    np.testing.assert_array_equal(explore(part)[0], normals[part])
    np.testing.assert_array_equal(explore(part)[1], uniforms[part])
    # a second call draws new numbers, not the first call's again
    rng = KeyedExploration(draws, rows, Purpose.FEED_EXPLORATION)
    first, second = rng.random((40, 4)), rng.random((40, 4))
    assert np.abs(first - second).min() > 0.0
    assert normals.dtype == np.float64 and abs(normals.mean()) < 0.3


def test_exploration_that_is_not_per_row_is_refused_by_name():
    rng = KeyedExploration(_draws(), _draws().rows(np.arange(5)), Purpose.ALLOCATION_EXPLORATION)
    with pytest.raises(
        ValueError, match="per row: size should start with the page's 5 rows, but is \\(1000,\\)"
    ):
        rng.standard_normal(1000)
    with pytest.raises(ValueError, match="page's 5 rows, but is \\(\\)"):
        rng.random()  # one number for the whole page
