"""Declaring the topics a run needs, idempotently.

Partition counts are part of the contract, not a tuning knob: keys are hashed onto partitions, so a
topic that silently kept an old partition count would route a user's events differently from what
the readers expect. An existing topic with the wrong count is therefore an error, never "good enough".
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import kafka.errors as kafka_errors
from kafka import KafkaAdminClient

from recsys_rl.kafka.connection import connect, quiet_kafka_logging
from recsys_rl.kafka.setup_errors import TopicSetupError

# Kafka's own rule (kafka.common.internals.Topic): checked here so a bad name fails with the name
# in the message instead of as an INVALID_TOPIC_EXCEPTION code from the broker.
_TOPIC_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")

_UNKNOWN_TOPIC = kafka_errors.UnknownTopicOrPartitionError.errno


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int = 1
    #: topic-level settings used when the topic is created, e.g. (("retention.ms", "-1"),);
    #: an existing topic keeps its own (they are its operator's business)
    configs: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not _TOPIC_NAME_RE.match(self.name) or self.name in (".", ".."):
            raise TopicSetupError(
                f"invalid topic name {self.name!r}: use 1-249 characters from [A-Za-z0-9._-]"
            )
        if self.partitions < 1:
            raise TopicSetupError(f"topic {self.name!r}: partitions must be >= 1, got {self.partitions}")
        if self.replication_factor < 1:
            raise TopicSetupError(
                f"topic {self.name!r}: replication_factor must be >= 1, got {self.replication_factor}"
            )


def ensure_topics(bootstrap_servers: str, specs: Iterable[TopicSpec], *, timeout_s: float = 30.0) -> None:
    """Create the missing topics and return once every partition of every topic has a leader.

    Waiting for leaders matters because CreateTopics only says the controller accepted the request;
    a producer that starts before leadership propagates gets NOT_LEADER errors and retries, and a
    reader asking for high watermarks right away may see no partitions at all.
    """
    wanted: dict[str, TopicSpec] = {}
    for spec in specs:
        if wanted.setdefault(spec.name, spec) != spec:
            raise TopicSetupError(f"topic {spec.name!r} is requested twice with different layouts")
    if not wanted:
        return
    admin = connect(KafkaAdminClient, bootstrap_servers, timeout_s, request_timeout_ms=int(timeout_s * 1000))
    try:
        existing = _partition_counts(admin, list(wanted))
        _check_layout(wanted, existing)
        missing = [spec for name, spec in wanted.items() if name not in existing]
        if missing:
            _create(admin, missing, timeout_s)
        try:
            admin.wait_for_topics(list(wanted), timeout_ms=int(timeout_s * 1000))
        except kafka_errors.KafkaTimeoutError as exc:
            raise TopicSetupError(
                f"topics on {bootstrap_servers} did not get a leader for every partition within "
                f"{timeout_s:g} s: {exc}"
            ) from None
    finally:
        with quiet_kafka_logging():
            admin.close()


def _partition_counts(admin: KafkaAdminClient, names: list[str]) -> dict[str, int]:
    """Partition count of each named topic that exists (absent ones are simply left out)."""
    counts: dict[str, int] = {}
    for topic in admin.describe_topics(names):
        if topic["error_code"] == _UNKNOWN_TOPIC:
            continue
        if topic["error_code"] != 0:
            error = kafka_errors.for_code(topic["error_code"]).__name__
            raise TopicSetupError(f"cannot describe topic {topic['name']!r}: {error}")
        counts[topic["name"]] = len(topic["partitions"])
    return counts


def _check_layout(wanted: dict[str, TopicSpec], existing: dict[str, int]) -> None:
    for name, count in existing.items():
        expected = wanted[name].partitions
        if count != expected:
            raise TopicSetupError(
                f"topic {name!r} already exists with {count} partition(s) but {expected} are required; "
                "delete it or use another topic name"
            )


def _create(admin: KafkaAdminClient, specs: list[TopicSpec], timeout_s: float) -> None:
    request: dict[str, dict[str, Any]] = {
        spec.name: {
            "num_partitions": spec.partitions,
            "replication_factor": spec.replication_factor,
            "configs": dict(spec.configs),
        }
        for spec in specs
    }
    response = admin.create_topics(request, timeout_ms=int(timeout_s * 1000), raise_errors=False)
    raced: list[str] = []
    for topic in response["topics"]:
        error = kafka_errors.for_code(topic["error_code"])
        if error is kafka_errors.TopicAlreadyExistsError:
            raced.append(topic["name"])
        elif error is not kafka_errors.NoError:
            detail = topic.get("error_message") or error.__name__
            raise TopicSetupError(f"cannot create topic {topic['name']!r}: {detail}")
    if raced:
        # Someone else created it between our describe and our create: its layout is theirs, so
        # check it like any other pre-existing topic.
        by_name = {spec.name: spec for spec in specs}
        _check_layout(by_name, _partition_counts(admin, raced))
