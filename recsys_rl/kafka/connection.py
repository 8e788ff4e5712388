"""Reaching a Kafka cluster: address validation, quiet client construction, readiness probing.

Every module in this package builds its kafka-python clients through `connect`, because kafka-python
3.x has two habits that make a missing broker look worse than it is:

* Its constructors bootstrap eagerly and, when that fails, raise *without* stopping the IO thread
  they already started; a retry loop would leak one thread and selector per attempt. `connect`
  injects the network client, so it can close it on failure.
* While it retries it logs every refused connection at WARNING/ERROR from its IO thread, which buries
  the one useful line ("nothing answers at HOST:PORT") under dozens of tracebacks. `connect` silences
  the ``kafka`` logger for the duration of the bootstrap and reports a single `BrokerUnavailable`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple, TypeVar

import kafka.errors as kafka_errors
from kafka import KafkaAdminClient
from kafka.net.compat import KafkaNetClient

from recsys_rl.kafka.setup_errors import BrokerConfigError, BrokerUnavailable

ClientT = TypeVar("ClientT")

# Hostnames as people actually type them, including the underscores that docker-compose service
# names carry (RFC 1123 forbids them, but resolvers and Kafka accept them).
_HOST_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME_RE = re.compile(rf"^{_HOST_LABEL}(\.{_HOST_LABEL})*\.?$")

# kafka-python grows its reconnect backoff up to 30 s by default; a probe that must notice a broker
# that has just come up cannot sleep that long between tries.
_PROBE_BACKOFF_MAX_MS = 250

# A process we started can die while we wait; checking for that once a second bounds how long a
# crashed broker keeps the caller waiting without spinning.
_PROBE_SLICE_S = 1.0
_RETRY_PAUSE_S = 0.2


class BrokerAddress(NamedTuple):
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_bootstrap_servers(value: str) -> tuple[BrokerAddress, ...]:
    """Split ``HOST:PORT[,HOST:PORT...]`` into addresses, rejecting anything kafka-python would misread.

    kafka-python silently defaults a missing port to 9092 and treats ``tcp://h:1`` as a host named
    ``tcp``; both turn a typo into a 30-second hang against the wrong address, so the syntax is
    checked up front and the error names the offending entry.
    """
    if not isinstance(value, str) or not value.strip():
        raise BrokerConfigError(f"empty Kafka bootstrap address {value!r}: expected HOST:PORT[,HOST:PORT...]")
    return tuple(_parse_entry(entry.strip(), value) for entry in value.split(","))


def format_bootstrap_servers(addresses: tuple[BrokerAddress, ...]) -> str:
    return ",".join(str(address) for address in addresses)


def _parse_entry(entry: str, whole: str) -> BrokerAddress:
    def bad(reason: str) -> BrokerConfigError:
        return BrokerConfigError(
            f"invalid Kafka bootstrap address {entry!r} in {whole!r}: {reason} "
            "(expected HOST:PORT[,HOST:PORT...])"
        )

    if not entry:
        raise bad("empty entry")
    if "://" in entry:
        raise bad("no URL scheme is allowed")
    if entry.startswith("["):
        host, sep, port_text = entry[1:].partition("]:")
        if not sep:
            raise bad("a bracketed IPv6 host must be followed by ]:PORT")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise bad(f"{host!r} is not an IPv6 address") from None
    else:
        host, sep, port_text = entry.rpartition(":")
        if not sep:
            raise bad("missing :PORT")
        if ":" in host:
            raise bad("an IPv6 host must be written in brackets, e.g. [::1]:9092")
        if not host:
            raise bad("missing HOST")
        if not _HOSTNAME_RE.match(host):
            raise bad(f"{host!r} is not a valid host name")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise bad(f"port {port_text!r} is not a number from 1 to 65535")
    return BrokerAddress(host, int(port_text))


_quiet_lock = threading.Lock()
_quiet_depth = 0
_quiet_saved_level = logging.NOTSET


@contextmanager
def quiet_kafka_logging() -> Iterator[None]:
    """Mute the ``kafka`` logger while a bootstrap may be retrying; nest-safe across threads.

    The level is process-wide, so concurrent users share one saved level and the last one out
    restores it: a nested or parallel probe must not re-enable logging under a running one.
    """
    global _quiet_depth, _quiet_saved_level
    logger = logging.getLogger("kafka")
    with _quiet_lock:
        if _quiet_depth == 0:
            _quiet_saved_level = logger.level
            logger.setLevel(logging.CRITICAL + 1)
        _quiet_depth += 1
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet_depth -= 1
            if _quiet_depth == 0:
                logger.setLevel(_quiet_saved_level)


# Failures of the bootstrap itself; anything else (a bad config key, say) is a programming error and
# is left to propagate unchanged.
_UNREACHABLE_ERRORS = (
    kafka_errors.KafkaTimeoutError,
    kafka_errors.KafkaConnectionError,
    kafka_errors.IncompatibleBrokerVersion,
)


def connect(
    factory: Callable[..., ClientT], bootstrap_servers: str, timeout_s: float, **configs: Any
) -> ClientT:
    """Build a kafka-python client whose bootstrap gives up after ``timeout_s`` with `BrokerUnavailable`.

    ``factory`` is `KafkaAdminClient`, `KafkaProducer` or `KafkaConsumer`; ``configs`` go to it as is.
    """
    made: list[KafkaNetClient] = []

    def net_client(**kwargs: Any) -> KafkaNetClient:
        client = KafkaNetClient(**kwargs)
        made.append(client)
        return client

    with quiet_kafka_logging():
        try:
            return factory(
                bootstrap_servers=bootstrap_servers,
                bootstrap_timeout_ms=max(1, int(timeout_s * 1000)),
                kafka_client=net_client,
                **configs,
            )
        except _UNREACHABLE_ERRORS as exc:
            _close_all(made)
            raise BrokerUnavailable(
                f"no Kafka broker answered at {bootstrap_servers} within {timeout_s:g} s{_detail(exc)}"
            ) from exc
        except BaseException:
            _close_all(made)
            raise


def _close_all(clients: list[KafkaNetClient]) -> None:
    for client in clients:
        # Best effort: the error that brought us here is the one worth reporting.
        with contextlib.suppress(Exception):
            client.close()


def _detail(exc: BaseException) -> str:
    """`` (why)`` for errors that add something; a bootstrap timeout only restates the address."""
    return "" if isinstance(exc, kafka_errors.KafkaTimeoutError) else f" ({_one_line(exc)})"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def wait_until_reachable(
    bootstrap_servers: str,
    timeout_s: float = 10.0,
    *,
    give_up: Callable[[], str | None] | None = None,
) -> None:
    """Return once a broker answers metadata requests at ``bootstrap_servers``; else `BrokerUnavailable`.

    Two round trips are made: the bootstrap (to the address given) and one metadata request to a
    broker *as the cluster advertises it*. The second catches the classic container mistake where
    the bootstrap port answers but ``advertised.listeners`` names an address this machine cannot
    reach, which would otherwise surface later as a producer hanging for minutes.

    ``give_up`` is polled between attempts (about once a second); if it returns a reason, for example
    that the broker process we started has exited, waiting stops early with that reason.
    """
    addresses = format_bootstrap_servers(parse_bootstrap_servers(bootstrap_servers))
    deadline = time.monotonic() + timeout_s
    problem = "nothing answered a metadata request"
    while (remaining := deadline - time.monotonic()) > 0:
        attempt_s = remaining if give_up is None else min(remaining, _PROBE_SLICE_S)
        attempt_started = time.monotonic()
        outcome = _probe(addresses, attempt_s)
        if outcome is None:
            return
        problem = outcome or problem
        if give_up is not None and (reason := give_up()) is not None:
            raise BrokerUnavailable(f"Kafka broker at {addresses} stopped before it became ready: {reason}")
        # An attempt can fail fast (advertised address refused); don't turn the wait into a busy loop.
        time.sleep(
            max(0.0, min(_RETRY_PAUSE_S - (time.monotonic() - attempt_started), deadline - time.monotonic()))
        )
    raise BrokerUnavailable(f"Kafka at {addresses} is not reachable after {timeout_s:g} s: {problem}")


def _probe(bootstrap_servers: str, timeout_s: float) -> str | None:
    """One bounded attempt: None when the cluster answered, else what went wrong ("" if nothing new)."""
    try:
        admin = connect(
            KafkaAdminClient,
            bootstrap_servers,
            timeout_s,
            reconnect_backoff_max_ms=_PROBE_BACKOFF_MAX_MS,
            request_timeout_ms=max(1, int(timeout_s * 1000)),
        )
    except BrokerUnavailable as exc:
        cause = exc.__cause__ or exc
        # A bootstrap timeout only restates the address; anything else says something new.
        return "" if isinstance(cause, kafka_errors.KafkaTimeoutError) else _one_line(cause)
    with quiet_kafka_logging():
        try:
            # An empty topic list asks for brokers only: cheap even on a cluster with many topics.
            admin.describe_topics([])
        except kafka_errors.KafkaError as exc:
            return (
                f"the bootstrap address answered, but the broker address it advertises did not "
                f"({_one_line(exc)}); check advertised.listeners"
            )
        finally:
            admin.close()
    return None
