"""Names of the state vectors that policies see, shared by the simulator, the pipelines and serving.

The decision log records the exact vector a policy saw together with these names and FEATURE_VERSION,
so training reads what serving used (feature logging); change the version with any change here.
"""

from __future__ import annotations

import numpy as np

FEATURE_VERSION = "state-v1"

#: Activity groups, in KuaiRand's ``user_active_degree`` order; a user's group id is the index.
ACTIVITY_GROUPS: tuple[str, ...] = ("high_active", "full_active", "middle_active", "low_active_or_unknown")

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

#: Pseudo-counts at typical rates: a new user's history features are sensible before any history exists,
#: instead of 0/0 (the simulator and serving both apply them; see ``history_features``).
PRIOR_VIEWS = 20.0
PRIOR_CLICK_RATE = 0.45
PRIOR_WATCH_PER_VIEW_S = 13.0
PRIOR_INTERACTION_RATE = 0.02


def history_features(
    views: np.ndarray,
    clicks: np.ndarray,
    watch_s: np.ndarray,
    interactions: np.ndarray,
    live_views: np.ndarray,
    live_watch_s: np.ndarray,
) -> np.ndarray:
    """(n, 4) ``hist_*`` features from short-video and live history totals, with their scalings.

    One definition for the simulator (whole-history totals) and serving (totals rebuilt from the
    feature store's rates), so the two cannot drift apart in smoothing or units.
    """
    smoothed_views = views + PRIOR_VIEWS
    return np.column_stack(
        [
            (clicks + PRIOR_VIEWS * PRIOR_CLICK_RATE) / smoothed_views,
            (watch_s + PRIOR_VIEWS * PRIOR_WATCH_PER_VIEW_S) / smoothed_views / 10.0,
            (interactions + PRIOR_VIEWS * PRIOR_INTERACTION_RATE) / smoothed_views * 10.0,
            live_watch_s / (live_views + 1.0) / 60.0,
        ]
    )
