"""Settings of ``recsys-rl serve``: one typed object, from YAML with CLI flags on top (recsys_rl.config)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServeConfig:
    registry: str | None = None  # model registry directory; its routing says what is served
    host: str = "127.0.0.1"
    port: int = 50051  # 0: any free port (RunningServer.port says which)
    worker_processes: int = 1  # server processes sharing the port (serve --workers; serving.workers)
    # Share the port with other processes (SO_REUSEPORT): set for the worker processes of serve --workers.
    # Off otherwise, so that a second server started on a taken port fails instead of taking half its calls.
    reuse_port: bool = False
    # Give each worker of serve --workers one CPU of those this process may use, in turn (a worker's event
    # loop and gRPC's poller thread then hand requests over on one core, without waking another).
    pin_workers: bool = True
    cpu: int | None = None  # the CPU this process runs on (set for each worker by the supervisor); None: any
    max_concurrent_rpcs: int = 256  # unary calls at once; more are refused with RESOURCE_EXHAUSTED at once
    # decision logging
    bootstrap_servers: str | None = None  # Kafka; None: decisions are counted but not logged
    decisions_topic: str = "recsys.decisions"
    shadow_topic: str = "recsys.decisions.shadow"  # shadow decisions: never shown, kept out of training
    log_queue_size: int = 10_000  # records waiting for Kafka; more are dropped (and counted)
    log_in_flight: int = 10_000  # records handed to the producer and not yet acknowledged
    log_flush_timeout_s: float = 5.0  # shutdown waits at most this long for queued records to be sent
    # features (Feast online store)
    feature_repo: str | None = None  # Feast repo (features/); None: every request uses default features
    feature_profile: str = "sqlite"  # a profile of recsys_rl.feature_store.PROFILES (checked when opened)
    feature_state_dir: str | None = None
    redis: str | None = None  # redis profile connection; None: env RECSYS_RL_REDIS_CONNECTION_STRING
    feature_budget_ms: float = 5.0  # a lookup slower than this falls back to defaults for that request
    # Sized by bench/feature_reads.py: a Feast read is mostly GIL-bound Python (3.4 ms for 1 user, 6.6 ms
    # for 64, 10 ms for 128 on the SQLite profile). Two readers let one plan while the other waits on the
    # store; 64 users cost 0.1 ms each, and a batch of 128 would outlast twice the default 5 ms budget.
    feature_readers: int = 2  # threads reading the store, each one batch of waiting users at a time
    feature_batch_size: int = 64  # users in one online read at most
    feature_max_pending: int = 4_096  # users queued for reads; past it lookups fall back (a hung store)
    feature_warm_users: str | None = None  # Parquet (user_id column) of users to read before serving
    # a cached row is answered this long, then still answered while a refresh is read; 0: no cache
    feature_cache_s: float = 60.0
    # user-author pairs' rows (a Rank's user-author term): the same store, readers, budget and cache time;
    # one read per candidate's author, so bigger batches, queue and cache than for users
    pair_batch_size: int = 256  # pairs in one online read at most
    pair_max_pending: int = 65_536  # pairs queued for reads; past it the term is left out (a hung store)
    pair_cache_size: int = 1_000_000  # pairs kept in memory, least recently used dropped first
    # policies and routing
    # sample the Gaussian (feed) / Bernoulli (allocation); False: serve the mode, logged as such
    # (action_selection MODE), whose sessions offline evaluation cannot weight and leaves out
    explore: bool = True
    reload_interval_s: float = 2.0  # how often routing.json is polled for a new revision
    live_position: int = 2  # slot of an inserted live stream in the page
    # limits
    max_candidates: int = 1000
    max_page_size: int = 100
    max_message_bytes: int = 4 * 1024 * 1024
    # On stop: NOT_SERVING at once, served on for shutdown_drain_s while load balancers move away, then
    # new calls refused and in-flight ones given shutdown_grace_s to finish; then the decision log flushes.
    shutdown_drain_s: float = 2.0
    shutdown_grace_s: float = 5.0
    # security and operations
    tls_cert: str | None = None  # PEM certificate chain; with tls_key, the server speaks TLS only
    tls_key: str | None = None
    auth_token_file: str | None = None  # enables the admin service, for callers that send this token
    metrics_port: int | None = None  # Prometheus /metrics over HTTP; None: off, 0: any free port

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together: give both or neither")
        if self.decisions_topic == self.shadow_topic:
            raise ValueError(
                f"decisions_topic and shadow_topic should differ, but both are {self.shadow_topic!r}"
            )
        for name in ("port", "live_position", "cpu"):
            if (getattr(self, name) or 0) < 0:
                raise ValueError(f"{name} should be >= 0, but is {getattr(self, name)}")
        for name in (
            "worker_processes",
            "max_concurrent_rpcs",
            "log_queue_size",
            "log_in_flight",
            "feature_readers",
            "feature_batch_size",
            "feature_max_pending",
            "pair_batch_size",
            "pair_max_pending",
            "pair_cache_size",
            "max_candidates",
            "max_page_size",
            "max_message_bytes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} should be at least 1, but is {getattr(self, name)}")
        for name in ("log_flush_timeout_s", "feature_budget_ms", "reload_interval_s", "shutdown_grace_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} should be > 0, but is {getattr(self, name)}")
        for name in ("feature_cache_s", "shutdown_drain_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} should be >= 0, but is {getattr(self, name)}")
