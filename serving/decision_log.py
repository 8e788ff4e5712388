"""Decision records to Kafka through a bounded queue and one sender thread: never on the request path.

``submit`` only appends to a bounded queue and returns; when the queue is full the record is dropped
and counted (``dropped_queue_full``): answering the request matters more than logging it. The queue is
a deque that the sender thread drains, looking again every ``_IDLE_WAIT_S`` when it finds it empty: no
lock and no thread wake-up per record on the request path (a ``queue.Queue``'s wake-up per record was
13% of the server's GIL-holding samples at 500 requests/s).

The sender hands records to a librdkafka producer (confluent-kafka), holding at most ``in_flight``
unacknowledged ones. librdkafka batches, encodes and checksums in C on its own threads, without the GIL;
kafka-python did all of that in Python on the server's GIL (a micro-benchmark of 9.5 KB records at
2,000/s: 140 us of Python per record then; 19 us of Python and 12 us in librdkafka's threads now).
Delivery reports and librdkafka's errors reach Python only inside ``poll``, which only the sender
calls, so the counts need no lock.

When Kafka is slow or down, the in-flight limit is reached or the broker does not answer: the sender
waits with the record (counted once as ``deferred``), the queue fills, and later records are dropped.
Records are handed over only while the broker is known to answer: at start, for each new topic, after
librdkafka reports every broker down (~10 s after a broker stops answering), and while it is down, the
sender asks for the topic's metadata (a probe, ``_PROBE_TIMEOUT_S`` at most, once a second at most); so
an unreachable broker leaves records in the queue, where the depth gauge shows them, not in librdkafka's.
A topic that does not exist is waited for too (topics come from ``ensure_topics``; nothing is created
on first send, a typo must not create a topic), but aside: while the broker answers, a missing topic's
records (each counted once as ``deferred``, and in the depth gauge) wait in a list of their own and the
records of other topics go on, so a shadow topic nobody created cannot stop the served decisions. Once
a second the sender asks again; when the topic exists its records go back to the head of the queue in
their order. Those still aside at shutdown count as ``dropped_shutdown``.
When Kafka is back, the waiting records go out (at least once: a request that timed out may be sent
again, its records then arrive twice and out of order, which the transition pipeline absorbs; see
``_PRODUCER_CONFIG``; keys go to the partitions kafka-python chose, murmur2).
Each state change of the broker is logged once: ``broker_unreachable`` (warning: records waiting, how
long since Kafka last answered) and ``broker_reachable`` (warning too, so that it shows wherever the
outage did: how long it was down, records deferred and dropped meanwhile).

A record Kafka refuses for good (larger than the 1 MiB request limit, refused at hand-over; or larger
than the topic allows, refused by the broker) is dropped, counted (``dropped_undeliverable``) and
logged, never retried: at the head of the queue it would stop every record behind it. (A broker refuses
a whole batch at once: on a topic whose ``max.message.bytes`` is below 1 MB, the records batched with an
oversized one share its fate. Batches stay under 1 MB, so at Kafka's default limits only the oversized
record is lost.) Other delivery failures (no acknowledgement within ``message.timeout.ms``, say) count
as ``failed``, as do the unacknowledged records of a producer that hit a fatal error (a new one takes
over). The Kafka timestamp is the record's ``event_time_ms`` (librdkafka reads 0 as "now").

Shutdown (``close``) stops accepting records and gives the sender ``flush_timeout_s`` in all to hand
over the queue and have the producer acknowledge it; whatever is left then is purged from the producer
and counted as ``dropped_shutdown``. ``close`` returns within ``flush_timeout_s`` plus 3 s (a probe
under way may take its 2 s).
"""

from __future__ import annotations

import collections
import enum
import threading
import time
from dataclasses import dataclass
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException

from recsys_rl import contracts
from recsys_rl.logs import get_logger, log_event
from recsys_rl.serving.metrics import ServingMetrics

_PROBE_TIMEOUT_S = 2.0  # a metadata request the broker does not answer in this long: unreachable
_PROBE_EVERY_S = 1.0  # while the broker or a topic is missing, it is asked about this often
_RETRY_PAUSE_S = 0.05
# The sender looks for new records this often when it found none: a record waits 20 ms at most before
# the producer has it (librdkafka then lingers), and the idle sender wakes 50 times a second.
_IDLE_WAIT_S = 0.02
_ACCOUNT_EVERY_S = 0.1  # delivery counts move into the metrics this often
_SERVE_EVERY_S = 0.01  # while busy, the sender serves delivery reports this often
_SNAPSHOT_EVERY_S = 1.0  # the drop count as of the last acknowledgement, for broker_reachable

_PRODUCER_CONFIG: dict[str, Any] = {
    # batches of ~25 records at 500 requests/s: fewer produce requests and less CPU (with kafka-python,
    # 20 ms cost ~20% more CPU per record than 50 ms); a decision reaches the log within a tenth of a
    # second, soon enough for the pipeline
    "linger.ms": 50,
    # durability as kafka-python had it: every replica acknowledges
    "acks": "all",
    # Not idempotent: librdkafka 2.16's idempotent producer busy-polls its broker thread while it waits
    # for in-flight produce requests, which a broker short of CPU answers late: 0.11-0.37 of a core per
    # server process in bench/serving.py (perf: poll() in rd_kafka_broker_ops_io_serve), and the bench's
    # saturation rose from 0.22 to 0.41 of the echo server's when it was turned off. What idempotence
    # guarded is handled downstream: a retry's duplicate is filtered by request id
    # (pipelines/episodes.py, filtered:duplicate_decision), and no step relies on Kafka order within a
    # user beyond that (decisions are sorted by their coordinates, sessions by event time).
    "enable.idempotence": False,
    # kafka-python's default partitioner: a user's records stay on the partition they went to before
    "partitioner": "murmur2_random",
    # kafka-python's request limit (max_request_size), which the issue-18 oversized record exceeded;
    # batches stay at librdkafka's 1,000,000 bytes, under a broker's default 1,048,588
    "message.max.bytes": 1_048_576,
    # kafka-python's 32 MB buffer: past it produce raises BufferError and the record waits (deferred)
    "queue.buffering.max.kbytes": 32 * 1024,
    # a request unanswered for 5 s (librdkafka's default: 60) drops the connection, so a broker that
    # hangs is reported down (_ALL_BROKERS_DOWN) after ~10 s: the failed reconnect takes 5 s more
    "socket.timeout.ms": 5_000,
    "socket.connection.setup.timeout.ms": 5_000,
    "request.timeout.ms": 5_000,
    "reconnect.backoff.max.ms": 1_000,
    # kafka-python's delivery timeout: a record not acknowledged within 2 minutes counts as failed
    "message.timeout.ms": 120_000,
    "allow.auto.create.topics": False,
    # librdkafka logs every failed reconnect; its errors reach _on_error, which logs state changes once
    "log_level": 2,
    "log.connection.close": False,
}
# Refusals that no retry can change: the record is dropped, so that it does not hold up later ones.
_UNDELIVERABLE = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_TIMESTAMP,
        KafkaError._INVALID_ARG,
    }
)
_PURGED = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})
_TOPIC_GONE = frozenset({KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION})
# Connection trouble that librdkafka retries on its own: remembered as the reason for broker_unreachable.
_CONNECTIVITY = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._RESOLVE,
        KafkaError._TIMED_OUT,
        KafkaError._MSG_TIMED_OUT,
    }
)


class _Broker(enum.Enum):
    UNKNOWN = "unknown"  # not asked yet
    UP = "up"
    DOWN = "down"


@dataclass(frozen=True)
class _Entry:
    topic: str
    key: bytes
    value: bytes
    timestamp_ms: int


class DecisionLog:
    def __init__(
        self,
        bootstrap_servers: str | None,
        metrics: ServingMetrics,
        *,
        capacity: int,
        in_flight: int,
        flush_timeout_s: float,
    ) -> None:
        self._bootstrap = bootstrap_servers
        self._metrics = metrics
        self._queue: collections.deque[_Entry] = collections.deque()
        self._capacity = capacity
        self._in_flight_limit = in_flight
        self._flush_timeout_s = flush_timeout_s
        self._closing = threading.Event()
        self._deadline = float("inf")  # monotonic time by which the sender must give up (set by close)
        self._logger = get_logger("serve.decision_log")
        self._outcomes = {  # the labelled counters, looked up once (labels() takes a lock per call)
            outcome: metrics.log_records.labels(outcome)
            for outcome in ("enqueued", "dropped_queue_full", "acked", "failed", "deferred")
        }
        # Touched by the sender thread only (delivery reports and errors run inside its poll calls).
        self._sent = 0  # handed to the producer
        self._done = 0  # of those, reported delivered or not
        self._acked = 0
        self._acked_reported = 0
        self._holding = False  # the sender holds a record it could not hand over yet
        # records for topics the broker says do not exist, waiting aside so that other topics' go on
        self._parked: dict[str, collections.deque[_Entry]] = {}
        self._parked_count = 0  # written by the sender, read by submit and the depth gauge
        self._deferred = 0
        self._broker = _Broker.UNKNOWN
        self._suspect = False  # librdkafka said every broker is down: ask before handing over more
        self._fatal: KafkaError | None = None
        self._last_error = ""  # the latest connection error librdkafka reported
        self._topics: set[str] = set()  # topics the broker said exist
        self._missing_topics: set[str] = set()
        self._last_topic: str | None = None
        self._next_probe = 0.0
        self._last_account = 0.0
        self._last_serve = 0.0
        self._last_warning = 0.0
        # as of the last sign of life from the broker: when, and the counts then (for broker_reachable)
        self._alive_at = time.monotonic()
        self._deferred_at_alive = 0
        self._dropped_at_alive = 0.0
        self._dropped_snapshot_at = 0.0
        # read when scraped, so it is right while the sender waits on Kafka (and costs submit nothing)
        metrics.log_queue_depth.set_function(self._waiting)
        self._producer = self._new_producer() if bootstrap_servers is not None else None
        self._thread = threading.Thread(target=self._run, name="decision-log", daemon=True)
        if bootstrap_servers is not None:
            self._thread.start()

    def submit(self, topic: str, record: contracts.DecisionRecord, candidates: bytes = b"") -> bool:
        """Queue one record for ``topic`` (keyed by user id); False if it was dropped. Never blocks.

        ``candidates``: the record's candidates field already encoded
        (recsys_rl.serving.wire.record_candidates), appended to the record's encoding, with which it merges.
        """
        if self._bootstrap is None or self._closing.is_set():
            return False
        if self._waiting() >= self._capacity:
            self._outcomes["dropped_queue_full"].inc()
            return False
        value = contracts.encode(record) + candidates
        self._queue.append(_Entry(topic, record.user_id.encode(), value, record.event_time_ms))
        self._outcomes["enqueued"].inc()
        return True

    def _waiting(self) -> int:
        """Records not handed to the producer yet: queued, or set aside for a missing topic."""
        return len(self._queue) + self._parked_count

    # --- the sender thread ---------------------------------------------------------------------------

    def _new_producer(self) -> confluent_kafka.Producer:
        """A producer; librdkafka connects in the background, so this neither blocks nor fails on a
        broker that is down (probes find that out)."""
        return confluent_kafka.Producer(
            {
                "bootstrap.servers": self._bootstrap,
                "on_delivery": self._on_delivery,
                "error_cb": self._on_error,
                "logger": get_logger("serve.decision_log.librdkafka"),
                "queue.buffering.max.messages": self._in_flight_limit,
                **_PRODUCER_CONFIG,
            }
        )

    def _run(self) -> None:
        while True:
            if self._fatal is not None:
                self._replace_producer()
            if self._parked:
                self._unpark_if_due()
            try:
                entry = self._queue.popleft()
            except IndexError:
                self._account_if_due()
                if self._closing.is_set() and not self._unpark_if_due(now=True):
                    break
                if self._needs_probe() and time.monotonic() >= self._next_probe:
                    self._probe(self._last_topic)
                self._poll(_IDLE_WAIT_S)
                continue
            self._holding = True
            sent = self._send(entry)
            self._holding = False
            if not sent:
                self._metrics.log_records.labels("dropped_shutdown").inc()
                self._drop_rest()
                break
        self._finish()

    def _send(self, entry: _Entry) -> bool:
        """Hand ``entry`` to the producer, waiting while Kafka cannot take it; False: shutdown deadline."""
        self._last_topic = entry.topic
        deferred = False
        while True:
            if (
                entry.topic not in self._parked  # behind its topic's earlier records
                and self._ready(entry.topic)
                and self._sent - self._done < self._in_flight_limit
            ):
                try:
                    self._produce(entry)
                    return True
                except BufferError:
                    pass  # librdkafka holds 32 MB already: the broker is slow
                except KafkaException as exc:
                    err: KafkaError = exc.args[0]
                    if err.code() in _UNDELIVERABLE:
                        self._undeliverable(err, entry.topic, len(entry.value))
                        return True
                    if err.code() in _TOPIC_GONE:
                        self._topics.discard(entry.topic)  # deleted since the probe: probe again
                    self._warn("send_deferred", err.str())
            if not deferred:
                deferred = True
                self._deferred += 1
                self._outcomes["deferred"].inc()
            if entry.topic in self._parked or (
                not self._needs_probe() and entry.topic in self._missing_topics
            ):
                self._park(entry)  # the broker answers, without this topic: the records behind go on
                return True
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._account_if_due()
            self._poll(min(_RETRY_PAUSE_S, remaining))

    def _produce(self, entry: _Entry) -> None:
        assert self._producer is not None
        self._producer.produce(entry.topic, entry.value, entry.key, timestamp=entry.timestamp_ms)
        self._sent += 1
        now = time.monotonic()
        if now - self._last_serve >= _SERVE_EVERY_S:
            # delivery reports are served in bunches: a poll per record would be a GIL round trip each
            self._last_serve = now
            self._producer.poll(0)
            if now - self._last_account >= _ACCOUNT_EVERY_S:
                self._account()

    def _park(self, entry: _Entry) -> None:
        self._parked.setdefault(entry.topic, collections.deque()).append(entry)
        self._parked_count += 1

    def _unpark_if_due(self, *, now: bool = False) -> bool:
        """Ask again, once a second (or ``now``), after each topic with records aside; the records of a
        topic that exists now go back to the head of the queue, in their order. True if any did."""
        if self._needs_probe() or not (now or time.monotonic() >= self._next_probe):
            return False
        moved = False
        for topic in list(self._parked):
            self._probe(topic)
            if topic in self._topics:
                entries = self._parked.pop(topic)
                self._queue.extendleft(reversed(entries))
                self._parked_count -= len(entries)
                moved = True
        return moved

    def _poll(self, timeout_s: float) -> None:
        assert self._producer is not None
        self._producer.poll(timeout_s)

    # --- is the broker there? ------------------------------------------------------------------------

    def _needs_probe(self) -> bool:
        return self._broker is not _Broker.UP or self._suspect

    def _ready(self, topic: str) -> bool:
        """Whether records for ``topic`` may be handed over: the broker answers and has the topic."""
        if not self._needs_probe() and topic in self._topics:
            return True
        # a topic not asked about yet is asked at once; a broker or topic found missing once a second
        first_ask = not self._needs_probe() and topic not in self._missing_topics
        if first_ask or time.monotonic() >= self._next_probe:
            self._probe(topic)
        return not self._needs_probe() and topic in self._topics

    def _probe(self, topic: str | None) -> None:
        """Ask the broker for ``topic``'s metadata (all topics' when None) and update what is known."""
        assert self._producer is not None
        now = time.monotonic()
        timeout_s = min(_PROBE_TIMEOUT_S, self._deadline - now)
        if timeout_s <= 0:
            return
        self._next_probe = now + _PROBE_EVERY_S
        try:
            metadata = self._producer.list_topics(topic, timeout=timeout_s)
        except KafkaException as exc:
            self._poll(0)  # librdkafka's own errors say more than "failed to get metadata"
            error = self._last_error or exc.args[0].str()
            self._logger.debug("probe_failed", extra={"kv": {"error": error}})
            self._became_unreachable(error)
            return
        self._became_reachable()
        if topic is None:
            return
        found = metadata.topics.get(topic)
        if found is not None and found.error is None and found.partitions:
            self._topics.add(topic)
            if topic in self._missing_topics:
                self._missing_topics.discard(topic)
                log_event(self._logger, "topic_available", topic=topic)
        elif topic not in self._missing_topics:
            self._missing_topics.add(topic)
            error = "no partitions" if found is None or found.error is None else found.error.str()
            waiting = self._waiting() + int(self._holding)
            self._logger.warning(
                "topic_unavailable", extra={"kv": {"topic": topic, "error": error, "waiting": waiting}}
            )

    def _became_unreachable(self, error: str) -> None:
        self._suspect = False
        if self._broker is _Broker.DOWN:
            return
        self._broker = _Broker.DOWN
        in_flight = self._sent - self._done
        fields = {
            "bootstrap_servers": self._bootstrap,
            "waiting": self._waiting() + int(self._holding) + in_flight,
            "in_flight": in_flight,
            "last_answer_s_ago": round(time.monotonic() - self._alive_at, 1),
            "error": error,
        }
        self._logger.warning("broker_unreachable", extra={"kv": fields})

    def _became_reachable(self) -> None:
        self._suspect = False
        self._last_error = ""
        previous, self._broker = self._broker, _Broker.UP
        if previous is _Broker.UNKNOWN:
            log_event(self._logger, "producer_connected", bootstrap_servers=self._bootstrap)
        elif previous is _Broker.DOWN:
            fields = {
                "bootstrap_servers": self._bootstrap,
                "down_s": round(time.monotonic() - self._alive_at, 1),
                "deferred": self._deferred - self._deferred_at_alive,
                "dropped_queue_full": int(self._dropped() - self._dropped_at_alive),
            }
            self._logger.warning("broker_reachable", extra={"kv": fields})
        self._mark_alive(snapshot=True)

    def _mark_alive(self, *, snapshot: bool = False) -> None:
        """The broker answered: remember when, and the counts then, which an outage is measured from."""
        now = time.monotonic()
        self._alive_at = now
        self._deferred_at_alive = self._deferred
        # reading a metric walks the registry: once a second at most, unless the state just changed
        if snapshot or now - self._dropped_snapshot_at >= _SNAPSHOT_EVERY_S:
            self._dropped_snapshot_at = now
            self._dropped_at_alive = self._dropped()

    def _dropped(self) -> float:
        return self._metrics.value("recsys_decision_log_records_total", outcome="dropped_queue_full")

    # --- librdkafka's callbacks (inside poll, flush and list_topics, on the sender thread) -----------

    def _on_delivery(self, err: KafkaError | None, message: confluent_kafka.Message) -> None:
        self._done += 1
        if err is None:
            self._acked += 1
            if self._broker is not _Broker.UP or self._suspect:
                self._became_reachable()
            return
        code = err.code()
        if code in _UNDELIVERABLE:
            self._undeliverable(err, message.topic() or "", len(message.value() or b""))
        elif code in _PURGED and self._closing.is_set():
            self._metrics.log_records.labels("dropped_shutdown").inc()
        else:
            self._outcomes["failed"].inc()
            if code in _CONNECTIVITY:
                self._last_error = err.str()
            if code in _TOPIC_GONE or code == KafkaError.UNKNOWN_TOPIC_OR_PART:
                self._topics.discard(message.topic() or "")
            self._warn("record_failed", err.str())

    def _on_error(self, err: KafkaError) -> None:
        code = err.code()
        if err.fatal():
            self._fatal = err
        elif code in _CONNECTIVITY:
            if code != KafkaError._ALL_BROKERS_DOWN or not self._last_error:
                self._last_error = err.str()  # "1/1 brokers are down" says less than why they are
            if code == KafkaError._ALL_BROKERS_DOWN and self._broker is _Broker.UP:
                self._suspect = True  # a probe decides: librdkafka also says this of brokers still up
            self._logger.debug("kafka_error", extra={"kv": {"code": err.name(), "error": err.str()}})
        else:
            self._warn("kafka_error", err.str())

    # --- accounting and shutdown ---------------------------------------------------------------------

    def _undeliverable(self, err: KafkaError, topic: str, size: int) -> None:
        self._metrics.log_records.labels("dropped_undeliverable").inc()
        self._logger.warning(
            "record_undeliverable", extra={"kv": {"error": err.str(), "bytes": size, "topic": topic}}
        )

    def _account_if_due(self) -> None:
        if time.monotonic() - self._last_account >= _ACCOUNT_EVERY_S:
            self._account()

    def _account(self) -> None:
        """Move the acknowledgements counted since last time into the metrics."""
        self._last_account = time.monotonic()
        acked = self._acked
        if acked != self._acked_reported:
            self._outcomes["acked"].inc(acked - self._acked_reported)
            self._acked_reported = acked
            if self._broker is _Broker.UP and not self._suspect:
                self._mark_alive()
        self._metrics.log_in_flight.set(self._sent - self._done)

    def _replace_producer(self) -> None:
        """After a fatal error the producer refuses everything: its records count as failed, and a new
        producer takes over."""
        assert self._producer is not None and self._fatal is not None
        self._logger.error("producer_fatal", extra={"kv": {"error": self._fatal.str()}})
        self._producer.purge()
        self._producer.poll(0)  # their delivery reports: failed (not closing)
        self._producer.close()
        unreported = self._sent - self._done
        if unreported:
            self._outcomes["failed"].inc(unreported)
            self._done = self._sent
        self._fatal = None
        self._producer = self._new_producer()
        self._broker, self._topics = _Broker.UNKNOWN, set()
        self._next_probe = time.monotonic() + _PROBE_EVERY_S

    def _drop_rest(self) -> None:
        while True:
            try:
                self._queue.popleft()
            except IndexError:
                break
            self._metrics.log_records.labels("dropped_shutdown").inc()

    def _finish(self) -> None:
        assert self._producer is not None
        self._producer.flush(max(0.0, self._deadline - time.monotonic()))
        if self._sent > self._done:
            # what is still in librdkafka: purged, reported through delivery reports as dropped_shutdown
            self._producer.purge()
            self._producer.poll(0)
        self._producer.close()
        self._account()
        if self._parked_count:  # their topics never appeared
            self._metrics.log_records.labels("dropped_shutdown").inc(self._parked_count)
            self._parked.clear()
            self._parked_count = 0
        unreported = self._sent - self._done
        if unreported:
            self._metrics.log_records.labels("dropped_shutdown").inc(unreported)
            self._done = self._sent
        self._metrics.log_in_flight.set(0)

    def _warn(self, event: str, error: str) -> None:
        # Once a second at most: a broker that misbehaves would otherwise log on every retry.
        now = time.monotonic()
        if now - self._last_warning >= 1.0:
            self._last_warning = now
            self._logger.warning(event, extra={"kv": {"error": error}})

    # --- lifecycle -------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop accepting records and send what is queued within ``flush_timeout_s`` (module docstring)."""
        if self._closing.is_set():
            return
        self._deadline = time.monotonic() + self._flush_timeout_s
        self._closing.set()
        if self._thread.is_alive():
            self._thread.join(self._flush_timeout_s + _PROBE_TIMEOUT_S + 1.0)
