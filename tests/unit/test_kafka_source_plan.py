"""Replay plans without a broker: chunking, the manifest form, argument checks, pickling and coding."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import apache_beam as beam
import confluent_kafka
import pytest
from apache_beam.internal import pickler
from hypothesis import given
from hypothesis import strategies as st

from recsys_rl.kafka.setup_errors import ReadError
from recsys_rl.pipelines.kafka_source import (
    KafkaBatch,
    KafkaBatchCoder,
    KafkaRecord,
    OffsetRange,
    ReadKafkaReplay,
    ReplayPlan,
    _ReadChunkFn,
    commit_offsets,
    committed_offsets,
    plan_replay,
    stable_end_offsets,
)

BOOTSTRAP = "127.0.0.1:9"  # never contacted: every case here fails or finishes before connecting


@st.composite
def plans(draw: st.DrawFn) -> ReplayPlan:
    places = draw(
        st.lists(st.tuples(st.sampled_from(["a", "b", "c.d"]), st.integers(0, 5)), unique=True, max_size=6)
    )
    ranges = []
    for topic, partition in places:
        start = draw(st.integers(0, 1_000))
        ranges.append(OffsetRange(topic, partition, start, start + draw(st.integers(0, 120))))
    group = draw(st.one_of(st.none(), st.text(min_size=1, max_size=8)))
    return ReplayPlan(BOOTSTRAP, group, tuple(ranges))


@given(plan=plans(), max_records=st.integers(1, 50))
def test_chunks_cover_every_range_exactly_once_in_order(plan: ReplayPlan, max_records: int) -> None:
    chunks = plan.chunks(max_records)
    assert all(0 < chunk.size <= max_records for chunk in chunks)
    for offset_range in plan.ranges:
        own = [c for c in chunks if (c.topic, c.partition) == (offset_range.topic, offset_range.partition)]
        if offset_range.size == 0:
            assert own == []
            continue
        # Contiguous, in order, from start to end: every offset in exactly one chunk.
        assert own[0].start == offset_range.start
        assert own[-1].end == offset_range.end
        assert all(before.end == after.start for before, after in itertools.pairwise(own))
        # Only the last piece may be short, so the chunk count is the minimum possible.
        assert len(own) == -(-offset_range.size // max_records)
    assert chunks == sorted(chunks)
    assert sum(c.size for c in chunks) == plan.total_records


@given(plan=plans())
def test_plan_survives_a_json_round_trip(plan: ReplayPlan) -> None:
    document = json.loads(json.dumps(plan.to_dict()))
    assert ReplayPlan.from_dict(document) == plan


def test_plan_keeps_ranges_sorted_whatever_order_they_come_in() -> None:
    ranges = (OffsetRange("b", 0, 0, 3), OffsetRange("a", 1, 5, 5), OffsetRange("a", 0, 2, 9))
    plan = ReplayPlan(BOOTSTRAP, "g", ranges)
    assert plan.ranges == tuple(sorted(ranges))
    assert plan == ReplayPlan(BOOTSTRAP, "g", tuple(reversed(ranges)))
    assert plan.total_records == 3 + 0 + 7
    assert plan.to_dict()["ranges"][0] == {"topic": "a", "partition": 0, "start": 2, "end": 9}


def _plan(*ranges: OffsetRange, group: str | None = "g") -> ReplayPlan:
    return ReplayPlan(BOOTSTRAP, group, ranges)


BAD_INPUTS = [
    pytest.param(lambda: _plan(OffsetRange("t", 0, 0, 9)).chunks(0), ValueError, r"got 0", id="chunks-zero"),
    pytest.param(lambda: _plan().chunks(-3), ValueError, r"max_records .* got -3", id="chunks-negative"),
    pytest.param(lambda: _plan().chunks(2.5), ValueError, r"got 2\.5", id="chunks-not-int"),
    pytest.param(lambda: ReadKafkaReplay(_plan(), 0), ValueError, r"got 0", id="transform-chunk-zero"),
    pytest.param(
        lambda: ReadKafkaReplay(_plan(), 10, idle_timeout_s=0), ValueError, r"got 0", id="transform-timeout"
    ),
    pytest.param(
        lambda: plan_replay(BOOTSTRAP, ["t"], None),
        ValueError,
        r"start='committed' needs a consumer group, got group=None",
        id="committed-without-group",
    ),
    pytest.param(
        lambda: plan_replay(BOOTSTRAP, ["t"], "g", start="latest"), ValueError, r"'latest'", id="start-word"
    ),
    pytest.param(
        lambda: plan_replay(BOOTSTRAP, ["t"], "g", start={("other", 0): 3}),
        ValueError,
        r"'other'",
        id="start-other-topic",
    ),
    pytest.param(
        lambda: plan_replay(BOOTSTRAP, ["t"], "g", start={("t", 0): -1}),
        ValueError,
        r"t\[0\] .* got -1",
        id="start-negative",
    ),
    pytest.param(lambda: plan_replay(BOOTSTRAP, [], "g"), ValueError, r"at least one topic", id="no-topics"),
    pytest.param(lambda: plan_replay(BOOTSTRAP, "t", "g"), TypeError, r"string 't'", id="topics-string"),
    pytest.param(
        lambda: plan_replay("localhost", ["t"], "g"),
        ValueError,
        r"'localhost'.*missing :PORT",
        id="bad-address",
    ),
    pytest.param(
        lambda: OffsetRange("t", 0, 7, 3), ValueError, r"end 3 is before start 7", id="range-reversed"
    ),
    pytest.param(
        lambda: OffsetRange("t", -1, 0, 3), ValueError, r"partition .* got -1", id="range-partition"
    ),
    pytest.param(lambda: OffsetRange("", 0, 0, 3), ValueError, r"topic .* got ''", id="range-topic"),
    pytest.param(
        lambda: _plan(OffsetRange("t", 0, 0, 3), OffsetRange("t", 0, 3, 5)),
        ValueError,
        r"more than one range for t\[0\]",
        id="plan-duplicate-partition",
    ),
    pytest.param(lambda: _plan(group=""), ValueError, r"got ''", id="plan-empty-group"),
    pytest.param(
        lambda: ReplayPlan.from_dict({"group": None, "ranges": []}),
        ValueError,
        r"bootstrap_servers",
        id="document-missing-key",
    ),
    pytest.param(
        lambda: ReplayPlan.from_dict(
            {"bootstrap_servers": BOOTSTRAP, "group": None, "ranges": [{"topic": "t"}]}
        ),
        ValueError,
        r"'partition'",
        id="document-bad-range",
    ),
    pytest.param(
        lambda: commit_offsets(_plan(group=None)),
        ValueError,
        r"without a consumer group",
        id="commit-no-group",
    ),
    pytest.param(
        lambda: committed_offsets(BOOTSTRAP, "", ["t"]), ValueError, r"got ''", id="fetch-empty-group"
    ),
]


@pytest.mark.parametrize(("call", "error", "message"), BAD_INPUTS)
def test_bad_inputs_are_rejected_naming_the_value(
    call: Callable[[], Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        call()


def test_transform_and_reader_pickle_without_a_live_client() -> None:
    """Multi-process and remote runners pickle the DoFn; a consumer made in __init__ would not survive."""
    plan = _plan(OffsetRange("t", 0, 0, 10))
    transform = ReadKafkaReplay(plan, 4)
    assert pickler.loads(pickler.dumps(transform))._plan == plan
    reader = _ReadChunkFn(BOOTSTRAP, 5.0, {"check.crcs": False})
    reader._reader = object()  # as if set up: still pickles, without it
    copy = pickler.loads(pickler.dumps(reader))
    assert copy._reader is None
    assert copy._consumer_config == {"check.crcs": False}


@pytest.mark.parametrize(
    "batch",
    [
        pytest.param(
            KafkaBatch(
                "recsys.feedback",
                3,
                [12_345, 12_346],
                [1_767_225_600_000] * 2,
                [b"user-1", b""],
                [b"\x00pay", b"v"],
            ),
            id="typical",
        ),
        pytest.param(KafkaBatch("t", 0, [0], [-1], [b""], [b""]), id="no-timestamp-empty-bytes"),
        pytest.param(KafkaBatch("t\u00e9", 2**31, [2**62], [0], [b"k"], [b"v" * 100_000]), id="large-values"),
        pytest.param(KafkaBatch("t", 0, [], [], [], []), id="empty"),
    ],
)
def test_batches_get_a_compact_coder_that_keeps_their_type(batch: KafkaBatch) -> None:
    coder = beam.coders.registry.get_coder(KafkaBatch)
    assert isinstance(coder, KafkaBatchCoder)
    assert coder.is_deterministic()
    encoded = coder.encode(batch)
    decoded = coder.decode(encoded)
    assert decoded == batch
    assert type(decoded) is KafkaBatch
    payload = len(batch.topic.encode()) + sum(map(len, batch.keys)) + sum(map(len, batch.values))
    assert len(encoded) - payload <= 20 + 30 * batch.size  # lengths and varints only; no class path
    copy = pickler.loads(pickler.dumps(coder))  # coders travel pickled to multi-process workers
    assert copy.decode(encoded) == batch


def test_a_batch_lists_its_records_in_offset_order() -> None:
    batch = KafkaBatch("t", 2, [5, 6], [10, 11], [b"k", b""], [b"a", b"b"])
    assert batch.size == 2
    assert batch.records() == [KafkaRecord("t", 2, 5, 10, b"k", b"a"), KafkaRecord("t", 2, 6, 11, b"", b"b")]


class _RestartedBroker:
    """A consumer (confluent-kafka's interface) of a one-partition topic whose broker has just restarted: it
    answers the first ``unled`` watermark asks with ``code``, then says the log ends at offset 5."""

    def __init__(self, code: int, unled: int) -> None:
        self.code, self.unled, self.asks = code, unled, 0

    def __call__(self, config: dict) -> _RestartedBroker:  # stands in for the Consumer class
        return self

    def list_topics(self, topic: str, timeout: float) -> SimpleNamespace:
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions={0: None})})

    def get_watermark_offsets(self, where, timeout: float, cached: bool) -> tuple[int, int]:
        self.asks += 1
        if self.asks <= self.unled:
            raise confluent_kafka.KafkaException(confluent_kafka.KafkaError(self.code))
        return 0, 5

    def assign(self, partitions) -> None:
        pass

    def poll(self, timeout: float) -> SimpleNamespace:
        end = confluent_kafka.KafkaError(confluent_kafka.KafkaError._PARTITION_EOF)
        return SimpleNamespace(error=lambda: end, partition=lambda: 0, offset=lambda: 5)

    def close(self) -> None:
        pass


def test_the_end_of_a_topic_waits_for_a_restarted_broker_to_lead_again(monkeypatch):
    """Seen in CI: `build-transitions` right after `broker start` failed with NOT_LEADER_FOR_PARTITION."""
    broker = _RestartedBroker(confluent_kafka.KafkaError.NOT_LEADER_FOR_PARTITION, unled=2)
    monkeypatch.setattr(confluent_kafka, "Consumer", broker)
    assert stable_end_offsets(BOOTSTRAP, "t", timeout_s=10.0) == {0: 5}
    assert broker.asks == 3


@pytest.mark.parametrize(
    ("code", "unled", "message"),
    [
        (
            confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED,
            1,
            "finding the end of topic 't' on .* failed",
        ),
        (confluent_kafka.KafkaError.NOT_LEADER_FOR_PARTITION, 10**9, "still failing at the deadline"),
    ],
)
def test_the_end_of_a_topic_gives_up_on_an_error_that_will_not_pass(monkeypatch, code, unled, message):
    monkeypatch.setattr(confluent_kafka, "Consumer", _RestartedBroker(code, unled))
    with pytest.raises(ReadError, match=message):
        stable_end_offsets(BOOTSTRAP, "t", timeout_s=0.3)
