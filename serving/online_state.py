"""The state vectors policies see, built from online features and the request as the simulator builds them.

Train/serve consistency: every ``recsys_rl.state`` feature is computed here with the simulator's
definition and scaling (``recsys_rl.sim.simulator._feed_state``), and the history features through the
very function the simulator uses (``recsys_rl.state.history_features``). The feature store keeps a
user's *last finished day* (rates and view counts); totals are rebuilt from them, so a user's
``hist_*`` features describe that day, smoothed by the same priors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from recsys_rl.contracts import serving_pb2
from recsys_rl.sim.simulator import LIVE_PREDICTION_SCALE
from recsys_rl.state import ACTIVITY_GROUPS, history_features

_DAY_S = 86_400
#: The group of a user the store does not know: KuaiRand's "low active or unknown".
UNKNOWN_GROUP = len(ACTIVITY_GROUPS) - 1


@dataclass(frozen=True)
class UserFeatures:
    """One user's ``user_engagement`` row; the rates are None for a day without the matching views."""

    activity_group: int | None
    views: int
    click_rate: float | None
    watch_s_per_view: float | None
    interaction_rate: float | None
    live_views: int
    live_watch_s_per_live_view: float | None
    day_end_s: int | None  # the row's timestamp: the first instant after the day it covers

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> UserFeatures | None:
        """The features of a Feast online row (with ``__ts`` columns), or None for an unknown user."""
        if _missing(row.get("views")):
            return None
        group = row.get("activity_group")
        return cls(
            activity_group=None if _missing(group) else int(group),
            views=int(row["views"]),
            click_rate=_number(row.get("click_rate")),
            watch_s_per_view=_number(row.get("watch_s_per_view")),
            interaction_rate=_number(row.get("interaction_rate")),
            live_views=0 if _missing(row.get("live_views")) else int(row["live_views"]),
            live_watch_s_per_live_view=_number(row.get("live_watch_s_per_live_view")),
            day_end_s=None if _missing(row.get("views__ts")) else int(row["views__ts"]),
        )


def _missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _number(value: Any) -> float | None:
    return None if _missing(value) else float(value)


def _total(rate: float | None, count: int) -> float:
    return 0.0 if rate is None else rate * count


def event_time_ms(context: serving_pb2.RequestContext, now_ms: int) -> int:
    """The request's time: the client's when it sent one, else the server's clock at arrival."""
    return context.event_time_ms or now_ms


def feed_state(user: UserFeatures | None, context: serving_pb2.RequestContext, time_ms: int) -> np.ndarray:
    """The FEED_STATE_FEATURES vector (float32) for one request; ``user`` None: a user without history."""
    group = UNKNOWN_GROUP if user is None or user.activity_group is None else user.activity_group
    onehot = np.eye(len(ACTIVITY_GROUPS))[min(max(group, 0), UNKNOWN_GROUP)]
    if user is None:
        history = history_features(*(np.zeros(1) for _ in range(6)))[0]
        returned_yesterday = 0.0
    else:
        history = history_features(
            np.array([user.views]),
            np.array([_total(user.click_rate, user.views)]),
            np.array([_total(user.watch_s_per_view, user.views)]),
            np.array([_total(user.interaction_rate, user.views)]),
            np.array([user.live_views]),
            np.array([_total(user.live_watch_s_per_live_view, user.live_views)]),
        )[0]
        # The row of day d is stamped at the start of day d + 1: the user was active yesterday exactly
        # when their latest row is stamped at the start of the request's day.
        today = time_ms // 1000 // _DAY_S
        returned_yesterday = float(user.day_end_s is not None and user.day_end_s // _DAY_S == today)
    local_s = time_ms / 1000.0 + context.utc_offset_minutes * 60.0
    angle = 2.0 * np.pi * ((local_s / 3600.0) % 24.0) / 24.0
    return np.concatenate(
        [
            onehot,
            history,
            [
                returned_yesterday,
                context.page_index / 10.0,
                context.session_watch_s / 100.0,
                context.last_page_click_rate,
                np.sin(angle),
                np.cos(angle),
            ],
        ]
    ).astype(np.float32)


def live_state(feed: np.ndarray, predictions: np.ndarray) -> np.ndarray:
    """The LIVE_STATE_FEATURES vector: the feed state plus the live predictions over their typical values."""
    return np.concatenate([feed, np.asarray(predictions, np.float64) / LIVE_PREDICTION_SCALE]).astype(
        np.float32
    )


def user_group(state: np.ndarray) -> int:
    """The activity group id a state's one-hot encodes (logged beside the state)."""
    return int(np.argmax(state[: len(ACTIVITY_GROUPS)]))
