"""The decision log on real brokers: records Kafka refuses never stop the others, a missing topic is waited
for (never created), and a broker that stops answering is reported once when it goes and once when it is
back."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable

import polling
import pytest
from confluent_kafka.admin import AdminClient

from recsys_rl import contracts
from recsys_rl.kafka import EmbeddedBroker
from recsys_rl.kafka.reader import read_range
from recsys_rl.kafka.topics import TopicSpec, ensure_topics
from recsys_rl.serving.decision_log import DecisionLog
from recsys_rl.serving.metrics import ServingMetrics

pytestmark = pytest.mark.integration

OUTCOMES = "recsys_decision_log_records_total"


def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Kafka outages take longer: 60 s."""
    polling.wait_for(condition, what, attempts=1_200)


def decision(request_id: str) -> contracts.DecisionRecord:
    return contracts.DecisionRecord(schema_version=1, request_id=request_id, user_id="u")


def logged(bootstrap_servers: str, topic: str) -> list[str]:
    return [
        contracts.decode_decision(r.value).request_id
        for r in read_range(bootstrap_servers, topic, idle_timeout_s=10.0)
    ]


def test_a_record_too_large_to_send_is_dropped_and_the_next_thousand_arrive(apache_kafka):
    """Issue 18: a 2 MB session id made a record over the producer's 1 MB limit, which the sender then
    retried forever at the head of its queue, so no later decision reached Kafka until a restart."""
    topic = f"decisions-{uuid.uuid4().hex[:8]}"
    ensure_topics(apache_kafka.bootstrap_servers, [TopicSpec(topic, 1)])
    metrics = ServingMetrics()
    log = DecisionLog(
        apache_kafka.bootstrap_servers, metrics, capacity=2_000, in_flight=500, flush_timeout_s=30
    )
    huge = contracts.DecisionRecord(
        schema_version=1, request_id="huge", user_id="u", session_id="s" * 2_000_000
    )
    assert log.submit(topic, huge)
    for i in range(1_000):
        assert log.submit(topic, decision(f"r{i}"))
    log.close()
    assert logged(apache_kafka.bootstrap_servers, topic) == [f"r{i}" for i in range(1_000)]
    assert metrics.value(OUTCOMES, outcome="dropped_undeliverable") == 1


def test_a_record_the_broker_refuses_as_too_large_is_dropped_not_retried(apache_kafka, decision_log_events):
    """Under the producer's limit but over the topic's: the broker's refusal comes back in the delivery
    report, and counts as undeliverable (logged), not as a failure; the records after it still go."""
    topic = f"decisions-{uuid.uuid4().hex[:8]}"
    ensure_topics(
        apache_kafka.bootstrap_servers, [TopicSpec(topic, 1, configs=(("max.message.bytes", "65536"),))]
    )
    metrics = ServingMetrics()
    log = DecisionLog(
        apache_kafka.bootstrap_servers, metrics, capacity=2_000, in_flight=500, flush_timeout_s=30
    )
    try:
        big = contracts.DecisionRecord(
            schema_version=1, request_id="big", user_id="u", session_id="s" * 100_000
        )
        assert log.submit(topic, big)
        # alone in its batch: a broker refuses a whole batch, and the records after it are not at fault
        wait_for(lambda: len(decision_log_events.named("record_undeliverable")) == 1, "the broker's refusal")
        for i in range(1_000):
            assert log.submit(topic, decision(f"r{i}"))
    finally:
        log.close()
    assert logged(apache_kafka.bootstrap_servers, topic) == [f"r{i}" for i in range(1_000)]
    assert metrics.value(OUTCOMES, outcome="dropped_undeliverable") == 1
    assert metrics.value(OUTCOMES, outcome="failed") == 0
    assert metrics.value(OUTCOMES, outcome="acked") == 1_000
    assert decision_log_events.named("record_undeliverable")[0]["bytes"] > 100_000


def test_records_for_a_missing_topic_wait_for_it_and_never_create_it(embedded_kafka, decision_log_events):
    """Topics come from ensure_topics with their partition counts: a typo must not create one (Tansu
    creates a topic that a metadata request asks for, unless the client says not to)."""
    bootstrap = embedded_kafka.bootstrap_servers
    topic = f"decisions-{uuid.uuid4().hex[:8]}"
    metrics = ServingMetrics()
    log = DecisionLog(bootstrap, metrics, capacity=50, in_flight=50, flush_timeout_s=30)
    try:
        for i in range(3):
            assert log.submit(topic, decision(f"r{i}"))
        wait_for(lambda: decision_log_events.named("topic_unavailable"), "the missing topic's warning")
        assert topic not in AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
        assert (
            metrics.value(OUTCOMES, outcome="deferred") == 3 and metrics.value(OUTCOMES, outcome="acked") == 0
        )
        ensure_topics(bootstrap, [TopicSpec(topic, 1)])
        wait_for(lambda: metrics.value(OUTCOMES, outcome="acked") == 3, "the records once the topic exists")
    finally:
        log.close()
    assert logged(bootstrap, topic) == ["r0", "r1", "r2"]
    (warning,) = decision_log_events.named("topic_unavailable")
    assert warning["topic"] == topic
    assert decision_log_events.named("topic_available") == [{"topic": topic}]


def test_a_missing_shadow_topic_holds_back_its_own_records_only(embedded_kafka):
    """A shadow topic nobody created held its first record at the head of the queue, and with it every
    served decision behind it: no decision reached Kafka until the topic appeared. The shadow's records
    now wait aside (still counted as waiting), the decisions go on, and the shadow's arrive in order once
    their topic exists; those still waiting at shutdown are counted as dropped."""
    bootstrap = embedded_kafka.bootstrap_servers
    decisions, shadow, never = (f"{name}-{uuid.uuid4().hex[:8]}" for name in ("dec", "shadow", "never"))
    ensure_topics(bootstrap, [TopicSpec(decisions, 1)])
    metrics = ServingMetrics()
    log = DecisionLog(bootstrap, metrics, capacity=500, in_flight=100, flush_timeout_s=30)
    try:
        for i in range(3):
            assert log.submit(shadow, decision(f"s{i}"))
        assert log.submit(never, decision("lost"))
        for i in range(200):
            assert log.submit(decisions, decision(f"r{i}"))
        wait_for(lambda: metrics.value(OUTCOMES, outcome="acked") == 200, "the decisions behind them")
        assert metrics.value("recsys_decision_log_queue_depth") == 4  # the shadow's three, and "lost"
        ensure_topics(bootstrap, [TopicSpec(shadow, 1)])
        wait_for(lambda: metrics.value(OUTCOMES, outcome="acked") == 203, "the shadow's, once it exists")
    finally:
        log.close()
    assert logged(bootstrap, decisions) == [f"r{i}" for i in range(200)]
    assert logged(bootstrap, shadow) == ["s0", "s1", "s2"]
    assert metrics.value(OUTCOMES, outcome="dropped_shutdown") == 1
    assert metrics.value("recsys_decision_log_queue_depth") == 0


def test_a_broker_that_stops_answering_is_reported_once_gone_and_once_back(decision_log_events):
    """Issue 18: a broker that stays unreachable is logged at warning level once per state change, with
    the records waiting; librdkafka reports it down again and again meanwhile."""
    with EmbeddedBroker() as broker:
        topic = f"dec-{uuid.uuid4().hex[:8]}"
        ensure_topics(broker.bootstrap_servers, [TopicSpec(topic, 1)])
        metrics = ServingMetrics()
        value = metrics.value
        log = DecisionLog(broker.bootstrap_servers, metrics, capacity=5, in_flight=3, flush_timeout_s=30)
        try:
            log.submit(topic, decision("before"))
            wait_for(lambda: value(OUTCOMES, outcome="acked") == 1, "the first record's ack")
            group = broker._process.pid  # the broker runs in its own process group
            os.killpg(group, signal.SIGSTOP)  # Kafka stops answering: connections hang
            try:
                for i in range(4):  # three in flight (the limit), and one the sender holds
                    assert log.submit(topic, decision(f"down-{i}"))
                wait_for(lambda: value(OUTCOMES, outcome="deferred") == 1, "the record the sender holds")
                accepted = [log.submit(topic, decision(f"queued-{i}")) for i in range(7)]
                assert accepted == [True] * 5 + [False] * 2  # the queue holds five
                wait_for(lambda: decision_log_events.named("broker_unreachable"), "the outage's warning")
                failed_probes = len(decision_log_events.named("probe_failed"))
                wait_for(
                    lambda: len(decision_log_events.named("probe_failed")) >= failed_probes + 2,
                    "more failed probes",
                )
                (gone,) = decision_log_events.named("broker_unreachable")
                assert gone["waiting"] == 3 + 1 + 5 and gone["in_flight"] == 3
                assert decision_log_events.named("broker_reachable") == []
            finally:
                os.killpg(group, signal.SIGCONT)
            wait_for(lambda: decision_log_events.named("broker_reachable"), "the recovery's warning")
            wait_for(lambda: value(OUTCOMES, outcome="acked") == 1 + 4 + 5, "the waiting records' acks")
        finally:
            log.close()
        (back,) = decision_log_events.named("broker_reachable")
        assert back["deferred"] == 1 and back["dropped_queue_full"] == 2 and back["down_s"] > 0
        assert len(decision_log_events.named("broker_unreachable")) == 1
        expected = ["before", *(f"down-{i}" for i in range(4)), *(f"queued-{i}" for i in range(5))]
        # every record at least once: requests that timed out while the broker was stopped are sent again,
        # and the broker may have taken the first copy too (the producer is not idempotent: see
        # serving.decision_log._PRODUCER_CONFIG; the pipeline filters a retry's duplicate by request id)
        delivered = logged(broker.bootstrap_servers, topic)
        assert set(delivered) == set(expected)
        assert delivered[0] == "before"
        assert value(OUTCOMES, outcome="failed") == 0
        assert value(OUTCOMES, outcome="dropped_queue_full") == 2
