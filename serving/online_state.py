"""One request's state: its context and its user's stored rows through ``recsys_rl.state``'s builder.

The builder is the simulator's and the live client's too (train/serve consistency); this module only
turns the request message into the builder's columns and takes the one row out.
"""

from __future__ import annotations

import numpy as np

from recsys_rl import state as state_builder
from recsys_rl.contracts import serving_pb2
from recsys_rl.state import ACTIVITY_GROUPS, StoredUserFeatures, live_states


def event_time_ms(context: serving_pb2.RequestContext, now_ms: int) -> int:
    """The request's time: the client's when it sent one, else the server's clock at arrival."""
    return context.event_time_ms or now_ms


def _frozen_unknown_user() -> StoredUserFeatures:
    """One unknown user's rows, built once (nine arrays per request otherwise) and read-only, so no
    request can change what the next one reads."""
    user = StoredUserFeatures.unknown(1)
    for column in vars(user).values():
        column.flags.writeable = False
    return user


_UNKNOWN_USER = _frozen_unknown_user()


def feed_state(
    user: StoredUserFeatures | None, context: serving_pb2.RequestContext, time_ms: int
) -> np.ndarray:
    """The FEED_STATE_FEATURES vector of one request; ``user`` None: the store told nothing about them."""
    return state_builder.feed_state(
        _UNKNOWN_USER if user is None else user,
        time_ms,
        context.page_index,
        context.session_watch_s,
        context.last_page_click_rate,
        context.utc_offset_minutes,
    )


def live_state(feed: np.ndarray, predictions: np.ndarray) -> np.ndarray:
    return live_states(feed, predictions)[0]


def user_group(state_values: list[float]) -> int:
    """The activity group, taken as ``user_groups`` takes it (the first largest of the one-hot), from
    the state's values that the decision record holds anyway: numpy's argmax was three calls a request."""
    groups = state_values[: len(ACTIVITY_GROUPS)]
    return groups.index(max(groups))
