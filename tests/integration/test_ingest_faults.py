"""Fault injection for build-transitions on real Apache Kafka: a run killed at each step, new records
produced before the rerun, and afterwards every offset in exactly one published dataset, no transition
twice, every dead letter once in the dead-letter topic.

Each kill is an exception raised at that step in-process (what a SIGKILL leaves behind is the same
files and offsets; the kernel's lock release is what `exclusive_output` relies on).
"""

from __future__ import annotations

import json
import uuid
from collections import Counter

import pandas as pd
import pytest
from kills import Killed, die_while_publishing

import recsys_rl.pipelines.build_transitions as build_module
from recsys_rl.kafka import ReadError
from recsys_rl.kafka.producer import EventProducer
from recsys_rl.kafka.reader import read_range
from recsys_rl.pipelines.build_transitions import BuildTransitionsConfig, build_transitions
from recsys_rl.pipelines.dataset import read_manifest
from recsys_rl.sim.simulate import SimulateConfig, run_simulation

pytestmark = pytest.mark.integration


def _after(name: str):
    """Let the step run, then die: its outputs exist, the steps after it never ran."""
    real = getattr(build_module, name)

    def step(*args, **kwargs):
        real(*args, **kwargs)
        raise Killed(f"killed after {name}")

    return step


def _before(name: str):
    def step(*args, **kwargs):
        raise Killed(f"killed before {name}")

    return step


KILLS = {
    "planning": lambda mp, config: mp.setattr(build_module, "plan_replay", _before("plan_replay")),
    "pipeline-written": lambda mp, config: mp.setattr(
        build_module, "build_pipeline", _after("build_pipeline")
    ),
    "letters-filled": lambda mp, config: mp.setattr(
        build_module, "fill_dead_letters", _after("fill_dead_letters")
    ),
    "published": lambda mp, config: mp.setattr(build_module, "finalize", _after("finalize")),
    "mid-dead-letters": lambda mp, config: die_while_publishing(mp, config.dead_letter_topic, after=1),
    "letters-sent": lambda mp, config: mp.setattr(
        build_module, "_note_published", _before("_note_published")
    ),
    "before-commit": lambda mp, config: mp.setattr(build_module, "commit_offsets", _before("commit_offsets")),
    "after-commit": lambda mp, config: mp.setattr(build_module, "commit_offsets", _after("commit_offsets")),
}


def _produce_bad(broker, topic: str, key: bytes, timestamp_ms: int, label: str, count: int) -> None:
    with EventProducer(broker.bootstrap_servers) as producer:
        for i in range(count):
            producer.send(topic, key, f"\x00{label} {i}".encode(), timestamp_ms)


@pytest.mark.parametrize("kill", list(KILLS))
def test_every_offset_lands_in_exactly_one_dataset_whatever_step_a_run_dies_at(
    apache_kafka, tmp_path, monkeypatch, kill
):
    suffix = uuid.uuid4().hex[:8]
    sim_config = SimulateConfig(
        users=12, seed=21, partitions=2, decisions_topic=f"dec-{suffix}", feedback_topic=f"fb-{suffix}"
    )
    run_simulation(sim_config, apache_kafka.bootstrap_servers)
    good = next(read_range(apache_kafka.bootstrap_servers, sim_config.feedback_topic))
    _produce_bad(apache_kafka, sim_config.feedback_topic, good.key, good.timestamp_ms, "first", 3)
    config = BuildTransitionsConfig(
        bootstrap_servers=apache_kafka.bootstrap_servers,
        group=f"g-{suffix}",
        out=str(tmp_path),
        decisions_topic=sim_config.decisions_topic,
        feedback_topic=sim_config.feedback_topic,
        dead_letter_topic=f"dlq-{suffix}",
        num_shards=1,
        carry_open_sessions=True,
    )

    KILLS[kill](monkeypatch, config)
    with pytest.raises(Killed):
        build_transitions(config)
    monkeypatch.undo()
    _produce_bad(apache_kafka, sim_config.feedback_topic, good.key, good.timestamp_ms, "between", 2)
    build_transitions(config)
    _produce_bad(apache_kafka, sim_config.feedback_topic, good.key, good.timestamp_ms, "after", 1)
    last = build_transitions(config)

    datasets = sorted(p for p in tmp_path.iterdir() if not p.name.startswith(".") and p.is_dir())
    held = Counter()
    for dataset in datasets:
        for r in read_manifest(dataset)["inputs"]["ranges"]:
            held.update((r["topic"], r["partition"], offset) for offset in range(r["start"], r["end"]))
    ends = {(r.topic, r.partition): r.end for r in last.plan.ranges}
    everything = {(t, p, o) for (t, p), end in ends.items() for o in range(end)}
    assert set(held) == everything and max(held.values()) == 1  # each offset in exactly one dataset

    requests = pd.concat(
        pd.read_parquet(sorted(d.glob("transitions-feed-*.parquet")))["request_id"] for d in datasets
    )
    assert requests.is_unique

    letters = [
        json.loads(line) for d in datasets for line in (d / "dead-letters.jsonl").read_bytes().splitlines()
    ]
    assert len(letters) == 6
    try:
        published = [
            record.key for record in read_range(apache_kafka.bootstrap_servers, config.dead_letter_topic)
        ]
    except ReadError:
        published = []
    assert sorted(published) == sorted(
        f"{d['topic']}/{d['partition']}/{d['offset']}".encode() for d in letters
    )
