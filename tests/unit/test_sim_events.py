"""A simulated day as Kafka contracts: counts, ids and payloads agree with the simulator's record."""

from collections import Counter

import numpy as np
import pytest

from recsys_rl import contracts, signals
from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.events import EventIds, decision_records, feedback_events
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.simulator import Simulator
from recsys_rl.state import FEED_STATE_FEATURES

VERSIONS = ("feed-v", "live-v")


@pytest.fixture(scope="module")
def day_events():
    sim = Simulator(SimConfig(n_users=150), seed=8)
    day = sim.run_day(behaviour_feed_policy(), behaviour_allocation_policy())
    ids = EventIds.for_seed(8)
    return (
        day,
        list(decision_records(day, sim.world, ids, VERSIONS)),
        list(feedback_events(day, sim.world, ids)),
    )


def test_one_record_per_decision_and_one_event_per_view(day_events):
    day, decisions, feedback = day_events
    surfaces = Counter(contracts.SURFACE_NAMES[d.surface] for d in decisions)
    assert surfaces == {"feed": day.feed.request.size, "live_allocation": day.live.request.size}
    assert len(feedback) == day.views.request.size
    assert len({d.request_id for d in decisions}) == len(decisions)


def test_every_feedback_event_answers_a_decision_that_served_its_item(day_events):
    _, decisions, feedback = day_events
    served = {d.request_id: set(d.served_item_ids) for d in decisions}
    for event in feedback:
        assert event.item_id in served[event.request_id]
        assert (event.item_type == contracts.ITEM_TYPES["live"]) == event.request_id.endswith("-live")


def test_records_are_valid_contracts_that_round_trip(day_events):
    _, decisions, feedback = day_events
    for record in decisions[:50]:
        assert contracts.decode_decision(contracts.encode(record)) == record
    for event in feedback[:50]:
        assert contracts.decode_feedback(contracts.encode(event)) == event


def test_feed_decision_payload_matches_the_simulator(day_events):
    day, decisions, _ = day_events
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
    day, _, feedback = day_events
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
