"""Prometheus metrics of one server, in a registry of its own (two servers in one process stay apart).

Errors are ``recsys_serving_requests_total`` with a code other than OK; QPS is its rate.

Caveat: importing Feast sets ``PROMETHEUS_MULTIPROC_DIR``, and a prometheus_client imported after that
keeps values in per-process files keyed by metric name and labels, shared by every registry of the
process. The server imports prometheus_client before Feast, so a server process is unaffected; in a
process that imported Feast first (a test session), two servers' metrics of the same name add up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

#: Latency buckets (seconds) around the 10 ms p99 target.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 1.0)


@dataclass
class ServingMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.latency = Histogram(
            "recsys_serving_request_seconds",
            "RPC handling time",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "recsys_serving_requests", "RPCs by final status code", ["method", "code"], registry=r
        )
        self.requests_in_flight = Gauge(
            "recsys_serving_requests_in_flight",
            "RPCs accepted and not finished, waiting for a handler thread or running (the concurrent-call "
            "limit applies to it)",
            registry=r,
        )
        self.decisions = Counter(
            "recsys_serving_decisions",
            "decisions by surface and routing arm (shadow too)",
            ["surface", "arm"],
            registry=r,
        )
        self.features_missing = Counter(
            "recsys_serving_features_missing",
            "requests served with default features, by reason",
            ["reason"],
            registry=r,
        )
        self.user_author_terms_missing = Counter(
            "recsys_serving_user_author_terms_missing",
            "Ranks whose user-author term was left out because the pairs' rows could not be read, by reason",
            ["reason"],
            registry=r,
        )
        self.feature_reads_pending = Gauge(
            "recsys_serving_feature_reads_pending",
            "users queued for an online feature read or being read (grows only while the store is slow)",
            registry=r,
        )
        self.log_queue_depth = Gauge(
            "recsys_decision_log_queue_depth", "decision records waiting for Kafka", registry=r
        )
        self.log_in_flight = Gauge(
            "recsys_decision_log_in_flight",
            "decision records sent to Kafka, not yet acknowledged",
            registry=r,
        )
        self.log_records = Counter(
            "recsys_decision_log_records",
            "decision records by outcome: enqueued, acked, deferred (Kafka slow or down when the record was "
            "next: it waited), dropped_queue_full, dropped_shutdown, dropped_undeliverable (too large to "
            "send, ever), failed (Kafka refused it, or did not acknowledge it within 2 minutes)",
            ["outcome"],
            registry=r,
        )
        self.reloads = Counter(
            "recsys_serving_reloads",
            "routing reloads by outcome (applied, refused, failed)",
            ["surface", "outcome"],
            registry=r,
        )
        self.routing_revision = Gauge(
            "recsys_serving_routing_revision",
            "routing.json revision served (-1: fallback only)",
            ["surface"],
            registry=r,
        )

    def value(self, name: str, **labels: str) -> float:
        """A sample's current value (0 when never set), for tests and status pages."""
        return self.registry.get_sample_value(name, labels) or 0.0


class MetricChildren:
    """The children of a labelled metric, each looked up once (``labels()`` takes a lock per call)."""

    def __init__(self, metric) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], object] = {}

    def get(self, *labels: str):
        child = self._children.get(labels)
        if child is None:
            child = self._children[labels] = self._metric.labels(*labels)
        return child
