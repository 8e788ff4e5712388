"""Services for the integration tests: started on first request, shared for the session, then stopped.

Each fixture starts its service lazily, so a unit-test run never pays for a JVM. A service that
cannot be started fails the tests that asked for it, with the reason as the message: a skipped
integration test reads as "fine" in CI while testing nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import prometheus_client  # noqa: F401  before Feast: see below
import pytest
import redis
from hypothesis import settings
from log_capture import Events

from recsys_rl.kafka import Broker, EmbeddedBroker, KafkaSetupError, LocalKafkaBroker
from recsys_rl.kafka.broker import free_port, log_excerpt
from recsys_rl.kafka.persistent import BROKER_DIR_ENV
from recsys_rl.logs import get_logger
from recsys_rl.processes import stop_process

# Property tests are seeded like every other test: each draws the same examples on every run and machine
# (derived from the test's name), and no example database carries one run's failures into the next, so a
# failure in CI is reproduced by running the test again.
settings.register_profile("seeded", derandomize=True, database=None)
settings.load_profile("seeded")

# Importing Feast sets PROMETHEUS_MULTIPROC_DIR, and a prometheus_client imported after that shares metric
# values between all registries of the process; the serving tests start many servers in one session and
# each must count its own requests (recsys_rl.serving.metrics), so prometheus_client is imported first.


#: the session's temporary folder, and TMPDIR and ``tempfile.tempdir`` as they were before it
_SESSION_TMP = pytest.StashKey[tuple[str, str | None, str | None]]()


def pytest_configure(config: pytest.Config) -> None:
    """The session gets a temporary folder of its own, removed when it ends, and every process it starts
    inherits it as TMPDIR: Beam's job servers and stagers leave a folder or two in the temporary folder
    per pipeline (``beam-temp*``, ``tmp*``), and a machine that runs the suite daily had gathered them by
    the thousand. pytest's own ``tmp_path`` folders stay where they were: pytest prunes those itself and
    keeps the last runs' for whoever debugs a failure.

    No test may find a broker that ``recsys-rl broker start`` left running on this machine either: every
    verb would use it by default. The tests' broker directory is in the session's folder, empty."""
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
    session_tmp = tempfile.mkdtemp(prefix="recsys-rl-test-session-")
    config.stash[_SESSION_TMP] = (session_tmp, os.environ.get("TMPDIR"), tempfile.tempdir)
    os.environ["TMPDIR"] = tempfile.tempdir = session_tmp
    os.environ[BROKER_DIR_ENV] = tempfile.mkdtemp(prefix="brokers-")


def pytest_unconfigure(config: pytest.Config) -> None:
    """The session's temporary folder goes with it (each xdist worker's lies inside the controller's)."""
    session_tmp, tmpdir_before, tempdir_before = config.stash[_SESSION_TMP]
    os.environ.pop(BROKER_DIR_ENV)
    if tmpdir_before is None:
        os.environ.pop("TMPDIR")
    else:
        os.environ["TMPDIR"] = tmpdir_before
    tempfile.tempdir = tempdir_before
    shutil.rmtree(session_tmp, ignore_errors=True)


def _started(broker: Broker, name: str) -> Broker:
    try:
        return broker.start()
    except KafkaSetupError as exc:
        pytest.fail(f"cannot start {name}: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def apache_kafka() -> Iterator[Broker]:
    """Apache Kafka (KRaft, one node) from the jars that `make kafka-jars` fetched."""
    broker = _started(LocalKafkaBroker(), "Apache Kafka")
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def embedded_kafka() -> Iterator[Broker]:
    """Tansu, the pip-installed broker the project uses when no cluster is given."""
    broker = _started(EmbeddedBroker(), "the embedded (Tansu) broker")
    yield broker
    broker.stop()


@pytest.fixture(
    scope="session",
    params=[
        pytest.param("apache_kafka", id="apache-kafka"),
        pytest.param("embedded_kafka", id="tansu"),
    ],
)
def kafka_broker(request: pytest.FixtureRequest) -> Broker:
    """Each Kafka-layer test runs on both brokers: Tansu is what users get, Kafka is the reference."""
    broker: Broker = request.getfixturevalue(request.param)
    return broker


@dataclass(frozen=True)
class RedisService:
    host: str
    port: int
    pid: int | None = None  # the redis-server process, for a test that stops it (SIGSTOP) and resumes it

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisService]:
    """A throw-away redis-server: loopback only, no persistence, in its own temp dir."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail(
            "redis-server is not installed (the Makefile installs it; or: apt-get install redis-server)",
            pytrace=False,
        )
    service = RedisService(host="127.0.0.1", port=free_port())
    argv = [binary, "--port", str(service.port), "--bind", service.host, "--save", "", "--appendonly", "no"]
    # retry=None: redis-py otherwise retries a refused connection with backoff for ~6 s per ping,
    # which would turn the polling loop's 50 ms steps into multi-second ones.
    client = redis.Redis(
        host=service.host, port=service.port, socket_connect_timeout=0.5, socket_timeout=0.5, retry=None
    )

    def answers() -> bool:
        try:
            return bool(client.ping())
        except redis.exceptions.ConnectionError:
            return False

    workdir = tmp_path_factory.mktemp("redis")
    with _service([*argv, "--dir", str(workdir)], workdir, "redis-server", answers) as process:
        client.close()
        yield dataclasses.replace(service, pid=process.pid)


@contextlib.contextmanager
def _service(
    argv: list[str], workdir: Path, name: str, ready: Callable[[], bool], timeout_s: float = 20.0
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``argv`` in ``workdir`` until the block ends, once ``ready()`` says it answers; a process that
    exits or stays silent fails the test with its log's excerpt."""
    log_path = workdir / f"{name}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            argv,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if process.poll() is not None:
                excerpt = log_excerpt(log_path)
                pytest.fail(f"{name} exited with code {process.returncode}: {excerpt}", pytrace=False)
            if time.monotonic() >= deadline:
                pytest.fail(f"{name} did not answer within {timeout_s:g} s: {log_excerpt(log_path)}")
            time.sleep(0.05)
        yield process
    finally:
        stop_process(process, grace_s=10)


@dataclass(frozen=True)
class S3Service:
    """An S3 API on loopback (moto's server, in memory), and the options that point Beam and boto3 at it."""

    endpoint: str
    bucket: str = "recsys-rl-tests"
    region: str = "us-east-1"
    key: str = "test-key"  # moto accepts any credentials; Beam and boto3 only need some

    @property
    def pipeline_args(self) -> list[str]:
        return [
            f"--s3_endpoint_url={self.endpoint}",
            f"--s3_access_key_id={self.key}",
            f"--s3_secret_access_key={self.key}",
            f"--s3_region_name={self.region}",
        ]

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=self.region,
            aws_access_key_id=self.key,
            aws_secret_access_key=self.key,
        )


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Service]:
    """moto's S3 server, a real HTTP endpoint on a free loopback port: the non-local filesystem the
    dataset code is tested on (Beam's S3 filesystem, through boto3), with one bucket."""
    port = free_port()
    service = S3Service(endpoint=f"http://127.0.0.1:{port}")
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]

    def answers() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    with _service(argv, tmp_path_factory.mktemp("s3"), "moto-server", answers):
        service.client().create_bucket(Bucket=service.bucket)
        yield service


#: Users and seed of the simulated logs the training tests learn from; the same world is what
#: simulator evaluations of the trained policies must use.
FEED_DATASET_USERS = 1500
FEED_DATASET_SEED = 0


@pytest.fixture(scope="session")
def feed_dataset(embedded_kafka: Broker, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A transition dataset built the production way: simulated traffic -> Kafka -> the Beam pipeline,
    with every surface (the user-author one too, for the pair critics)."""
    from recsys_rl.pipelines.simulated import simulated_dataset

    result = simulated_dataset(
        embedded_kafka.bootstrap_servers,
        tmp_path_factory.mktemp("feed-dataset"),
        users=FEED_DATASET_USERS,
        seed=FEED_DATASET_SEED,
        user_author_surface=True,
    )
    return result.dataset_dir


@pytest.fixture
def decision_log_events() -> Iterator[Events]:
    """The serving decision log's events (``log_capture.Events``), debug level included."""
    logger = get_logger("serve.decision_log")
    handler, level = Events(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.fixture(scope="session")
def flink_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """Beam's Flink job server (Flink 1.19 in its JVM, jars from `make flink-jars`) and a Python worker
    pool run with this interpreter's environment (`recsys_rl.pipelines.flink_service.LocalFlink`)."""
    from recsys_rl.pipelines.flink_service import FlinkSetupError, LocalFlink

    flink = LocalFlink(tmp_path_factory.mktemp("flink"))
    try:
        flink.start()
    except FlinkSetupError as exc:
        pytest.fail(f"cannot start Flink: {exc}", pytrace=False)
    yield flink
    flink.stop()
