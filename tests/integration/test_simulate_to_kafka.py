"""Simulated days written to Kafka are read back exactly, on Apache Kafka and on the embedded broker."""

import uuid
from collections import Counter, defaultdict

import pytest

from recsys_rl import contracts
from recsys_rl.kafka.reader import high_watermarks, read_range
from recsys_rl.sim.simulate import SimulateConfig, day_messages, run_simulation, simulated_days

pytestmark = pytest.mark.integration


def _expected_records(config: SimulateConfig) -> dict[str, list[tuple[bytes, bytes]]]:
    """What the run must have written, rebuilt independently from the same seed."""
    sim, next_day = simulated_days(config)
    out: dict[str, list[tuple[bytes, bytes]]] = {config.decisions_topic: [], config.feedback_topic: []}
    for _ in range(config.days):
        for topic, key, value, _ in day_messages(config, sim, next_day()):
            out[topic].append((key, value))
    return out


def test_simulated_days_round_trip_exactly(kafka_broker):
    suffix = uuid.uuid4().hex[:8]
    config = SimulateConfig(
        users=120,
        days=2,
        seed=31,
        partitions=3,
        decisions_topic=f"decisions-{suffix}",
        feedback_topic=f"feedback-{suffix}",
    )
    report = run_simulation(config, kafka_broker.bootstrap_servers)
    expected = _expected_records(config)

    assert report.days == 2 and report.requests > 0
    for topic, records in expected.items():
        got = list(read_range(kafka_broker.bootstrap_servers, topic))
        assert report.written[topic] == len(records) == len(got)
        assert report.end_offsets[topic] == len(records)
        # same records, byte for byte, with the keys they were sent with
        assert Counter((r.key, r.value) for r in got) == Counter(records)
        # one user's records stay in one partition, in the order they were produced
        by_key: dict[bytes, list[tuple[int, int, bytes]]] = defaultdict(list)
        for r in got:
            by_key[r.key].append((r.partition, r.offset, r.value))
        produced_order: dict[bytes, list[bytes]] = defaultdict(list)
        for key, value in records:
            produced_order[key].append(value)
        for key, rows in by_key.items():
            assert len({p for p, _, _ in rows}) == 1
            assert [v for _, _, v in sorted(rows)] == produced_order[key]
        # end offsets from the fetch high watermark match per partition
        per_partition = Counter(r.partition for r in got)
        assert high_watermarks(kafka_broker.bootstrap_servers, topic) == {
            p: per_partition.get(p, 0) for p in range(config.partitions)
        }
    # payloads decode as the contracts say, with event times as Kafka timestamps
    first = next(iter(read_range(kafka_broker.bootstrap_servers, config.feedback_topic)))
    assert first.timestamp_ms == contracts.decode_feedback(first.value).event_time_ms
