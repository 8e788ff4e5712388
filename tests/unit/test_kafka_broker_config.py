"""Bootstrap-address validation and broker selection: everything decided before any socket opens."""

from __future__ import annotations

from pathlib import Path

import pytest

from recsys_rl.kafka import (
    BrokerConfigError,
    EmbeddedBroker,
    ExternalBroker,
    KafkaSetupError,
    LocalKafkaBroker,
    open_broker,
    parse_bootstrap_servers,
)
from recsys_rl.kafka.broker import KAFKA_LIBS_ENV
from recsys_rl.kafka.connection import BrokerAddress


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("localhost:9092", [("localhost", 9092)], id="hostname"),
        pytest.param("127.0.0.1:19092", [("127.0.0.1", 19092)], id="ipv4"),
        pytest.param("[::1]:9092", [("::1", 9092)], id="bracketed-ipv6"),
        pytest.param("kafka_1:29092", [("kafka_1", 29092)], id="compose-service-underscore"),
        pytest.param(
            "b-1.msk.eu-west-1.amazonaws.com:9094", [("b-1.msk.eu-west-1.amazonaws.com", 9094)], id="fqdn"
        ),
        pytest.param("a:1,b:65535", [("a", 1), ("b", 65535)], id="two-brokers-port-limits"),
        pytest.param(" a:1 , b:2 ", [("a", 1), ("b", 2)], id="whitespace-around-entries"),
    ],
)
def test_valid_bootstrap_servers_parse(value: str, expected: list[tuple[str, int]]) -> None:
    assert list(parse_bootstrap_servers(value)) == [BrokerAddress(h, p) for h, p in expected]


@pytest.mark.parametrize(
    ("value", "named"),
    [
        pytest.param("", "''", id="empty"),
        pytest.param("   ", "'   '", id="blank"),
        pytest.param("localhost", "'localhost'", id="missing-port"),
        pytest.param("localhost:", "'localhost:'", id="empty-port"),
        pytest.param(":9092", "':9092'", id="missing-host"),
        pytest.param("localhost:0", "'localhost:0'", id="port-zero"),
        pytest.param("localhost:65536", "'localhost:65536'", id="port-too-big"),
        pytest.param("localhost:90x2", "'localhost:90x2'", id="port-not-numeric"),
        pytest.param("localhost:-1", "'localhost:-1'", id="port-negative"),
        pytest.param("PLAINTEXT://localhost:9092", "'PLAINTEXT://localhost:9092'", id="url-scheme"),
        pytest.param("a:1,,b:2", "''", id="empty-entry"),
        pytest.param("a:1,", "''", id="trailing-comma"),
        pytest.param("bad host:9092", "'bad host:9092'", id="space-in-host"),
        pytest.param("::1:9092", "'::1:9092'", id="unbracketed-ipv6"),
        pytest.param("[zz::1]:9092", "'[zz::1]:9092'", id="bad-ipv6"),
        pytest.param("[::1]9092", "'[::1]9092'", id="ipv6-without-colon"),
        pytest.param("good:1,bad", "'bad'", id="second-entry-bad"),
    ],
)
def test_invalid_bootstrap_servers_name_the_bad_entry(value: str, named: str) -> None:
    with pytest.raises(BrokerConfigError) as caught:
        parse_bootstrap_servers(value)
    assert named in str(caught.value)
    # Callers may catch either family: argument validation or Kafka set-up problems.
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, KafkaSetupError)


def test_external_broker_normalises_but_does_not_start_anything() -> None:
    broker = ExternalBroker(" a:1 ,[::1]:2")
    assert broker.bootstrap_servers == "a:1,[::1]:2"
    assert not broker.running
    broker.stop()
    broker.stop()  # idempotent, and a no-op for a cluster we do not own


def test_external_broker_rejects_bad_syntax_with_value_error() -> None:
    with pytest.raises(ValueError, match="'nope'"):
        ExternalBroker("nope")


@pytest.mark.parametrize(
    ("servers", "kind", "expected_type"),
    [
        pytest.param("h:9092", "embedded", ExternalBroker, id="servers-win-over-embedded"),
        pytest.param("h:9092", "local-kafka", ExternalBroker, id="servers-win-over-local-kafka"),
        pytest.param(None, "embedded", EmbeddedBroker, id="embedded"),
        pytest.param(None, "local-kafka", LocalKafkaBroker, id="local-kafka"),
    ],
)
def test_open_broker_picks_the_source(servers: str | None, kind: str, expected_type: type) -> None:
    broker = open_broker(servers, kind)
    assert type(broker) is expected_type
    assert not broker.running


def test_open_broker_defaults_to_embedded() -> None:
    assert type(open_broker(None)) is EmbeddedBroker


@pytest.mark.parametrize("servers", [pytest.param(None, id="no-servers"), pytest.param("h:1", id="servers")])
def test_open_broker_rejects_unknown_kind(servers: str | None) -> None:
    with pytest.raises(BrokerConfigError, match=r"'zookeeper'.*embedded, local-kafka"):
        open_broker(servers, "zookeeper")


def test_open_broker_validates_given_servers() -> None:
    with pytest.raises(BrokerConfigError, match="'h'"):
        open_broker("h", "embedded")


def test_unstarted_managed_broker_has_no_address() -> None:
    with pytest.raises(KafkaSetupError, match="start"):
        _ = EmbeddedBroker().bootstrap_servers


def test_local_kafka_libs_dir_comes_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(KAFKA_LIBS_ENV, str(tmp_path))
    assert LocalKafkaBroker().libs_dir == tmp_path


def test_local_kafka_libs_dir_defaults_to_user_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KAFKA_LIBS_ENV, raising=False)
    assert LocalKafkaBroker().libs_dir == Path.home() / ".cache" / "recsys-rl" / "kafka-4.1.1" / "libs"


def test_missing_kafka_jars_say_how_to_fetch_them(tmp_path: Path) -> None:
    broker = LocalKafkaBroker(tmp_path / "empty")
    with pytest.raises(KafkaSetupError, match="make kafka-jars"):
        broker.start()
    assert not broker.running
    assert broker.log_path is None  # the temp dir made for the attempt is gone again
