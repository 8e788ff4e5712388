"""Assembly: the gRPC server with its services, health, reflection, TLS, auth and metrics.

``start_server(config)`` returns a ``RunningServer`` (``.port``, ``.stop(grace)``) for in-process use;
``recsys-rl serve`` runs the same in its own process. Health starts NOT_SERVING for every service and
turns SERVING once the first load of the registry's routing has been tried (a policy loaded, or the
deterministic fallback in its place); ``stop`` turns it NOT_SERVING first and serves on through a drain
period, so load balancers stop sending before the listener closes and the in-flight requests finish.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from recsys_rl import contracts
from recsys_rl.config import ConfigError
from recsys_rl.contracts import serving_pb2, serving_pb2_grpc
from recsys_rl.errors import OperationalError
from recsys_rl.logs import get_logger, log_event
from recsys_rl.registry import RegistryError
from recsys_rl.registry.layout import open_registry
from recsys_rl.serving import heap, wire
from recsys_rl.serving.auth import AdminTokenInterceptor, read_token
from recsys_rl.serving.call_accounting import CallAccounting
from recsys_rl.serving.decision_log import DecisionLog
from recsys_rl.serving.http_endpoints import start_http_endpoints
from recsys_rl.serving.metrics import MetricChildren, ServingMetrics
from recsys_rl.serving.online_features import OnlineRowReader, PairHistoryReader, UserFeatureReader
from recsys_rl.serving.policies import (
    NoUserAuthorTerm,
    allocation_fallback,
    feed_fallback,
    load_allocation_decider,
    load_feed_decider,
    load_user_author_decider,
)
from recsys_rl.serving.reflection import enable_reflection
from recsys_rl.serving.routing import PolicyHolder, RoutingWatcher
from recsys_rl.serving.service import Handlers
from recsys_rl.serving.settings import ServeConfig
from recsys_rl.serving.workers import pin_to_cpu

_SERVICES = serving_pb2.DESCRIPTOR.services_by_name
RANKING = _SERVICES["RankingService"].full_name
ALLOCATION = _SERVICES["AllocationService"].full_name
ADMIN = _SERVICES["AdminService"].full_name
STATUS = _SERVICES["StatusService"].full_name


T = TypeVar("T")

#: How long a shutdown step may run past its own bound (the gRPC stop past its grace) before the stop
#: goes on without it: the decision log's flush after it must not wait on a stuck transport.
STOP_OVERRUN_S = 5.0


class ServeError(OperationalError):
    """The server cannot start: a port taken, a certificate unreadable."""


class _EventLoop:
    """The server's asyncio event loop on a thread of its own: gRPC and every handler run on it.

    One thread computing each request inline costs less than a pool of handler threads passing the GIL
    and each call between them (measured: about a third less CPU per Rank, half again the requests per
    second); the only wait, the feature read, is awaited. The server's API stays synchronous: callers
    hand coroutines to the loop and wait for their results.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="grpc-aio", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """The coroutine's result, run on the loop; past ``timeout_s`` it is cancelled and TimeoutError
        raised."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10.0)
        self.loop.close()


@dataclass
class RunningServer:
    port: int
    metrics: ServingMetrics
    metrics_port: int | None
    holders: dict[str, PolicyHolder]
    _server: grpc.aio.Server
    _loop: _EventLoop
    _health: health.aio.HealthServicer
    _watcher: RoutingWatcher
    _log: DecisionLog
    _readers: tuple[OnlineRowReader, ...]  # the online stores' readers (users, pairs)
    _metrics_http: object | None
    _ready: threading.Event

    def wait_ready(self, timeout_s: float | None = None) -> bool:
        return self._ready.wait(timeout_s)

    def wait(self) -> None:
        self._loop.run(self._server.wait_for_termination())

    def stop(self, grace_s: float | None = None, drain_s: float = 0.0) -> None:
        """Shut down without failing a call that reached the server, in the order load balancers need.

        Health turns NOT_SERVING at once, and the server goes on serving for ``drain_s`` while health
        checkers notice and clients move away (a call already sent when the listener closes would fail);
        then it refuses new calls and gives the ones in flight ``grace_s`` to finish; then the decision log
        flushes (its own bound). Every step is bounded: a gRPC stop that overruns its grace by
        ``STOP_OVERRUN_S`` is logged and left, so that the decision log still flushes what it holds and the
        process exits. Stopping a stopped server does nothing.
        """
        if self._loop.loop.is_closed():
            return
        self._bounded_step(self._health.enter_graceful_shutdown(), STOP_OVERRUN_S, "health_shutdown_overran")
        if drain_s > 0:
            log_event(get_logger("serve"), "draining", drain_s=drain_s, grace_s=grace_s)
            time.sleep(drain_s)
        self._bounded_step(self._server.stop(grace_s), (grace_s or 0.0) + STOP_OVERRUN_S, "grpc_stop_overran")
        self._loop.close()
        self._watcher.stop()
        self._log.close()
        for reader in self._readers:
            reader.close()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()

    def _bounded_step(self, step: Coroutine[Any, Any, Any], timeout_s: float, overran: str) -> None:
        """One shutdown step on the loop for at most ``timeout_s``; past it, the event ``overran`` is logged
        and the stop goes on without it."""
        try:
            self._loop.run(step, timeout_s=timeout_s)
        except TimeoutError:
            log_event(get_logger("serve"), overran, timeout_s=timeout_s)


def _read_pem(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise ConfigError(f"cannot read {what} {path!r}: {err.strerror}") from None


def _open_features(config: ServeConfig) -> tuple[UserFeatureReader, PairHistoryReader]:
    """Readers of the users' and the user-author pairs' online rows, on one store."""
    store = None
    if config.feature_repo is not None:
        from recsys_rl.feature_store import open_store  # Feast is heavy: import it only when configured

        store = open_store(
            config.feature_repo,
            config.feature_profile,
            state_dir=config.feature_state_dir,
            redis=config.redis,
        )
    shared = {"readers": config.feature_readers, "cache_s": config.feature_cache_s}
    users = UserFeatureReader(
        store, batch_size=config.feature_batch_size, max_pending=config.feature_max_pending, **shared
    )
    pairs = PairHistoryReader(
        store,
        cache_size=config.pair_cache_size,
        batch_size=config.pair_batch_size,
        max_pending=config.pair_max_pending,
        **shared,
    )
    return users, pairs


def _warm_users(path: str | None) -> list[str]:
    """The ``user_id`` column of a Parquet file or directory: users whose rows are read before serving."""
    if path is None:
        return []
    import pyarrow.dataset as pads

    try:
        table = pads.dataset(path, format="parquet").to_table(columns=["user_id"])
    except (OSError, ValueError) as err:  # a missing path; not Parquet, or no user_id column (ArrowInvalid)
        raise ConfigError(
            f"feature_warm_users {path!r} should be Parquet with a user_id column: {err}"
        ) from None
    return list(dict.fromkeys(table.column("user_id").to_pylist()))


def _open_registry(path: str | None) -> Path | None:
    """The registry directory, checked before anything starts: a mistyped path must not serve the
    fallback policies behind a SERVING health status."""
    if path is None:
        return None
    try:
        return open_registry(path)
    except RegistryError as err:
        raise ConfigError(f"registry {path!r}: {err}") from None


def start_server(config: ServeConfig, *, wait_ready: bool = True) -> RunningServer:
    """Start serving ``config``; with ``wait_ready``, return once health says SERVING."""
    if config.cpu is not None:
        pin_to_cpu(config.cpu)
    log = get_logger("serve")
    started_at_ms = time.time_ns() // 1_000_000
    registry = _open_registry(config.registry)
    token = read_token(config.auth_token_file) if config.auth_token_file else None
    credentials = None
    if config.tls_cert is not None and config.tls_key is not None:
        credentials = grpc.ssl_server_credentials(
            [(_read_pem(config.tls_key, "tls_key"), _read_pem(config.tls_cert, "tls_cert"))]
        )
    warm_users = _warm_users(config.feature_warm_users)
    metrics = ServingMetrics()
    features, pairs = _open_features(config)
    metrics.feature_reads_pending.set_function(features.pending)
    decision_log = DecisionLog(
        config.bootstrap_servers,
        metrics,
        capacity=config.log_queue_size,
        in_flight=config.log_in_flight,
        flush_timeout_s=config.log_flush_timeout_s,
    )

    ready = threading.Event()

    def on_reload(surface: str, outcome: str, error: str | None) -> None:
        if outcome == "applied" and ready.is_set():  # the first load settles once, when all are loaded
            heap.settle()
        metrics.reloads.labels(surface, outcome).inc()
        metrics.routing_revision.labels(surface).set(holders[surface].current.revision)
        fields = {"surface": surface, "outcome": outcome, "revision": holders[surface].current.revision}
        log_event(log, "routing_reload", **fields, **({"error": error} if error else {}))

    holders = {
        "feed": PolicyHolder(registry, "feed", load_feed_decider, feed_fallback(), on_reload),
        "live_allocation": PolicyHolder(
            registry, "live_allocation", load_allocation_decider, allocation_fallback(), on_reload
        ),
        "user_author": PolicyHolder(
            registry, "user_author", load_user_author_decider, NoUserAuthorTerm(), on_reload
        ),
    }
    handlers = Handlers(config, holders, features, pairs, decision_log, metrics, ready.is_set, started_at_ms)

    requests = MetricChildren(metrics.requests)
    accounting = CallAccounting(
        config.max_concurrent_rpcs, lambda method, code: requests.get(method, code).inc()
    )
    metrics.requests_in_flight.set_function(accounting.active)
    interceptors = [accounting, *([AdminTokenInterceptor(token)] if token else [])]
    offered = [RANKING, ALLOCATION, STATUS, *([ADMIN] if token else [])]
    loop = _EventLoop()
    try:
        server, health_servicer, port = loop.run(
            _start_grpc(config, handlers, interceptors, offered, credentials, with_admin=token is not None)
        )
    except BaseException:
        loop.close()
        decision_log.close()
        features.close()
        pairs.close()
        raise

    watcher = RoutingWatcher(list(holders.values()), config.reload_interval_s)

    def first_load() -> None:
        warmed = features.warm_up(warm_users)
        for holder in holders.values():
            holder.refresh()
        heap.settle()
        ready.set()
        loop.run(_set_health(health_servicer, offered, health_pb2.HealthCheckResponse.SERVING))
        log_event(
            log,
            "ready",
            port=port,
            warm_users=warmed,
            **{s: (h.current.stable or h.current.fallback).version for s, h in holders.items()},
        )
        watcher.start()

    threading.Thread(target=first_load, name="first-load", daemon=True).start()
    metrics_http, metrics_port = None, None
    if config.metrics_port is not None:
        metrics_http = start_http_endpoints(
            config.host, config.metrics_port, metrics.registry, lambda: handlers.status(None, None)
        )
        metrics_port = metrics_http.server_port
    running = RunningServer(
        port,
        metrics,
        metrics_port,
        holders,
        server,
        loop,
        health_servicer,
        watcher,
        decision_log,
        (features, pairs),
        metrics_http,
        ready,
    )
    if wait_ready:
        ready.wait()
    return running


async def _start_grpc(
    config: ServeConfig,
    handlers: Handlers,
    interceptors: list[grpc.aio.ServerInterceptor],
    offered: list[str],
    credentials: grpc.ServerCredentials | None,
    *,
    with_admin: bool,
) -> tuple[grpc.aio.Server, health.aio.HealthServicer, int]:
    """The gRPC server listening (health NOT_SERVING until the first load); ServeError if it cannot."""
    server = grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", config.max_message_bytes),
            ("grpc.max_send_message_length", config.max_message_bytes),
            ("grpc.so_reuseport", int(config.reuse_port)),
        ],
    )
    _add_services(server, handlers, with_admin=with_admin)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    await _set_health(health_servicer, offered, health_pb2.HealthCheckResponse.NOT_SERVING)
    enable_reflection([*offered, health.SERVICE_NAME], server)
    address = f"{config.host}:{config.port}"
    try:
        port = (
            server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
        )
    except RuntimeError as err:
        port, reason = 0, str(err)
    else:
        reason = "the port is taken or the host is not local"
    if port == 0:
        raise ServeError(f"cannot listen on {address}: {reason}")
    await server.start()
    return server, health_servicer, port


async def _set_health(servicer: health.aio.HealthServicer, offered: list[str], status: int) -> None:
    for name in ("", *offered):
        await servicer.set(name, status)


def _add_services(server: grpc.aio.Server, handlers: Handlers, *, with_admin: bool) -> None:
    class Allocation(serving_pb2_grpc.AllocationServiceServicer):
        Allocate = staticmethod(handlers.instrumented("Allocate", handlers.allocate))

    class Status(serving_pb2_grpc.StatusServiceServicer):
        Status = staticmethod(handlers.instrumented("Status", handlers.status))

    # Rank requests decode as wire.RankHead: the candidates stay encoded until the handler reads them
    rank = {
        "Rank": grpc.unary_unary_rpc_method_handler(
            handlers.instrumented("Rank", handlers.rank),
            request_deserializer=wire.RankHead.FromString,
            response_serializer=contracts.RankResponse.SerializeToString,
        )
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(RANKING, rank),))
    server.add_registered_method_handlers(RANKING, rank)
    serving_pb2_grpc.add_AllocationServiceServicer_to_server(Allocation(), server)
    serving_pb2_grpc.add_StatusServiceServicer_to_server(Status(), server)
    if with_admin:

        class Admin(serving_pb2_grpc.AdminServiceServicer):
            Reload = staticmethod(handlers.instrumented("Reload", handlers.reload))

        serving_pb2_grpc.add_AdminServiceServicer_to_server(Admin(), server)
