"""Decision records to Kafka through a bounded queue and one sender thread: never on the request path.

``submit`` only appends to a bounded queue and returns; when the queue is full the record is dropped
and counted (``dropped_queue_full``): answering the request matters more than logging it. The queue is
a deque that the sender thread drains, looking again every ``_IDLE_WAIT_S`` when it finds it empty: no
lock and no thread wake-up per record on the request path (a ``queue.Queue``'s wake-up per record was
13% of the server's GIL-holding samples at 500 requests/s). The sender hands records to a kafka-python
producer, holding at most ``in_flight`` unacknowledged ones.
When Kafka is slow or down, the producer cannot connect or the in-flight limit is reached: the sender
waits with the record (counted once as ``deferred``), the queue fills, and later records are dropped.
When Kafka is back, the waiting records go out in order. A record the producer refuses for good (larger
than its request limit) is dropped, counted (``dropped_undeliverable``) and logged, never retried: at the
head of the queue it would stop every record behind it.

Shutdown (``close``) stops accepting records and gives the sender ``flush_timeout_s`` in all to hand
over the queue and have the producer acknowledge it; whatever is left then is counted as
``dropped_shutdown``. ``close`` returns within ``flush_timeout_s`` plus 3 s (a connection attempt
under way may take its 2 s; the producer's close takes up to 1 s more).
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass

from recsys_rl import contracts
from recsys_rl.errors import OperationalError
from recsys_rl.kafka import DeliveryError
from recsys_rl.kafka.producer import EventProducer
from recsys_rl.logs import get_logger, log_event
from recsys_rl.serving.metrics import ServingMetrics

_CONNECT_TIMEOUT_S = 2.0
_RETRY_PAUSE_S = 0.05
# The sender looks for new records this often when it found none: a record waits 20 ms at most before
# the producer has it (kafka-python then lingers), and the idle sender wakes 50 times a second.
_IDLE_WAIT_S = 0.02
_ACCOUNT_EVERY_S = 0.1  # delivery counts move into the metrics this often while idle
_PRODUCER_TUNING = {
    # batches of ~25 records (about 256 KiB, the producer's batch size) at 500 requests/s: fewer
    # produce requests, less CPU taken from the RPCs (20 ms: ~20% more CPU per record, measured);
    # a decision reaches the log within a tenth of a second, soon enough for the pipeline
    "linger_ms": 50,
    "max_block_ms": 1_000,  # metadata for a missing topic: the sender notices within a second
    "request_timeout_ms": 5_000,
    "reconnect_backoff_max_ms": 1_000,
}


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
        self._producer: EventProducer | None = None
        self._reported = {"acked": 0, "failed": 0}
        self._logger = get_logger("serve.decision_log")
        self._last_warning = 0.0
        self._last_account = 0.0
        self._outcomes = {  # the labelled counters, looked up once (labels() takes a lock per call)
            outcome: metrics.log_records.labels(outcome) for outcome in ("enqueued", "dropped_queue_full")
        }
        # read when scraped, so it is right while the sender waits on Kafka (and costs submit nothing)
        metrics.log_queue_depth.set_function(self._queue.__len__)
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
        if len(self._queue) >= self._capacity:
            self._outcomes["dropped_queue_full"].inc()
            return False
        value = contracts.encode(record) + candidates
        self._queue.append(_Entry(topic, record.user_id.encode(), value, record.event_time_ms))
        self._outcomes["enqueued"].inc()
        return True

    # --- the sender thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                entry = self._queue.popleft()
            except IndexError:
                if time.monotonic() - self._last_account >= _ACCOUNT_EVERY_S:
                    self._account()
                if self._closing.is_set():
                    break
                self._closing.wait(_IDLE_WAIT_S)
                continue
            if not self._send(entry):
                self._metrics.log_records.labels("dropped_shutdown").inc()
                self._drop_rest()
                break
        self._finish()

    def _send(self, entry: _Entry) -> bool:
        """Hand ``entry`` to the producer, waiting while Kafka cannot take it; False: shutdown deadline."""
        deferred = False
        while time.monotonic() < self._deadline:
            producer = self._connected()
            if producer is not None and self._in_flight() < self._in_flight_limit:
                try:
                    producer.send(entry.topic, entry.key, entry.value, entry.timestamp_ms)
                    return True
                except DeliveryError as err:
                    if not getattr(err.__cause__, "retriable", True):
                        # too large, or otherwise refused for good: waiting would stop every later record
                        self._metrics.log_records.labels("dropped_undeliverable").inc()
                        self._logger.warning(
                            "record_undeliverable",
                            extra={
                                "kv": {"error": str(err), "bytes": len(entry.value), "topic": entry.topic}
                            },
                        )
                        return True
                    self._warn("send_deferred", err)
            if not deferred:
                deferred = True
                self._metrics.log_records.labels("deferred").inc()
            self._account()
            time.sleep(_RETRY_PAUSE_S)
        return False

    def _connected(self) -> EventProducer | None:
        if self._producer is None:
            try:
                self._producer = EventProducer(
                    self._bootstrap, connect_timeout_s=_CONNECT_TIMEOUT_S, **_PRODUCER_TUNING
                )
                log_event(self._logger, "producer_connected", bootstrap_servers=self._bootstrap)
            except OperationalError as err:
                self._warn("producer_unavailable", err)
        return self._producer

    def _in_flight(self) -> int:
        assert self._producer is not None
        return sum(c.pending for c in self._producer.counts().values())

    def _account(self) -> None:
        """Move the producer's delivery counts into the metrics."""
        self._last_account = time.monotonic()
        if self._producer is None:
            return
        counts = self._producer.counts().values()
        totals = {"acked": sum(c.acked for c in counts), "failed": sum(c.failed for c in counts)}
        for outcome, total in totals.items():
            self._metrics.log_records.labels(outcome).inc(total - self._reported[outcome])
        self._reported = totals
        self._metrics.log_in_flight.set(sum(c.pending for c in counts))

    def _drop_rest(self) -> None:
        while True:
            try:
                self._queue.popleft()
            except IndexError:
                break
            self._metrics.log_records.labels("dropped_shutdown").inc()

    def _finish(self) -> None:
        if self._producer is None:
            return
        remaining = max(0.0, self._deadline - time.monotonic())
        try:
            # close() flushes and then closes, each with this timeout: half the time left for each
            self._producer.close(timeout_s=max(remaining / 2, 0.1))
        except DeliveryError as err:
            self._warn("unflushed_at_shutdown", err)
        self._account()
        unacked = sum(c.pending for c in self._producer.counts().values())
        if unacked:
            self._metrics.log_records.labels("dropped_shutdown").inc(unacked)

    def _warn(self, event: str, err: Exception) -> None:
        # Once a second at most: a broker that is down would otherwise log on every retry.
        now = time.monotonic()
        if now - self._last_warning >= 1.0:
            self._last_warning = now
            self._logger.warning(event, extra={"kv": {"error": str(err)}})

    # --- lifecycle -------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop accepting records and send what is queued within ``flush_timeout_s`` (module docstring)."""
        if self._closing.is_set():
            return
        self._deadline = time.monotonic() + self._flush_timeout_s
        self._closing.set()
        if self._thread.is_alive():
            self._thread.join(self._flush_timeout_s + _CONNECT_TIMEOUT_S + 1.0)
