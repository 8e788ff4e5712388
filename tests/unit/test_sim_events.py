"""A simulated day as Kafka contracts: counts, ids and payloads agree with the simulator's record."""

from collections import Counter

import numpy as np
import pyarrow.parquet as pq
import pytest

from recsys_rl import contracts, signals
from recsys_rl.feature_tables import USER_ACTIVITY
from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.events import EventIds, decision_records, feedback_events, write_user_table
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.simulator import VIEW_SIGNAL_COLUMNS, Simulator
from recsys_rl.state import ACTIVITY_GROUPS, FEATURE_VERSION, FEED_STATE_FEATURES, LIVE_STATE_FEATURES

VERSIONS = ("feed-v", "live-v")


@pytest.fixture  # per test, not per module: mutation testing maps a function to the tests that call it,
def day_events():  # and a module's fixture is called in its first test's set-up only
    sim = Simulator(SimConfig(n_users=150), seed=8)
    day = sim.run_day(behaviour_feed_policy(), behaviour_allocation_policy())
    ids = EventIds.for_seed(8)
    return (
        day,
        list(decision_records(day, sim.world, ids, VERSIONS)),
        list(feedback_events(day, sim.world, ids)),
        sim.world,
    )


def test_one_record_per_decision_and_one_event_per_view(day_events):
    day, decisions, feedback, _ = day_events
    surfaces = Counter(contracts.SURFACE_NAMES[d.surface] for d in decisions)
    assert surfaces == {"feed": day.feed.request.size, "live_allocation": day.live.request.size}
    assert len(feedback) == day.views.request.size
    assert len({d.request_id for d in decisions}) == len(decisions)


def test_every_feedback_event_answers_a_decision_that_served_its_item(day_events):
    _, decisions, feedback, _ = day_events
    served = {d.request_id: set(d.served_item_ids) for d in decisions}
    for event in feedback:
        assert event.item_id in served[event.request_id]
        assert (event.item_type == contracts.ITEM_TYPES["live"]) == event.request_id.endswith("-live")


def test_records_are_valid_contracts_that_round_trip(day_events):
    _, decisions, feedback, _ = day_events
    for record in decisions[:50]:
        assert contracts.decode_decision(contracts.encode(record)) == record
    for event in feedback[:50]:
        assert contracts.decode_feedback(contracts.encode(event)) == event


def test_feed_decision_payload_matches_the_simulator(day_events):
    day, decisions, _, _ = day_events
    first = decisions[0]
    feed = day.feed
    assert list(first.feature_names) == list(FEED_STATE_FEATURES)
    assert list(first.prediction_names) == list(signals.FEED_SIGNALS)
    np.testing.assert_allclose(first.state, feed.state[0])
    np.testing.assert_allclose(first.action, feed.action[0])
    assert first.log_propensity == pytest.approx(feed.log_propensity[0])
    assert len(first.candidates) == feed.candidates.shape[1]
    assert first.policy_version == "feed-v"
    assert first.event_time_ms == feed.time_ms[0]


def test_feedback_signals_sum_to_the_simulators_rewards(day_events):
    day, _, feedback, _ = day_events
    totals = Counter()
    for event in feedback:
        for name, value in contracts.feedback_signal_values(event).items():
            totals[name] += value
    assert totals["watch_time"] == pytest.approx(day.feed.reward[:, 0].sum())
    assert totals["click"] == pytest.approx(
        day.feed.reward[:, 1].sum() + (day.views.signals[day.views.is_live, 1]).sum()
    )
    assert totals["live_watch_time"] == pytest.approx(day.live.reward[:, 0].sum())
    assert sum(e.session_end for e in feedback) == np.unique(day.views.session).size


def test_same_seed_gives_the_same_bytes():
    def encoded():
        sim = Simulator(SimConfig(n_users=30), seed=4)
        day = sim.run_day(behaviour_feed_policy(), behaviour_allocation_policy())
        ids = EventIds.for_seed(4)
        return [contracts.encode(r) for r in decision_records(day, sim.world, ids, VERSIONS)]

    assert encoded() == encoded()


def _ids(prefix: str, values) -> list[str]:
    return [f"{prefix}{int(v)}" for v in values]


def _surface_records(decisions, surface: str, log) -> list:
    """The surface's decision records, one per row of its log, in the log's order."""
    records = [d for d in decisions if d.surface == contracts.SURFACES[surface]]
    assert len(records) == log.request.size
    return records


def _check_logged_row(record, log, i: int, request_id: str, version: str) -> None:
    """The fields every decision record takes from its log row, whatever its surface."""
    assert record.request_id == request_id
    assert record.session_id == f"sim8-s{log.session[i]:09d}"
    assert record.user_id == f"u{log.user[i]}"
    assert record.event_time_ms == log.time_ms[i]
    assert record.schema_version == contracts.DECISION_SCHEMA_VERSION
    assert record.feature_version == FEATURE_VERSION
    assert record.user_group == int(np.argmax(log.state[i][: len(ACTIVITY_GROUPS)]))
    assert record.policy_version == version
    assert record.routing_arm == contracts.ROUTING_ARMS["behaviour"]
    assert record.action_selection == contracts.ACTION_SELECTIONS["sampled"]
    np.testing.assert_allclose(record.state, log.state[i], rtol=1e-6)
    assert record.log_propensity == pytest.approx(log.log_propensity[i])


def test_every_feed_decision_carries_its_logged_row_field_by_field(day_events):
    """Ids written out by hand (u<user>, v<video>, a<author>, l<live>, sim<seed>-r/-s<zero-padded>)."""
    day, decisions, _, world = day_events
    feed = day.feed
    for i, record in enumerate(_surface_records(decisions, "feed", feed)):
        _check_logged_row(record, feed, i, f"sim8-r{feed.request[i]:010d}", "feed-v")
        np.testing.assert_allclose(record.action, feed.action[i], rtol=1e-6)
        assert [c.item_id for c in record.candidates] == _ids("v", feed.candidates[i])
        assert [c.author_id for c in record.candidates] == _ids("a", world.videos.author[feed.candidates[i]])
        assert {c.item_type for c in record.candidates} == {contracts.ITEM_TYPES["video"]}
        np.testing.assert_allclose([list(c.predictions) for c in record.candidates], feed.predictions[i])
        served = [
            f"l{item}" if slot == feed.live_slot[i] else f"v{item}"
            for slot, item in enumerate(feed.served[i])
        ]
        assert list(record.served_item_ids) == served
    assert (feed.live_slot >= 0).any() and (feed.live_slot < 0).any()  # both layouts were written


def test_every_live_decision_offers_its_stream_and_serves_it_only_when_inserted(day_events):
    day, decisions, _, world = day_events
    live = day.live
    for i, record in enumerate(_surface_records(decisions, "live_allocation", live)):
        _check_logged_row(record, live, i, f"sim8-r{live.request[i]:010d}-live", "live-v")
        assert list(record.feature_names) == list(LIVE_STATE_FEATURES)
        assert list(record.prediction_names) == list(signals.LIVE_SIGNALS)
        assert list(record.action) == [float(live.action[i])]
        (candidate,) = record.candidates
        assert candidate.item_id == f"l{live.live[i]}"
        assert candidate.author_id == f"a{world.lives.author[live.live[i]]}"
        assert candidate.item_type == contracts.ITEM_TYPES["live"]
        np.testing.assert_allclose(candidate.predictions, live.predictions[i], rtol=1e-6)
        assert list(record.served_item_ids) == ([f"l{live.live[i]}"] if live.action[i] else [])
    assert set(live.action.tolist()) == {0, 1}


def test_every_feedback_event_carries_its_view_field_by_field(day_events):
    day, _, feedback, world = day_events
    views = day.views
    assert views.is_live.any() and not views.is_live.all()
    for i, event in enumerate(feedback):
        live = bool(views.is_live[i])
        item, author = (
            int(views.item[i]),
            (world.lives.author if live else world.videos.author)[views.item[i]],
        )
        assert event.request_id == f"sim8-r{views.request[i]:010d}" + ("-live" if live else "")
        assert event.user_id == f"u{views.user[i]}"
        assert event.item_id == (f"l{item}" if live else f"v{item}")
        assert event.author_id == f"a{author}"
        assert event.item_type == contracts.ITEM_TYPES["live" if live else "video"]
        assert event.event_time_ms == views.time_ms[i]
        assert event.position == views.position[i]
        assert event.session_end == bool(views.session_end[i])
        assert event.schema_version == contracts.FEEDBACK_SCHEMA_VERSION
        expected = dict(zip(VIEW_SIGNAL_COLUMNS, views.signals[i].tolist(), strict=True))
        assert contracts.feedback_signal_values(event) == pytest.approx(expected)


def test_the_user_table_holds_every_accounts_group_as_of_its_time(tmp_path):
    sim = Simulator(SimConfig(n_users=40), seed=3)
    path = write_user_table(sim.world, EventIds.for_seed(3), tmp_path, as_of_ms=1_700_000_000_000)
    table = pq.read_table(path)
    assert table.schema == USER_ACTIVITY.arrow_schema()
    assert table["user_id"].to_pylist() == [f"u{u}" for u in range(40)]
    assert table["activity_group"].to_pylist() == sim.world.users.group.tolist()
    as_of = table["event_timestamp"].cast("int64").to_pylist()
    assert as_of == [1_700_000_000_000_000] * 40  # microseconds
    assert path.name == "as-of-1700000000000.parquet"
