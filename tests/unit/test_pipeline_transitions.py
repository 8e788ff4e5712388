"""The Beam composites on realistic and malformed records: accounting, dead letters, deterministic files."""

import random
from collections import Counter, defaultdict

import apache_beam as beam
import pyarrow.parquet as pq
import pytest
from apache_beam.io.tfrecordio import _TFRecordUtil
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to

from recsys_rl import contracts
from recsys_rl.dataset_contract import USER_AUTHOR
from recsys_rl.pipelines.episodes import (
    DECISION,
    EVENT_TYPES,
    EpisodeConfig,
    build_user_episodes,
    decode_event,
)
from recsys_rl.pipelines.episodes import FEEDBACK as FEEDBACK_KIND
from recsys_rl.pipelines.kafka_source import KafkaBatch, KafkaRecord
from recsys_rl.pipelines.transition_io import ShardTransitions
from recsys_rl.pipelines.transitions import KafkaToTransitions
from recsys_rl.pipelines.whole_files import WriteWholeFiles
from recsys_rl.sim.simulate import SimulateConfig, day_messages, simulated_days

CONFIG = SimulateConfig(users=40, seed=21)
DECISIONS, FEEDBACK = CONFIG.decisions_topic, CONFIG.feedback_topic


def simulated_records() -> list[KafkaRecord]:
    sim, next_day = simulated_days(CONFIG)
    offsets: Counter = Counter()
    records = []
    for topic, key, value, ts in day_messages(CONFIG, sim, next_day()):
        records.append(KafkaRecord(topic, 0, offsets[topic], ts, key, value))
        offsets[topic] += 1
    return records


def malformed_records(good: list[KafkaRecord]) -> tuple[list[KafkaRecord], Counter]:
    """One record per bad case, after the good ones; returns them with the fate each must get."""
    decision = next(r for r in good if r.topic == DECISIONS)
    event = contracts.decode_feedback(next(r for r in good if r.topic == FEEDBACK).value)
    base = 10_000_000

    def fb(offset, message_bytes):
        return KafkaRecord(FEEDBACK, 0, base + offset, 0, event.user_id.encode(), message_bytes)

    future = contracts.FeedbackEvent()
    future.CopyFrom(event)
    future.schema_version = 9
    no_item = contracts.FeedbackEvent()
    no_item.CopyFrom(event)
    no_item.item_id = ""
    negative = contracts.FeedbackEvent()
    negative.CopyFrom(event)
    negative.signals.watch_time_s = -4.0
    orphan = contracts.FeedbackEvent()
    orphan.CopyFrom(event)
    orphan.request_id = "never-decided"
    as_json = contracts.FeedbackEvent()
    as_json.CopyFrom(event)
    as_json.item_id, as_json.position = "v-json", 77  # a new view, sent as JSON: must be used
    long_id = contracts.FeedbackEvent()
    long_id.CopyFrom(event)
    long_id.item_id = "v" * (contracts.MAX_ID_LENGTH + 1)
    typeless = contracts.FeedbackEvent()
    typeless.CopyFrom(event)
    typeless.item_type = 0
    ahead = contracts.FeedbackEvent()  # sent a day and a second before the event it reports
    ahead.CopyFrom(event)
    ahead.item_id, ahead.position = "v-ahead", 78
    written_ms = ahead.event_time_ms - 86_401_000
    bad = [
        fb(0, b"\x08\x01\xff\xff\xff"),
        fb(1, b'{"request_id": '),
        fb(2, contracts.encode(future)),
        fb(3, contracts.encode(no_item)),
        fb(4, contracts.encode(negative)),
        fb(5, contracts.encode(orphan)),
        fb(6, contracts.feedback_to_json(as_json)),
        KafkaRecord(DECISIONS, 0, base + 7, decision.timestamp_ms, decision.key, decision.value),  # resent
        KafkaRecord("elsewhere", 0, 0, 0, b"", b"x"),
        fb(8, contracts.encode(long_id)),
        fb(9, contracts.encode(typeless)),
        KafkaRecord(FEEDBACK, 0, base + 10, written_ms, event.user_id.encode(), contracts.encode(ahead)),
        fb(11, b""),
        fb(12, b"\xef\xbb\xbf" + contracts.feedback_to_json(as_json)),
    ]
    expected = Counter(
        {
            "dead_letter:malformed_bytes": 1,
            "dead_letter:malformed_json": 1,
            "dead_letter:unknown_schema_version": 1,
            "dead_letter:missing_field": 1,
            "dead_letter:out_of_range": 1,
            "dead_letter:orphan_feedback": 1,
            "dead_letter:unknown_topic": 1,
            "dead_letter:too_long": 1,
            "dead_letter:unknown_item_type": 1,
            "dead_letter:future_event_time": 1,
            "dead_letter:empty_value": 1,
            "dead_letter:byte_order_mark": 1,
            "filtered:duplicate_decision": 1,
            "used": 1,  # the JSON feedback
        }
    )
    return bad, expected


def batches(records: list[KafkaRecord], size: int = 50) -> list[KafkaBatch]:
    """Records as the source yields them: runs of one topic and partition, at most ``size`` long."""
    out: list[KafkaBatch] = []
    for r in records:
        if not out or (out[-1].topic, out[-1].partition) != (r.topic, r.partition) or out[-1].size == size:
            out.append(KafkaBatch(r.topic, r.partition, [], [], [], []))
        batch = out[-1]
        batch.offsets.append(r.offset)
        batch.timestamps_ms.append(r.timestamp_ms)
        batch.keys.append(r.key)
        batch.values.append(r.value)
    return out


@pytest.fixture(scope="module")
def records():
    return simulated_records()


@pytest.mark.parametrize("pairs", [False, True], ids=["request-surfaces", "with-user-author"])
def test_every_record_gets_exactly_one_fate(records, pairs):
    bad, expected_bad = malformed_records(records)
    expected = expected_bad + Counter({"used": len(records)})
    expected["read"] = len(records) + len(bad)
    decisions = sum(1 for r in records if r.topic == DECISIONS)
    surfaces = (contracts.decode_decision(r.value).surface for r in records if r.topic == DECISIONS)
    expected.update(Counter(f"built:{contracts.SURFACE_NAMES[surface]}" for surface in surfaces))
    # every feedback event used is one interaction of a user-author pair: the good ones, and the new view
    # sent as JSON among the bad
    interactions = (len(records) - decisions + 1) if pairs else 0
    if pairs:
        expected[f"built:{USER_AUTHOR}"] = interactions
    with BeamTestPipeline() as p:
        out = (
            p
            | beam.Create(batches(records + bad))
            | KafkaToTransitions(DECISIONS, FEEDBACK, EpisodeConfig(), pairs=pairs)
        )
        assert_that(out["fates"], equal_to(list(expected.items())), label="fates")
        assert_that(
            out["transitions"] | beam.Map(len) | beam.CombineGlobally(sum),
            equal_to([decisions + interactions]),
            label="transitions",
        )
        reasons = out["dead_letters"] | beam.Map(lambda d: d["reason"])
        assert_that(
            reasons,
            equal_to(
                [
                    k.split(":")[1]
                    for k, v in expected_bad.items()
                    if k.startswith("dead_letter")
                    for _ in range(v)
                ]
            ),
            label="reasons",
        )


def _write(row_lists, directory, options=None):
    with beam.Pipeline(options=PipelineOptions(options or [])) as p:
        (
            p
            | beam.Create(row_lists)
            | ShardTransitions(3)
            | WriteWholeFiles(str(directory), str(directory / ".tmp"))
        )
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir()) if path.is_file()}


def _transitions(records):
    """The rows KafkaToTransitions emits, built without Beam so the writer is tested on its own."""
    by_user = defaultdict(list)
    for r in records:
        kind = DECISION if r.topic == DECISIONS else FEEDBACK_KIND
        user_id, fields = decode_event(kind, r)
        by_user[user_id].append(EVENT_TYPES[kind]._make(fields))
    return [
        row
        for user, events in by_user.items()
        for row in build_user_episodes(user, events, EpisodeConfig()).transitions
    ]


def test_shards_are_byte_identical_whatever_the_input_order_and_runner_mode(records, tmp_path):
    rows = _transitions(records)
    shuffled = rows[:]
    random.Random(3).shuffle(shuffled)
    first = _write([rows], tmp_path / "a")
    second = _write(
        [shuffled[i : i + 7] for i in range(0, len(shuffled), 7)],
        tmp_path / "b",
        ["--direct_num_workers=2", "--direct_running_mode=multi_processing"],
    )
    assert first == second
    assert sorted(first) == sorted(
        f"transitions-{s}-{i:05d}-of-00003.{ext}"
        for s in ("feed", "live_allocation")
        for i in range(3)
        for ext in ("tfrecord", "parquet")
    )
    parquet_rows = sum(
        pq.read_metadata(tmp_path / "a" / name).num_rows for name in first if name.endswith("parquet")
    )
    assert parquet_rows == len(rows)
    tfrecords = 0
    for name in first:
        if name.endswith("tfrecord"):
            with open(tmp_path / "a" / name, "rb") as fh:
                while _TFRecordUtil.read_record(fh) is not None:
                    tfrecords += 1
    assert tfrecords == len(rows)


@pytest.mark.parametrize("kept", [0, 1], ids=["no-rows", "one-row"])
def test_every_shard_gets_its_files_however_few_rows_there_are(records, tmp_path, kept):
    rows = _transitions(records)[:kept]
    files = _write([rows], tmp_path)
    names = [
        f"transitions-{s}-{i:05d}-of-00003.{ext}"
        for s in ("feed", "live_allocation")
        for i in range(3)
        for ext in ("tfrecord", "parquet")
    ]
    assert sorted(files) == sorted(names)
    parquet = [name for name in names if name.endswith("parquet")]
    assert sum(pq.read_metadata(tmp_path / name).num_rows for name in parquet) == kept
    assert sum(len(files[name]) > 0 for name in names if name.endswith("tfrecord")) == kept
