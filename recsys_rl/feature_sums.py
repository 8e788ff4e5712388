"""Exact per-day sums of view facts, and the feature values they give: one arithmetic for two users.

The feature pipeline (``recsys_rl.pipelines.feature_aggregates``) sums every entity's day through these
functions, and so does the simulator's copy of the store (``recsys_rl.sim.stored_features``), which
therefore holds the very floats the pipeline writes and serving reads. No Beam here: the simulator
imports it.

Fixed point: sums of integer micro-units are exact in any order of addition, so any runner and bundling
give the same bits, and int / int (correctly rounded in Python) turns them back into rates exact to
that resolution.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from recsys_rl.feature_tables import AUTHOR_STATS, ITEM_STATS, USER_ENGAGEMENT, FeatureTable

_ONE = 1_000_000  # micro-units: small integers keep the per-view arithmetic on Python's fast path


def _exact(values: list[float]) -> np.ndarray:
    """``round(value * _ONE)`` of each value as int64: the same IEEE product, rounded half to even.

    Exact below 2**53 micro-units (about nine billion seconds); the pipeline validates signals far
    below that, and sums stay in int64 for hundreds of millions of views per entity and day.
    """
    array = np.asarray(values)
    if array.dtype.kind in "iu":
        return array.astype(np.int64) * _ONE
    scaled = np.multiply(array, _ONE, dtype=np.float64)  # in place from here: a simulated day is 8 x 500k
    if not (scaled.size == 0 or -(2.0**53) < scaled.min() <= scaled.max() < 2.0**53):  # NaN fails too
        raise ValueError(f"view fact signals should be below {2**53 / _ONE:g}, but hold {values!r}")
    return np.rint(scaled, out=scaled).astype(np.int64)


def _ratio(numerator, denominator):
    """A rate, None without a denominator; on int64 columns (the simulator's whole day at once) NaN
    there instead. Both are the same correctly rounded quotient: sums stay below 2**53, where int64 to
    float64 is exact and IEEE division rounds as Python's int / int does."""
    if isinstance(denominator, np.ndarray):
        return np.divide(
            numerator, denominator, out=np.full(denominator.shape, np.nan), where=denominator != 0
        )
    return numerator / denominator if denominator else None


def _count(micro):
    return micro // _ONE


def user_increments(columns: Mapping[str, Sequence], live: np.ndarray) -> np.ndarray:
    """(n, 8) exact increments (scaled by _ONE) of each view fact to its user's day, USER_ENGAGEMENT's sums.

    ``columns`` holds the facts' signals field by field, ``live`` whether each is a live-stream view.
    Feed engagement is measured on short-video views, live engagement on live views. The simulator's
    copy of the store (``recsys_rl.sim.stored_features``) sums its views through this too.
    """
    return _user_sums(_exact_signals(columns), live)


def _exact_signals(columns: Mapping[str, Sequence]) -> dict[str, np.ndarray]:
    return {name: _exact(columns[name]) for name in _USED_SIGNALS}


def _user_sums(signal: Mapping[str, np.ndarray], live: np.ndarray) -> np.ndarray:
    video = ~live
    interactions = signal["like"] + signal["follow"] + signal["comment"] + signal["share"]
    by_video = (_ONE, signal["click"], signal["like"], signal["watch_time_s"], interactions, signal["hate"])
    # written sum by sum into one array: stacking temporaries cost twice the time on a simulated day; each
    # sum's column is contiguous (the result is the transpose of a row per sum), so that writing it here and
    # summing it per user by bincount in the simulator read and write no strided memory (18 of 80 ms a day)
    out = np.empty((len(by_video) + 2, live.size), np.int64)
    for j, column in enumerate(by_video):
        np.multiply(column, video, out=out[j])
    np.multiply(_ONE, live, out=out[-2])
    np.multiply(signal["live_watch_s"], live, out=out[-1])
    return out.T


def increments(columns: Mapping[str, list]) -> tuple[np.ndarray, ...]:
    """The exact increments each view fact adds to its user's, item's and author's day, in
    ``AGGREGATIONS`` order: one row per fact, one column per sum of the table."""
    signal = _exact_signals(columns)
    one = np.full(signal["click"].size, _ONE, dtype=np.int64)
    # the contract zeroes one of the two watches
    item_watch = signal["watch_time_s"] + signal["live_watch_s"]
    item = np.stack([one, signal["click"], item_watch, signal["like"], signal["hate"]], axis=1)
    author = np.stack([one, signal["follow"]], axis=1)
    live = np.array([item_type == "live" for item_type in columns["item_type"]], dtype=bool)
    return _user_sums(signal, live), item, author


_USED_SIGNALS = ("watch_time_s", "click", "like", "follow", "comment", "share", "hate", "live_watch_s")
FACT_COLUMNS = ("user_id", "item_id", "author_id", "item_type", "event_time_ms", *_USED_SIGNALS)


# The feature values of one entity's day from its sums (in the order of ``increments``' columns); for
# users, also of many users' days at once from the sums' int64 columns.
def user_features(s: Sequence[int] | Sequence[np.ndarray], day: int | np.ndarray) -> dict[str, Any]:
    views, clicks, likes, watch, interactions, hates, live_views, live_watch = s
    return {
        "day": day,
        "views": _count(views),
        "click_rate": _ratio(clicks, views),
        "like_rate": _ratio(likes, views),
        "watch_s_per_view": _ratio(watch, views),
        "interaction_rate": _ratio(interactions, views),
        "hate_rate": _ratio(hates, views),
        "live_views": _count(live_views),
        "live_watch_s_per_live_view": _ratio(live_watch, live_views),
    }


def _item_features(s: Sequence[int], day: int) -> dict[str, Any]:
    views, clicks, watch, likes, hates = s
    return {
        "views": _count(views),
        "click_rate": _ratio(clicks, views),
        "watch_s_per_view": _ratio(watch, views),
        "like_rate": _ratio(likes, views),
        "hate_rate": _ratio(hates, views),
    }


def _author_features(s: Sequence[int], day: int) -> dict[str, Any]:
    views, follows = s
    return {"views": _count(views), "follow_rate": _ratio(follows, views)}


@dataclass(frozen=True)
class Aggregation:
    table: FeatureTable
    features: Callable[[Sequence[int], int], dict[str, Any]]


# in the order of ``increments``' results
AGGREGATIONS = (
    Aggregation(USER_ENGAGEMENT, user_features),
    Aggregation(ITEM_STATS, _item_features),
    Aggregation(AUTHOR_STATS, _author_features),
)
