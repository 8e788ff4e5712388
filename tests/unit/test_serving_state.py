"""Serving builds the state vector the simulator builds (train/serve consistency)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from recsys_rl.contracts import serving_pb2
from recsys_rl.serving.online_state import UserFeatures, feed_state, live_state, user_group
from recsys_rl.sim.history import UserHistory
from recsys_rl.state import FEED_STATE_FEATURES, LIVE_STATE_FEATURES

DAY_MS = 86_400_000
INDEX = {name: i for i, name in enumerate(FEED_STATE_FEATURES)}
HIST = slice(INDEX["hist_click_rate"], INDEX["hist_live_watch"] + 1)


def features(**changes) -> UserFeatures:
    values = {
        "activity_group": 1,
        "views": 40,
        "click_rate": 0.5,
        "watch_s_per_view": 12.0,
        "interaction_rate": 0.05,
        "live_views": 3,
        "live_watch_s_per_live_view": 40.0,
        "day_end_s": 100 * 86_400,
    }
    return UserFeatures(**{**values, **changes})


def test_history_features_match_the_simulators_for_the_same_totals():
    history = UserHistory.fresh(1)
    history.views[0], history.clicks[0], history.watch_s[0] = 40, 20, 480.0
    history.interactions[0], history.live_views[0], history.live_watch_s[0] = 2, 3, 120.0
    state = feed_state(features(), serving_pb2.RequestContext(), 100 * DAY_MS)
    np.testing.assert_allclose(state[HIST], history.features(np.array([0]))[0], rtol=1e-6)


def test_an_unknown_user_gets_the_simulators_new_user_state():
    state = feed_state(None, serving_pb2.RequestContext(), 100 * DAY_MS)
    assert state.dtype == np.float32 and state.shape == (len(FEED_STATE_FEATURES),)
    np.testing.assert_allclose(state[HIST], UserHistory.fresh(1).features(np.array([0]))[0], rtol=1e-6)
    assert user_group(state) == 3 and state[INDEX["returned_yesterday"]] == 0


def test_group_and_request_context_fill_their_features():
    context = serving_pb2.RequestContext(
        page_index=3, session_watch_s=250.0, last_page_click_rate=0.25, utc_offset_minutes=120
    )
    time_ms = 100 * DAY_MS + 4 * 3_600_000  # 04:00 UTC = 06:00 local
    state = feed_state(features(activity_group=2), context, time_ms)
    assert user_group(state) == 2 and state[:4].sum() == 1
    assert state[INDEX["page_index"]] == pytest.approx(0.3)
    assert state[INDEX["session_watch"]] == pytest.approx(2.5)
    assert state[INDEX["last_page_click_rate"]] == pytest.approx(0.25)
    assert state[INDEX["hour_sin"]] == pytest.approx(math.sin(2 * math.pi * 6 / 24), abs=1e-6)
    assert state[INDEX["hour_cos"]] == pytest.approx(math.cos(2 * math.pi * 6 / 24), abs=1e-6)


@pytest.mark.parametrize(("row_day_end", "expected"), [(100, 1.0), (99, 0.0), (None, 0.0)])
def test_returned_yesterday_means_the_latest_row_covers_yesterday(row_day_end, expected):
    day_end_s = None if row_day_end is None else row_day_end * 86_400
    state = feed_state(features(day_end_s=day_end_s), serving_pb2.RequestContext(), 100 * DAY_MS + 5_000)
    assert state[INDEX["returned_yesterday"]] == expected


def test_rates_of_a_day_without_views_count_as_no_history():
    quiet = features(views=0, click_rate=None, watch_s_per_view=None, interaction_rate=None)
    fresh = feed_state(None, serving_pb2.RequestContext(), 0)
    np.testing.assert_allclose(feed_state(quiet, serving_pb2.RequestContext(), 0)[HIST][:3], fresh[HIST][:3])


def test_feast_rows_with_nulls_become_features_or_none():
    assert UserFeatures.from_row({"views": float("nan")}) is None
    row = {
        "views": 4,
        "activity_group": None,
        "click_rate": float("nan"),
        "live_views": None,
        "views__ts": 86_400,
    }
    user = UserFeatures.from_row(row)
    assert user is not None and user.activity_group is None and user.click_rate is None
    assert user.live_views == 0 and user.day_end_s == 86_400


def test_live_state_appends_scaled_predictions():
    feed = feed_state(None, serving_pb2.RequestContext(), 0)
    state = live_state(feed, np.array([60.0, 0.2, 26.0]))
    assert state.shape == (len(LIVE_STATE_FEATURES),)
    np.testing.assert_allclose(state[-3:], [2.0, 2.0, 2.0])
