"""The Kafka layer against real brokers: Apache Kafka (the reference) and Tansu (what users get).

The brokers are shared by the whole session, so every test works on its own uuid-named topics.
"""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from typing import Any

import pytest
import redis
from kafka.partitioner.default import murmur2

from recsys_rl.kafka import (
    Broker,
    BrokerUnavailable,
    DeliveryError,
    ExternalBroker,
    ReadError,
    TopicSetupError,
    wait_until_reachable,
)
from recsys_rl.kafka.broker import free_port
from recsys_rl.kafka.producer import EventProducer
from recsys_rl.kafka.reader import ConsumedRecord, high_watermarks, read_range
from recsys_rl.kafka.topics import TopicSpec, ensure_topics

pytestmark = pytest.mark.integration

RECORDS = 3_000
PARTITIONS = 4
EMPTY_PARTITION = 3


def _partition_of(key: bytes) -> int:
    """Where the producer's default (Java-compatible murmur2) partitioner puts ``key``.

    Knowing this without asking the broker gives the tests an expectation that does not depend on
    the code under test: the per-partition counts follow from what was sent.
    """
    return (murmur2(key) & 0x7FFFFFFF) % PARTITIONS


# 37 keys that all avoid one partition, so the topic mixes filled partitions with an empty one.
KEYS = [k for k in (f"user-{n}".encode() for n in range(1_000)) if _partition_of(k) != EMPTY_PARTITION][:37]


def _sent_per_partition() -> dict[int, int]:
    sent = Counter(_partition_of(_record(i)[0]) for i in range(RECORDS))
    return {p: sent.get(p, 0) for p in range(PARTITIONS)}


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def _record(i: int) -> tuple[bytes, bytes]:
    return KEYS[i % len(KEYS)], f"event-{i}".encode()


def _produce(bootstrap: str, topic: str, count: int, *, base_ts: int = 1_700_000_000_000) -> None:
    with EventProducer(bootstrap) as producer:
        for i in range(count):
            key, value = _record(i)
            producer.send(topic, key, value, timestamp_ms=base_ts + i)
        producer.flush(timeout_s=60)
        counts = producer.counts()[topic]
    assert (counts.sent, counts.acked, counts.failed) == (count, count, 0)


@pytest.fixture(scope="module")
def filled_topic(kafka_broker: Broker) -> tuple[str, list[ConsumedRecord]]:
    """A topic with records in all partitions but one, read back in full once per broker."""
    topic = _topic("filled")
    ensure_topics(kafka_broker.bootstrap_servers, [TopicSpec(topic, partitions=PARTITIONS)])
    _produce(kafka_broker.bootstrap_servers, topic, RECORDS)
    return topic, list(read_range(kafka_broker.bootstrap_servers, topic))


def test_ensure_topics_creates_requested_partitions_and_is_idempotent(kafka_broker: Broker) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    specs = [TopicSpec(_topic("three"), partitions=3), TopicSpec(_topic("one"), partitions=1)]
    ensure_topics(bootstrap, specs)
    ensure_topics(bootstrap, specs)  # already there with the same layout: fine
    for spec in specs:
        assert set(high_watermarks(bootstrap, spec.name)) == set(range(spec.partitions))


def test_ensure_topics_rejects_existing_topic_with_other_partition_count(kafka_broker: Broker) -> None:
    name = _topic("layout")
    ensure_topics(kafka_broker.bootstrap_servers, [TopicSpec(name, partitions=2)])
    with pytest.raises(TopicSetupError, match=rf"'{name}'.*2 partition\(s\) but 5"):
        ensure_topics(kafka_broker.bootstrap_servers, [TopicSpec(name, partitions=5)])


def test_produced_records_read_back_exactly(filled_topic: tuple[str, list[ConsumedRecord]]) -> None:
    topic, records = filled_topic
    assert len(records) == RECORDS
    assert Counter((r.key, r.value) for r in records) == Counter(_record(i) for i in range(RECORDS))
    assert all(r.topic == topic for r in records)

    by_partition: dict[int, list[ConsumedRecord]] = defaultdict(list)
    for record in records:
        by_partition[record.partition].append(record)
    for partition_records in by_partition.values():
        assert [r.offset for r in partition_records] == list(range(len(partition_records)))
        # Within a partition, events keep the order they were sent in.
        sent_index = [int(r.value.removeprefix(b"event-")) for r in partition_records]
        assert sent_index == sorted(sent_index)
        assert [r.timestamp_ms for r in partition_records] == [1_700_000_000_000 + i for i in sent_index]

    assert Counter(r.partition for r in records) == +Counter(_sent_per_partition())

    partitions_of_key: dict[bytes | None, set[int]] = defaultdict(set)
    for record in records:
        partitions_of_key[record.key].add(record.partition)
    assert len(partitions_of_key) == len(KEYS)
    assert all(len(partitions) == 1 for partitions in partitions_of_key.values())


def test_high_watermarks_count_records_per_partition(
    kafka_broker: Broker, filled_topic: tuple[str, list[ConsumedRecord]]
) -> None:
    """Fails on Tansu if end offsets come from ListOffsets(latest), which lands inside the last batch."""
    topic, _ = filled_topic
    expected = _sent_per_partition()
    assert expected[EMPTY_PARTITION] == 0
    assert high_watermarks(kafka_broker.bootstrap_servers, topic) == expected


def test_high_watermarks_of_an_empty_topic_are_zero(kafka_broker: Broker) -> None:
    topic = _topic("empty")
    ensure_topics(kafka_broker.bootstrap_servers, [TopicSpec(topic, partitions=3)])
    assert high_watermarks(kafka_broker.bootstrap_servers, topic) == {0: 0, 1: 0, 2: 0}
    assert list(read_range(kafka_broker.bootstrap_servers, topic)) == []


def test_read_range_returns_exactly_the_requested_slice(
    kafka_broker: Broker, filled_topic: tuple[str, list[ConsumedRecord]]
) -> None:
    topic, records = filled_topic
    ends = high_watermarks(kafka_broker.bootstrap_servers, topic)
    busy = [p for p, end in ends.items() if end >= 10]
    first, second = busy[0], busy[1]
    start = {first: 3, second: 0}
    end = {first: ends[first] - 2, second: 5}

    got = list(read_range(kafka_broker.bootstrap_servers, topic, start=start, end=end))

    def in_slice(r: ConsumedRecord) -> bool:
        return r.partition in end and start[r.partition] <= r.offset < end[r.partition]

    def by_position(r: ConsumedRecord) -> tuple[int, int]:
        return r.partition, r.offset

    assert sorted(got, key=by_position) == sorted(filter(in_slice, records), key=by_position)
    assert len(got) == (ends[first] - 5) + 5


def test_read_range_with_empty_slice_reads_nothing(
    kafka_broker: Broker, filled_topic: tuple[str, list[ConsumedRecord]]
) -> None:
    topic, _ = filled_topic
    assert list(read_range(kafka_broker.bootstrap_servers, topic, start={0: 7}, end={0: 7})) == []


def test_read_range_beyond_the_log_end_is_an_error_not_a_hang(
    kafka_broker: Broker, filled_topic: tuple[str, list[ConsumedRecord]]
) -> None:
    """Kafka answers OFFSET_OUT_OF_RANGE; Tansu just returns nothing, caught by the idle timeout."""
    topic, _ = filled_topic
    ends = high_watermarks(kafka_broker.bootstrap_servers, topic)
    partition = next(p for p, end in ends.items() if end > 0)
    beyond = {partition: ends[partition] + 5}
    with pytest.raises(ReadError, match=repr(topic)):
        list(
            read_range(
                kafka_broker.bootstrap_servers,
                topic,
                start=beyond,
                end={partition: ends[partition] + 10},
                idle_timeout_s=1.0,
            )
        )


def test_reading_a_missing_topic_is_a_clear_error(kafka_broker: Broker) -> None:
    missing = _topic("missing")
    with pytest.raises(ReadError, match=f"'{missing}' does not exist"):
        high_watermarks(kafka_broker.bootstrap_servers, missing)
    with pytest.raises(ReadError, match=f"'{missing}' does not exist"):
        list(read_range(kafka_broker.bootstrap_servers, missing))


def test_flush_reports_records_the_broker_rejected(apache_kafka: Broker) -> None:
    """Kafka only: Tansu accepts records over max.message.bytes, so it has no rejection to report."""
    topic = _topic("too-big")
    ensure_topics(apache_kafka.bootstrap_servers, [TopicSpec(topic, partitions=1)])
    with EventProducer(apache_kafka.bootstrap_servers, max_request_size=4 * 1024 * 1024) as producer:
        producer.send(topic, b"k", b"x" * (2 * 1024 * 1024))  # over the broker's 1 MiB default
        with pytest.raises(
            DeliveryError, match=r"1 record\(s\) were not delivered; first error: .*MessageSizeTooLarge"
        ):
            producer.flush(timeout_s=30)
        assert producer.counts()[topic].failed == 1
        producer.flush(timeout_s=30)  # each failure is reported once


def test_sending_to_a_missing_topic_fails_instead_of_creating_it(apache_kafka: Broker) -> None:
    """Kafka only: Tansu creates topics on first use whatever the client asks."""
    missing = _topic("typo")
    with EventProducer(apache_kafka.bootstrap_servers, max_block_ms=1_000) as producer:
        with pytest.raises(DeliveryError, match=f"'{missing}'.*does the topic exist"):
            producer.send(missing, b"k", b"v")
        assert producer.counts()[missing].failed == 1


def test_unreachable_address_raises_broker_unavailable_naming_it() -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(BrokerUnavailable, match=address):
        wait_until_reachable(address, timeout_s=1.0)
    with pytest.raises(BrokerUnavailable, match=address):
        ExternalBroker(address, ready_timeout_s=1.0).start()


def test_external_broker_attaches_to_a_running_broker(kafka_broker: Broker) -> None:
    with ExternalBroker(kafka_broker.bootstrap_servers) as external:
        assert external.running
        assert external.bootstrap_servers == kafka_broker.bootstrap_servers
    assert not external.running
    wait_until_reachable(kafka_broker.bootstrap_servers, timeout_s=10.0)  # leaving it did not stop it


def test_redis_server_answers_set_and_get(redis_server: Any) -> None:
    client = redis.Redis.from_url(redis_server.url)
    try:
        client.set("recsys-rl:smoke", b"ok")
        assert client.get("recsys-rl:smoke") == b"ok"
    finally:
        client.close()
