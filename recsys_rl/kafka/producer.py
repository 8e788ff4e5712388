"""Batched producing with delivery accounting that stays constant-size however much is sent.

The simulator writes millions of events; keeping each send's future around to check it later would
grow without bound. Instead every future reports into per-topic counters through callbacks (run on
kafka-python's sender thread), and `flush` turns "some records failed" into one `DeliveryError`.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, Self

import kafka.errors as kafka_errors
from kafka import KafkaProducer

from recsys_rl.kafka.connection import connect, quiet_kafka_logging
from recsys_rl.kafka.setup_errors import DeliveryError


@dataclass(slots=True)
class DeliveryCounts:
    """Records handed to the producer for one topic, and what became of them so far."""

    sent: int = 0
    acked: int = 0
    failed: int = 0

    @property
    def pending(self) -> int:
        return self.sent - self.acked - self.failed


class EventProducer:
    """A `KafkaProducer` tuned for throughput, with per-topic sent/acked/failed counts.

    Defaults: ``linger_ms=20`` and 256 KiB batches, because the events are small and numerous and
    per-request overhead dominates otherwise; no compression, because on loopback (the common case
    here) CPU is scarcer than bandwidth, and pass ``compression_type`` to change that. kafka-python's
    own defaults stay in force for durability (``acks=all``, idempotence on), so retries can neither
    duplicate nor reorder a key's events. ``allow_auto_create_topics`` is off: topics come from
    `ensure_topics` with explicit partition counts, and a typo must fail rather than create a topic.
    Any other ``KafkaProducer`` setting can be passed through ``tuning``.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        linger_ms: int = 20,
        batch_size: int = 256 * 1024,
        compression_type: str | None = None,
        connect_timeout_s: float = 10.0,
        **tuning: Any,
    ) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, DeliveryCounts] = {}
        self._unreported_failures = 0
        self._first_failure: str | None = None
        self._closed = False
        configs: dict[str, Any] = {
            "linger_ms": linger_ms,
            "batch_size": batch_size,
            "compression_type": compression_type,
            "allow_auto_create_topics": False,
            "max_block_ms": 30_000,
            **tuning,
        }
        self._producer = connect(KafkaProducer, bootstrap_servers, connect_timeout_s, **configs)

    def send(self, topic: str, key: bytes, value: bytes, timestamp_ms: int | None = None) -> None:
        """Queue one record; returns at once unless the buffer is full (then blocks up to max_block_ms).

        Errors the producer reports synchronously (unknown topic after max_block_ms, oversized
        record, producer closed) raise `DeliveryError` here; errors from the broker surface in `flush`.
        """
        with self._lock:
            counts = self._counts.setdefault(topic, DeliveryCounts())
            counts.sent += 1
        try:
            future = self._producer.send(topic, value=value, key=key, timestamp_ms=timestamp_ms)
        except kafka_errors.KafkaError as exc:
            with self._lock:
                counts.failed += 1
            hint = ""
            if isinstance(exc, kafka_errors.KafkaTimeoutError):
                hint = " (does the topic exist? topics are created by ensure_topics, not on first send)"
            raise DeliveryError(f"cannot send to topic {topic!r}: {_describe(exc)}{hint}") from exc
        future.add_callback(functools.partial(self._on_acked, counts))
        future.add_errback(functools.partial(self._on_failed, topic, counts))

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every queued record is acknowledged or failed; raise if any failed since last time.

        Each failure is reported by exactly one flush, so a caller that handles a `DeliveryError`
        and carries on is not told about the same records again.
        """
        try:
            self._producer.flush(timeout=timeout_s)
        except kafka_errors.KafkaTimeoutError:
            pending = sum(c.pending for c in self.counts().values())
            raise DeliveryError(
                f"{pending} record(s) still unacknowledged after {timeout_s:g} s; is the broker still up?"
            ) from None
        with self._lock:
            failed, first = self._unreported_failures, self._first_failure
            self._unreported_failures, self._first_failure = 0, None
        if failed:
            raise DeliveryError(f"{failed} record(s) were not delivered; first error: {first}")

    def counts(self) -> dict[str, DeliveryCounts]:
        """A snapshot per topic (copies, so it does not change under the caller)."""
        with self._lock:
            return {topic: replace(counts) for topic, counts in self._counts.items()}

    def close(self, timeout_s: float = 30.0) -> None:
        """Flush (raising `DeliveryError` as `flush` does) and release the connection; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.flush(timeout_s)
        finally:
            with quiet_kafka_logging():
                self._producer.close(timeout=timeout_s)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _on_acked(self, counts: DeliveryCounts, _metadata: object) -> None:
        with self._lock:
            counts.acked += 1

    def _on_failed(self, topic: str, counts: DeliveryCounts, exc: BaseException) -> None:
        with self._lock:
            counts.failed += 1
            self._unreported_failures += 1
            if self._first_failure is None:
                self._first_failure = f"topic {topic!r}: {_describe(exc)}"


def _describe(exc: BaseException) -> str:
    """One line that names the error class once (kafka-python's messages sometimes already do)."""
    text = " ".join(str(exc).split())
    name = type(exc).__name__
    if not text:
        return name
    return text if name in text else f"{name}: {text}"
