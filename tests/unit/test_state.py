"""The one state builder: what each feature means, and that the simulator's batches equal serving's rows."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from recsys_rl.contracts import serving_pb2
from recsys_rl.serving.online_state import feed_state, live_state, user_group
from recsys_rl.state import (
    DAY_MS,
    ENGAGEMENT_TTL_DAYS,
    FEED_STATE_FEATURES,
    LIVE_STATE_FEATURES,
    PRIOR_CLICK_RATE,
    PRIOR_INTERACTION_RATE,
    PRIOR_VIEWS,
    PRIOR_WATCH_PER_VIEW_S,
    UNKNOWN_GROUP,
    RequestContexts,
    StoredUserFeatures,
    feed_states,
    live_states,
    user_groups,
)

INDEX = {name: i for i, name in enumerate(FEED_STATE_FEATURES)}
HIST = slice(INDEX["hist_click_rate"], INDEX["hist_live_watch"] + 1)
TODAY = 100
NOON = TODAY * DAY_MS + 12 * 3_600_000


def stored(**changes) -> StoredUserFeatures:
    values = {
        "known": True,
        "activity_group": 1,
        "day": TODAY - 1,
        "views": 40,
        "click_rate": 0.5,
        "watch_s_per_view": 12.0,
        "interaction_rate": 0.05,
        "live_views": 3,
        "live_watch_s_per_live_view": 40.0,
    }
    values.update(changes)
    return StoredUserFeatures(**{name: np.array([value]) for name, value in values.items()})


def state_at(user: StoredUserFeatures | None, time_ms: int = NOON, **context) -> np.ndarray:
    return feed_state(user, serving_pb2.RequestContext(**context), time_ms)


def test_history_is_yesterdays_totals_smoothed_by_the_priors():
    state = state_at(stored())
    clicks = 0.5 * 40
    assert state[INDEX["hist_click_rate"]] == pytest.approx(
        (clicks + PRIOR_VIEWS * PRIOR_CLICK_RATE) / (40 + PRIOR_VIEWS)
    )
    # seconds per view over 10, interactions per view times 10 (FEED_STATE_FEATURES' comments)
    watch_s, interactions = 12.0 * 40, 0.05 * 40
    assert state[INDEX["hist_watch_per_view"]] == pytest.approx(
        (watch_s + PRIOR_VIEWS * PRIOR_WATCH_PER_VIEW_S) / (40 + PRIOR_VIEWS) / 10
    )
    assert state[INDEX["hist_interaction_rate"]] == pytest.approx(
        (interactions + PRIOR_VIEWS * PRIOR_INTERACTION_RATE) / (40 + PRIOR_VIEWS) * 10
    )
    assert state[INDEX["hist_live_watch"]] == pytest.approx(40.0 * 3 / (3 + 1) / 60)
    assert state[INDEX["returned_yesterday"]] == 1.0 and user_group(state.tolist()) == 1


def test_a_user_the_store_does_not_know_gets_the_priors_and_the_unknown_group():
    state = state_at(None)
    assert state.dtype == np.float32 and state.shape == (len(FEED_STATE_FEATURES),)
    no_history = state_at(stored(views=0, live_views=0, click_rate=np.nan, live_watch_s_per_live_view=np.nan))
    np.testing.assert_array_equal(state[HIST], no_history[HIST])
    assert state[INDEX["hist_click_rate"]] == pytest.approx(PRIOR_CLICK_RATE)
    assert user_group(state.tolist()) == UNKNOWN_GROUP and state[INDEX["returned_yesterday"]] == 0


@pytest.mark.parametrize(
    ("day", "time_ms", "current", "returned"),
    [
        pytest.param(TODAY - 1, NOON, True, True, id="yesterday"),
        pytest.param(TODAY - 3, NOON, True, False, id="days-ago"),
        pytest.param(TODAY - 1, TODAY * DAY_MS, True, True, id="at-its-end"),
        pytest.param(TODAY, NOON, False, False, id="today-not-finished"),
        pytest.param(TODAY - 1 - ENGAGEMENT_TTL_DAYS, TODAY * DAY_MS, True, False, id="at-the-ttl"),
        pytest.param(TODAY - 1 - ENGAGEMENT_TTL_DAYS, TODAY * DAY_MS + 1, False, False, id="past-the-ttl"),
        pytest.param(-1, NOON, False, False, id="no-row"),
        pytest.param(0, DAY_MS + 3_600_000, True, True, id="day-zero-is-a-day"),  # only -1 means none
    ],
)
def test_an_engagement_row_counts_from_its_days_end_until_its_ttl(day, time_ms, current, returned):
    """As Feast's point-in-time join reads a row stamped with the end of its day, with the view's ttl."""
    state = state_at(stored(day=day), time_ms)
    assert (state[INDEX["hist_click_rate"]] != pytest.approx(PRIOR_CLICK_RATE)) == current
    assert state[INDEX["returned_yesterday"]] == float(returned)
    assert user_group(state.tolist()) == 1  # the group is the user table's, whatever the engagement row


def test_request_context_fills_its_features_in_local_time():
    time_ms = TODAY * DAY_MS + 4 * 3_600_000  # 04:00 UTC = 06:00 local
    state = state_at(
        stored(activity_group=2),
        time_ms,
        page_index=3,
        session_watch_s=250.0,
        last_page_click_rate=0.25,
        utc_offset_minutes=120,
    )
    assert user_group(state.tolist()) == 2 and state[:4].sum() == 1
    assert state[INDEX["page_index"]] == pytest.approx(0.3)
    assert state[INDEX["session_watch"]] == pytest.approx(2.5)
    assert state[INDEX["last_page_click_rate"]] == pytest.approx(0.25)
    assert state[INDEX["hour_sin"]] == pytest.approx(math.sin(2 * math.pi * 6 / 24), abs=1e-6)
    assert state[INDEX["hour_cos"]] == pytest.approx(math.cos(2 * math.pi * 6 / 24), abs=1e-6)


@pytest.mark.parametrize(
    ("utc_hour", "offset_minutes", "local_hour"),
    [
        pytest.param(1.0, -120, 23.0, id="west-back-over-midnight"),
        pytest.param(0.0, -330, 18.5, id="minus-five-thirty-at-midnight"),
        pytest.param(4.0, -840, 14.0, id="minus-fourteen-hours"),
        pytest.param(4.0, 840, 18.0, id="plus-fourteen-hours"),
        pytest.param(22.0, 180, 1.0, id="east-forward-over-midnight"),
        pytest.param(6.0, -360, 0.0, id="local-midnight-exactly"),
    ],
)
def test_the_hour_features_are_the_local_hour_for_offsets_either_side_of_utc(
    utc_hour, offset_minutes, local_hour
):
    time_ms = TODAY * DAY_MS + round(utc_hour * 3_600_000)
    expected = (math.sin(2 * math.pi * local_hour / 24), math.cos(2 * math.pi * local_hour / 24))
    state = state_at(stored(), time_ms, utc_offset_minutes=offset_minutes)  # serving's path, from the proto
    assert (state[INDEX["hour_sin"]], state[INDEX["hour_cos"]]) == pytest.approx(expected, abs=1e-6)
    batch = feed_states(  # the simulator's path, a batch of contexts
        stored(),
        RequestContexts(
            time_ms=np.array([time_ms]),
            page_index=np.array([0]),
            session_watch_s=np.array([0.0]),
            last_page_click_rate=np.array([0.0]),
            utc_offset_minutes=np.array([offset_minutes]),
        ),
    )[0]
    np.testing.assert_array_equal(batch, state)
    # the offset moves the clock only: the engagement row stays the UTC day's
    assert state[INDEX["returned_yesterday"]] == 1.0


def test_feast_rows_with_nulls_become_stored_features():
    rows = StoredUserFeatures.from_records(
        [
            {"views": 4, "day": 7, "activity_group": None, "click_rate": float("nan"), "live_views": pd.NA},
            {"activity_group": 0},
            {"activity_group": UNKNOWN_GROUP},  # an account the platform rates low active or unknown
            {"activity_group": None, "day": float("nan")},
        ]
    )
    assert rows.activity_group.tolist() == [UNKNOWN_GROUP, 0, UNKNOWN_GROUP, UNKNOWN_GROUP]
    assert rows.day.tolist() == [7, -1, -1, -1] and rows.views.tolist() == [4, 0, 0, 0]
    assert np.isnan(rows.click_rate).all() and rows.live_views.tolist() == [0, 0, 0, 0]
    assert rows.known.tolist() == [True, True, True, False]


def test_a_full_feast_row_keeps_every_column_in_its_type():
    row = {
        "activity_group": 2,
        "day": 9,
        "views": 40,
        "click_rate": 0.5,
        "watch_s_per_view": 12.5,
        "interaction_rate": 0.05,
        "live_views": 3,
        "live_watch_s_per_live_view": 40.0,
    }
    rows = StoredUserFeatures.from_records([row])
    for name, value in row.items():
        column = getattr(rows, name)
        assert column.tolist() == [value], name
        assert column.dtype == (np.int64 if isinstance(value, int) else np.float64), name
    assert rows.known.dtype == bool and rows.known.tolist() == [True]
    # pandas hands a count column with a null in it over as floats, and a rate may arrive as an int
    swapped = {k: float(v) if isinstance(v, int) else int(v) for k, v in row.items()}
    rows = StoredUserFeatures.from_records([swapped])
    for name, value in row.items():
        assert getattr(rows, name).dtype == (np.int64 if isinstance(value, int) else np.float64), name


def test_unknown_rows_do_not_share_their_arrays():
    rows = StoredUserFeatures.unknown(2)
    assert rows.known.dtype == bool and not rows.known.any()
    assert rows.activity_group.tolist() == [UNKNOWN_GROUP] * 2 and rows.day.tolist() == [-1, -1]
    assert rows.views.tolist() == [0, 0] and rows.views.dtype == np.int64
    rows.views[0] = 5
    rows.click_rate[0] = 0.5
    assert rows.live_views[0] == 0 and np.isnan(rows.watch_s_per_view[0])


def test_a_batch_builds_each_row_as_serving_builds_it_alone_bit_for_bit():
    """The simulator builds a page's states at once, serving one request at a time, from the message:
    the two must agree in every bit, last_page_click_rate's float32 on the wire included."""
    rng = np.random.default_rng(3)
    n = 300
    users = StoredUserFeatures(
        known=np.ones(n, bool),
        activity_group=rng.integers(0, 4, n),
        day=np.where(rng.random(n) < 0.1, -1, rng.integers(TODAY - 10, TODAY + 1, n)),
        views=rng.integers(0, 200, n),
        click_rate=np.where(rng.random(n) < 0.1, np.nan, rng.random(n)),
        watch_s_per_view=rng.random(n) * 30,
        interaction_rate=rng.random(n) / 7,
        live_views=rng.integers(0, 5, n),
        live_watch_s_per_live_view=rng.random(n) * 300,
    )
    requests = RequestContexts(
        time_ms=TODAY * DAY_MS + rng.integers(0, DAY_MS, n),
        page_index=rng.integers(0, 30, n),
        session_watch_s=rng.random(n) * 900,
        last_page_click_rate=rng.random(n),
        utc_offset_minutes=rng.integers(-840, 841, n),  # local hours either side of UTC's midnight
    )
    batch = feed_states(users, requests)
    for i in range(n):
        message = serving_pb2.RequestContext(
            event_time_ms=int(requests.time_ms[i]),
            page_index=int(requests.page_index[i]),
            session_watch_s=float(requests.session_watch_s[i]),
            last_page_click_rate=float(requests.last_page_click_rate[i]),
            utc_offset_minutes=int(requests.utc_offset_minutes[i]),
        )
        alone = feed_state(users.take(slice(i, i + 1)), message, int(requests.time_ms[i]))
        np.testing.assert_array_equal(alone, batch[i])
        assert user_group(alone.tolist()) == user_groups(batch[i])


def test_a_requests_group_is_the_batchs_argmax_ties_included():
    rng = np.random.default_rng(11)
    states = rng.integers(0, 3, (500, len(FEED_STATE_FEATURES))).astype(np.float32)  # ties: first wins
    assert [user_group(state.tolist()) for state in states] == user_groups(states).tolist()


def test_live_states_and_groups_of_a_batch_are_row_by_row():
    feed = np.stack([state_at(stored(activity_group=g)) for g in (0, 2, 3)])
    assert user_groups(feed).tolist() == [0, 2, 3]
    predictions = np.array([[60.0, 0.2, 26.0], [30.0, 0.1, 13.0], [0.0, 0.0, 0.0]])
    live = live_states(feed, predictions)
    assert live.dtype == np.float32 and live.shape == (3, len(LIVE_STATE_FEATURES))
    np.testing.assert_array_equal(live[:, : len(FEED_STATE_FEATURES)], feed)
    np.testing.assert_allclose(live[:, -3:], [[2.0, 2.0, 2.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])


def test_live_state_appends_scaled_predictions():
    state = live_state(state_at(None), np.array([60.0, 0.2, 26.0]))
    assert state.shape == (len(LIVE_STATE_FEATURES),)
    np.testing.assert_allclose(state[-3:], [2.0, 2.0, 2.0])
