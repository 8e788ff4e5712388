"""The gRPC server over real sockets: generated stubs, real policies, real Kafka, reloads under load.

Two behaviour-cloning policies trained on the pipeline-built dataset are registered with passing
blessings (``recsys_rl.ope.blessing.write_blessing``); each test gets its own registry copy and server.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from pathlib import Path
from urllib.request import urlopen

import grpc
import numpy as np
import pytest
import redis
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from open_gate import OPEN_GATE
from polling import wait_for
from registry_fakes import make_report

from recsys_rl import contracts, registry
from recsys_rl.cli.main import main
from recsys_rl.config import ConfigError
from recsys_rl.fusion import FEED_ACTION_NAMES, fusion_scores, top_k
from recsys_rl.kafka import EmbeddedBroker
from recsys_rl.kafka.reader import read_range
from recsys_rl.kafka.topics import TopicSpec, ensure_topics
from recsys_rl.serving.request_validation import LIVE_PREDICTION_NAMES
from recsys_rl.serving.server import RunningServer, ServeError, start_server
from recsys_rl.serving.settings import ServeConfig
from recsys_rl.state import FEED_STATE_FEATURES

pytestmark = pytest.mark.integration

RANK = contracts.ROUTING_ARMS


@pytest.fixture(scope="module")
def runs(feed_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = tmp_path_factory.mktemp("serve-runs")
    made = []
    for seed in (0, 1):
        run = out / f"bc-{seed}"
        args = ["train", "--algo", "bc", "--data", str(feed_dataset), "--out", str(run), "--steps", "40"]
        assert main([*args, "--seed", str(seed)]) == 0
        made.append(run)
    return made


@pytest.fixture
def registry_dir(runs: list[Path], tmp_path: Path) -> Path:
    """A registry with the two policies as v1 (stable) and v2, both blessed."""
    root = tmp_path / "registry"
    for name, run in zip(("v1", "v2"), runs, strict=True):
        report = make_report(tmp_path / f"report-{name}", run / "policy")
        registry.register(root, "feed", run=run, report=report, version=name)
    registry.promote(root, "feed", "v1", "stable")
    return root


@pytest.fixture
def topics(embedded_kafka) -> tuple[str, str]:
    names = (f"dec-{uuid.uuid4().hex[:8]}", f"shadow-{uuid.uuid4().hex[:8]}")
    ensure_topics(embedded_kafka.bootstrap_servers, [TopicSpec(n, 1) for n in names])
    return names


@pytest.fixture
def serve(tmp_path: Path) -> Iterator:
    started: list[RunningServer] = []

    def start(**settings) -> RunningServer:
        server = start_server(ServeConfig(**{"port": 0, "reload_interval_s": 0.05, **settings}))
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop(1.0)


@contextlib.contextmanager
def serve_process(*args: str) -> Iterator[subprocess.Popen]:
    """``recsys-rl serve ARGS`` in a process of its own (output piped, text), stopped if still running.

    A server still running is aborted with Python's fault handler on, so its stderr, which goes to the
    test's captured output, ends with every thread's stack: a shutdown that hangs says where."""
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "recsys-rl"), "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGABRT)
            try:
                _, stderr = process.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                _, stderr = process.communicate()
            print(
                f"recsys-rl serve was still running and was aborted; its stderr:\n{stderr}", file=sys.stderr
            )


def rank_request(request_id: str = "req-1", user_id: str = "user-1", n: int = 20) -> contracts.RankRequest:
    rng = np.random.default_rng(3)  # the same candidates for every request
    base = np.array([13.0, 0.45, 0.014, 0.0005, 0.0028, 0.0011, 0.00035])
    predictions = base * rng.lognormal(0.0, 0.5, (n, len(base)))
    return contracts.RankRequest(
        schema_version=1,
        request_id=request_id,
        user_id=user_id,
        page_size=6,
        prediction_names=FEED_ACTION_NAMES,
        context=contracts.serving_pb2.RequestContext(
            event_time_ms=1_700_000_000_000, page_index=1, session_watch_s=40.0, session_id="s1"
        ),
        candidates=[
            contracts.Candidate(item_id=f"v{j}", author_id=f"a{j}", item_type=1, predictions=row)
            for j, row in enumerate(predictions.tolist())
        ],
    )


def allocate_request(request_id: str = "live-1") -> contracts.AllocateRequest:
    return contracts.AllocateRequest(
        schema_version=1,
        request_id=request_id,
        user_id="user-1",
        prediction_names=LIVE_PREDICTION_NAMES,
        live_candidate=contracts.Candidate(item_id="l1", item_type=2, predictions=[90.0, 0.3, 5.0]),
    )


def channel(server: RunningServer) -> grpc.Channel:
    return grpc.insecure_channel(f"127.0.0.1:{server.port}")


def ranking(ch: grpc.Channel):
    return contracts.serving_pb2_grpc.RankingServiceStub(ch)


def decisions(bootstrap: str, topic: str) -> list[contracts.DecisionRecord]:
    return [contracts.decode_decision(r.value) for r in read_range(bootstrap, topic, idle_timeout_s=10.0)]


def status_of(ch: grpc.Channel) -> dict[str, contracts.serving_pb2.SurfaceStatus]:
    """The Status RPC's answer by surface; asked without any token."""
    answer = contracts.serving_pb2_grpc.StatusServiceStub(ch).Status(contracts.serving_pb2.StatusRequest())
    return {surface.surface: surface for surface in answer.surfaces}


# --- Rank end to end ---------------------------------------------------------------------------------


def test_rank_serves_the_stable_policy_and_logs_exactly_what_it_served(
    registry_dir, topics, embedded_kafka, serve
):
    from recsys_rl.training.agents.policy_io import load_feed_policy

    server = serve(
        registry=str(registry_dir),
        bootstrap_servers=embedded_kafka.bootstrap_servers,
        decisions_topic=topics[0],
        shadow_topic=topics[1],
    )
    request = rank_request()
    with channel(server) as ch:
        first = ranking(ch).Rank(request)
        again = ranking(ch).Rank(request)  # a retry: same seed, same decision
    assert first == again
    assert first.routing_arm == RANK["stable"] and first.policy_version == "v1"
    predictions = np.array([c.predictions for c in request.candidates])
    action = np.array(first.action)
    expected = top_k(fusion_scores(predictions[None], action[None]), 6)[0]
    assert list(first.item_ids) == [request.candidates[j].item_id for j in expected]
    np.testing.assert_allclose(
        first.scores, fusion_scores(predictions[None], action[None])[0][expected], rtol=1e-5
    )

    server.stop(1.0)  # flushes the decision log
    logged = decisions(embedded_kafka.bootstrap_servers, topics[0])
    assert len(logged) == 2 and logged[0] == logged[1]
    record = logged[0]
    assert record.request_id == "req-1" and record.user_id == "user-1" and record.session_id == "s1"
    assert record.surface == contracts.SURFACES["feed"] and record.routing_arm == RANK["stable"]
    assert tuple(record.feature_names) == FEED_STATE_FEATURES and len(record.state) == len(
        FEED_STATE_FEATURES
    )
    assert record.features_missing  # no feature store configured: defaults, flagged
    assert list(record.served_item_ids) == list(first.item_ids)
    assert list(record.candidates) == list(request.candidates)
    assert record.log_propensity == first.log_propensity
    # the logged propensity is the serving policy's log-density of the served action at the logged state
    policy = load_feed_policy(registry_dir / "feed" / "versions" / "v1" / "policy")
    density = policy.log_prob(np.array([record.state]), np.array([record.action]))[0]
    assert density == pytest.approx(record.log_propensity, abs=1e-4)
    assert server.metrics.value("recsys_serving_decisions_total", surface="feed", arm="stable") == 2


def test_without_any_loadable_policy_a_deterministic_fallback_answers(tmp_path, serve):
    server = serve(registry=str(tmp_path))  # a registry with nothing registered
    with channel(server) as ch:
        stub = ranking(ch)
        first, second = stub.Rank(rank_request()), stub.Rank(rank_request())
        other = stub.Rank(rank_request("req-2"))
        live = contracts.serving_pb2_grpc.AllocationServiceStub(ch).Allocate(allocate_request())
    assert first == second and first.routing_arm == RANK["fallback"]
    assert first.policy_version == "fallback-behaviour-feed-v1"
    assert other.action != first.action  # exploration: a different request draws different noise
    assert live.routing_arm == RANK["fallback"] and live.policy_version == "fallback-behaviour-live-v1"
    assert live.log_propensity < 0 and live.position == (2 if live.insert else 0)


# --- health, reflection, validation, limits ----------------------------------------------------------


def test_health_and_reflection_under_v1_and_v1alpha(registry_dir, serve):
    server = serve(registry=str(registry_dir))
    with channel(server) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        for service in ("", "recsys.v1.RankingService", "recsys.v1.AllocationService"):
            status = health.Check(health_pb2.HealthCheckRequest(service=service)).status
            assert status == health_pb2.HealthCheckResponse.SERVING
        listing = reflection_pb2.ServerReflectionRequest(list_services="")
        lookup = reflection_pb2.ServerReflectionRequest(file_containing_symbol="recsys.v1.RankingService")
        v1 = ch.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        for call in (reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo, v1):
            services_answer, file_answer = list(call(iter([listing, lookup])))
            names = {s.name for s in services_answer.list_services_response.service}
            assert {
                "recsys.v1.RankingService",
                "recsys.v1.AllocationService",
                "grpc.health.v1.Health",
            } <= names
            assert {
                "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection",
            } <= names
            assert "recsys.v1.AdminService" not in names  # no token: no admin service at all
            assert file_answer.file_descriptor_response.file_descriptor_proto


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda r: setattr(r, "schema_version", 7), "schema_version"),
        (lambda r: setattr(r, "request_id", ""), "request_id"),
        (lambda r: setattr(r, "user_id", ""), "user_id"),
        (lambda r: setattr(r, "page_size", 0), "page_size"),
        (lambda r: r.prediction_names.pop(), "prediction_names"),
        (lambda r: r.ClearField("candidates"), "candidates"),
        (lambda r: r.candidates.extend(r.candidates[:1] * 31), "candidates"),  # over max_candidates=50
        (lambda r: setattr(r.candidates[4], "item_id", "v3"), "candidates[4].item_id"),
        (lambda r: r.candidates[2].predictions.pop(), "candidates[2].predictions"),
        (lambda r: r.candidates[1].predictions.__setitem__(0, float("nan")), "candidates[1].predictions[0]"),
        (lambda r: setattr(r.context, "last_page_click_rate", 2.0), "context.last_page_click_rate"),
        (lambda r: setattr(r.context, "session_watch_s", -3.0), "context.session_watch_s"),
        (lambda r: setattr(r.context, "utc_offset_minutes", -2000), "context.utc_offset_minutes"),
        (
            lambda r: setattr(r.candidates[3], "item_type", contracts.ITEM_TYPES["live"]),
            "candidates[3].item_type",
        ),
    ],
)
def test_invalid_fields_are_invalid_argument_naming_the_field(mutate, field, tmp_path, serve):
    server = serve(max_candidates=50)
    request = rank_request()
    mutate(request)
    with channel(server) as ch, pytest.raises(grpc.RpcError) as err:
        ranking(ch).Rank(request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(field + " ")
    assert server.metrics.value("recsys_serving_requests_total", method="Rank", code="INVALID_ARGUMENT") == 1


def test_oversized_messages_are_refused_and_the_server_carries_on(tmp_path, serve):
    server = serve(max_message_bytes=16 * 1024)
    with channel(server) as ch:
        with pytest.raises(grpc.RpcError) as err:
            ranking(ch).Rank(rank_request(n=500))  # ~40 KB
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert ranking(ch).Rank(rank_request()).item_ids


# --- routing and reload ------------------------------------------------------------------------------


def test_hot_reload_under_concurrent_load_fails_no_request(registry_dir, serve):
    server = serve(registry=str(registry_dir))
    failures: list[Exception] = []
    versions: set[tuple[int, str]] = set()
    stop = threading.Event()

    def client(worker: int) -> None:
        with channel(server) as ch:
            stub = ranking(ch)
            i = 0
            while not stop.is_set():
                try:
                    answer = stub.Rank(rank_request(f"w{worker}-{i}", user_id=f"user-{i % 50}"), timeout=30)
                    versions.add((answer.routing_arm, answer.policy_version))
                except grpc.RpcError as err:
                    failures.append(err)
                i += 1

    threads = [threading.Thread(target=client, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    try:
        v1 = server.holders["feed"].current.stable.version
        registry.promote(registry_dir, "feed", "v2", "stable")
        wait_for(lambda: server.holders["feed"].current.stable.version == "v2", "v2 to become stable")
        wait_for(lambda: any(v == "v2" for _, v in versions) or not versions, "a v2 answer")
        registry.promote(registry_dir, "feed", "v1", "canary", canary_fraction=0.5)
        wait_for(lambda: (RANK["canary"], v1) in versions, "a canary answer")
        registry.rollback(registry_dir, "feed")
        wait_for(lambda: server.holders["feed"].current.revision == 4, "the rollback")
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert failures == []
    assert {(RANK["stable"], v1), (RANK["stable"], "v2"), (RANK["canary"], v1)} <= versions
    # the holder serves a new revision before its reload callback counts it: wait for the count
    wait_for(
        lambda: server.metrics.value("recsys_serving_reloads_total", surface="feed", outcome="applied") >= 4,
        "the four applied reloads to be counted",
    )


class _Cycle:
    """Garbage only the cyclic collector frees (it refers to itself)."""

    def __init__(self) -> None:
        self.itself = self


def test_the_server_freezes_its_heap_when_ready_and_frees_frozen_garbage_at_a_reload(registry_dir, serve):
    """Full collections over TensorFlow's objects paused serving for 200 ms (serving.heap): the server
    freezes what it holds once loaded, and a reload, which drops the old policies, settles it again."""
    gc.unfreeze()
    frozen_at_start = _Cycle()  # alive when the server freezes its heap
    server = serve(registry=str(registry_dir))
    assert gc.get_freeze_count() > 0
    dropped = weakref.ref(frozen_at_start)
    del frozen_at_start
    gc.collect()
    assert dropped() is not None, "frozen: ordinary collections leave it alone"
    registry.promote(registry_dir, "feed", "v2", "stable")
    wait_for(lambda: server.holders["feed"].current.stable.version == "v2", "v2 to become stable")
    wait_for(lambda: dropped() is None, "the reload to collect the garbage frozen before it")


def test_a_corrupt_artifact_is_refused_and_the_previous_policy_keeps_serving(registry_dir, serve):
    server = serve(registry=str(registry_dir), reload_interval_s=3600.0)
    registry.promote(registry_dir, "feed", "v2", "stable")  # intact when promoted (promote hashes the files)
    variables = registry_dir / "feed" / "versions" / "v2" / "policy" / "variables"
    data = next(variables.glob("variables.data-*"))
    data.write_bytes(data.read_bytes()[:-8] + b"corrupt!")  # and changed on disk before the server loads it
    assert not server.holders["feed"].refresh()
    assert server.metrics.value("recsys_serving_reloads_total", surface="feed", outcome="refused") == 1
    with channel(server) as ch:
        answer = ranking(ch).Rank(rank_request())
        status = status_of(ch)
    assert answer.routing_arm == RANK["stable"] and answer.policy_version == "v1"
    assert server.holders["feed"].current.stable.version == "v1"
    assert "does not match its manifest" in server.holders["feed"].status.last_error
    assert (status["feed"].stable_version, status["feed"].routing_revision) == ("v1", 1)
    assert status["feed"].last_error == server.holders["feed"].status.last_error


def test_a_shadow_is_computed_and_logged_apart_but_never_served(registry_dir, topics, embedded_kafka, serve):
    registry.promote(registry_dir, "feed", "v2", "shadow")
    server = serve(
        registry=str(registry_dir),
        bootstrap_servers=embedded_kafka.bootstrap_servers,
        decisions_topic=topics[0],
        shadow_topic=topics[1],
    )
    with channel(server) as ch:
        served = ranking(ch).Rank(rank_request())
    server.stop(1.0)
    (decision,) = decisions(embedded_kafka.bootstrap_servers, topics[0])
    (shadow,) = decisions(embedded_kafka.bootstrap_servers, topics[1])
    assert served.routing_arm == RANK["stable"] and decision.routing_arm == RANK["stable"]
    assert shadow.routing_arm == RANK["shadow"] and shadow.policy_version != served.policy_version
    assert shadow.request_id == decision.request_id and shadow.state == decision.state
    assert list(shadow.action) != list(served.action)


@pytest.mark.parametrize(
    ("flags", "selection"), [((), "sampled"), (("--no-explore",), "mode")], ids=["explore", "no-explore"]
)
def test_the_logged_records_say_whether_the_action_was_drawn_or_the_mode(
    flags, selection, topics, embedded_kafka
):
    """Issue 19: ``serve --no-explore`` logged the mode's density as a propensity and nothing in the
    record said so, so OPE weighted by it. Through the CLI, a real socket and Kafka: every record (Rank and
    Allocate) now says how its action was chosen."""
    bootstrap = embedded_kafka.bootstrap_servers
    args = ("--port", "0", "--bootstrap-servers", bootstrap, "--decisions-topic", topics[0], *flags)
    with serve_process(*args, "--shutdown-drain-s", "0") as process:
        line = process.stdout.readline()
        assert line.startswith("serving on grpc://127.0.0.1:"), line + process.stderr.read()
        with grpc.insecure_channel(line.strip().rsplit("/", 1)[1]) as ch:
            ranked = [ranking(ch).Rank(rank_request(f"{selection}-{i}")) for i in range(2)]
            contracts.serving_pb2_grpc.AllocationServiceStub(ch).Allocate(allocate_request(f"{selection}-l"))
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, process.stderr.read()
    logged = decisions(bootstrap, topics[0])
    assert [(r.request_id, contracts.SURFACE_NAMES[r.surface]) for r in logged] == [
        (f"{selection}-0", "feed"),
        (f"{selection}-1", "feed"),
        (f"{selection}-l", "live_allocation"),
    ]
    for record in logged:
        assert record.schema_version == contracts.DECISION_SCHEMA_VERSION
        assert record.action_selection == contracts.ACTION_SELECTIONS[selection]
        assert contracts.action_selection(record) == selection
    # the mark tells the truth: the mode is the same action for every request id, a draw is not
    assert (ranked[0].action == ranked[1].action) is (selection == "mode")


# --- decision logging when Kafka is down --------------------------------------------------------------


def test_kafka_down_and_back_answers_every_request_and_counts_what_it_deferred_and_dropped(tmp_path, serve):
    with EmbeddedBroker() as broker:
        topic = f"dec-{uuid.uuid4().hex[:8]}"
        ensure_topics(broker.bootstrap_servers, [TopicSpec(topic, 1)])
        server = serve(
            bootstrap_servers=broker.bootstrap_servers,
            decisions_topic=topic,
            log_queue_size=5,
            log_in_flight=3,
        )
        value = server.metrics.value
        outcome = "recsys_decision_log_records_total"
        with channel(server) as ch:
            stub = ranking(ch)
            stub.Rank(rank_request("before"))
            wait_for(lambda: value(outcome, outcome="acked") == 1, "the first record's ack")
            group = broker._process.pid  # the broker runs in its own process group
            os.killpg(group, signal.SIGSTOP)  # Kafka stops answering: connections hang
            try:
                answers = [stub.Rank(rank_request(f"down-{i}")) for i in range(30)]
                wait_for(lambda: value(outcome, outcome="deferred") >= 1, "a deferred record")
                assert value(outcome, outcome="dropped_queue_full") >= 30 - 3 - 5 - 1
            finally:
                os.killpg(group, signal.SIGCONT)
            assert len(answers) == 30 and all(a.item_ids for a in answers)
            kept = value(outcome, outcome="enqueued")
            wait_for(lambda: value(outcome, outcome="acked") == kept, "the kept records' acks")
            stub.Rank(rank_request("after"))
            wait_for(lambda: value(outcome, outcome="acked") == kept + 1, "the record after the outage")
        logged = [r.request_id for r in decisions(broker.bootstrap_servers, topic)]
        assert logged[0] == "before" and logged[-1] == "after" and len(logged) == kept + 1
        down = [int(r.removeprefix("down-")) for r in logged[1:-1]]
        assert down == sorted(down)  # what was kept went out in order
        assert value(outcome, outcome="failed") == 0


# --- TLS and admin auth -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_tls_serves_verified_clients_and_refuses_plaintext(certificate, tmp_path, serve):
    cert, key = certificate
    server = serve(tls_cert=str(cert), tls_key=str(key))
    credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    with grpc.secure_channel(f"localhost:{server.port}", credentials) as ch:
        assert ranking(ch).Rank(rank_request()).item_ids
    with channel(server) as ch, pytest.raises(grpc.RpcError) as err:
        ranking(ch).Rank(rank_request(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_admin_reload_needs_the_token(registry_dir, tmp_path, serve):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token-0123456789\n")
    server = serve(registry=str(registry_dir), auth_token_file=str(token_file), reload_interval_s=3600.0)
    with channel(server) as ch:
        admin = contracts.serving_pb2_grpc.AdminServiceStub(ch)
        for metadata in ((), (("authorization", "Bearer wrong-token-0123456789"),)):
            with pytest.raises(grpc.RpcError) as err:
                admin.Reload(contracts.serving_pb2.ReloadRequest(), metadata=metadata)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        registry.promote(registry_dir, "feed", "v2", "stable")  # the hourly poll would not see it yet
        answer = admin.Reload(
            contracts.serving_pb2.ReloadRequest(),
            metadata=(("authorization", "Bearer s3cret-token-0123456789"),),
        )
        feed = next(s for s in answer.surfaces if s.surface == "feed")
        assert feed.stable_version == server.holders["feed"].current.stable.version
        assert feed.routing_revision == 2 and not feed.last_error
        assert ranking(ch).Rank(rank_request()).policy_version == feed.stable_version


def test_status_says_which_versions_serve_which_arm_since_when_over_grpc_and_http(registry_dir, serve):
    token_file = registry_dir.parent / "token"
    token_file.write_text("s3cret-token-0123456789\n")
    before_ms = time.time_ns() // 1_000_000
    server = serve(registry=str(registry_dir), metrics_port=0, auth_token_file=str(token_file))
    with channel(server) as ch:
        answer = contracts.serving_pb2_grpc.StatusServiceStub(ch).Status(
            contracts.serving_pb2.StatusRequest()
        )
        started = status_of(ch)
        feed, live = started["feed"], started["live_allocation"]
        assert answer.ready and before_ms <= answer.started_at_ms <= feed.serving_since_ms
        assert (feed.routing_revision, feed.stable_version, feed.canary_version) == (1, "v1", "")
        assert feed.fallback_version == "fallback-behaviour-feed-v1" and not feed.last_error
        assert (live.routing_revision, live.stable_version) == (0, "")  # a routing never written
        assert live.fallback_version == "fallback-behaviour-live-v1"
        assert feed.serving_since_ms <= live.serving_since_ms  # loaded in that order at start-up
        registry.promote(registry_dir, "feed", "v2", "canary", canary_fraction=0.25)
        wait_for(lambda: status_of(ch)["feed"].routing_revision == 2, "the canary")
        feed = status_of(ch)["feed"]
        assert (feed.stable_version, feed.canary_version, feed.canary_fraction) == ("v1", "v2", 0.25)
        assert feed.serving_since_ms > started["feed"].serving_since_ms
        assert status_of(ch)["live_allocation"] == live  # nothing changed there
        http = json.loads(urlopen(f"http://127.0.0.1:{server.metrics_port}/status", timeout=5).read())
        grpc_answer = contracts.serving_pb2_grpc.StatusServiceStub(ch).Status(
            contracts.serving_pb2.StatusRequest()
        )
    assert http == json_format.MessageToDict(grpc_answer, preserving_proto_field_name=True)
    metrics = urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).read().decode()
    assert "recsys_serving_requests_total" in metrics


def test_a_registry_that_does_not_exist_stops_the_server_from_starting(tmp_path, serve):
    nowhere = tmp_path / "nowhere"
    with pytest.raises(ConfigError, match=r"registry '.*nowhere': no registry at .*nowhere"):
        serve(registry=str(nowhere))
    done = subprocess.run(
        [str(Path(sys.executable).parent / "recsys-rl"), "serve", "--registry", str(nowhere)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"recsys-rl serve: error: registry {str(nowhere)!r}: no registry at {nowhere} "
        "(registering a policy creates one)"
    ]


def test_the_cli_serves_in_a_subprocess_and_stops_cleanly_on_sigterm(registry_dir, tmp_path):
    with serve_process("--registry", str(registry_dir), "--port", "0") as process:
        line = process.stdout.readline()
        assert line.startswith("serving on grpc://127.0.0.1:"), line + process.stderr.read()
        port = int(line.rsplit(":", 1)[1])
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            assert ranking(ch).Rank(rank_request()).routing_arm == RANK["stable"]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        assert process.stdout.read().strip() == "stopped"


def test_sigterm_drains_before_stopping_so_no_call_in_flight_is_cancelled(registry_dir):
    """NOT_SERVING at once, served on through the drain period, in-flight calls finished, then stopped."""
    with serve_process("--registry", str(registry_dir), "--port", "0", "--shutdown-drain-s", "3") as process:
        line = process.stdout.readline()
        assert line.startswith("serving on grpc://127.0.0.1:"), line + process.stderr.read()
        with grpc.insecure_channel(line.strip().rsplit("/", 1)[1]) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            ranking(ch).Rank(rank_request(), timeout=10)  # connected, and the policy has answered once
            calls = [ranking(ch).Rank.future(rank_request(f"r{i}"), timeout=60) for i in range(100)]
            process.send_signal(signal.SIGTERM)
            wait_for(
                lambda: (
                    health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
                    == health_pb2.HealthCheckResponse.NOT_SERVING
                ),
                "NOT_SERVING",
            )
            after = ranking(ch).Rank(rank_request("after-the-signal"), timeout=10)  # still served
            codes = [call.code() for call in calls]
        assert codes == [grpc.StatusCode.OK] * 100
        assert after.policy_version == "v1"
        assert process.wait(timeout=60) == 0
        assert process.stdout.read().strip() == "stopped"


def test_a_second_server_on_a_taken_port_refuses_to_start(serve):
    first = serve()
    with pytest.raises(ServeError, match=f"cannot listen on 127.0.0.1:{first.port}"):
        serve(port=first.port)  # gRPC's default SO_REUSEPORT would have let it take half the calls


def _requests_served(metrics_url: str) -> float:
    text = urlopen(metrics_url, timeout=10).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith('recsys_serving_requests_total{code="OK",method="Rank"}')
    )


def _cpus_of_each_worker(supervisor: int) -> list[set[int]]:
    """The CPUs that any thread of each of ``supervisor``'s child processes may run on, in start order."""
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    return [
        set().union(*(os.sched_getaffinity(int(t.name)) for t in Path(f"/proc/{child}/task").iterdir()))
        for child in sorted(children, key=int)
    ]


def _dealt(cpus: list[int], workers: int) -> list[set[int]]:
    return [{cpus[i % len(cpus)]} for i in range(workers)]


def test_worker_processes_share_the_port_and_stop_together_on_sigterm(registry_dir):
    with serve_process(
        "--registry",
        str(registry_dir),
        "--port",
        "0",
        "--metrics-port",
        "0",
        "--workers",
        "2",
        "--shutdown-drain-s",
        "0.5",
    ) as process:
        line = process.stdout.readline()
        assert line.startswith("serving on grpc://127.0.0.1:"), line + process.stderr.read()
        address, metrics = line.strip().removeprefix("serving on grpc://").split(", metrics on ")
        assert address.endswith(" with 2 worker processes")
        target, metrics_urls = address.split()[0], metrics.split(", ")
        assert len(set(metrics_urls)) == 2
        # 16 connections: the kernel spreads connections, so both workers get some (all on one: 2**-15)
        channels = [
            grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(16)
        ]
        try:
            answers = [
                ranking(ch).Rank(rank_request(f"r{i}-{k}"), timeout=30)
                for k, ch in enumerate(channels)
                for i in range(3)
            ]
        finally:
            for ch in channels:
                ch.close()
        assert {a.policy_version for a in answers} == {"v1"}
        served = [_requests_served(url) for url in metrics_urls]
        assert sum(served) == len(answers) and min(served) > 0
        assert _cpus_of_each_worker(process.pid) == _dealt(sorted(os.sched_getaffinity(0)), 2)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0
        assert process.stdout.read().strip().splitlines()[-1] == "stopped"


# --- online features and a Redis outage ---------------------------------------------------------------

FEATURE_REPO = Path(__file__).resolve().parents[2] / "features"
DAY_MS = 86_400_000
FEATURE_DAY = 19_800  # the UTC day (days since 1970) the user was last active
REQUEST_TIME_MS = (FEATURE_DAY + 1) * DAY_MS + 9 * 3_600_000  # 09:00 the next day


def _view(item: str, minute: int, watch: float, click: int) -> dict:
    return {
        "user_id": "user-1",
        "item_id": item,
        "author_id": "author-1",
        "item_type": "video",
        "event_time_ms": FEATURE_DAY * DAY_MS + minute * 60_000,
        "watch_time_s": watch,
        "click": click,
        "like": 0,
        "follow": 0,
        "comment": 0,
        "share": 0,
        "hate": 0,
        "live_watch_s": 0.0,
        "gift": 0.0,
    }


#: user-1's history with author-1 after the ten views of ``redis_features``.
PAIR_ROW = {
    "views": 10,
    "clicks": 5,
    "followed": 0,
    "gifts": 0.0,
    "last_interaction_ms": FEATURE_DAY * DAY_MS + 69 * 60_000,
}


@pytest.fixture(scope="module")
def redis_features(redis_server, tmp_path_factory) -> Path:
    """user-1's account (high active) and day of views, aggregated by the feature pipeline and
    materialised into Redis."""
    import apache_beam as beam

    from recsys_rl.feature_store import MaterializeConfig, materialize_repo
    from recsys_rl.feature_tables import USER_AUTHOR_HISTORY, write_user_activity
    from recsys_rl.pipelines.feature_aggregates import WriteFeatureAggregates
    from recsys_rl.pipelines.transitions import pair_history_file

    root = tmp_path_factory.mktemp("serve-features")
    facts = [_view(f"v{i}", 60 + i, watch=20.0, click=i % 2) for i in range(10)]
    with beam.Pipeline() as p:
        p | beam.Create(facts) | WriteFeatureAggregates(str(root / "offline"))
    # the pair (user-1, author-1) those views made, as a transition run with the pair surface writes it
    name, parquet = pair_history_file(
        (FEATURE_DAY + 1) * DAY_MS,
        [[{**PAIR_ROW, "user_id": "user-1", "author_id": "author-1"}]],
    )
    pairs = root / "offline" / USER_AUTHOR_HISTORY.name  # a dataset's features/ is an offline root
    pairs.mkdir()
    (pairs / Path(name).name).write_bytes(parquet)
    write_user_activity(root / "users", ["user-1"], [0], FEATURE_DAY * DAY_MS)
    end = dt.datetime.fromtimestamp((FEATURE_DAY + 1) * 86_400 + 3_600, dt.UTC).isoformat()
    config = MaterializeConfig(
        repo=str(FEATURE_REPO),
        profile="redis",
        offline=str(root / "offline"),
        user_table=str(root / "users"),
        state_dir=str(root / "state"),
        redis=redis_server.url,
        end_date=end,
    )
    materialize_repo(config)
    return root / "state"


def redis_feature_settings(redis_features: Path, redis_server, tmp_path: Path) -> dict:
    """A server without policies whose user features come from the Redis store of ``redis_features``."""
    return {
        "feature_repo": str(FEATURE_REPO),
        "feature_profile": "redis",
        "feature_state_dir": str(redis_features),
        "redis": redis_server.url,
    }


def features_missing(server: RunningServer) -> float:
    """Requests the server answered with default features, whatever the reason."""
    return sum(
        server.metrics.value("recsys_serving_features_missing_total", reason=r)
        for r in contracts.FEATURES_MISSING_REASONS
    )


@contextlib.contextmanager
def stopped(redis_server) -> Iterator[None]:
    """redis-server frozen (SIGSTOP) for the block: connections stay open and nothing answers, until it
    resumes (SIGCONT) when the block ends, however long that took."""
    os.kill(redis_server.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(redis_server.pid, signal.SIGCONT)


def test_online_features_fill_the_state_and_a_paused_redis_falls_back_to_defaults(
    redis_features, redis_server, topics, embedded_kafka, tmp_path, serve
):
    server = serve(
        **redis_feature_settings(redis_features, redis_server, tmp_path),
        feature_budget_ms=1_000.0,  # generous: the test is about the fallback, not about speed
        feature_readers=1,
        feature_max_pending=1,  # one user queued while Redis hangs; any other falls back at once
        feature_cache_s=0.0,  # every request reads the store, so that the pause shows in each
        bootstrap_servers=embedded_kafka.bootstrap_servers,
        decisions_topic=topics[0],
        shadow_topic=topics[1],
    )
    missing = "recsys_serving_features_missing_total"

    def request(request_id: str, user_id: str = "user-1") -> contracts.RankRequest:
        r = rank_request(request_id, user_id)
        r.context.event_time_ms = REQUEST_TIME_MS
        return r

    recovered: list[str] = []

    def served_with_features(stub) -> bool:
        before = features_missing(server)
        recovered.append(f"recovered-{len(recovered)}")
        stub.Rank(request(recovered[-1]))
        return features_missing(server) == before

    with channel(server) as ch:
        stub = ranking(ch)
        stub.Rank(request("known"))
        assert features_missing(server) == 0
        # Redis stops answering until the test resumes it: the outage ends when the counts are read, not
        # after a timed pause that a slow run could outlast (Redis 7.0 blocks CLIENT UNPAUSE itself)
        with stopped(redis_server):
            answers = [
                stub.Rank(request(f"paused-{i}", user))
                for i, user in enumerate(["user-1", "user-1", "user-2"])
            ]
            assert all(a.item_ids for a in answers)  # answered anyway, with default features
            # The first lookup waited out its budget and its read still fills the only queue place. The
            # same user's next request waits for that same read (and times out too); another user's skips
            # at once.
            assert server.metrics.value(missing, reason="timeout") == 2
            assert server.metrics.value(missing, reason="busy") == 1
        wait_for(lambda: served_with_features(stub), "a lookup after the outage", attempts=200)
    server.stop(1.0)
    logged = {r.request_id: r for r in decisions(embedded_kafka.bootstrap_servers, topics[0])}
    index = {name: i for i, name in enumerate(FEED_STATE_FEATURES)}
    for request_id in ("known", recovered[-1]):
        record = logged[request_id]
        assert not record.features_missing and record.user_group == 0  # high_active, from the store
        assert record.features_missing_reason == ""
        assert record.state[index["returned_yesterday"]] == 1.0
        # 10 views, 5 clicks, 200 s on top of the priors (recsys_rl.state._history)
        assert record.state[index["hist_click_rate"]] == pytest.approx((5 + 9) / 30, rel=1e-5)
        assert record.state[index["hist_watch_per_view"]] == pytest.approx((200 + 260) / 30 / 10, rel=1e-5)
    for i in range(3):
        record = logged[f"paused-{i}"]
        assert record.features_missing and record.user_group == 3  # defaults: low_active_or_unknown
        assert record.features_missing_reason == ("busy" if i == 2 else "timeout")
        assert record.state[index["returned_yesterday"]] == 0.0


def test_warm_users_are_read_before_serving_so_their_first_page_has_features(
    redis_features, redis_server, tmp_path, serve
):
    users = redis_features.parent / "offline" / "user_engagement"  # the day's users, as the pipeline wrote
    server = serve(
        **redis_feature_settings(redis_features, redis_server, tmp_path),
        feature_warm_users=str(users),
        feature_budget_ms=0.001,  # no time for a read: only a warmed cache can answer
    )
    with channel(server) as ch:
        stub = ranking(ch)
        stub.Rank(rank_request("warm", "user-1"))
        assert features_missing(server) == 0  # answered from the warmed cache
        stub.Rank(rank_request("cold", "user-2"))  # not in the store, not warmed: no time to ask
        assert features_missing(server) == 1


def test_warm_users_that_cannot_be_read_stop_the_server_from_starting(tmp_path, serve):
    with pytest.raises(ConfigError, match=r"feature_warm_users .*missing.* should be Parquet with a user_id"):
        serve(feature_warm_users=str(tmp_path / "missing"))
    (tmp_path / "users.parquet").write_bytes(b"not parquet")
    with pytest.raises(ConfigError, match=r"should be Parquet with a user_id column"):
        serve(feature_warm_users=str(tmp_path / "users.parquet"))


def test_calls_refused_before_any_handler_runs_are_counted_by_code(
    redis_features, redis_server, tmp_path, serve
):
    """RESOURCE_EXHAUSTED, undecodable requests and unknown methods never reach a handler; still counted.

    Two calls are held in flight by a Redis that stops answering: they await their feature reads.
    """
    server = serve(
        **redis_feature_settings(redis_features, redis_server, tmp_path),
        feature_budget_ms=30_000.0,
        feature_cache_s=0.0,
        max_concurrent_rpcs=2,
    )
    count = server.metrics.value
    client = redis.Redis(host=redis_server.host, port=redis_server.port)
    with channel(server) as ch:
        client.execute_command("CLIENT", "PAUSE", "20000", "ALL")
        try:
            held = [
                ranking(ch).Rank.future(rank_request(f"held-{i}", f"user-{i}"), timeout=60) for i in (1, 2)
            ]
            wait_for(lambda: count("recsys_serving_requests_in_flight") == 2, "two calls in flight")
            for i in range(3):
                with pytest.raises(grpc.RpcError) as err:
                    ranking(ch).Rank(rank_request(f"refused-{i}"), timeout=10)
                assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        finally:
            client.execute_command("CLIENT", "UNPAUSE")
        assert all(call.result().item_ids for call in held)
        wait_for(lambda: count("recsys_serving_requests_in_flight") == 0, "the calls to finish")
        raw = ch.unary_unary("/recsys.v1.RankingService/Rank")  # bytes in, bytes out
        with pytest.raises(grpc.RpcError) as err:
            raw(b"\xff\xff\xff\xff", timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details().startswith("the request is not a recsys.v1.RankRequest: ")
        with pytest.raises(grpc.RpcError) as err:
            ch.unary_unary("/recsys.v1.NoSuchService/Rank")(b"", timeout=10)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    client.close()
    assert count("recsys_serving_requests_total", method="Rank", code="RESOURCE_EXHAUSTED") == 3
    assert count("recsys_serving_requests_total", method="Rank", code="OK") == 2
    assert count("recsys_serving_requests_total", method="Rank", code="INVALID_ARGUMENT") == 1
    assert count("recsys_serving_requests_total", method="unknown", code="UNIMPLEMENTED") == 1
    assert count("recsys_serving_requests_in_flight") == 0


@pytest.fixture(scope="module")
def pair_value_run(feed_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("serve-pair") / "ua-mtcl"
    args = ["train", "--algo", "ua-mtcl", "--data", str(feed_dataset), "--out", str(run), "--steps", "40"]
    assert main(args) == 0
    return run


def user_author_registry(run: Path, tmp_path: Path) -> Path:
    """A registry whose user_author surface serves ``run``'s value as ua1, stable (a passing blessing
    written by hand: the gate is not under test here)."""
    root = tmp_path / "registry"
    report = make_report(tmp_path / "report-ua", run / "policy")
    registry.register(root, "user_author", run=run, report=report, version="ua1")
    registry.promote(root, "user_author", "ua1", "stable")
    return root


def test_rank_adds_the_user_author_term_from_the_pairs_online_rows_and_logs_it(
    pair_value_run, redis_features, redis_server, topics, embedded_kafka, tmp_path, serve
):
    """Issue 22 end to end: a trained, exported, registered and routed user-author value; its pair's
    history materialised into Redis; the term in the served scores and in the logged record."""
    from recsys_rl.pair_state import PairHistory
    from recsys_rl.sim.ranking_terms import PairValueTerm
    from recsys_rl.training.agents.policy_io import load_pair_value_policy, term_id

    root = user_author_registry(pair_value_run, tmp_path)
    server = serve(
        registry=str(root),
        **redis_feature_settings(redis_features, redis_server, tmp_path),
        feature_budget_ms=2_000.0,  # generous: the first read of a pair is cold
        bootstrap_servers=embedded_kafka.bootstrap_servers,
        decisions_topic=topics[0],
        shadow_topic=topics[1],
    )
    request = rank_request()
    request.context.event_time_ms = REQUEST_TIME_MS
    request.candidates[3].author_id = "author-1"  # the author user-1 has met; the others never met
    request.candidates[5].author_id = ""  # a candidate without an author gets no term
    with channel(server) as ch:
        answer = ranking(ch).Rank(request)
        assert status_of(ch)["user_author"].stable_version == "ua1"
    assert answer.user_author_version == "ua1"
    server.stop(1.0)
    [record] = decisions(embedded_kafka.bootstrap_servers, topics[0])
    logged = record.user_author
    assert (logged.policy_version, logged.routing_arm, logged.missing_reason) == ("ua1", RANK["stable"], "")

    policy = load_pair_value_policy(root / "user_author" / "versions" / "ua1" / "policy")
    term = PairValueTerm(policy.values, np.array(policy.manifest["reward_std"]))
    met = PairHistory(10, 5, False, 0.0, PAIR_ROW["last_interaction_ms"])
    states = np.array([met.state(REQUEST_TIME_MS), PairHistory().state(REQUEST_TIME_MS)])
    met_term, never_met_term = term.of_states(states)
    expected = np.full(len(request.candidates), never_met_term)
    expected[3], expected[5] = met_term, 0.0
    np.testing.assert_allclose(logged.terms, expected, rtol=1e-5, atol=1e-6)
    assert met_term != pytest.approx(never_met_term)  # the store's row made a difference

    predictions = np.array([c.predictions for c in request.candidates])
    scores = fusion_scores(predictions[None], np.array(answer.action)[None])[0]
    scores = scores + np.exp(logged.weight_logit) * expected
    order = top_k(scores[None], request.page_size)[0]
    assert list(answer.item_ids) == [request.candidates[j].item_id for j in order]
    np.testing.assert_allclose(answer.scores, scores[order], rtol=1e-4)
    assert logged.term_id == term_id(policy.manifest)
    manifest = policy.manifest["term"]
    noise = (logged.weight_logit - manifest["weight_logit_mean"]) / manifest["weight_logit_std"]
    assert logged.log_propensity == pytest.approx(
        -0.5 * noise**2 - math.log(manifest["weight_logit_std"]) - 0.5 * math.log(2 * math.pi), abs=1e-5
    )


def test_a_first_exposure_serves_its_term_to_the_canary_share_only(
    pair_value_run, redis_features, redis_server, topics, embedded_kafka, tmp_path, serve
):
    """A new term on an approved first exposure (no report: the gate has no logs of it yet) serves as
    canary within its share beside the fallback: a canary user's ranking carries the term under the
    canary arm, anyone else's carries none."""
    root = tmp_path / "registry"
    registry.register(root, "user_author", run=pair_value_run, version="ua1")
    registry.approve_exposure(root, "user_author", "ua1", max_canary_fraction=0.05, reason="first logs")
    registry.promote(root, "user_author", "ua1", "canary", canary_fraction=0.05)
    in_canary = next(f"user-{i}" for i in range(1000) if registry.arm_for_user(f"user-{i}", 0.05) == "canary")
    server = serve(
        registry=str(root),
        **redis_feature_settings(redis_features, redis_server, tmp_path),
        feature_budget_ms=2_000.0,
        bootstrap_servers=embedded_kafka.bootstrap_servers,
        decisions_topic=topics[0],
        shadow_topic=topics[1],
    )
    with channel(server) as ch:
        surface = status_of(ch)["user_author"]
        assert (surface.canary_version, surface.canary_fraction, surface.stable_version) == ("ua1", 0.05, "")
        answers = [ranking(ch).Rank(rank_request(f"x-{user}", user)) for user in (in_canary, "user-1")]
    server.stop(1.0)
    assert [a.user_author_version for a in answers] == ["ua1", ""]
    by_user = {r.user_id: r.user_author for r in decisions(embedded_kafka.bootstrap_servers, topics[0])}
    assert (by_user[in_canary].policy_version, by_user[in_canary].routing_arm) == ("ua1", RANK["canary"])
    assert len(by_user[in_canary].terms) == 20 and not by_user["user-1"].policy_version


def test_a_first_exposures_draws_reach_the_gate_through_kafka_and_the_pipeline_and_earn_its_blessing(
    pair_value_run, redis_features, redis_server, embedded_kafka, tmp_path, serve
):
    """A new term's way in, with the real pieces: approved first exposure, canary, the server's logs of
    the term through Kafka and the transition pipeline, the user_author gate on them, the report attached,
    stable. The gate's steps are the logged weight logits and their log-densities, in order, for the
    candidate with the served term function; its rewards, the feed's and the pairs' return (every
    candidate is author-1's, and each user comes back to that author on a second day)."""
    from recsys_rl.kafka.producer import EventProducer
    from recsys_rl.ope.evaluate import EvaluateConfig, run_evaluation
    from recsys_rl.ope.gate import GateConfig
    from recsys_rl.ope.logged import LoggedSteps
    from recsys_rl.pipelines.build_transitions import BuildTransitionsConfig, build_transitions
    from recsys_rl.training.agents.data import open_dataset
    from recsys_rl.training.agents.policy_io import term_id

    decisions_topic, feedback_topic, shadow_topic = (f"{n}-{uuid.uuid4().hex[:8]}" for n in "dfs")
    ensure_topics(
        embedded_kafka.bootstrap_servers, [TopicSpec(decisions_topic, 1), TopicSpec(feedback_topic, 1)]
    )
    root = tmp_path / "registry"
    registry.register(root, "user_author", run=pair_value_run, version="ua1")
    registry.approve_exposure(root, "user_author", "ua1", max_canary_fraction=0.05, reason="first logs")
    registry.promote(root, "user_author", "ua1", "canary", canary_fraction=0.05)
    canary = [f"user-{i}" for i in range(1000) if registry.arm_for_user(f"user-{i}", 0.05) == "canary"][:3]
    server = serve(
        registry=str(root),
        **redis_feature_settings(redis_features, redis_server, tmp_path),
        feature_budget_ms=2_000.0,
        bootstrap_servers=embedded_kafka.bootstrap_servers,
        decisions_topic=decisions_topic,
        shadow_topic=shadow_topic,
    )
    answers = []
    with channel(server) as ch, EventProducer(embedded_kafka.bootstrap_servers) as producer:
        for i in range(12):  # three canary users, two sessions a day apart, two pages each, a video watched
            user = canary[i % 3]
            request = rank_request(f"term-{i}", user)
            request.context.event_time_ms = REQUEST_TIME_MS + DAY_MS * (i // 6) + 30_000 * (i % 6)
            for candidate in request.candidates:
                candidate.author_id = "author-1"
            answers.append(ranking(ch).Rank(request))
            watched = contracts.FeedbackEvent(
                schema_version=1,
                request_id=request.request_id,
                user_id=user,
                item_id=answers[-1].item_ids[0],
                author_id="author-1",
                event_time_ms=request.context.event_time_ms + 10_000,
                item_type=contracts.ITEM_TYPES["video"],
                signals=contracts.FeedbackSignals(  # each signal from each user: the gate's intervals
                    watch_time_s=5.0 + i,  # resample users, and a signal needs a baseline in each
                    click=1,
                    like=i // 3 % 2,
                    follow=1 - i // 3 % 2,
                    comment=i // 3 % 2,
                    share=1 - i // 3 % 2,
                    hate=int(i // 3 == 3),
                ),
            )
            producer.send(feedback_topic, user.encode(), contracts.encode(watched), watched.event_time_ms)
    server.stop(1.0)
    logged = decisions(embedded_kafka.bootstrap_servers, decisions_topic)
    assert [r.request_id for r in logged] == [f"term-{i}" for i in range(12)]
    assert {a.user_author_version for a in answers} == {"ua1"}
    assert {r.user_author.routing_arm for r in logged} == {RANK["canary"]}

    result = build_transitions(
        BuildTransitionsConfig(
            bootstrap_servers=embedded_kafka.bootstrap_servers,
            group=f"term-{uuid.uuid4().hex[:8]}",
            out=str(tmp_path / "data"),
            decisions_topic=decisions_topic,
            feedback_topic=feedback_topic,
            dead_letter_topic="",
            start="earliest",
            commit=False,
            user_author_surface=True,  # the request rows' pair rewards, which the gate reads
        )
    )
    policy = registry.get_version(root, "user_author", "ua1").policy_dir
    served_term = term_id(json.loads((policy / "policy.json").read_text()))
    steps = LoggedSteps.from_dataset(open_dataset(result.dataset_dir), served_term)
    assert steps.rows == 12 and steps.excluded == {}
    # each step is one logged draw with its own density (the steps come grouped by session)
    drawn = sorted(
        (float(np.float32(r.user_author.weight_logit)), r.user_author.log_propensity) for r in logged
    )
    assert sorted(zip(steps.actions[:, 0].tolist(), steps.behaviour_log_prob.tolist(), strict=True)) == drawn
    with pytest.raises(ValueError, match="without the evaluated user-author term function"):
        LoggedSteps.from_dataset(open_dataset(result.dataset_dir), "another-term")
    assert steps.rewards[:, 0].sum() == pytest.approx(sum(5.0 + i for i in range(12)))
    with_return = LoggedSteps.from_dataset(open_dataset(result.dataset_dir), served_term, ("author_return",))
    assert with_return.rewards[:, -1].sum() == 3  # each user's first view on the second day

    # the gate on the canary's own logs (a lenient one: what is under test is the path, not the verdict)
    gate = GateConfig(surface="user_author", resamples=20, interval="percentile", **OPEN_GATE)
    report = tmp_path / "report"
    run_evaluation(
        EvaluateConfig(
            candidate=str(pair_value_run), data=str(result.dataset_dir), out=str(report), gate=gate
        )
    )
    assert registry.attach_report(root, "user_author", "ua1", report)
    assert registry.get_version(root, "user_author", "ua1").why_not_blessed is None
    assert registry.promote(root, "user_author", "ua1", "stable").after.stable == "ua1"
