"""The decision log on real Apache Kafka: one record that can never be sent does not stop the others."""

from __future__ import annotations

import uuid

import pytest

from recsys_rl import contracts
from recsys_rl.kafka.reader import read_range
from recsys_rl.kafka.topics import TopicSpec, ensure_topics
from recsys_rl.serving.decision_log import DecisionLog
from recsys_rl.serving.metrics import ServingMetrics

pytestmark = pytest.mark.integration

OUTCOMES = "recsys_decision_log_records_total"


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
        assert log.submit(topic, contracts.DecisionRecord(schema_version=1, request_id=f"r{i}", user_id="u"))
    log.close()
    arrived = [
        contracts.decode_decision(r.value).request_id
        for r in read_range(apache_kafka.bootstrap_servers, topic)
    ]
    assert arrived == [f"r{i}" for i in range(1_000)]
    assert metrics.value(OUTCOMES, outcome="dropped_undeliverable") == 1
