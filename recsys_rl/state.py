"""The state vectors policies see, and the one function that builds them, for the simulator and serving.

A state is built from two things only: the user's rows in the feature store (``StoredUserFeatures``) and
the request's context (``RequestContexts``). The simulator's behaviour policies, the live client and the
server all call ``feed_states`` with those, so a state cannot depend on who built it: the simulator
keeps its hidden truths (interests, sensitivities, the exit and return hazards) for the responses only.

The decision log records the exact vector a policy saw together with these names and FEATURE_VERSION,
so training reads what serving used (feature logging); change the version with any change here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
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

_GROUPS = len(ACTIVITY_GROUPS)
_HISTORY = slice(_GROUPS, _GROUPS + 4)
#: Column of each feature after the group one-hot and the four history features.
_COLUMN = {name: FEED_STATE_FEATURES.index(name) for name in FEED_STATE_FEATURES[_GROUPS + 4 :]}


def feed_states(users: StoredUserFeatures, requests: RequestContexts) -> np.ndarray:
    """(n, len(FEED_STATE_FEATURES)) float32: the state of each request from its user's stored rows.

    The engagement row counts when it is finished before the request (its day ended) and younger than
    ENGAGEMENT_TTL_DAYS, as Feast's point-in-time join reads it; totals are rebuilt from the day's rates.
    Written into one float64 array, cast once, with the four history features computed as one block:
    the server builds one state per request, where each numpy call's overhead costs more than its
    arithmetic (a column at a time: 37 us a state; as a block: 33, the same floats to the bit).
    """
    group = np.minimum(np.maximum(users.activity_group, 0), UNKNOWN_GROUP)  # np.clip: 10x the overhead
    time_ms = np.asarray(requests.time_ms, np.int64)
    row_end_ms = (users.day + 1) * DAY_MS
    current = (users.day >= 0) & (row_end_ms <= time_ms)
    current &= time_ms - row_end_ms <= ENGAGEMENT_TTL_DAYS * DAY_MS
    current_row = current[:, None]
    rates = np.stack(
        [users.click_rate, users.watch_s_per_view, users.interaction_rate, users.live_watch_s_per_live_view],
        axis=1,
    )
    views = np.stack([users.views, users.views, users.views, users.live_views], axis=1)
    # a day's total is its rate times its views; nothing when the row does not count or the rate is null
    totals = np.where(current_row & ~np.isnan(rates), rates * views, 0.0)
    views = np.where(current_row, views, 0)

    states = np.zeros((group.shape[0], len(FEED_STATE_FEATURES)))
    states[np.arange(group.shape[0]), group] = 1.0
    states[:, _HISTORY] = (totals + _PSEUDO_TOTALS) / (views + _PSEUDO_VIEWS) / _DIVIDE_BY * _MULTIPLY_BY
    local_s = time_ms / 1000.0 + np.asarray(requests.utc_offset_minutes) * 60.0
    angle = 2.0 * np.pi * ((local_s / 3600.0) % 24.0) / 24.0
    states[:, _COLUMN["returned_yesterday"]] = current & (users.day == time_ms // DAY_MS - 1)
    states[:, _COLUMN["page_index"]] = np.asarray(requests.page_index) / 10.0
    states[:, _COLUMN["session_watch"]] = np.asarray(requests.session_watch_s) / 100.0
    states[:, _COLUMN["last_page_click_rate"]] = requests.last_page_click_rate
    states[:, _COLUMN["hour_sin"]] = np.sin(angle)
    states[:, _COLUMN["hour_cos"]] = np.cos(angle)
    return states.astype(np.float32)


def live_states(feed: np.ndarray, predictions: np.ndarray) -> np.ndarray:
    """(n, len(LIVE_STATE_FEATURES)) float32: feed states plus the live predictions, over typical values."""
    scaled = (
        np.asarray(predictions, np.float64).reshape(-1, len(LIVE_PREDICTION_SCALE)) / LIVE_PREDICTION_SCALE
    )
    feed = np.asarray(feed).reshape(scaled.shape[0], len(FEED_STATE_FEATURES))
    return np.column_stack([feed, scaled]).astype(np.float32)


def user_groups(states: np.ndarray) -> np.ndarray:
    """The activity group id each state's one-hot encodes (logged beside the state)."""
    return np.argmax(np.asarray(states)[..., : len(ACTIVITY_GROUPS)], axis=-1)
