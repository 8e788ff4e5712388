"""The state vectors policies see, and the one set of formulas that builds them, for the simulator and
serving.

A state is built from two things only: the user's rows in the feature store (``StoredUserFeatures``) and
the request's context (``RequestContexts``). The simulator's behaviour policies and the live client call
``feed_states`` with those, a batch at a time; the server calls ``feed_state`` for its one request, the
same formulas on Python numbers (they agree to the bit). So a state cannot depend on who built it: the
simulator keeps its hidden truths (interests, sensitivities, the exit and return hazards) for the
responses only.

The decision log records the exact vector a policy saw together with these names and FEATURE_VERSION,
so training reads what serving used (feature logging); change the version with any change here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

import numpy as np

#: v2: the activity group comes from the user table, not from earlier states; history is the last
#: finished day's and expires after ENGAGEMENT_TTL_DAYS; the hour is the request's logged time.
FEATURE_VERSION = "state-v2"

#: Activity groups, in KuaiRand's ``user_active_degree`` order; a user's group id is the index.
ACTIVITY_GROUPS: tuple[str, ...] = ("high_active", "full_active", "middle_active", "low_active_or_unknown")
#: The group of a user the user table does not know: KuaiRand's "low active or unknown".
UNKNOWN_GROUP = len(ACTIVITY_GROUPS) - 1

#: State of a feed-ranking request: who the user is (group, logged history) and where they are.
FEED_STATE_FEATURES: tuple[str, ...] = (
    *(f"group_{name}" for name in ACTIVITY_GROUPS),
    "hist_click_rate",
    "hist_watch_per_view",  # seconds / 10
    "hist_interaction_rate",  # (likes + follows + comments + shares) per view, x10
    "hist_live_watch",  # live seconds per live view / 60
    "returned_yesterday",
    "page_index",  # / 10
    "session_watch",  # seconds watched so far in the session / 100
    "last_page_click_rate",
    "hour_sin",
    "hour_cos",
)

#: State of a live-allocation decision: the feed state plus the upstream predictions for the live
#: candidate and for the video it would displace, each divided by its typical value.
LIVE_STATE_FEATURES: tuple[str, ...] = (
    *FEED_STATE_FEATURES,
    "pred_live_watch_time",
    "pred_gift",
    "pred_video_watch_displaced",
)
#: Typical values of the live-state predictions (live watch s, gift, displaced video watch s).
LIVE_PREDICTION_SCALE = np.array([30.0, 0.1, 13.0])

#: Pseudo-counts at typical rates: a new user's history features are sensible before any history exists,
#: instead of 0/0.
PRIOR_VIEWS = 20.0
PRIOR_CLICK_RATE = 0.45
PRIOR_WATCH_PER_VIEW_S = 13.0
PRIOR_INTERACTION_RATE = 0.02

#: How long a user's engagement row describes them: the ttl of the Feast view that holds it. The state
#: applies it itself because Feast applies it to point-in-time reads only; an online read returns a row
#: of any age, and serving would otherwise see history that training's point-in-time join calls absent.
ENGAGEMENT_TTL_DAYS = 7

DAY_MS = 86_400_000


@dataclass(frozen=True)
class StoredUserFeatures:
    """Users' rows in the feature store, one array element per user (or per request).

    Nulls as the store has them: ``activity_group`` is UNKNOWN_GROUP without a user-table row; ``day``
    is -1 without an engagement row (and the counts are then 0); a rate is NaN for a day without a view
    of its kind. ``known`` tells a user the store has no row of at all from one whose account says
    "low active or unknown".
    """

    known: np.ndarray  # bool: the store has a user-table or an engagement row of the user
    activity_group: np.ndarray  # int64
    day: np.ndarray  # int64: the UTC day (days since 1970-01-01) the engagement row covers; -1: none
    views: np.ndarray  # int64: short-video views that day
    click_rate: np.ndarray  # float64
    watch_s_per_view: np.ndarray
    interaction_rate: np.ndarray
    live_views: np.ndarray  # int64
    live_watch_s_per_live_view: np.ndarray

    @classmethod
    def unknown(cls, n: int) -> StoredUserFeatures:
        """What a state knows about users the store could not tell it about: nothing."""
        fill = {"activity_group": UNKNOWN_GROUP, "day": -1, "views": 0, "live_views": 0}
        columns = {
            f.name: np.full(n, fill[f.name], np.int64) if f.name in fill else np.full(n, np.nan)
            for f in fields(cls)
        }
        return cls(**{**columns, "known": np.zeros(n, bool)})

    @cached_property
    def user_columns(self) -> np.ndarray:
        """(n, 8) read-only: each user's group one-hot and history features, as they are while the
        engagement row counts (``feed_states`` puts the priors in their place when it does not).

        Computed once per set of rows: a server answers all of a user's requests from the same cached
        rows, and this is most of a state's numpy calls, which cost more than their arithmetic.
        """
        n = self.activity_group.shape[0]
        group = np.minimum(np.maximum(self.activity_group, 0), UNKNOWN_GROUP)  # np.clip: 10x the overhead
        columns = np.zeros((n, _GROUPS + 4))
        columns[np.arange(n), group] = 1.0
        rates = np.stack(
            [self.click_rate, self.watch_s_per_view, self.interaction_rate, self.live_watch_s_per_live_view],
            axis=1,
        )
        views = np.stack([self.views, self.views, self.views, self.live_views], axis=1)
        # a day's total is its rate times its views; nothing for a null rate
        columns[:, _HISTORY] = _history(np.where(np.isnan(rates), 0.0, rates * views), views)
        columns.flags.writeable = False
        return columns

    @classmethod
    def from_records(cls, records: Sequence[Mapping[str, Any]]) -> StoredUserFeatures:
        """Rows as Feast returns them (online or point in time), with None, NaN or pandas NA for null."""

        def column(name: str, null: float, dtype) -> np.ndarray:
            return np.array([null if _missing(r.get(name)) else r[name] for r in records], dtype=dtype)

        return cls(
            known=~(_nulls(records, "activity_group") & _nulls(records, "day")),
            activity_group=column("activity_group", UNKNOWN_GROUP, np.int64),
            day=column("day", -1, np.int64),
            views=column("views", 0, np.int64),
            click_rate=column("click_rate", np.nan, np.float64),
            watch_s_per_view=column("watch_s_per_view", np.nan, np.float64),
            interaction_rate=column("interaction_rate", np.nan, np.float64),
            live_views=column("live_views", 0, np.int64),
            live_watch_s_per_live_view=column("live_watch_s_per_live_view", np.nan, np.float64),
        )

    def take(self, index) -> StoredUserFeatures:
        return StoredUserFeatures(**{f.name: getattr(self, f.name)[index] for f in fields(self)})


def _nulls(records: Sequence[Mapping[str, Any]], name: str) -> np.ndarray:
    return np.array([_missing(r.get(name)) for r in records], dtype=bool)


def _missing(value: Any) -> bool:
    if value is None:
        return True
    try:
        return bool(value != value)  # NaN and pandas NA
    except TypeError:
        return True


@dataclass(frozen=True)
class RequestContexts:
    """What a request says about itself (``serving.proto``'s RequestContext), one element per request."""

    time_ms: np.ndarray  # int64: the request's event time
    page_index: np.ndarray
    session_watch_s: np.ndarray  # short-video seconds watched so far in the session
    last_page_click_rate: np.ndarray
    utc_offset_minutes: np.ndarray  # the user's local time minus UTC

    def take(self, index) -> RequestContexts:
        return RequestContexts(**{f.name: getattr(self, f.name)[index] for f in fields(self)})


#: The history features are one (n, 4) block: a total per view of its kind, its prior's pseudo-total
#: added, over the views plus the prior's pseudo-views, then scaled. By column: click rate, watch per
#: view (s / 10), interaction rate (x 10), live watch per live view (s / 60; its prior: one view of 0 s).
_PSEUDO_TOTALS = PRIOR_VIEWS * np.array(
    [PRIOR_CLICK_RATE, PRIOR_WATCH_PER_VIEW_S, PRIOR_INTERACTION_RATE, 0.0]
)
_PSEUDO_VIEWS = np.array([PRIOR_VIEWS, PRIOR_VIEWS, PRIOR_VIEWS, 1.0])
# divided, then multiplied: x / 1.0 and x * 1.0 are x exactly, so each column is rounded as its own
# formula rounds it (x * 10.0 and x / 0.1 are not the same float)
_DIVIDE_BY = np.array([1.0, 10.0, 1.0, 60.0])
_MULTIPLY_BY = np.array([1.0, 1.0, 10.0, 1.0])


def _history(totals: np.ndarray, views: np.ndarray) -> np.ndarray:
    return (totals + _PSEUDO_TOTALS) / (views + _PSEUDO_VIEWS) / _DIVIDE_BY * _MULTIPLY_BY


#: The history features of a user whose engagement row does not count: the priors alone.
_PRIOR_HISTORY = _history(np.zeros(4), np.zeros(4, np.int64))
_PRIOR_HISTORY.flags.writeable = False

_GROUPS = len(ACTIVITY_GROUPS)
_HISTORY = slice(_GROUPS, _GROUPS + 4)
_CONTEXT = slice(_GROUPS + 4, None)  # returned_yesterday and what ``_request_columns`` gives, in order


def _engagement_counts(day, time_ms):
    """(whether the engagement row counts, whether the user returned yesterday), for arrays or Python
    ints alike: the row counts when its day has ended before the request and it is younger than
    ENGAGEMENT_TTL_DAYS, as Feast's point-in-time join reads it."""
    row_end_ms = (day + 1) * DAY_MS
    counts = (day >= 0) & (row_end_ms <= time_ms) & (time_ms - row_end_ms <= ENGAGEMENT_TTL_DAYS * DAY_MS)
    return counts, counts & (day == time_ms // DAY_MS - 1)


def _request_columns(time_ms, page_index, session_watch_s, last_page_click_rate, utc_offset_minutes):
    """page_index, session_watch, last_page_click_rate, hour_sin, hour_cos, for arrays or Python numbers
    alike (IEEE arithmetic and numpy's sine give the same floats either way: the batch and the single
    request agree to the bit, which tests/unit/test_state.py checks)."""
    local_s = time_ms / 1000.0 + utc_offset_minutes * 60.0
    angle = 2.0 * np.pi * ((local_s / 3600.0) % 24.0) / 24.0
    return page_index / 10.0, session_watch_s / 100.0, last_page_click_rate, np.sin(angle), np.cos(angle)


def feed_states(users: StoredUserFeatures, requests: RequestContexts) -> np.ndarray:
    """(n, len(FEED_STATE_FEATURES)) float32: the state of each request from its user's stored rows (the
    simulator's batches; a server's single requests go through ``feed_state``, the same formulas)."""
    time_ms = np.asarray(requests.time_ms, np.int64)
    counts, returned = _engagement_counts(users.day, time_ms)
    states = np.empty((time_ms.shape[0], len(FEED_STATE_FEATURES)))
    states[:, : _GROUPS + 4] = users.user_columns
    states[~counts, _HISTORY] = _PRIOR_HISTORY
    states[:, _CONTEXT] = np.column_stack(
        [
            returned,
            *_request_columns(
                time_ms,
                np.asarray(requests.page_index),
                np.asarray(requests.session_watch_s),
                np.asarray(requests.last_page_click_rate),
                np.asarray(requests.utc_offset_minutes),
            ),
        ]
    )
    return states.astype(np.float32)


def feed_state(
    user: StoredUserFeatures,
    time_ms: int,
    page_index: int,
    session_watch_s: float,
    last_page_click_rate: float,
    utc_offset_minutes: int,
) -> np.ndarray:
    """The state of one request (``user``: its user's one row), as ``feed_states`` builds it, on Python
    numbers: a server's request costs three numpy calls here instead of thirty, and in a busy server
    each numpy call costs several microseconds (cold caches), so the state was a sixth of its CPU."""
    counts, returned = _engagement_counts(int(user.day[0]), time_ms)
    columns = user.user_columns[0]
    history = columns[_HISTORY] if counts else _PRIOR_HISTORY
    request = _request_columns(time_ms, page_index, session_watch_s, last_page_click_rate, utc_offset_minutes)
    return np.array([*columns[:_GROUPS], *history, returned, *request], np.float32)


def live_states(feed: np.ndarray, predictions: np.ndarray) -> np.ndarray:
    """(n, len(LIVE_STATE_FEATURES)) float32: feed states plus the live predictions, over typical values."""
    scaled = (
        np.asarray(predictions, np.float64).reshape(-1, len(LIVE_PREDICTION_SCALE)) / LIVE_PREDICTION_SCALE
    )
    feed = np.asarray(feed).reshape(scaled.shape[0], len(FEED_STATE_FEATURES))
    return np.column_stack([feed, scaled]).astype(np.float32)


def user_groups(states: np.ndarray) -> np.ndarray:
    """The activity group id each state's one-hot encodes (logged beside the state)."""
    return np.asarray(states)[..., : len(ACTIVITY_GROUPS)].argmax(axis=-1)
