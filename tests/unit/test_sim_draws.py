"""Keyed draws: uniform, independent across keys and purposes, and a pure function of the key."""

import math

import numpy as np
import pytest

from recsys_rl.sim.draws import KeyedDraws, KeyedExploration, Purpose, _box_muller


def _draws(seed: int = 0) -> KeyedDraws:
    return KeyedDraws(np.random.SeedSequence(seed))


# The documented construction, again in plain Python integers (module docstring): SplitMix64's finaliser
# (Steele, Lea & Flood, 2014), a row key mixed from its parts in turn, and per purpose and position one
# 64-bit hash whose low and high halves are two 32-bit draws. The logs of every committed result depend
# on these exact numbers.
_MASK = 2**64 - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _splitmix_finaliser(x: int) -> int:
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _row_key(seed: int, *parts: int) -> int:
    key = int(np.random.SeedSequence(seed).generate_state(1, np.uint64)[0])
    for part in parts:
        key = _splitmix_finaliser((key + (part % 2**64) * _GOLDEN) & _MASK)
    return key


def _bits(row: int, purpose: Purpose, count: int) -> list[int]:
    """The row's ``count`` 32-bit draws: the low halves of ceil(count / 2) hashes, then their high halves."""
    hashes = [
        _splitmix_finaliser(row ^ _splitmix_finaliser(((j + (purpose << 32)) * _GOLDEN) & _MASK))
        for j in range(-(-count // 2))
    ]
    return ([h & 0xFFFFFFFF for h in hashes] + [h >> 32 for h in hashes])[:count]


def test_draws_are_the_documented_hash_of_episode_row_purpose_and_position():
    draws = _draws(7)
    users, days = np.array([0, 1, 12_345, 2**40]), np.array([0, 3, 2, 1])
    rows = draws.rows(users, days)
    assert rows.dtype == np.uint64
    assert rows.tolist() == [_row_key(7, int(u), int(d)) for u, d in zip(users, days, strict=True)]
    for count in (1, 6, 7):
        uniforms = draws.uniform(rows, Purpose.EXIT, (count,))
        expected = [[(b + 0.5) * 2.0**-32 for b in _bits(r, Purpose.EXIT, count)] for r in rows.tolist()]
        np.testing.assert_array_equal(uniforms, expected)
    normals = draws.normal(rows, Purpose.PREDICTION_NOISE, (5,))
    assert normals.dtype == np.float32
    for row, z in zip(rows.tolist(), normals, strict=True):
        uniforms = (np.array(_bits(row, Purpose.PREDICTION_NOISE, 6), np.float64) + 0.5) * 2.0**-32
        radius, angle = np.sqrt(-2.0 * np.log(uniforms[:3])), 2.0 * np.pi * uniforms[3:]
        box_muller = np.r_[radius * np.cos(angle), radius * np.sin(angle)]
        np.testing.assert_allclose(z, box_muller[:5], atol=2e-5)


def test_normals_stay_finite_and_exact_at_the_extreme_bits():
    """Bits 0 give the largest radius, sqrt(2 * 33 ln 2), and the smallest angle, 2 pi / 2^33: the half
    added to the bits is what keeps the first finite and the second above 0."""
    z = _box_muller(np.array([[0]], np.uint32), np.array([[0]], np.uint32))
    radius = math.sqrt(66.0 * math.log(2.0))
    np.testing.assert_allclose(z[0], [radius, radius * math.sin(2.0 * math.pi * 2.0**-33)], rtol=1e-5)


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
    assert first.shape == (40, 4) and np.abs(first - second).min() > 0.0
    # the n-th call of a page draws with its rows keyed again by n, from 1
    for call, drawn in enumerate((first, second), start=1):
        keys = draws.rows(rows, np.full(40, call))
        np.testing.assert_array_equal(drawn, draws.uniform(keys, Purpose.FEED_EXPLORATION, (4,)))
    assert normals.dtype == np.float64 and abs(normals.mean()) < 0.3


def test_exploration_that_is_not_per_row_is_refused_by_name():
    rng = KeyedExploration(_draws(), _draws().rows(np.arange(5)), Purpose.ALLOCATION_EXPLORATION)
    with pytest.raises(
        ValueError, match="per row: size should start with the page's 5 rows, but is \\(1000,\\)"
    ):
        rng.standard_normal(1000)
    with pytest.raises(ValueError, match="page's 5 rows, but is \\(\\)"):
        rng.random()  # one number for the whole page
