"""Bounded reads of a topic: "these offsets, then stop", without a consumer group.

Two broker behaviours shape this module:

* Joining a consumer group for the first time takes about 25 s on Tansu (the embedded broker), and a
  bounded read has no use for group coordination anyway, so partitions are always assigned by hand
  and no offsets are committed.
* Tansu answers ListOffsets(latest), which is what kafka-python's ``end_offsets`` sends, with an
  offset short of the real log end: after 4,000 records it reported 3,699, apparently the base
  offset of the last record batch rather than the offset after the last record. Apache Kafka gets
  it right. The high watermark carried in every *fetch* response is right on both, so end offsets
  here always come from a fetch (see `high_watermarks`), and ListOffsets(latest) is used only as a
  hint for where to fetch from.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import kafka.errors as kafka_errors
from kafka import KafkaConsumer, TopicPartition

from recsys_rl.kafka.connection import connect, quiet_kafka_logging
from recsys_rl.kafka.setup_errors import ReadError

_POLL_MS = 100


@dataclass(frozen=True, slots=True)
class ConsumedRecord:
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None


def high_watermarks(bootstrap_servers: str, topic: str, timeout_s: float = 30.0) -> dict[int, int]:
    """The end offset (one past the last record) of every partition, as reported by fetch responses.

    Why not ListOffsets: see the module docstring (Tansu reports an offset inside the last batch).

    A fetch response carries the high watermark even when it carries no records, so this works for
    empty partitions too: the fetch at offset 0 comes back empty (after the broker's fetch wait)
    with a high watermark of 0. To avoid downloading a large partition just to learn where it ends,
    each partition is fetched from its ListOffsets(latest) answer, which is exact on Kafka and at most
    one batch short on Tansu; should a broker ever answer past the end, the consumer's ``earliest``
    reset makes the next fetch start from the beginning, which is slower but still correct.

    The result covers at least every record acknowledged before the call started.
    """
    deadline = time.monotonic() + timeout_s
    consumer = _open_consumer(
        bootstrap_servers, timeout_s, auto_offset_reset="earliest", fetch_max_wait_ms=_POLL_MS
    )
    try:
        partitions = _topic_partitions(consumer, topic)
        consumer.assign(partitions)
        for tp, hint in consumer.end_offsets(partitions, timeout_ms=_remaining_ms(deadline)).items():
            consumer.seek(tp, hint)
        known: dict[int, int] = {}
        while len(known) < len(partitions):
            if time.monotonic() >= deadline:
                unknown = sorted(tp.partition for tp in partitions if tp.partition not in known)
                raise ReadError(
                    f"no fetch response from {bootstrap_servers} gave the end offset of topic {topic!r} "
                    f"partition(s) {unknown} within {timeout_s:g} s"
                )
            consumer.poll(timeout_ms=_POLL_MS)
            for tp in partitions:
                if tp.partition not in known and (highwater := consumer.highwater(tp)) is not None:
                    known[tp.partition] = highwater
                    consumer.pause(tp)  # nothing more to learn there; stop fetching its records
        return dict(sorted(known.items()))
    finally:
        _close(consumer)


def read_range(
    bootstrap_servers: str,
    topic: str,
    start: Mapping[int, int] | None = None,
    end: Mapping[int, int] | None = None,
    *,
    idle_timeout_s: float = 30.0,
) -> Iterator[ConsumedRecord]:
    """Yield the records with ``start[p] <= offset < end[p]`` for each partition p, then stop.

    ``end`` defaults to `high_watermarks` taken when iteration begins (not ListOffsets: see the module
    docstring), so records produced while reading are not chased. When ``end`` is given, only the
    partitions it names are read. ``start`` defaults to each partition's first offset; a partition
    missing from a given ``start`` also starts at its first offset.

    An ``end`` past what the partition holds waits for the missing records (a producer may still be
    writing them) and gives up after ``idle_timeout_s`` without progress.

    Records come in offset order within a partition; partitions are interleaved in no fixed order.
    A ``start`` that is no longer in the log (retention) or beyond its end raises `ReadError` rather
    than silently reading something else.
    """
    if end is None:
        end = high_watermarks(bootstrap_servers, topic, timeout_s=idle_timeout_s)
    consumer = _open_consumer(bootstrap_servers, idle_timeout_s, auto_offset_reset="none")
    try:
        by_partition = {tp.partition: tp for tp in _topic_partitions(consumer, topic)}
        _check_known(topic, by_partition, end, "end")
        _check_known(topic, by_partition, start or {}, "start")
        explicit = {p: offset for p, offset in (start or {}).items() if p in end}
        stops = {by_partition[p]: stop for p, stop in end.items() if explicit.get(p, 0) < stop}
        if not stops:
            return
        consumer.assign(list(stops))
        # seek_to_beginning() with no arguments means *all* assigned partitions, hence the guard.
        if from_first := [tp for tp in stops if tp.partition not in explicit]:
            consumer.seek_to_beginning(*from_first)
        for tp in stops:
            if tp.partition in explicit:
                consumer.seek(tp, explicit[tp.partition])
        yield from _drain(consumer, topic, stops, idle_timeout_s)
    except kafka_errors.OffsetOutOfRangeError as exc:
        raise ReadError(f"topic {topic!r}: requested offsets are outside the log ({exc})") from None
    finally:
        _close(consumer)


def _drain(
    consumer: KafkaConsumer, topic: str, stops: dict[TopicPartition, int], idle_timeout_s: float
) -> Iterator[ConsumedRecord]:
    active = dict(stops)
    positions = {tp: consumer.position(tp) for tp in active}
    last_progress = time.monotonic()
    while active:
        _retire_finished(consumer, active, positions)
        if not active:
            return
        for tp, records in consumer.poll(timeout_ms=_POLL_MS).items():
            stop = active.get(tp)
            if stop is None:
                continue
            for record in records:
                if record.offset >= stop:
                    break
                yield ConsumedRecord(
                    topic=record.topic,
                    partition=record.partition,
                    offset=record.offset,
                    timestamp_ms=record.timestamp,
                    key=record.key,
                    value=record.value,
                )
        moved = {tp: consumer.position(tp) for tp in active}
        if any(moved[tp] != positions[tp] for tp in active):
            last_progress = time.monotonic()
        elif time.monotonic() - last_progress > idle_timeout_s:
            behind = {tp.partition: f"{positions[tp]}/{active[tp]}" for tp in active}
            raise ReadError(
                f"reading topic {topic!r} made no progress for {idle_timeout_s:g} s; "
                f"position/end per partition: {behind}"
            )
        positions = moved


def _retire_finished(
    consumer: KafkaConsumer, active: dict[TopicPartition, int], positions: dict[TopicPartition, int]
) -> None:
    # Position, not "saw offset end-1": compaction and transaction markers leave offsets that never
    # come back as records, and the position still moves past them.
    for tp in [tp for tp, stop in active.items() if positions[tp] >= stop]:
        consumer.pause(tp)
        del active[tp]


def _open_consumer(bootstrap_servers: str, timeout_s: float, **overrides: Any) -> KafkaConsumer:
    configs: dict[str, Any] = {
        "group_id": None,
        "enable_auto_commit": False,
        "request_timeout_ms": max(1000, int(timeout_s * 1000)),
        **overrides,
    }
    return connect(KafkaConsumer, bootstrap_servers, timeout_s, **configs)


def _topic_partitions(consumer: KafkaConsumer, topic: str) -> list[TopicPartition]:
    partitions = consumer.partitions_for_topic(topic)
    if not partitions:
        raise ReadError(f"topic {topic!r} does not exist (or has no partitions visible to this client)")
    return [TopicPartition(topic, p) for p in sorted(partitions)]


def _check_known(topic: str, known: Mapping[int, Any], offsets: Mapping[int, int], label: str) -> None:
    unknown = sorted(set(offsets) - set(known))
    if unknown:
        raise ReadError(f"{label} offsets name partition(s) {unknown} that topic {topic!r} does not have")
    negative = {p: offset for p, offset in offsets.items() if offset < 0}
    if negative:
        raise ReadError(f"{label} offsets for topic {topic!r} must be >= 0, got {negative}")


def _remaining_ms(deadline: float) -> int:
    return max(1, int((deadline - time.monotonic()) * 1000))


def _close(consumer: KafkaConsumer) -> None:
    with quiet_kafka_logging():
        consumer.close(autocommit=False)
