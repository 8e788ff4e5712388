"""Confidence intervals: clustered bootstrap (percentile and BCa) and concentration bounds.

Bootstrap. The unit is a session (every estimate is a sum of per-session terms), but what is resampled
is a cluster of sessions, by default a user's: a user's sessions share the user's tastes and history, so
on multi-day logs they are far from independent (the user-level spread of watch time is 1.6-2 times the
session-level one), and resampling sessions alone would give intervals about half as wide as they should
be. Every estimate is a ratio of column sums of per-session terms (``recsys_rl.ope.terms``), so a
resample only needs the terms' column sums weighted by how often each cluster is drawn. Counts are
Poisson(1) per cluster (the Poisson bootstrap: the same limit as multinomial resampling, but clusters are
drawn independently, so counts for a chunk of clusters can be generated and used without the others): a
chunk's counts times its terms is one matrix product, and memory stays at one chunk whatever the number
of rows. Each user group's sums are kept apart and the overall sums are the sum over groups; a cluster's
count is shared by its sessions in every group, so the overall and per-group intervals come from the
same draws; so do the intervals of every estimator and of a lift's candidate and baseline (paired),
because their terms are columns of one matrix.

BCa (Efron 1987) corrects the percentile interval for bias (z0, from the share of resamples below the
estimate) and skewness (the acceleration a, from a jackknife). A delete-one jackknife over a million
clusters would be a million estimates; instead clusters are dealt round-robin into ``JACKKNIFE_BLOCKS``
blocks and each block is left out in turn (grouped jackknife). The acceleration is a ratio of the third
to the 1.5th power of the second moment of the leave-out influences, and for blocks of m clusters both
scale the same way, so the grouped estimate targets the same a; with fewer clusters than blocks it is
exactly the delete-one jackknife.

Concentration bounds, for a mean of n independent terms known to lie in [low, high] (R = high - low),
two-sided at level 1 - alpha, alpha split evenly between the sides:

* Hoeffding: mean -/+ R sqrt(ln(2 / alpha) / (2 n))
* empirical Bernstein (Maurer & Pontil 2009, Theorem 4, applied to (x - low) / R with delta = alpha / 2):
  mean -/+ (sqrt(2 V ln(4 / alpha) / n) + 7 R ln(4 / alpha) / (3 (n - 1))), V the unbiased sample variance.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

#: Blocks of the grouped jackknife behind BCa's acceleration.
JACKKNIFE_BLOCKS = 200
#: Units per chunk of bootstrap counts (whole clusters): resamples x about this many float64 counts are
#: held at a time.
CHUNK_UNITS = 8_192
INTERVAL_METHODS = ("bca", "percentile")
#: Share of non-finite resamples beyond which an interval is refused rather than read off the rest.
MAX_DROPPED_SHARE = 0.01

_NORMAL = NormalDist()
_cdf = np.vectorize(_NORMAL.cdf, otypes=[float])
_inv_cdf = np.vectorize(_NORMAL.inv_cdf, otypes=[float])

#: A statistic maps column sums (..., M) to estimates (..., S).
Statistic = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Resampled:
    """Column sums of per-session terms over one set of sessions (a group, or all)."""

    observed: np.ndarray  # (M,)
    bootstrap: np.ndarray  # (B, M): under each bootstrap resample
    jackknife: np.ndarray  # (J, M): with each jackknife block left out


@dataclass(frozen=True)
class GroupedResamples:
    """``Resampled`` per user group, drawn once; the overall sums are their totals."""

    groups: np.ndarray  # (G,) group codes, ascending
    observed: np.ndarray  # (G, M)
    bootstrap: np.ndarray  # (G, B, M)
    blocks: np.ndarray  # (G, J, M) sums of each jackknife block
    block_sizes: np.ndarray  # (G, J) sessions per block (0 for a group with fewer sessions than blocks)

    def group(self, code: int) -> Resampled:
        g = int(np.searchsorted(self.groups, code))
        used = self.block_sizes[g] > 0
        return Resampled(self.observed[g], self.bootstrap[g], self.observed[g] - self.blocks[g][used])

    def overall(self) -> Resampled:
        total = self.observed.sum(axis=0)
        used = self.block_sizes > 0
        return Resampled(total, self.bootstrap.sum(axis=0), total - self.blocks[used])


def resample_sums(
    terms: np.ndarray,
    unit_groups: np.ndarray,
    *,
    resamples: int,
    seed: int,
    clusters: np.ndarray | None = None,
    blocks: int = JACKKNIFE_BLOCKS,
    chunk_units: int = CHUNK_UNITS,
) -> GroupedResamples:
    """Observed, bootstrap and jackknife-block column sums of ``terms`` (units, M), per group.

    ``clusters`` (units,) says what is resampled: the units of one cluster (a user's sessions) get the
    same count in every resample, whichever group each is in, and fall in one jackknife block of their
    group, so the intervals see the dependence between them; ``None`` makes every unit its own cluster.
    Seeded: the same inputs give the same resamples.
    """
    if resamples < 1:
        raise ValueError(f"resamples should be at least 1, but is {resamples}")
    codes, group_of = np.unique(unit_groups, return_inverse=True)
    cluster_of = (
        np.arange(terms.shape[0]) if clusters is None else np.unique(clusters, return_inverse=True)[1]
    )
    observed = np.zeros((codes.size, terms.shape[1]))
    block_sums = np.zeros((codes.size, blocks, terms.shape[1]))
    block_sizes = np.zeros((codes.size, blocks), dtype=np.int64)
    for g in range(codes.size):
        mine = np.flatnonzero(group_of == g)
        observed[g] = terms[mine].sum(axis=0)
        block_sums[g], block_sizes[g] = _block_sums(terms[mine], cluster_of[mine], blocks)
    boot = _poisson_sums(terms, group_of, codes.size, cluster_of, resamples, seed, chunk_units)
    return GroupedResamples(codes, observed, boot, block_sums, block_sizes)


def _block_sums(terms: np.ndarray, cluster_of: np.ndarray, blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """Column sums per jackknife block, with clusters dealt round-robin in order of first appearance, and
    how many clusters each block holds."""
    _, first, inverse = np.unique(cluster_of, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    block_of = rank[inverse] % blocks
    order = np.argsort(block_of, kind="stable")
    present, starts = np.unique(block_of[order], return_index=True)
    sums = np.zeros((blocks, terms.shape[1]))
    if present.size:
        sums[present] = np.add.reduceat(terms[order], starts, axis=0)
    return sums, np.bincount(rank % blocks, minlength=blocks)


def _poisson_sums(
    terms: np.ndarray,
    group_of: np.ndarray,
    groups: int,
    cluster_of: np.ndarray,
    resamples: int,
    seed: int,
    chunk_units: int,
) -> np.ndarray:
    """(groups, resamples, M) column sums under Poisson(1) counts per cluster (codes 0..C-1).

    Whole clusters go into chunks of about ``chunk_units`` units: a chunk's counts times its terms is one
    matrix product per group, and memory stays at one chunk however large the data.
    """
    rng = np.random.default_rng(seed)
    boot = np.zeros((groups, resamples, terms.shape[1]))
    order = np.argsort(cluster_of, kind="stable")
    cluster_starts = np.r_[np.searchsorted(cluster_of[order], np.arange(cluster_of.max() + 1)), order.size]
    edges = np.r_[
        np.unique(np.searchsorted(cluster_starts[:-1], np.arange(0, order.size, chunk_units))),
        cluster_starts.size - 1,
    ]
    for first, stop in itertools.pairwise(edges):
        rows = order[cluster_starts[first] : cluster_starts[stop]]
        counts = rng.poisson(1.0, (resamples, stop - first)).astype(np.float64)[:, cluster_of[rows] - first]
        chunk_groups = group_of[rows]
        for g in np.unique(chunk_groups):
            mine = chunk_groups == g
            boot[g] += counts[:, mine] @ terms[rows[mine]]
    return boot


@dataclass(frozen=True)
class Interval:
    value: np.ndarray  # (S,)
    low: np.ndarray  # (S,) NaN when no interval could be given
    high: np.ndarray  # (S,)
    method: str
    dropped: np.ndarray  # (S,) resamples whose estimate was not finite, left out of the quantiles


def bootstrap_interval(statistic: Statistic, sums: Resampled, method: str, alpha: float) -> Interval:
    """The estimate ``statistic(observed sums)`` with its percentile or BCa interval at level 1 - alpha.

    A resample whose estimate is not finite (it drew no session of a small group, or a ratio's baseline
    summed to 0) is left out and counted; when more than ``MAX_DROPPED_SHARE`` of them are, the interval
    is NaN: the rest would describe a different, luckier sample.
    """
    value = statistic(sums.observed)
    boot = statistic(sums.bootstrap)
    if method == "percentile":
        low, high = percentile_interval(boot, alpha)
    elif method == "bca":
        low, high = bca_interval(value, boot, statistic(sums.jackknife), alpha)
    else:
        raise ValueError(f"interval method should be one of {INTERVAL_METHODS}, but is {method!r}")
    dropped = (~np.isfinite(boot)).sum(axis=0)
    failed = dropped > MAX_DROPPED_SHARE * boot.shape[0]
    return Interval(value, np.where(failed, np.nan, low), np.where(failed, np.nan, high), method, dropped)


def percentile_interval(boot: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """alpha/2 and 1 - alpha/2 quantiles of bootstrap estimates (B, S)."""
    levels = np.full(boot.shape[1], alpha / 2)
    return _quantiles(boot, levels, 1 - levels)


def jackknife_acceleration(jack: np.ndarray) -> np.ndarray:
    """a = sum d^3 / (6 (sum d^2)^1.5), d = mean of leave-out estimates - each one; 0 when they agree.

    Non-finite leave-out estimates (a block holding all of a group's weight) are left out. The
    deviations are divided by their largest magnitude first: ``a`` does not depend on their scale, and
    cubes and 1.5 powers of raw deviations overflow or underflow at scales far from 1.
    """
    finite = np.isfinite(jack)
    count = finite.sum(axis=0)
    mean = np.where(finite, jack, 0.0).sum(axis=0) / np.maximum(count, 1)
    d = np.where(finite, mean - jack, 0.0)
    largest = np.abs(d).max(axis=0)
    d = d / np.where(largest > 0, largest, 1.0)
    second = (d**2).sum(axis=0)
    third = (d**3).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(second > 0, third / (6.0 * second**1.5), 0.0)


def bias_correction(value: np.ndarray, boot: np.ndarray) -> np.ndarray:
    """z0 = Phi^-1(share of resamples below the estimate, ties counting half), kept within the resamples'
    resolution (share in [1/(2B), 1 - 1/(2B)]) so an estimate outside every resample stays finite."""
    finite = np.isfinite(boot)
    resamples = np.maximum(finite.sum(axis=0), 1)
    below = ((boot < value) & finite).sum(axis=0) + 0.5 * ((boot == value) & finite).sum(axis=0)
    share = np.clip(below / resamples, 0.5 / resamples, 1 - 0.5 / resamples)
    return _inv_cdf(share)


def bca_interval(
    value: np.ndarray, boot: np.ndarray, jack: np.ndarray, alpha: float
) -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap quantiles at the BCa levels Phi(z0 + (z0 + z) / (1 - a (z0 + z))) for z = Phi^-1(alpha/2) and
    Phi^-1(1 - alpha/2)."""
    z0 = bias_correction(value, boot)
    a = jackknife_acceleration(jack)
    levels = []
    for z in (_NORMAL.inv_cdf(alpha / 2), _NORMAL.inv_cdf(1 - alpha / 2)):
        shifted = z0 + z
        # a (z0 + z) >= 1 only for absurd skew; the level then goes to the far end it tends to
        denominator = np.maximum(1.0 - a * shifted, 1e-12)
        levels.append(_cdf(z0 + shifted / denominator))
    return _quantiles(boot, levels[0], levels[1])


def _quantiles(boot: np.ndarray, low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per column s, the low[s] and high[s] quantiles of its finite bootstrap estimates (NaN if none).

    A resample can be non-finite when it draws no session of a small group, or when a ratio's baseline is 0.
    """
    out_low = np.full(boot.shape[1], np.nan)
    out_high = np.full(boot.shape[1], np.nan)
    for s in range(boot.shape[1]):
        column = boot[:, s][np.isfinite(boot[:, s])]
        if column.size:
            out_low[s], out_high[s] = np.quantile(column, [low[s], high[s]])
    return out_low, out_high


def hoeffding_interval(
    values: np.ndarray, low: np.ndarray, high: np.ndarray, alpha: float
) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided Hoeffding interval for the mean of terms (n, S) within [low, high] (S,)."""
    n = values.shape[0]
    half = (high - low) * math.sqrt(math.log(2 / alpha) / (2 * n))
    mean = values.mean(axis=0)
    return mean - half, mean + half


def empirical_bernstein_interval(
    values: np.ndarray, low: np.ndarray, high: np.ndarray, alpha: float
) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided empirical-Bernstein interval (Maurer & Pontil) for the mean of terms (n, S), n >= 2."""
    n = values.shape[0]
    if n < 2:
        raise ValueError("the empirical Bernstein bound needs at least 2 terms")
    log_term = math.log(4 / alpha)
    variance = values.var(axis=0, ddof=1)
    half = np.sqrt(2 * variance * log_term / n) + 7 * (high - low) * log_term / (3 * (n - 1))
    mean = values.mean(axis=0)
    return mean - half, mean + half
