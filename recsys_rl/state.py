"""Names of the state vectors that policies see, shared by the simulator, the pipelines and serving.

The decision log records the exact vector a policy saw together with these names and FEATURE_VERSION,
so training reads what serving used (feature logging); change the version with any change here.
"""

from __future__ import annotations

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
