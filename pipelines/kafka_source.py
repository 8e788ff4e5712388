"""A bounded replay of Kafka topics as a Beam source, and the group-offset bookkeeping around it.

A dataset build must be reproducible and must consume every event exactly once across runs, so the
read is planned before the pipeline starts and the plan is what the run is about:

* `plan_replay` fixes, per partition, ``[start, end)``: start from the consumer group's committed
  offset (or a given start), end at the last stable offset at launch (the high watermark unless a
  transaction is still open). Records produced later belong to the next run. The plan goes into the
  dataset manifest (`ReplayPlan.to_dict`).
* Reads are read_committed: an aborted transaction's records never reach a dataset, and ending at the
  last stable offset leaves records behind an open transaction to the next run, instead of reading
  them before the transaction decides or stalling until it does.
* `ReadKafkaReplay` splits the plan into chunks that workers read in parallel with manually assigned
  partitions. There is no consumer-group membership anywhere: a first group JOIN costs ~25 s on Tansu
  and would buy nothing for a bounded read.
* `commit_offsets` moves the group to the plan's ends. It is a separate step that the caller runs only
  after the pipeline's outputs are safely written; the pipeline itself never commits, so a failed run
  is simply planned and run again from the same offsets.

Offsets are committed and fetched as a "simple consumer" (OffsetCommit with generation -1, through
the admin client's alter/list group offsets): this works on Apache Kafka and Tansu alike, without a
JOIN, in milliseconds.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, TypeVar

import apache_beam as beam
import confluent_kafka
import kafka.errors as kafka_errors
from apache_beam.metrics import Metrics
from kafka import KafkaAdminClient, TopicPartition
from kafka.admin import OffsetSpec
from kafka.structs import OffsetAndMetadata

from recsys_rl.kafka.connection import connect, parse_bootstrap_servers, quiet_kafka_logging
from recsys_rl.kafka.setup_errors import KafkaSetupError, ReadError

log = logging.getLogger(__name__)

StartSpec = Literal["committed", "earliest"] | Mapping[tuple[str, int], int]
T = TypeVar("T")

DEFAULT_RECORDS_PER_CHUNK = 5_000

# librdkafka settings for replay reads, from measurements on the 2-core machine with simulated events
# (63 B and 1.2 KB values) on the embedded broker. Records are read with confluent-kafka (librdkafka)
# rather than kafka-python, which the rest of the project uses: kafka-python parses records in Python at
# ~10 us each, the largest single cost of a pipeline run, while librdkafka parses them in C and fetches
# ahead on its own threads while the pipeline works on the previous chunk. Two settings decide whether
# that read-ahead pays (with librdkafka's defaults the runs were no faster than with kafka-python):
# * fetch.queue.backoff.ms: by default librdkafka waits a whole second before the next fetch once its
#   queue holds queued.min.messages, which stalled reads for ~0.6 s every few thousand records;
# * fetch.wait.max.ms: with the default 500 ms, fetches waited it out ~3 s in all per run of 256k
#   records; at 10 ms a partition at its log end costs the broker an empty fetch every 10 ms, only
#   while a worker holds it.
# CRCs are checked (in C, a few percent).
READ_TUNING: dict[str, Any] = {"check.crcs": True, "fetch.queue.backoff.ms": 5, "fetch.wait.max.ms": 10}

_POLL_S = 0.2
_END_POLL_S = 0.02
_RETRY_PAUSE_S = 0.1


class OffsetCommitError(KafkaSetupError):
    """The plan's end offsets were not committed: the next ``start="committed"`` plan would re-read them."""


# -- the plan ---------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one partition; ordered by (topic, partition, start, end)."""

    topic: str
    partition: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str) or not self.topic:
            raise ValueError(f"OffsetRange topic must be a non-empty string, got {self.topic!r}")
        for name in ("partition", "start", "end"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"OffsetRange {name} must be an integer >= 0, got {value!r}")
        if self.end < self.start:
            raise ValueError(
                f"OffsetRange {self.topic}[{self.partition}]: end {self.end} is before start {self.start}"
            )

    @property
    def size(self) -> int:
        return self.end - self.start

    def split(self, max_records: int) -> list[OffsetRange]:
        """Consecutive pieces of at most ``max_records`` offsets; none for an empty range."""
        _check_chunk_size(max_records)
        return [
            OffsetRange(self.topic, self.partition, first, min(first + max_records, self.end))
            for first in range(self.start, self.end, max_records)
        ]

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}] offsets [{self.start}, {self.end})"


@dataclass(frozen=True)
class ReplayPlan:
    """Exactly what one run reads: the offset range of every partition, fixed before the run starts.

    Ranges are kept sorted and unique per partition, so two plans of the same offsets compare equal and
    serialise identically into manifests.
    """

    bootstrap_servers: str
    group: str | None
    ranges: tuple[OffsetRange, ...]

    def __post_init__(self) -> None:
        parse_bootstrap_servers(self.bootstrap_servers)
        if self.group is not None and (not isinstance(self.group, str) or not self.group):
            raise ValueError(f"consumer group must be a non-empty string or None, got {self.group!r}")
        ranges = tuple(sorted(self.ranges))
        seen: set[tuple[str, int]] = set()
        for offset_range in ranges:
            if not isinstance(offset_range, OffsetRange):
                raise TypeError(f"ReplayPlan ranges must be OffsetRange, got {offset_range!r}")
            where = (offset_range.topic, offset_range.partition)
            if where in seen:
                raise ValueError(f"ReplayPlan has more than one range for {where[0]}[{where[1]}]")
            seen.add(where)
        object.__setattr__(self, "ranges", ranges)

    @property
    def total_records(self) -> int:
        """Offsets covered; records actually read can be fewer (compaction, transaction markers)."""
        return sum(offset_range.size for offset_range in self.ranges)

    def chunks(self, max_records: int) -> list[OffsetRange]:
        """The ranges cut into work items of at most ``max_records`` offsets, in plan order."""
        _check_chunk_size(max_records)
        return [chunk for offset_range in self.ranges for chunk in offset_range.split(max_records)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "bootstrap_servers": self.bootstrap_servers,
            "group": self.group,
            "ranges": [
                {"topic": r.topic, "partition": r.partition, "start": r.start, "end": r.end}
                for r in self.ranges
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReplayPlan:
        """Inverse of `to_dict`; a malformed document raises ValueError saying what is wrong."""
        try:
            ranges = tuple(
                OffsetRange(item["topic"], item["partition"], item["start"], item["end"])
                for item in data["ranges"]
            )
            return cls(data["bootstrap_servers"], data["group"], ranges)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a replay plan document ({type(exc).__name__}: {exc}): {data!r}") from None


def _check_chunk_size(max_records: int) -> None:
    if not isinstance(max_records, int) or isinstance(max_records, bool) or max_records < 1:
        raise ValueError(f"max_records must be an integer >= 1, got {max_records!r}")


def plan_replay(
    bootstrap_servers: str,
    topics: Sequence[str],
    group: str | None,
    start: StartSpec = "committed",
    *,
    timeout_s: float = 30.0,
) -> ReplayPlan:
    """Fix the offsets a run will read: one range per partition of ``topics``, ending at launch.

    ``start``:

    * ``"committed"``: where ``group`` left off; a partition the group never committed starts at its
      log start. ``group`` is required.
    * ``"earliest"``: every partition's log start (``group`` is only recorded for `commit_offsets`).
    * a mapping ``{(topic, partition): offset}``: those starts; unnamed partitions start at their log
      start.

    The end is each partition's last stable offset (`stable_end_offsets`).

    A start outside ``[log start, end]`` raises `ReadError`: below the log start the records were
    deleted (retention), and reading on from the log start would silently drop them from the dataset;
    above the end the topic or broker was replaced since the offsets were committed.
    """
    parse_bootstrap_servers(bootstrap_servers)  # a typo fails here, not after a 30 s connect timeout
    topic_list = _check_topics(topics)
    _check_start(start, group, topic_list)
    ends: dict[tuple[str, int], int] = {}
    for topic in topic_list:
        for partition, end in stable_end_offsets(bootstrap_servers, topic, timeout_s=timeout_s).items():
            ends[(topic, partition)] = end
    partitions = [TopicPartition(topic, partition) for topic, partition in ends]
    with _admin(bootstrap_servers, timeout_s) as admin:
        deadline = time.monotonic() + timeout_s
        log_starts = _log_starts(admin, partitions, deadline)
        committed = _fetch_committed(admin, group, partitions, deadline) if start == "committed" else {}
    if isinstance(start, Mapping):
        _check_mapping_keys(start, ends)
        starts = {where: start.get(where, log_starts[where]) for where in ends}
        origin = "given start"
    elif start == "committed":
        starts = {
            where: log_starts[where] if committed[where] is None else committed[where] for where in ends
        }
        origin = f"offset committed by group {group!r}"
    else:
        starts = dict(log_starts)
        origin = "log start"
    ranges = [
        _checked_range(where, starts[where], log_starts[where], end, origin) for where, end in ends.items()
    ]
    return ReplayPlan(bootstrap_servers, group, tuple(ranges))


def stable_end_offsets(bootstrap_servers: str, topic: str, *, timeout_s: float = 30.0) -> dict[int, int]:
    """Each partition's last stable offset: where a read_committed reader stops, one past the last
    record that no open transaction holds back (the high watermark when none is open).

    Measured by reading: a read_committed consumer starts at ListOffsets(latest) and reads on to the
    end-of-partition event, which librdkafka raises at the last stable offset. ListOffsets alone is not
    enough: Tansu answers it with an offset inside the last batch (see `recsys_rl.kafka.reader`), and
    reading on from there reaches the true end. On Apache Kafka the answer is already the last stable
    offset and the event comes with the first fetch.
    """
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": "recsys-rl-plan",  # never joined: partitions are assigned by hand
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "logger": log,
            **READ_TUNING,  # short fetch waits: the end-of-partition events come with the first fetches
        }
    )
    deadline = time.monotonic() + timeout_s
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            raise ReadError(f"topic {topic!r} does not exist (or has no partitions visible to this client)")
        starts = []
        for partition in sorted(metadata.partitions):
            where = confluent_kafka.TopicPartition(topic, partition)
            # a broker that has just restarted answers NOT_LEADER_FOR_PARTITION until it leads again
            _, hint = _retrying(
                lambda where=where: consumer.get_watermark_offsets(
                    where, timeout=_remaining_s(deadline), cached=False
                ),
                deadline,
                f"finding the end of topic {topic!r} on {bootstrap_servers}",
            )
            starts.append(confluent_kafka.TopicPartition(topic, partition, hint))
        consumer.assign(starts)
        ends: dict[int, int] = {}
        while len(ends) < len(starts):
            if time.monotonic() >= deadline:
                unknown = sorted({tp.partition for tp in starts} - set(ends))
                raise ReadError(
                    f"no fetch from {bootstrap_servers} reached the end of topic {topic!r} partition(s) "
                    f"{unknown} within {timeout_s:g} s"
                )
            # poll, not consume: consume waits out its timeout unless it fills its count
            message = consumer.poll(_END_POLL_S)
            error = None if message is None else message.error()
            if error is not None and error.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                ends[message.partition()] = message.offset()
        return dict(sorted(ends.items()))
    except confluent_kafka.KafkaException as exc:
        raise ReadError(f"finding the end of topic {topic!r} on {bootstrap_servers} failed: {exc}") from exc
    finally:
        consumer.close()


def _remaining_s(deadline: float) -> float:
    return max(0.001, deadline - time.monotonic())


def _check_topics(topics: Sequence[str]) -> list[str]:
    if isinstance(topics, str):
        raise TypeError(f"topics must be a sequence of topic names, not the string {topics!r}")
    topic_list = list(dict.fromkeys(topics))
    if not topic_list:
        raise ValueError("topics must name at least one topic")
    bad = [topic for topic in topic_list if not isinstance(topic, str) or not topic]
    if bad:
        raise ValueError(f"topic names must be non-empty strings, got {bad!r}")
    return topic_list


def _check_start(start: StartSpec, group: str | None, topics: list[str]) -> None:
    if isinstance(start, str):
        if start not in ("committed", "earliest"):
            raise ValueError(f"start must be 'committed', 'earliest' or a mapping, got {start!r}")
        if start == "committed" and group is None:
            raise ValueError("start='committed' needs a consumer group, got group=None")
    elif isinstance(start, Mapping):
        for where, offset in start.items():
            if not (isinstance(where, tuple) and len(where) == 2):
                raise ValueError(f"start keys must be (topic, partition) pairs, got {where!r}")
            topic, _partition = where
            if topic not in topics:
                raise ValueError(f"start names topic {topic!r}, which is not among the topics {topics!r}")
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise ValueError(
                    f"start offset for {topic}[{_partition}] must be an int >= 0, got {offset!r}"
                )
    else:
        raise TypeError(f"start must be 'committed', 'earliest' or a mapping, got {start!r}")


def _check_mapping_keys(start: Mapping[tuple[str, int], int], ends: Mapping[tuple[str, int], int]) -> None:
    unknown = sorted(set(start) - set(ends))
    if unknown:
        named = ", ".join(f"{topic}[{partition}]" for topic, partition in unknown)
        raise ReadError(f"start names partition(s) that do not exist: {named}")


def _checked_range(where: tuple[str, int], start: int, log_start: int, end: int, origin: str) -> OffsetRange:
    topic, partition = where
    if start < log_start:
        raise ReadError(
            f"{topic}[{partition}]: {origin} {start} is below the log start {log_start}; records in between "
            "were deleted (retention?) and would be missing from the dataset. Plan with start='earliest' "
            "to accept the gap"
        )
    if start > end:
        raise ReadError(
            f"{topic}[{partition}]: {origin} {start} is past the log end {end}; was the topic or the broker "
            "replaced since?"
        )
    return OffsetRange(topic, partition, start, end)


# -- group offsets ----------------------------------------------------------------------------------


def committed_offsets(
    bootstrap_servers: str, group: str, topics: Sequence[str], *, timeout_s: float = 30.0
) -> dict[tuple[str, int], int | None]:
    """The group's committed offset for every partition of ``topics``; None where it has none.

    Reads with OffsetFetch only, so the group is neither joined nor created.
    """
    if not isinstance(group, str) or not group:
        raise ValueError(f"consumer group must be a non-empty string, got {group!r}")
    parse_bootstrap_servers(bootstrap_servers)
    topic_list = _check_topics(topics)
    with _admin(bootstrap_servers, timeout_s) as admin:
        deadline = time.monotonic() + timeout_s
        partitions = _partitions_of(admin, topic_list, deadline)
        return dict(sorted(_fetch_committed(admin, group, partitions, deadline).items()))


def commit_offsets(
    plan: ReplayPlan, *, timeout_s: float = 30.0, clock: Callable[[], float] = time.monotonic
) -> None:
    """Commit each range's end for ``plan.group``, so the next ``start="committed"`` plan begins there.

    Run it only once the run's outputs are durable: committing is what makes the records "consumed".
    The commit is a simple-consumer OffsetCommit (no group JOIN); Kafka refuses it with
    UNKNOWN_MEMBER_ID while the group has live members, which is reported, not retried. Retriable
    errors are retried until ``timeout_s`` has passed on ``clock`` (a test's clock can leave no time).
    """
    if plan.group is None:
        raise ValueError("cannot commit offsets for a plan without a consumer group (group=None)")
    offsets = {TopicPartition(r.topic, r.partition): OffsetAndMetadata(r.end, "", -1) for r in plan.ranges}
    if not offsets:
        return
    group = plan.group
    with _admin(plan.bootstrap_servers, timeout_s) as admin:
        deadline = clock() + timeout_s
        results = _retrying(
            lambda: admin.alter_group_offsets(group, offsets),
            deadline,
            f"committing offsets for group {group!r}",
            OffsetCommitError,
            clock,
        )
    failed = {
        f"{tp.topic}[{tp.partition}]": error.__name__
        for tp, error in results.items()
        if error is not kafka_errors.NoError
    }
    missing = sorted(f"{tp.topic}[{tp.partition}]" for tp in set(offsets) - set(results))
    if failed or missing:
        raise OffsetCommitError(
            f"group {group!r} on {plan.bootstrap_servers}: offsets not committed: {failed or ''}"
            f"{' no answer for ' + ', '.join(missing) if missing else ''}"
        )


@contextlib.contextmanager
def _admin(bootstrap_servers: str, timeout_s: float) -> Iterator[KafkaAdminClient]:
    admin = connect(
        KafkaAdminClient, bootstrap_servers, timeout_s, request_timeout_ms=max(1000, int(timeout_s * 1000))
    )
    try:
        yield admin
    finally:
        with quiet_kafka_logging():
            admin.close()


def _retrying(
    call: Callable[[], T],
    deadline: float,
    what: str,
    error: type[KafkaSetupError] = ReadError,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """``call()``, retried on retriable broker errors until ``deadline``; then ``error`` saying ``what``.

    Needed for group calls: on a fresh Apache Kafka the offsets topic does not exist until the first
    FindCoordinator creates it, and the admin client reports COORDINATOR_NOT_AVAILABLE meanwhile
    (about 0.2 s) instead of waiting. And for a confluent-kafka call on a broker that has just restarted.
    """
    while True:
        try:
            return call()
        except (kafka_errors.KafkaError, confluent_kafka.KafkaException) as exc:
            if not _retriable(exc):
                raise error(f"{what} failed: {type(exc).__name__}: {exc}") from exc
            if clock() >= deadline:
                raise error(f"{what} still failing at the deadline: {type(exc).__name__}: {exc}") from exc
        time.sleep(_RETRY_PAUSE_S)


def _retriable(exc: kafka_errors.KafkaError | confluent_kafka.KafkaException) -> bool:
    """Whether the broker's error may pass: kafka-python's reading of the protocol's error codes, which a
    confluent-kafka error carries too (librdkafka marks the errors it raises from a call as not retriable,
    whatever the code; its own errors have negative codes, which no retriable error has)."""
    if isinstance(exc, kafka_errors.KafkaError):
        return exc.retriable
    return kafka_errors.for_code(exc.args[0].code()).retriable


def _partitions_of(admin: KafkaAdminClient, topics: list[str], deadline: float) -> list[TopicPartition]:
    described = _retrying(lambda: admin.describe_topics(topics), deadline, "describing topics")
    partitions: list[TopicPartition] = []
    for topic in described:
        error = kafka_errors.for_code(topic["error_code"])
        if error is kafka_errors.UnknownTopicOrPartitionError or (
            error is kafka_errors.NoError and not topic["partitions"]
        ):
            raise ReadError(f"topic {topic['name']!r} does not exist")
        if error is not kafka_errors.NoError:
            raise ReadError(f"cannot describe topic {topic['name']!r}: {error.__name__}")
        partitions += [TopicPartition(topic["name"], p["partition_index"]) for p in topic["partitions"]]
    return sorted(partitions)


def _log_starts(
    admin: KafkaAdminClient, partitions: list[TopicPartition], deadline: float
) -> dict[tuple[str, int], int]:
    answer = _retrying(
        lambda: admin.list_partition_offsets(dict.fromkeys(partitions, OffsetSpec.EARLIEST)),
        deadline,
        "looking up log start offsets",
    )
    return {(tp.topic, tp.partition): answer[tp].offset for tp in partitions}


def _fetch_committed(
    admin: KafkaAdminClient, group: str | None, partitions: list[TopicPartition], deadline: float
) -> dict[tuple[str, int], int | None]:
    assert group is not None  # callers check; kept for the type checker
    answer = _retrying(
        lambda: admin.list_group_offsets({group: partitions}),
        deadline,
        f"fetching offsets of group {group!r}",
    )[group]
    result: dict[tuple[str, int], int | None] = {}
    for tp in partitions:
        committed = answer.get(tp)
        # Both brokers answer -1 for a partition the group has never committed.
        result[(tp.topic, tp.partition)] = (
            None if committed is None or committed.offset < 0 else committed.offset
        )
    return result


# -- reading ----------------------------------------------------------------------------------------


class KafkaRecord(NamedTuple):
    """One Kafka record; bytes rather than None keep consumers of it simple."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes  # b"" for a null key
    value: bytes  # b"" for a null value (tombstone)


class KafkaBatch(NamedTuple):
    """The records of one chunk, column by column: what the source yields.

    One element per chunk instead of one per record: each element costs a runner several
    microseconds whatever its size, which at ~10 us per record read would be most of the pipeline's
    work. Columns rather than a list of records, because the consumers walk them once with ``zip``
    and the records never need to exist as objects.
    """

    topic: str
    partition: int
    offsets: list[int]
    timestamps_ms: list[int]
    keys: list[bytes]  # b"" for a null key
    values: list[bytes]  # b"" for a null value (tombstone)

    @property
    def size(self) -> int:
        """Records in the batch (``len`` is the tuple's, six columns)."""
        return len(self.offsets)

    def records(self) -> list[KafkaRecord]:
        """The batch as records, in offset order."""
        return [
            KafkaRecord(self.topic, self.partition, *fields)
            for fields in zip(self.offsets, self.timestamps_ms, self.keys, self.values, strict=True)
        ]


_BATCH_FIELDS = beam.coders.TupleCoder(
    [
        beam.coders.StrUtf8Coder(),
        beam.coders.VarIntCoder(),
        beam.coders.ListCoder(beam.coders.VarIntCoder()),
        beam.coders.ListCoder(beam.coders.VarIntCoder()),
        beam.coders.ListCoder(beam.coders.BytesCoder()),
        beam.coders.ListCoder(beam.coders.BytesCoder()),
    ]
).get_impl()


class KafkaBatchCoder(beam.coders.Coder):
    """Encodes `KafkaBatch` column by column with Beam's compiled coders.

    Beam's default for a NamedTuple pickles it; this writes lengths and varints only. It is pickled
    into the pipeline and always decodes to `KafkaBatch`, where a RowCoder would hand multi-process
    workers a NamedTuple class generated from the schema instead.
    """

    def encode(self, value: KafkaBatch) -> bytes:
        return _BATCH_FIELDS.encode(value)

    def decode(self, encoded: bytes) -> KafkaBatch:
        return KafkaBatch._make(_BATCH_FIELDS.decode(encoded))

    def estimate_size(self, value: KafkaBatch) -> int:
        # Runners sample element sizes for their metrics; the default would encode a whole chunk.
        return sum(map(len, value.keys)) + sum(map(len, value.values)) + 12 * value.size + len(value.topic)

    def is_deterministic(self) -> bool:
        return True

    def to_type_hint(self) -> type[KafkaBatch]:
        return KafkaBatch


beam.coders.registry.register_coder(KafkaBatch, KafkaBatchCoder)


class ReadKafkaReplay(beam.PTransform):
    """Read every record of a `ReplayPlan`, exactly once, as one `KafkaBatch` element per chunk.

    The plan is cut into chunks of at most ``max_records_per_chunk`` offsets, spread over workers by
    a reshuffle, and each chunk is read by manual assignment of its partition. Smaller chunks spread
    better over workers; each chunk that does not continue the worker's previous one costs a seek and
    a first fetch's round trip. Records are read committed: an aborted transaction's records are
    skipped (their offsets, like transaction markers, never come back as records).

    ``idle_timeout_s`` bounds how long a chunk may make no progress before the read fails; a chunk
    is either read completely or the pipeline fails, never silently cut short.
    ``consumer_config`` overrides `READ_TUNING` with librdkafka properties (e.g. ``{"check.crcs": False}``).
    """

    def __init__(
        self,
        plan: ReplayPlan,
        max_records_per_chunk: int = DEFAULT_RECORDS_PER_CHUNK,
        *,
        idle_timeout_s: float = 30.0,
        consumer_config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        _check_chunk_size(max_records_per_chunk)
        if not idle_timeout_s > 0:
            raise ValueError(f"idle_timeout_s must be > 0, got {idle_timeout_s!r}")
        self._plan = plan
        self._max_records_per_chunk = max_records_per_chunk
        self._idle_timeout_s = idle_timeout_s
        # librdkafka keeps this many records of the assigned partition fetched ahead: about the next chunk
        self._consumer_config = {
            "queued.min.messages": max_records_per_chunk,
            **READ_TUNING,
            **(consumer_config or {}),
        }

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection[KafkaBatch]:
        chunks = self._plan.chunks(self._max_records_per_chunk)
        return (
            pbegin
            | "Chunks" >> beam.Create(chunks, reshuffle=False)
            | "Spread" >> beam.Reshuffle()
            | "Read"
            >> beam.ParDo(
                _ReadChunkFn(self._plan.bootstrap_servers, self._idle_timeout_s, self._consumer_config)
            ).with_output_types(KafkaBatch)
        )


class _ReadChunkFn(beam.DoFn):
    """Reads chunks with one `_ChunkReader` per DoFn instance, made in `setup` so the DoFn pickles cleanly."""

    def __init__(self, bootstrap_servers: str, idle_timeout_s: float, consumer_config: Mapping[str, Any]):
        self._bootstrap_servers = bootstrap_servers
        self._idle_timeout_s = idle_timeout_s
        self._consumer_config = dict(consumer_config)
        self._reader: _ChunkReader | None = None
        self._records = Metrics.counter("kafka_replay", "records")
        self._chunks = Metrics.counter("kafka_replay", "chunks")

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_reader": None}

    def setup(self) -> None:
        parse_bootstrap_servers(self._bootstrap_servers)
        self._reader = _ChunkReader(self._bootstrap_servers, self._idle_timeout_s, self._consumer_config)

    def process(self, chunk: OffsetRange) -> Iterator[KafkaBatch]:
        assert self._reader is not None, "setup() was not called"
        batch = self._reader.read(chunk)
        self._records.inc(batch.size)
        self._chunks.inc()
        if batch.offsets:
            yield batch

    def teardown(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()


class _ChunkReader:
    """One librdkafka consumer that reads chunks one after another.

    The consumer is only ever assigned partitions (the group id that librdkafka insists on is never
    joined, and nothing is committed). A chunk that starts where the previous one ended, on the same
    partition, is read on without a seek, from records librdkafka fetched ahead while the pipeline
    worked on the previous one; the in-process runner hands a worker a partition's chunks in order.
    """

    def __init__(self, bootstrap_servers: str, idle_timeout_s: float, config: Mapping[str, Any]) -> None:
        self._idle_timeout_s = idle_timeout_s
        self._consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": bootstrap_servers,
                "group.id": "recsys-rl-replay",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                # an end-of-log event tells a chunk whose last offsets hold no record that it is done
                "enable.partition.eof": True,
                "auto.offset.reset": "error",  # a start outside the log fails the chunk, never skips records
                "isolation.level": "read_committed",
                "logger": log,
                **config,
            }
        )
        # (topic, partition, offset) the consumer delivers next: a chunk starting there needs no seek
        self._next: tuple[str, int, int] | None = None

    def read(self, chunk: OffsetRange) -> KafkaBatch:
        """The chunk's records in offset order; raises `ReadError` if it cannot be read to its end.

        Done means every offset below the end was passed, not "saw offset end - 1": compaction and
        transaction markers leave offsets that never come back as records. A record at or past the end
        ends the chunk too (it belongs to the next one, which then seeks back to it). No progress for
        ``idle_timeout_s`` fails the chunk: on Tansu that is the only sign of offsets that are gone (it
        answers a fetch outside the log with nothing), and it is also how a dead broker shows.
        """
        topic, partition, end = chunk.topic, chunk.partition, chunk.end
        batch = KafkaBatch(topic, partition, [], [], [], [])
        offsets, timestamps, keys, values = batch.offsets, batch.timestamps_ms, batch.keys, batch.values
        position = chunk.start
        if self._next != (topic, partition, position):
            self._next = None  # until the chunk is read: a failed read leaves the consumer anywhere
            self._assign(chunk)
        last_progress = time.monotonic()
        while position < end:
            try:
                messages = self._consumer.consume(num_messages=end - position, timeout=_POLL_S)
            except confluent_kafka.KafkaException as exc:
                raise ReadError(f"reading {chunk} failed at offset {position}: {exc}") from exc
            moved = position
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                        moved = max(moved, message.offset())  # the log ends there: no record is left below
                    elif not error.retriable():
                        raise ReadError(f"reading {chunk} failed at offset {position}: {error.str()}")
                    continue
                offset = message.offset()
                moved = offset + 1
                if offset >= end:
                    break
                offsets.append(offset)
                timestamps.append(message.timestamp()[1])
                keys.append(message.key() or b"")
                values.append(message.value() or b"")
            now = time.monotonic()
            if moved != position:
                position, last_progress = moved, now
            elif now - last_progress > self._idle_timeout_s:
                raise ReadError(
                    f"reading {chunk} made no progress for {self._idle_timeout_s:g} s at offset {position}: "
                    "records missing from the log, or the broker is gone"
                )
        self._next = (topic, partition, position)
        return batch

    def _assign(self, chunk: OffsetRange) -> None:
        try:
            self._consumer.assign([confluent_kafka.TopicPartition(chunk.topic, chunk.partition, chunk.start)])
        except confluent_kafka.KafkaException as exc:
            raise ReadError(f"reading {chunk}: cannot assign the partition: {exc}") from exc

    def close(self) -> None:
        with contextlib.suppress(confluent_kafka.KafkaException, RuntimeError):
            self._consumer.close()
