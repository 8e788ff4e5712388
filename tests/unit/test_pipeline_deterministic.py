"""Issue 19: how serving chose each action reaches the transitions, from the Kafka record to the files.

A decision served as the policy's mode (``serve --no-explore``) logs a density, not a propensity; the
transitions carry a ``deterministic`` column so OPE can leave such sessions out. Version-1 records
(written before serving said) are read as sampled; a version-3 record, or a version-2 one that does not
say, is dead-lettered.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import apache_beam as beam
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to

from recsys_rl import contracts
from recsys_rl.dataset_contract import USER_AUTHOR
from recsys_rl.pipelines.carry import CARRIED_FILE, carried_lines, read_carried
from recsys_rl.pipelines.episodes import DECISION, Decision, EpisodeConfig, build_user_episodes, decode_event
from recsys_rl.pipelines.kafka_source import KafkaBatch, KafkaRecord
from recsys_rl.pipelines.transition_io import ShardTransitions
from recsys_rl.pipelines.transitions import KafkaToTransitions
from recsys_rl.pipelines.whole_files import WriteWholeFiles
from recsys_rl.proto import tf_example_pb2
from recsys_rl.sim.simulate import SimulateConfig, day_messages, simulated_days

CONFIG = SimulateConfig(users=12, seed=5)
DECISIONS, FEEDBACK = CONFIG.decisions_topic, CONFIG.feedback_topic
MODE, SAMPLED = contracts.ACTION_SELECTIONS["mode"], contracts.ACTION_SELECTIONS["sampled"]


def _rewritten(record: KafkaRecord, **fields) -> KafkaRecord:
    decision = contracts.decode_decision(record.value)
    for name, value in fields.items():
        if value is None:
            decision.ClearField(name)
        else:
            setattr(decision, name, value)
    return record._replace(value=contracts.encode(decision))


@pytest.fixture(scope="module")
def records() -> tuple[list[KafkaRecord], dict[str, bool], Counter]:
    """A simulated day with serving's marks put in: per user, a way of choosing the actions.

    Returns the records, whether each used decision's action was deterministic (by request id), and the
    dead-letter fates the bad ones must get.
    """
    sim, next_day = simulated_days(CONFIG)
    offsets: Counter = Counter()
    raw = []
    for topic, key, value, ts in day_messages(CONFIG, sim, next_day()):
        raw.append(KafkaRecord(topic, 0, offsets[topic], ts, key, value))
        offsets[topic] += 1
    users = sorted({contracts.decode_decision(r.value).user_id for r in raw if r.topic == DECISIONS})
    # whole users served in mode (both surfaces), by a version-1 server, or by a sampling one
    mode_users, v1_users = set(users[0:3]), set(users[3:5])
    out, deterministic, expected_bad = [], {}, Counter()
    for r in raw:
        if r.topic != DECISIONS:
            out.append(r)
            continue
        decision = contracts.decode_decision(r.value)
        if decision.user_id in mode_users:
            r = _rewritten(r, action_selection=MODE)
        elif decision.user_id in v1_users:
            r = _rewritten(r, schema_version=1, action_selection=None)
        deterministic[decision.request_id] = decision.user_id in mode_users
        out.append(r)
    # one decision a newer server wrote, one that a version-2 server sent without saying how it chose
    base = 50_000_000
    template = next(r for r in out if r.topic == DECISIONS)
    future = _rewritten(template, schema_version=3, request_id="from-v3")._replace(offset=base)
    silent = _rewritten(template, action_selection=None, request_id="unsaid")._replace(offset=base + 1)
    out += [future, silent]
    expected_bad["dead_letter:unknown_schema_version"] += 1
    expected_bad["dead_letter:missing_field"] += 1
    assert mode_users and v1_users and len(users) > 5
    return out, deterministic, expected_bad


def _batches(records: list[KafkaRecord]) -> list[KafkaBatch]:
    out: list[KafkaBatch] = []
    for r in records:
        if not out or (out[-1].topic, out[-1].partition) != (r.topic, r.partition):
            out.append(KafkaBatch(r.topic, r.partition, [], [], [], []))
        out[-1].offsets.append(r.offset)
        out[-1].timestamps_ms.append(r.timestamp_ms)
        out[-1].keys.append(r.key)
        out[-1].values.append(r.value)
    return out


def test_the_mark_reaches_every_transition_and_bad_versions_are_dead_lettered(records):
    kept, deterministic, expected_bad = records
    expected_rows = sorted(deterministic.items())
    assert any(flag for _, flag in expected_rows) and not all(flag for _, flag in expected_rows)
    with BeamTestPipeline() as p:
        out = p | beam.Create(_batches(kept)) | KafkaToTransitions(DECISIONS, FEEDBACK, EpisodeConfig())
        rows = out["transitions"] | beam.FlatMap(
            lambda rows: [(r["request_id"], r["deterministic"]) for r in rows if r["surface"] != USER_AUTHOR]
        )
        assert_that(rows, equal_to(expected_rows), label="marks")
        dead = out["fates"] | beam.Filter(
            lambda fate: fate[0] in ("dead_letter:unknown_schema_version", "dead_letter:missing_field")
        )
        assert_that(dead, equal_to(list(expected_bad.items())), label="dead letters")


def _files(rows: list[dict], directory: Path) -> Path:
    with beam.Pipeline(options=PipelineOptions([])) as p:
        (
            p
            | beam.Create([rows])
            | ShardTransitions(1)
            | WriteWholeFiles(str(directory), str(directory / ".tmp"))
        )
    return directory


def _rows(kept: list[KafkaRecord]) -> list[dict]:
    by_user: dict[str, list] = {}
    for r in kept:
        if r.topic != DECISIONS or r.offset >= 50_000_000:
            continue
        user_id, fields = decode_event(DECISION, r)
        by_user.setdefault(user_id, []).append(Decision._make(fields))
    return [
        row
        for user, events in by_user.items()
        for row in build_user_episodes(user, events, EpisodeConfig()).transitions
    ]


def test_the_parquet_and_tfrecord_files_carry_the_column(records, tmp_path):
    kept, deterministic, _ = records
    directory = _files(_rows(kept), tmp_path)
    for surface in ("feed", "live_allocation"):
        name = f"transitions-{surface}-00000-of-00001"
        table = pq.read_table(directory / f"{name}.parquet", columns=["request_id", "deterministic"])
        assert table.schema.field("deterministic").type == "int64"
        got = dict(zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True))
        assert got and got == {rid: int(deterministic[rid]) for rid in got}
        examples = [tf_example_pb2.Example.FromString(e) for e in _tfrecords(directory / f"{name}.tfrecord")]
        from_examples = {
            e.features.feature["request_id"].bytes_list.value[0].decode(): e.features.feature[
                "deterministic"
            ].int64_list.value[0]
            for e in examples
        }
        assert from_examples == got


def _tfrecords(path: Path) -> list[bytes]:
    from apache_beam.io.tfrecordio import _TFRecordUtil

    out = []
    with open(path, "rb") as fh:
        while (record := _TFRecordUtil.read_record(fh)) is not None:
            out.append(record)
    return out


def test_a_decision_carried_by_a_run_before_the_mark_reads_back_as_sampled(records, tmp_path):
    """Open sessions carried in a dataset written before Decision gained ``deterministic`` (13 fields)
    must still be read by the next run: those runs read version-1 records only, which are sampled."""
    kept, _, _ = records
    decoded = Decision._make(decode_event(DECISION, next(r for r in kept if r.topic == DECISIONS))[1])
    decision, mode = decoded._replace(deterministic=False), decoded._replace(deterministic=True)
    lines = list(carried_lines("u", [decision, mode]))
    before_mark = Decision._fields.index("deterministic")
    old = [{**line, "events": [event[:before_mark] for event in line["events"]]} for line in lines]
    (tmp_path / CARRIED_FILE).write_text("".join(json.dumps(line) + "\n" for line in old))
    [(user, (kind, events))] = read_carried(tmp_path / CARRIED_FILE)
    assert (user, kind) == ("u", DECISION)
    # the old run's: both sampled, every later field at its default
    assert [Decision._make(e) for e in events] == [Decision(*decision[:before_mark])] * 2
    (tmp_path / CARRIED_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))
    [(_, (_, events))] = read_carried(tmp_path / CARRIED_FILE)
    assert [Decision._make(e) for e in events] == [decision, mode]  # this run's keep their mark
