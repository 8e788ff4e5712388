"""Random numbers keyed by whose and which draw they are: common random numbers across policies.

Two policies compared on one world should differ only by what the policies do. With one shared
generator they do not: as soon as one user's session is a page longer under one policy, every later draw
of every other user shifts, and the paired difference between the runs is as noisy as two independent
runs. Here every draw is a hash of the episode key, the row it belongs to (a user's day, session and page)
and its purpose and position, so a user whose page is the same under both policies gets the same clicks,
exits and next-day return draw, and a user whose page differs gets draws for the same positions: the
variance reduction of common random numbers (Glasserman & Yao, 1992), applied per user as in
counter-based generators (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011).

The hash is SplitMix64's finaliser (Steele, Lea & Flood, OOPSLA 2014): one multiply-xorshift pass per
number, vectorised over numpy uint64 arrays (their multiplication wraps modulo 2^64, as the mix needs).
"""

from __future__ import annotations

import enum
import math
import sys

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


class Purpose(enum.IntEnum):
    """What a draw decides; each has its own numbers for the same row."""

    RETURN = 1
    EXTRA_SESSIONS = 2
    SESSION_HOUR = 3
    CANDIDATE_TOPIC = 4
    CANDIDATE_VIDEO = 5
    FOLLOWED_VIDEO = 7
    PREDICTION_NOISE = 8
    LIVE_OFFERED = 9
    LIVE_ID = 10
    LIVE_PREDICTION_NOISE = 11
    VIDEO_RESPONSE = 12
    LIVE_RESPONSE = 13
    EXIT = 14
    FEED_EXPLORATION = 15
    ALLOCATION_EXPLORATION = 16


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a bijection of uint64 whose output bits all depend on every input bit.

    Mixes ``x`` in place (callers pass a fresh array) and returns it: the draws hash millions of numbers
    a simulated day, and each operation allocating its result doubled the time."""
    shifted = x >> _S30
    x ^= shifted
    x *= _M1
    np.right_shift(x, _S27, out=shifted)
    x ^= shifted
    x *= _M2
    np.right_shift(x, _S31, out=shifted)
    x ^= shifted
    return x


def _box_muller(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """(n, 2h) normals from (n, h) uint32 bits: uniforms (bits + 1/2) / 2^32, a radius from ``low`` and an
    angle from ``high``, the cosines in the first h columns, the sines in the last (float32, in place).
    The half keeps the radius finite at bits 0."""
    half = low.shape[1]
    radius = low.astype(np.float32)
    radius += np.float32(0.5)
    radius *= np.float32(2.0**-32)
    np.log(radius, out=radius)
    radius *= np.float32(-2.0)
    np.sqrt(radius, out=radius)
    angle = high.astype(np.float32)
    angle += np.float32(0.5)
    angle *= np.float32(2.0**-32)
    angle *= np.float32(2.0 * np.pi)
    z = np.empty((low.shape[0], 2 * half), np.float32)
    np.cos(angle, out=z[:, :half])
    np.sin(angle, out=z[:, half:])
    z[:, :half] *= radius
    z[:, half:] *= radius
    return z


class KeyedDraws:
    """Uniforms, normals and friends as functions of (episode key, row key, purpose, position)."""

    def __init__(self, seed: np.random.SeedSequence) -> None:
        self._key = np.uint64(seed.generate_state(1, np.uint64)[0])

    def rows(self, *parts: np.ndarray) -> np.ndarray:
        """(n,) row keys from integer arrays (user, day, session, page...), each part mixed in turn (numpy's
        array arithmetic wraps modulo 2^64 without a warning)."""
        key = np.full(np.shape(parts[0]), self._key, np.uint64)
        for part in parts:
            key = _mix(key + np.asarray(part).astype(np.uint64) * _GOLDEN)
        return key

    def _bits(self, rows: np.ndarray, purpose: Purpose, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Two (n, ceil(count / 2)) uint32 arrays of random bits: the low and the high halves of every hash
        (read in place, as a view: splitting them arithmetically cost more than the hash itself)."""
        positions = np.arange(-(-count // 2), dtype=np.uint64) + np.uint64(int(purpose) << 32)
        hashes = _mix(rows.reshape(-1, 1) ^ _mix(positions * _GOLDEN)[None, :])
        halves = hashes.view(np.uint32).reshape(*hashes.shape, 2)
        low, high = (0, 1) if sys.byteorder == "little" else (1, 0)
        return halves[..., low], halves[..., high]

    def uniform(self, rows: np.ndarray, purpose: Purpose, shape: tuple[int, ...] = ()) -> np.ndarray:
        """(n, *shape) uniforms in (0, 1) with 32-bit resolution: one per row and position of ``shape``."""
        count = math.prod(shape)
        low, high = self._bits(rows, purpose, count)
        out = np.empty((rows.size, 2 * low.shape[1]))
        np.add(low, 0.5, out=out[:, : low.shape[1]])
        np.add(high, 0.5, out=out[:, low.shape[1] :])
        out *= 2.0**-32
        return out[:, :count].reshape(rows.shape + shape)

    def normal(self, rows: np.ndarray, purpose: Purpose, shape: tuple[int, ...] = ()) -> np.ndarray:
        """(n, *shape) standard normals by Box-Muller (float32 arithmetic, in place), both of each pair
        used: the cosine ones first, then the sine ones."""
        count = math.prod(shape)
        return _box_muller(*self._bits(rows, purpose, count))[:, :count].reshape(rows.shape + shape)

    def poisson(self, rows: np.ndarray, purpose: Purpose, mean: np.ndarray) -> np.ndarray:
        """(n,) Poisson counts with per-row ``mean`` by inverting the distribution function."""
        u = self.uniform(rows, purpose)
        term = np.exp(-np.asarray(mean, np.float64))
        cdf, count = term.copy(), np.zeros(rows.shape, np.int64)
        for k in range(1, _POISSON_TERMS):
            above = u > cdf
            if not above.any():
                break
            count += above
            term = term * mean / k
            cdf = cdf + term
        return count


class KeyedExploration:
    """What a policy explores with on a page (``recsys_rl.exploration.Exploration``): the two methods of
    numpy's ``Generator`` the project's policies draw from (``random`` and ``standard_normal``), keyed by
    the page's rows.

    The users' draws being keyed was not enough for common random numbers: a stochastic policy (the
    behaviour's Gaussian fusion, its Bernoulli live allocation) drew from one shared generator, so one
    user's longer session shifted every later user's exploration. At 4,000 users over two days, giving half
    of them another fusion changed the totals of 55% of the other half, and a per-user difference between
    two runs carried that noise. Keyed, a row's exploration depends on its own row alone. A policy must
    draw per row (the first dimension of ``size`` is the page's rows); each call gets its own numbers.
    """

    def __init__(self, draws: KeyedDraws, rows: np.ndarray, purpose: Purpose) -> None:
        self._draws, self._rows, self._purpose = draws, rows, purpose
        self._calls = 0

    def random(self, size: int | tuple[int, ...] | None = None) -> np.ndarray:
        keys, shape = self._call(size)
        return self._draws.uniform(keys, self._purpose, shape)

    def standard_normal(self, size: int | tuple[int, ...] | None = None) -> np.ndarray:
        keys, shape = self._call(size)
        return self._draws.normal(keys, self._purpose, shape).astype(np.float64)

    def _call(self, size: int | tuple[int, ...] | None) -> tuple[np.ndarray, tuple[int, ...]]:
        """This call's row keys and the shape of each row's draws."""
        shape = () if size is None else tuple(np.atleast_1d(size).tolist())
        if not shape or shape[0] != self._rows.size:
            raise ValueError(
                f"exploration is drawn per row: size should start with the page's {self._rows.size} "
                f"rows, but is {shape}"
            )
        self._calls += 1
        return self._draws.rows(self._rows, np.full(self._rows.size, self._calls)), shape[1:]


#: Enough terms for the means a simulator uses (a few sessions per day): the tail beyond is below 1e-15.
_POISSON_TERMS = 40
