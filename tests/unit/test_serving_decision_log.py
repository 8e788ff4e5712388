"""The decision log never blocks its caller: with Kafka unreachable it defers, drops and counts."""

from __future__ import annotations

import threading

from recsys_rl import contracts
from recsys_rl.kafka.broker import free_port
from recsys_rl.serving.decision_log import DecisionLog
from recsys_rl.serving.metrics import ServingMetrics

OUTCOMES = "recsys_decision_log_records_total"


def record(i: int) -> contracts.DecisionRecord:
    return contracts.DecisionRecord(
        schema_version=1, request_id=f"r{i}", user_id=f"u{i % 3}", event_time_ms=i
    )


def test_an_unreachable_kafka_fills_the_queue_then_drops_and_counts():
    metrics = ServingMetrics()
    log = DecisionLog(f"127.0.0.1:{free_port()}", metrics, capacity=5, in_flight=100, flush_timeout_s=0.5)
    accepted = [log.submit("decisions", record(i)) for i in range(20)]
    # the sender holds one record while it waits for Kafka; the queue holds 5 more at most
    assert 5 <= sum(accepted) <= 6 and accepted[:5] == [True] * 5
    assert metrics.value(OUTCOMES, outcome="dropped_queue_full") == 20 - sum(accepted)
    log.close()
    assert metrics.value(OUTCOMES, outcome="deferred") >= 1
    assert metrics.value(OUTCOMES, outcome="dropped_shutdown") == sum(accepted)
    assert metrics.value(OUTCOMES, outcome="enqueued") == sum(accepted)
    assert log.submit("decisions", record(99)) is False  # closed: nothing more is taken


def test_without_kafka_nothing_is_queued():
    metrics = ServingMetrics()
    log = DecisionLog(None, metrics, capacity=5, in_flight=5, flush_timeout_s=0.1)
    assert log.submit("decisions", record(0)) is False
    log.close()
    assert metrics.value(OUTCOMES, outcome="enqueued") == 0


def test_the_queue_depth_gauge_is_right_while_kafka_is_down():
    """Issue 18: the gauge moved only when the sender took a record, so it read 0 while records waited
    behind one the sender held for an unreachable broker."""
    metrics = ServingMetrics()
    log = DecisionLog(f"127.0.0.1:{free_port()}", metrics, capacity=50, in_flight=100, flush_timeout_s=0.5)
    for i in range(10):
        log.submit("decisions", record(i))
    waiting = metrics.value("recsys_decision_log_queue_depth")
    assert waiting in (9, 10)  # the sender may hold the first one
    log.close()
    assert metrics.value("recsys_decision_log_queue_depth") == 0


def test_a_broker_that_never_answers_is_warned_about_once_with_the_records_waiting(decision_log_events):
    """Issue 18: an unreachable broker is logged at warning level once per state change, not once per
    retry (librdkafka reports it down many times a second while it tries, and the sender keeps asking)."""
    metrics = ServingMetrics()
    log = DecisionLog(f"127.0.0.1:{free_port()}", metrics, capacity=50, in_flight=100, flush_timeout_s=0.5)
    try:
        for i in range(4):
            log.submit("decisions", record(i))
        pause = threading.Event()
        for _ in range(600):  # 30 s at most; the broker is asked about every 1 to 2 s
            if len(decision_log_events.named("probe_failed")) >= 3:
                break
            pause.wait(0.05)
        assert len(decision_log_events.named("probe_failed")) >= 3
        (warning,) = decision_log_events.named("broker_unreachable")
        assert warning["waiting"] == 4 and warning["in_flight"] == 0
        assert "Connection refused" in warning["error"]
        assert (
            decision_log_events.named("broker_reachable") == []
            and decision_log_events.named("producer_connected") == []
        )
        assert metrics.value(OUTCOMES, outcome="deferred") == 1  # the record the sender holds
    finally:
        log.close()
