"""The Beam replay source and group-offset bookkeeping against real brokers (Apache Kafka and Tansu).

Expected records are derived from what the test sends (partition by the producer's murmur2
partitioner, offsets by send order within a partition), never from the code under test. The brokers
are shared by the session, so every test uses its own topics and group.
"""

from __future__ import annotations

import math
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence

import apache_beam as beam
import confluent_kafka
import kafka
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from kafka import KafkaProducer
from kafka.partitioner.default import murmur2

from recsys_rl.kafka import Broker, ReadError
from recsys_rl.kafka.connection import connect
from recsys_rl.kafka.producer import EventProducer
from recsys_rl.kafka.topics import TopicSpec, ensure_topics
from recsys_rl.pipelines.kafka_source import (
    KafkaBatch,
    KafkaRecord,
    OffsetRange,
    ReadKafkaReplay,
    ReplayPlan,
    commit_offsets,
    committed_offsets,
    plan_replay,
)

pytestmark = pytest.mark.integration

PARTITIONS = 3
RECORDS = 600
CHUNK = 70  # small, so every partition is read as several chunks, the last one short
BASE_TS = 1_767_225_600_000


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def _partition_of(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class Topic:
    """A fresh topic plus a model of its contents: what a correct reader must return."""

    def __init__(self, broker: Broker, prefix: str, partitions: int = PARTITIONS) -> None:
        self.bootstrap = broker.bootstrap_servers
        self.name = _name(prefix)
        self.partitions = partitions
        self.records: list[KafkaRecord] = []
        ensure_topics(self.bootstrap, [TopicSpec(self.name, partitions=partitions)])

    def produce(self, count: int) -> list[KafkaRecord]:
        """Send ``count`` keyed records; return them as the reader should yield them."""
        next_offset = Counter(r.partition for r in self.records)
        sent: list[KafkaRecord] = []
        with EventProducer(self.bootstrap) as producer:
            for _ in range(count):
                i = len(self.records) + len(sent)
                key, value, ts = f"user-{i % 41}".encode(), f"{self.name}/event-{i}".encode(), BASE_TS + i
                partition = _partition_of(key, self.partitions)
                producer.send(self.name, key, value, timestamp_ms=ts)
                sent.append(KafkaRecord(self.name, partition, next_offset[partition], ts, key, value))
                next_offset[partition] += 1
        self.records += sent
        return sent

    def ends(self) -> dict[int, int]:
        counts = Counter(r.partition for r in self.records)
        return {p: counts.get(p, 0) for p in range(self.partitions)}


def _read_and_check(
    plan: ReplayPlan, expected: Iterable[KafkaRecord], *, chunk: int = CHUNK, options: Sequence[str] = ()
) -> None:
    """Run the source alone in a pipeline; assert_that's equal_to is a multiset check (catches duplicates)."""
    pipeline_options = PipelineOptions(["--runner=DirectRunner", *options])
    with beam.Pipeline(options=pipeline_options) as pipeline:
        records = pipeline | ReadKafkaReplay(plan, chunk) | beam.FlatMap(KafkaBatch.records)
        assert_that(records, equal_to(list(expected)))


@pytest.fixture(scope="module")
def filled(kafka_broker: Broker) -> Topic:
    topic = Topic(kafka_broker, "replay")
    topic.produce(RECORDS)
    assert 0 not in topic.ends().values(), "the key set should reach every partition"
    return topic


def test_plan_from_earliest_spans_each_partition(filled: Topic) -> None:
    plan = plan_replay(filled.bootstrap, [filled.name], None, start="earliest")
    assert plan.ranges == tuple(OffsetRange(filled.name, p, 0, end) for p, end in filled.ends().items())
    assert plan.total_records == RECORDS


def test_source_reads_every_record_exactly_once_with_all_fields(filled: Topic) -> None:
    plan = plan_replay(filled.bootstrap, [filled.name], None, start="earliest")
    assert len(plan.chunks(CHUNK)) > PARTITIONS
    _read_and_check(plan, filled.records)


def test_source_reads_from_a_given_start(filled: Topic) -> None:
    start = {(filled.name, 0): 5, (filled.name, 2): filled.ends()[2]}  # partition 1 from its log start
    plan = plan_replay(filled.bootstrap, [filled.name], None, start=start)
    assert [(r.partition, r.start) for r in plan.ranges] == [(0, 5), (1, 0), (2, filled.ends()[2])]
    expected = [r for r in filled.records if r.offset >= start.get((r.topic, r.partition), 0)]
    _read_and_check(plan, expected)


def test_source_reads_two_topics_and_maps_null_keys_to_empty_bytes(
    kafka_broker: Broker, filled: Topic
) -> None:
    other = Topic(kafka_broker, "second", partitions=1)
    other.produce(25)
    with EventProducer(other.bootstrap) as producer:
        producer.send(other.name, None, b"", timestamp_ms=BASE_TS)  # type: ignore[arg-type]
    null_key = KafkaRecord(other.name, 0, 25, BASE_TS, b"", b"")
    plan = plan_replay(kafka_broker.bootstrap_servers, [filled.name, other.name], None, start="earliest")
    assert {r.topic for r in plan.ranges} == {filled.name, other.name}
    _read_and_check(plan, [*filled.records, *other.records, null_key], chunk=10)


def test_records_produced_after_planning_are_not_read(kafka_broker: Broker) -> None:
    topic = Topic(kafka_broker, "bounded")
    first = topic.produce(150)
    plan = plan_replay(topic.bootstrap, [topic.name], None, start="earliest")
    topic.produce(90)
    _read_and_check(plan, first, chunk=40)


def test_committed_offsets_carry_the_next_plan_on_from_the_last_one(
    kafka_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = Topic(kafka_broker, "committed")
    group = _name("group")
    first = topic.produce(200)
    assert committed_offsets(topic.bootstrap, group, [topic.name]) == dict.fromkeys(
        ((topic.name, p) for p in range(PARTITIONS)), None
    )

    plan = plan_replay(topic.bootstrap, [topic.name], group)  # nothing committed yet: from log start
    assert plan.total_records == 200
    _read_and_check(plan, first)
    # One OffsetCommit, no group join: no consumer may be made, and the clock leaves no time for a retry
    # (its first reading sets the deadline, any later one is past it).
    readings: list[float] = []

    def past_the_deadline_once_read() -> float:
        readings.append(0.0 if not readings else math.inf)
        return readings[-1]

    def no_consumer(*args, **kwargs):
        raise AssertionError("committing offsets made a consumer: it would join the group")

    with monkeypatch.context() as patched:
        patched.setattr(confluent_kafka, "Consumer", no_consumer)
        patched.setattr(kafka, "KafkaConsumer", no_consumer)
        commit_offsets(plan, clock=past_the_deadline_once_read)
    assert readings == [0.0], "the commit needed a retry"
    assert committed_offsets(topic.bootstrap, group, [topic.name]) == {
        (topic.name, p): end for p, end in topic.ends().items()
    }

    caught_up = plan_replay(topic.bootstrap, [topic.name], group)
    assert caught_up.total_records == 0
    assert [(r.start, r.end) for r in caught_up.ranges] == [(end, end) for end in topic.ends().values()]
    _read_and_check(caught_up, [])

    more = topic.produce(60)
    following = plan_replay(topic.bootstrap, [topic.name], group)
    assert following.total_records == 60
    _read_and_check(following, more, chunk=25)


def test_offsets_taken_by_transaction_markers_neither_stall_nor_overrun_a_chunk(kafka_broker: Broker) -> None:
    """Each committed transaction leaves a marker that takes an offset but is never returned as a record.

    Chunks of 4 offsets then end on a marker (the chunk must still finish) or hold fewer records than
    offsets (the reader must not take the next chunk's first record to make up the number).
    """
    topic = Topic(kafka_broker, "transactions", partitions=1)
    producer = connect(KafkaProducer, topic.bootstrap, 10.0, transactional_id=_name("txn"))
    expected = []
    try:
        producer.init_transactions()
        for transaction in range(3):
            producer.begin_transaction()
            for i in range(5):
                key, value, ts = b"k", f"{transaction}-{i}".encode(), BASE_TS + i
                producer.send(topic.name, key=key, value=value, timestamp_ms=ts)
                expected.append(KafkaRecord(topic.name, 0, 6 * transaction + i, ts, key, value))
            producer.commit_transaction()
    finally:
        producer.close()
    plan = plan_replay(topic.bootstrap, [topic.name], None, start="earliest")
    assert plan.ranges == (OffsetRange(topic.name, 0, 0, 18),)  # 15 records, 3 markers
    _read_and_check(plan, expected, chunk=4)


def test_aborted_transactions_are_not_read_and_an_open_one_ends_the_plan(apache_kafka: Broker) -> None:
    """Read committed: an aborted transaction's records never reach a dataset, and the plan ends at the
    last stable offset, so records behind a transaction still open wait for the next run rather than
    being read before the transaction decides (or stalling the read until it does).

    Offsets come from the broker's acknowledgements: where an aborted transaction's records and markers
    land is the broker's business, and the test only needs to know where each record went."""
    topic = Topic(apache_kafka, "isolation", partitions=1)

    def send(producer: KafkaProducer, values: Sequence[str]) -> list[KafkaRecord]:
        futures = [
            producer.send(topic.name, key=b"k", value=v.encode(), timestamp_ms=BASE_TS + i)
            for i, v in enumerate(values)
        ]
        producer.flush()
        return [
            KafkaRecord(topic.name, 0, f.get(timeout=10).offset, BASE_TS + i, b"k", v.encode())
            for i, (f, v) in enumerate(zip(futures, values, strict=True))
        ]

    plain = connect(KafkaProducer, topic.bootstrap, 10.0)
    aborting = connect(KafkaProducer, topic.bootstrap, 10.0, transactional_id=_name("aborts"))
    pending = connect(KafkaProducer, topic.bootstrap, 10.0, transactional_id=_name("pending"))
    try:
        kept = send(plain, ["a0", "a1", "a2"])
        aborting.init_transactions()
        aborting.begin_transaction()
        send(aborting, ["x0", "x1", "x2", "x3"])
        aborting.abort_transaction()
        kept += send(plain, ["b0", "b1"])
        pending.init_transactions()
        pending.begin_transaction()
        held = send(pending, ["p0", "p1"])  # open: the last stable offset stays at p0's
        held += send(plain, ["c0"])
        plan = plan_replay(topic.bootstrap, [topic.name], None, start="earliest")
        assert plan.ranges == (OffsetRange(topic.name, 0, 0, held[0].offset),)
        _read_and_check(plan, kept, chunk=3)

        pending.commit_transaction()
        after = plan_replay(topic.bootstrap, [topic.name], None, start={(topic.name, 0): held[0].offset})
        assert after.ranges[0].start == held[0].offset and after.ranges[0].end > held[-1].offset
        _read_and_check(after, held, chunk=3)
    finally:
        for producer in (plain, aborting, pending):
            producer.close()


def test_multi_process_workers_read_the_same_records(embedded_kafka: Broker) -> None:
    """Once, on Tansu: what is under test is that the DoFn pickles and reconnects in other processes."""
    topic = Topic(embedded_kafka, "processes")
    topic.produce(300)
    plan = plan_replay(topic.bootstrap, [topic.name], None, start="earliest")
    multi_process = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
    _read_and_check(plan, topic.records, chunk=40, options=multi_process)

    # Through a shuffle between processes, batches must come back as KafkaBatch (see KafkaBatchCoder).
    with beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner", *multi_process])) as pipeline:
        shuffled = pipeline | ReadKafkaReplay(plan, 40) | beam.Reshuffle()
        assert_that(
            shuffled | beam.Map(lambda r: type(r).__name__) | beam.Distinct(), equal_to(["KafkaBatch"])
        )


def test_planning_an_unknown_topic_names_it(kafka_broker: Broker, filled: Topic) -> None:
    missing = _name("missing")
    with pytest.raises(ReadError, match=f"'{missing}' does not exist"):
        plan_replay(kafka_broker.bootstrap_servers, [filled.name, missing], None, start="earliest")
    with pytest.raises(ReadError, match=f"'{missing}' does not exist"):
        committed_offsets(kafka_broker.bootstrap_servers, _name("group"), [missing])


def test_a_start_past_the_log_end_is_refused(filled: Topic) -> None:
    beyond = filled.ends()[1] + 5
    with pytest.raises(ReadError, match=rf"{filled.name}\[1\]: given start {beyond} is past the log end"):
        plan_replay(filled.bootstrap, [filled.name], None, start={(filled.name, 1): beyond})
    with pytest.raises(ReadError, match=rf"{filled.name}\[{PARTITIONS}\]"):
        plan_replay(filled.bootstrap, [filled.name], None, start={(filled.name, PARTITIONS): 0})


def test_a_chunk_that_cannot_be_read_completely_fails_the_pipeline(filled: Topic) -> None:
    """Offsets past the log end stand in for deleted records: Tansu answers such fetches with nothing."""
    end = filled.ends()[0]
    plan = ReplayPlan(filled.bootstrap, None, (OffsetRange(filled.name, 0, end - 3, end + 4),))
    failure = rf"{filled.name}\[0\] offsets \[{end - 3}, {end + 4}\).*no progress"
    pipeline = beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner"]))
    _ = pipeline | ReadKafkaReplay(plan, 100, idle_timeout_s=1.0)
    with pytest.raises(Exception, match=failure):
        pipeline.run().wait_until_finish()
