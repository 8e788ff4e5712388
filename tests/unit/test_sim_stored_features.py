"""The simulator's copy of the feature store holds the very numbers the feature pipeline writes."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pyarrow.parquet as pq
import pytest

from recsys_rl import contracts
from recsys_rl.feature_tables import USER_ENGAGEMENT
from recsys_rl.pipelines.feature_aggregates import WriteFeatureAggregates
from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.events import EventIds, feedback_events
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.simulator import VIEW_SIGNAL_COLUMNS, Simulator, ViewLog
from recsys_rl.sim.stored_features import SimulatedFeatureStore
from recsys_rl.state import DAY_MS, StoredUserFeatures

SIGNALS = ("watch_time_s", "click", "like", "follow", "comment", "share", "hate", "live_watch_s")
_LIVE = contracts.ITEM_TYPES["live"]


def _fact(event: contracts.FeedbackEvent) -> dict:
    """A feedback event as the pipeline's view fact: what travels on the wire, nothing else."""
    return {
        "user_id": event.user_id,
        "request_id": event.request_id,
        "item_id": event.item_id,
        "author_id": event.author_id,
        "item_type": "live" if event.item_type == _LIVE else "video",
        "event_time_ms": event.event_time_ms,
        **{name: getattr(event.signals, name) for name in SIGNALS},
        "gift": event.signals.gift_value,
    }


def test_a_simulated_day_leaves_the_rows_the_feature_pipeline_writes_from_its_feedback(tmp_path):
    users = 200
    sim = Simulator(SimConfig(n_users=users), 6)
    ids = EventIds.for_seed(6)
    before = sim.store.lookup(np.arange(users))
    assert np.all(before.day == -1) and np.array_equal(before.activity_group, sim.world.users.group)
    day = sim.run_day(behaviour_feed_policy(), behaviour_allocation_policy())
    facts = [_fact(event) for event in feedback_events(day, sim.world, ids)]
    with beam.Pipeline() as p:
        p | beam.Create(facts) | WriteFeatureAggregates(str(tmp_path))
    written = pq.read_table(tmp_path / USER_ENGAGEMENT.name).to_pylist()
    active = [int(row["user_id"][1:]) for row in written]
    assert len(active) == np.unique(day.views.user).size > 50
    expected = StoredUserFeatures.from_records(written)
    stored = sim.store.lookup(np.array(active))
    for name in vars(expected):
        if name != "activity_group":  # the user table's, not the pipeline's
            np.testing.assert_array_equal(getattr(stored, name), getattr(expected, name), err_msg=name)
    # users who stayed away keep no engagement row, only their account's group
    away = np.setdiff1d(np.arange(users), active)
    assert np.all(sim.store.lookup(away).day == -1) and np.all(sim.store.lookup(away).views == 0)


def _views(users: list[int], watch_s: list[float], days: list[int] | None = None) -> ViewLog:
    """Short-video views, one a user id, of the given watch seconds, on the given UTC days (day 0)."""
    n = len(users)
    signals = np.zeros((n, len(VIEW_SIGNAL_COLUMNS)))
    signals[:, VIEW_SIGNAL_COLUMNS.index("watch_time")] = watch_s
    index = np.arange(n)
    flag = np.zeros(n, bool)
    time_ms = 1_000 + index + DAY_MS * np.array(days or [0] * n)
    return ViewLog(index, index, np.array(users), index, flag, index, time_ms, signals, signals, flag)


@pytest.mark.parametrize("views", [1, 2])
@pytest.mark.parametrize("watch_s", [float("nan"), 1e10, -1e10, 2**53 / 1e6, -(2**53) / 1e6])
def test_a_view_whose_signal_has_no_exact_micro_units_is_refused_by_name(watch_s, views):
    store = SimulatedFeatureStore(np.zeros(2, np.int64))
    with pytest.raises(ValueError, match=r"view fact signals should be below 9\.0072e\+09"):
        store.add_views(_views([0, 1][-views:], [10.0, watch_s][-views:]))


def test_signals_just_inside_exact_micro_units_are_summed_exactly():
    store = SimulatedFeatureStore(np.zeros(2, np.int64))
    store.add_views(_views([0, 1], [-9e9, 9e9]))  # the sign is the pipeline's validation's business
    assert store.lookup(np.array([0, 1])).watch_s_per_view.tolist() == [-9e9, 9e9]


def test_a_users_day_that_sums_past_exact_floats_is_refused_and_smaller_days_are_exact():
    store = SimulatedFeatureStore(np.zeros(2, np.int64))
    # each view is exact in micro-units, their sum (9.2e15 micro-units) is not in a float64
    with pytest.raises(ValueError, match=r"^a user's day sums past 2\*\*53 micro-units"):
        store.add_views(_views([1, 1], [4.6e9, 4.6e9]))
    with pytest.raises(ValueError, match=r"^a user's day sums past 2\*\*53 micro-units"):
        store.add_views(_views([1, 1], [-4.6e9, -4.6e9]))
    # 2**53 itself may be a larger sum rounded down to it
    with pytest.raises(ValueError, match=r"^a user's day sums past 2\*\*53 micro-units"):
        store.add_views(_views([1, 1], [2.0**52 / 1e6, 2.0**52 / 1e6]))
    # the largest watch a day can hold exactly, and rates to the last digit, summed in any order
    watch = [4.5e9, 0.000001, 4.5e9 - 1, 3.0]
    store.add_views(_views([1, 0, 1, 0], watch))
    rows = store.lookup(np.array([0, 1]))
    assert rows.views.tolist() == [2, 2]
    assert rows.watch_s_per_view.tolist() == [3.000001 / 2, (9e9 - 1) / 2]


def test_a_day_of_one_view_is_stored():
    store = SimulatedFeatureStore(np.zeros(2, np.int64))
    store.add_views(_views([1], [12.5], days=[2]))
    assert store.lookup(np.array([1])).day.tolist() == [2]
    assert store.lookup(np.array([1])).watch_s_per_view.tolist() == [12.5]


def test_views_past_midnight_make_the_next_days_row_and_the_latest_day_is_kept():
    """Days 3 and 4 in one log (a session past UTC midnight): user 0's stored row is day 4's, user 1's day
    3's; an older log does not replace a newer row; the same day again does (its later, fuller count)."""
    store = SimulatedFeatureStore(np.zeros(3, np.int64))
    store.add_views(_views([0, 1, 0, 0], [10.0, 20.0, 30.0, 50.0], days=[3, 3, 4, 4]))
    rows = store.lookup(np.array([0, 1, 2]))
    assert rows.day.tolist() == [4, 3, -1]
    assert rows.views.tolist() == [2, 1, 0]
    assert rows.watch_s_per_view[:2].tolist() == [40.0, 20.0]
    store.add_views(_views([0, 1], [1.0, 2.0], days=[2, 3]))  # user 0's day 2 is older than its day 4
    rows = store.lookup(np.array([0, 1]))
    assert rows.day.tolist() == [4, 3] and rows.watch_s_per_view.tolist() == [40.0, 2.0]
