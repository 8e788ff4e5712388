"""build-transitions end to end on a real Apache Kafka broker: counts, rewards, accounting, idempotence."""

import base64
import dataclasses
import json
import re
import subprocess
import sys
import uuid
from collections import Counter

import numpy as np
import pandas as pd
import pytest
from kills import Killed, die_while_publishing

import recsys_rl.pipelines.build_transitions as build_module
from recsys_rl import contracts
from recsys_rl.kafka import ReadError
from recsys_rl.kafka.producer import EventProducer
from recsys_rl.kafka.reader import read_range
from recsys_rl.kafka.topics import TopicSpec, ensure_topics
from recsys_rl.pair_state import PAIR_STATE_FEATURES
from recsys_rl.pipelines.build_transitions import BuildTransitionsConfig, build_transitions
from recsys_rl.pipelines.dataset import read_manifest, verify
from recsys_rl.pipelines.kafka_source import plan_replay
from recsys_rl.signals import PAIR_SIGNALS
from recsys_rl.sim.events import EventIds
from recsys_rl.sim.simulate import SimulateConfig, day_messages, run_simulation, simulated_days
from recsys_rl.storage import ObjectPath
from recsys_rl.training.agents.data import open_dataset
from recsys_rl.training.pair_value import PairTransitions

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def simulated_topics(apache_kafka):
    """One simulated day in fresh topics, and the simulator's own record of it."""
    suffix = uuid.uuid4().hex[:8]
    config = SimulateConfig(
        users=60, seed=44, partitions=2, decisions_topic=f"dec-{suffix}", feedback_topic=f"fb-{suffix}"
    )
    report = run_simulation(config, apache_kafka.bootstrap_servers)
    _, next_day = simulated_days(config)
    return config, report, next_day()


def _config(broker, sim_config, out, **overrides) -> BuildTransitionsConfig:
    settings = dict(
        bootstrap_servers=broker.bootstrap_servers,
        group=f"g-{uuid.uuid4().hex[:8]}",
        out=str(out),
        decisions_topic=sim_config.decisions_topic,
        feedback_topic=sim_config.feedback_topic,
        dead_letter_topic=f"dlq-{uuid.uuid4().hex[:8]}",
        num_shards=2,
        max_records_per_chunk=700,
    )
    settings.update(overrides)
    return BuildTransitionsConfig(**settings)


@pytest.fixture(scope="module")
def in_memory_build(apache_kafka, simulated_topics, tmp_path_factory):
    """The simulated day built once in memory without committing offsets, so the group stays at the
    start: the reference that the tests below compare other ways of building against."""
    sim_config, _, _ = simulated_topics
    out = tmp_path_factory.mktemp("in-memory")
    return build_transitions(_config(apache_kafka, sim_config, out, commit=False, user_author_surface=True))


def _pair_features(*datasets) -> pd.DataFrame:
    """The pairs' feature-store rows the datasets wrote, indexed by pair, the latest row of each."""
    files = [f for d in datasets for f in sorted((d / "features" / "user_author_history").glob("*.parquet"))]
    rows = pd.concat([pd.read_parquet(f) for f in files]).sort_values("event_timestamp", kind="stable")
    return rows.groupby(["user_id", "author_id"]).last().sort_index()


def _rows(dataset, surface) -> pd.DataFrame:
    return pd.read_parquet(sorted(dataset.glob(f"transitions-{surface}-*.parquet")))


def test_a_simulated_day_becomes_the_simulators_transitions(simulated_topics, in_memory_build):
    sim_config, report, log = simulated_topics
    result = in_memory_build
    manifest = result.manifest
    accounting = manifest["accounting"]
    assert accounting["read"] == sum(report.written.values())
    assert accounting["balanced"] and accounting["dead_lettered"] == 0 and accounting["filtered"] == 0
    assert manifest["surfaces"]["feed"]["rows"] == log.feed.request.size
    assert manifest["surfaces"]["live_allocation"]["rows"] == log.live.request.size
    assert verify(result.dataset_dir) == []

    ids = EventIds.for_seed(sim_config.seed)
    feed = _rows(result.dataset_dir, "feed").set_index("request_id")
    expected_ids = [ids.request(int(r)) for r in log.feed.request]
    rewards = feed.loc[
        expected_ids, [f"reward_{s}" for s in ("watch_time", "click", "like", "hate")]
    ].to_numpy()
    np.testing.assert_allclose(rewards, log.feed.reward[:, [0, 1, 2, 6]], rtol=1e-6, atol=1e-6)
    assert feed.loc[expected_ids, "done"].astype(bool).tolist() == log.feed.done.tolist()
    assert feed["session_id"].nunique() == log.sessions
    assert (result.dataset_dir / "features").is_dir()
    # the user-author surface: one step per feedback event, each pair's last one truncated at the cut-off
    section = manifest["surfaces"]["user_author"]
    pairs = _rows(result.dataset_dir, "user_author")
    assert section["rows"] == len(pairs) == report.written[sim_config.feedback_topic]
    assert section["pairs"] == len(pairs.groupby(["user_id", "author_id"])) == section["truncated"]
    assert pairs.groupby(["user_id", "author_id"])["pair_step"].max().add(1).sum() == len(pairs)
    # and the pair critic's reader takes the surface as it is
    data = PairTransitions.from_dataset(open_dataset(result.dataset_dir, "user_author"))
    assert data.states.shape == (len(pairs), len(PAIR_STATE_FEATURES))
    reward_columns = [f"reward_{s}" for s in PAIR_SIGNALS]
    np.testing.assert_allclose(data.rewards.sum(axis=0), pairs[reward_columns].sum().to_numpy(), rtol=1e-6)
    # each request row holds the pair rewards of its views: the pair rows' rewards summed by request
    requests = pd.concat([_rows(result.dataset_dir, s) for s in ("feed", "live_allocation")])
    by_request = pairs.groupby("request_id")[reward_columns].sum()
    held = pd.DataFrame(
        requests["pair_reward"].tolist(), index=requests["request_id"], columns=reward_columns
    )
    assert set(by_request.index) <= set(held.index)
    np.testing.assert_allclose(held.loc[by_request.index].to_numpy(), by_request.to_numpy(), rtol=1e-6)
    assert held.drop(by_request.index).to_numpy().sum() == 0  # a request without views: zeros
    # on a feed request the pairs' clicks are the feed's
    assert held.loc[feed.index, "reward_click"].sum() == feed["reward_click"].sum() > 0
    # the feature store's pair rows: one per pair, its totals through its last step, stamped at its day's end
    features = _pair_features(result.dataset_dir)
    assert len(features) == section["pairs"]
    last = pairs.sort_values("pair_step").groupby(["user_id", "author_id"]).last()
    assert features["views"].tolist() == (last["pair_step"] + 1).tolist()
    sums = pairs.groupby(["user_id", "author_id"])[reward_columns].sum()
    assert features["clicks"].tolist() == sums["reward_click"].astype(int).tolist()
    assert features["followed"].tolist() == (sums["reward_follow"] > 0).astype(int).tolist()
    np.testing.assert_allclose(features["gifts"], sums["reward_gift"], rtol=1e-6)
    assert features["last_interaction_ms"].tolist() == last["event_time_ms"].tolist()
    day_ms = 86_400_000
    stamps = (features["event_timestamp"] - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(milliseconds=1)
    assert (stamps == (features["last_interaction_ms"] // day_ms + 1) * day_ms).all()


def test_rerun_after_a_crash_before_the_commit_loses_and_duplicates_nothing(
    apache_kafka, simulated_topics, tmp_path, monkeypatch
):
    sim_config, _, log = simulated_topics
    config = _config(apache_kafka, sim_config, tmp_path)

    def crash(plan):
        raise RuntimeError("killed between the write and the offset commit")

    monkeypatch.setattr(build_module, "commit_offsets", crash)
    with pytest.raises(RuntimeError, match="killed between"):
        build_transitions(config)
    monkeypatch.undo()
    [first_dir] = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    first_hashes = read_manifest(first_dir)["sha256"]

    rerun = build_transitions(config)
    assert rerun.reused and rerun.committed and rerun.dataset_dir == first_dir
    assert read_manifest(first_dir)["sha256"] == first_hashes
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == [first_dir.name]
    assert rerun.manifest["surfaces"]["feed"]["rows"] == log.feed.request.size
    # the user-author surface is built only when asked for
    assert "user_author" not in rerun.manifest["surfaces"]
    assert not (first_dir / "pair-histories.jsonl").exists()
    # the group now sits at the end: nothing left to read, nothing read twice
    assert (
        plan_replay(
            apache_kafka.bootstrap_servers,
            [sim_config.decisions_topic, sim_config.feedback_topic],
            config.group,
        ).total_records
        == 0
    )
    assert build_transitions(config).dataset_dir is None


def test_bad_records_are_dead_lettered_counted_and_published(apache_kafka, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    sim_config = SimulateConfig(
        users=20, seed=3, partitions=1, decisions_topic=f"dec-{suffix}", feedback_topic=f"fb-{suffix}"
    )
    run_simulation(sim_config, apache_kafka.bootstrap_servers)
    good = next(read_range(apache_kafka.bootstrap_servers, sim_config.feedback_topic))
    event = contracts.decode_feedback(good.value)
    orphan = contracts.FeedbackEvent()
    orphan.CopyFrom(event)
    orphan.request_id = "lost"
    decision = next(read_range(apache_kafka.bootstrap_servers, sim_config.decisions_topic))
    conflicting = contracts.decode_decision(decision.value)
    conflicting.log_propensity -= 1.0  # same request id, other content
    with EventProducer(apache_kafka.bootstrap_servers) as producer:
        for value in (b"\x00garbage", b'{"oops"', contracts.encode(orphan), good.value):
            producer.send(sim_config.feedback_topic, good.key, value, good.timestamp_ms)
        producer.send(
            sim_config.decisions_topic, decision.key, contracts.encode(conflicting), decision.timestamp_ms
        )
    config = _config(apache_kafka, sim_config, tmp_path)
    result = build_transitions(config)
    accounting = result.manifest["accounting"]
    assert accounting["balanced"]
    assert accounting["dead_lettered_by_reason"] == {
        "malformed_bytes": 1,
        "malformed_json": 1,
        "orphan_feedback": 1,
        "conflicting_decision": 1,
    }
    assert accounting["filtered_by_reason"] == {"duplicate_feedback": 1}
    published = list(read_range(apache_kafka.bootstrap_servers, config.dead_letter_topic))
    assert result.dead_letters_published == len(published) == 4
    assert Counter(p.value.count(b'"reason"') for p in published) == Counter({1: 4})
    lines = (result.dataset_dir / "dead-letters.jsonl").read_bytes().splitlines()
    assert sorted(lines) == sorted(p.value for p in published)
    # the conflicting decision's letter carries its bytes, read back from the decisions topic
    [letter] = [json.loads(line) for line in lines if b"conflicting_decision" in line]
    assert base64.b64decode(letter["value"]) == contracts.encode(conflicting)
    assert base64.b64decode(letter["key"]) == decision.key
    assert letter["timestamp_ms"] == decision.timestamp_ms


def test_a_dataset_written_to_s3_by_worker_processes_is_the_in_memory_one_byte_for_byte(
    apache_kafka, simulated_topics, in_memory_build, s3_server
):
    """Issue 21: datasets stored by URI. Two worker processes write the shards to S3 (moto's server)
    with the endpoint and credentials they get from the pipeline options; the driver checks, hashes and
    publishes them through the same filesystem layer. Their shards are byte for byte those of the
    in-memory build of the same offsets (so neither the runner's parallelism nor the filesystem changes
    a dataset). A rerun finds the dataset there and verifies it."""
    sim_config, _, _ = simulated_topics
    local = in_memory_build
    out = f"s3://{s3_server.bucket}/{uuid.uuid4().hex[:8]}/transitions/"  # a trailing slash is fine
    config = _config(apache_kafka, sim_config, out, commit=False, user_author_surface=True)
    workers = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
    remote = build_transitions(config, [*s3_server.pipeline_args, *workers])

    assert remote.dataset_dir == ObjectPath(out.rstrip("/")) / local.dataset_dir.name
    assert remote.manifest["sha256"] == local.manifest["sha256"]
    assert verify(remote.dataset_dir) == []  # every object read back and hashed against the manifest
    assert [p.name for p in remote.dataset_dir.parent.iterdir()] == [local.dataset_dir.name]
    rerun = build_transitions(config, s3_server.pipeline_args)
    assert rerun.reused and rerun.manifest == remote.manifest

    # a publication cut short (objects are copied one by one, the manifest last) and a dead run's
    # staging: the next build clears both and builds the dataset again
    (remote.dataset_dir / "manifest.json").unlink()
    (remote.dataset_dir.parent / ".staging-transitions-0123456789abcdef" / "part").write_bytes(b"")
    cleared = []
    again = build_transitions(
        config,
        s3_server.pipeline_args,
        lambda event, fields: cleared.append(fields) if event == "cleared" else None,
    )
    assert cleared == [{"leftovers": 2}] and not again.reused
    assert again.manifest["sha256"] == local.manifest["sha256"] and verify(again.dataset_dir) == []
    assert [p.name for p in remote.dataset_dir.parent.iterdir()] == [local.dataset_dir.name]


def test_cli_builds_and_reports_the_accounting(apache_kafka, simulated_topics, tmp_path):
    sim_config, report, _ = simulated_topics
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "recsys_rl.cli.main",
            "build-transitions",
            "--bootstrap-servers",
            apache_kafka.bootstrap_servers,
            "--group",
            f"cli-{uuid.uuid4().hex[:6]}",
            "--out",
            str(tmp_path),
            "--decisions-topic",
            sim_config.decisions_topic,
            "--feedback-topic",
            sim_config.feedback_topic,
            "--num-shards",
            "1",
            "--carry-open-sessions",
            "--user-author-surface",
            "--runner=DirectRunner",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    total = sum(report.written.values())
    # the day's last sessions were still open at its cut-off: they wait for the group's next run
    line = re.search(
        r"records read (\d+) = used (\d+) \+ dead-lettered 0 .* carried to the next (\d+)", result.stdout
    )
    assert line is not None, result.stdout
    read, used, carried = map(int, line.groups())
    assert read == total == used + carried and carried > 0
    assert "offsets committed" in result.stdout
    pairs = re.search(r"user_author\s+(\d+) transitions", result.stdout)
    assert pairs is not None and 0 < int(pairs.group(1)) <= report.written[sim_config.feedback_topic]


def _dead_letters_in(broker, topic: str) -> list[bytes]:
    """The keys of the records in a dead-letter topic; none when the topic was never created."""
    try:
        return [record.key for record in read_range(broker.bootstrap_servers, topic)]
    except ReadError:
        return []


def test_dead_letters_are_published_exactly_once_across_crashes_and_never_by_a_dry_run(
    apache_kafka, tmp_path, monkeypatch
):
    suffix = uuid.uuid4().hex[:8]
    sim_config = SimulateConfig(
        users=10, seed=5, partitions=1, decisions_topic=f"dec-{suffix}", feedback_topic=f"fb-{suffix}"
    )
    run_simulation(sim_config, apache_kafka.bootstrap_servers)
    good = next(read_range(apache_kafka.bootstrap_servers, sim_config.feedback_topic))
    with EventProducer(apache_kafka.bootstrap_servers) as producer:
        for i in range(5):
            producer.send(sim_config.feedback_topic, good.key, b"\x00garbage %d" % i, good.timestamp_ms)
    config = _config(
        apache_kafka, sim_config, tmp_path, group=f"g-{suffix}", dead_letter_topic=f"dlq-{suffix}"
    )
    dry = build_transitions(dataclasses.replace(config, commit=False))
    assert dry.dead_letters_published == 0 and _dead_letters_in(apache_kafka, config.dead_letter_topic) == []

    # killed after two letters went out: the rerun sends the other three, not all five again
    die_while_publishing(monkeypatch, config.dead_letter_topic, after=2)
    with pytest.raises(Killed, match="killed while publishing"):
        build_transitions(config)
    monkeypatch.undo()
    assert len(_dead_letters_in(apache_kafka, config.dead_letter_topic)) == 2

    # killed after every letter went out but before the run noted it: the rerun sends none
    def dying_marker(*args, **kwargs):
        raise RuntimeError("killed before the published marker")

    monkeypatch.setattr(build_module, "_note_published", dying_marker)
    with pytest.raises(RuntimeError, match="killed before the published marker"):
        build_transitions(config)
    monkeypatch.undo()
    rerun = build_transitions(config)
    assert rerun.reused and rerun.committed and rerun.dead_letters_published == 0
    keys = _dead_letters_in(apache_kafka, config.dead_letter_topic)
    assert len(keys) == len(set(keys)) == 5


def _published(out) -> list:
    return sorted(p for p in out.iterdir() if not p.name.startswith(".") and (p / "manifest.json").exists())


def _offsets(dataset) -> set[tuple[str, int, int]]:
    ranges = read_manifest(dataset)["inputs"]["ranges"]
    return {(r["topic"], r["partition"], o) for r in ranges for o in range(r["start"], r["end"])}


def test_a_dataset_left_uncommitted_by_a_crash_is_orphaned_when_new_records_change_the_plan(
    apache_kafka, tmp_path, monkeypatch
):
    """Crash after writing, then new records: the rerun plans other end offsets, so another version.
    The first dataset's offsets were never committed, and the new one covers them too: two published
    datasets of one group over the same offsets would count those events twice. The first is moved
    aside; leftovers of dead runs (staging directories, temporary files) go too."""
    suffix = uuid.uuid4().hex[:8]
    sim_config = SimulateConfig(
        users=10, seed=6, partitions=1, decisions_topic=f"dec-{suffix}", feedback_topic=f"fb-{suffix}"
    )
    run_simulation(sim_config, apache_kafka.bootstrap_servers)
    config = _config(apache_kafka, sim_config, tmp_path, group=f"g-{suffix}")

    def crash(plan):
        raise RuntimeError("killed before the offset commit")

    monkeypatch.setattr(build_module, "commit_offsets", crash)
    with pytest.raises(RuntimeError, match="killed before"):
        build_transitions(config)
    monkeypatch.undo()
    [first] = _published(tmp_path)
    good = next(read_range(apache_kafka.bootstrap_servers, sim_config.feedback_topic))
    with EventProducer(apache_kafka.bootstrap_servers) as producer:  # new records after the crash
        producer.send(sim_config.feedback_topic, good.key, b"\x00late garbage", good.timestamp_ms)
    stale_staging = tmp_path / ".staging-transitions-0123456789abcdef"
    (stale_staging / "part").mkdir(parents=True)
    stale_tmp = first / ".manifest.json.tmp"
    stale_tmp.write_text("{")

    result = build_transitions(config)
    assert result.committed and not result.reused
    assert _published(tmp_path) == [result.dataset_dir]
    orphaned = tmp_path / ".orphaned" / first.name
    assert (orphaned / "manifest.json").exists() and not first.exists()
    assert _offsets(orphaned) <= _offsets(result.dataset_dir)  # what the orphan held is in the new one
    assert result.orphaned == [first.name]
    assert not stale_staging.exists() and not (orphaned / stale_tmp.name).exists()


def test_sessions_open_at_the_cut_off_are_carried_to_the_next_run_and_built_whole(apache_kafka, tmp_path):
    """Two runs that split a day in the middle of sessions give, together, the transitions one run over
    the whole day gives, byte for byte in rewards: what was open at the first cut-off (a session that
    goes on, a decision whose feedback comes later) waits for the second run instead of being built with
    zero rewards and a false end."""
    suffix = uuid.uuid4().hex[:8]
    sim_config = SimulateConfig(
        users=40, seed=9, partitions=2, decisions_topic=f"dec-{suffix}", feedback_topic=f"fb-{suffix}"
    )
    ensure_topics(
        apache_kafka.bootstrap_servers,
        [TopicSpec(t, 2) for t in (sim_config.decisions_topic, sim_config.feedback_topic)],
    )
    sim, next_day = simulated_days(sim_config)
    messages = sorted(day_messages(sim_config, sim, next_day()), key=lambda m: m[3])
    cut_ms = messages[len(messages) // 2][3]

    def produce(part):
        with EventProducer(apache_kafka.bootstrap_servers) as producer:
            for topic, key, value, timestamp_ms in part:
                producer.send(topic, key, value, timestamp_ms)

    split = _config(
        apache_kafka, sim_config, tmp_path / "split", carry_open_sessions=True, user_author_surface=True
    )
    produce([m for m in messages if m[3] < cut_ms])
    first = build_transitions(split)
    produce([m for m in messages if m[3] >= cut_ms])
    second = build_transitions(dataclasses.replace(split, carry_open_sessions=False))  # the last run
    whole = build_transitions(
        _config(apache_kafka, sim_config, tmp_path / "whole", start="earliest", user_author_surface=True)
    )

    carried = first.manifest["accounting"]["carried"]
    assert carried > 0 and second.manifest["accounting"]["released"] == carried
    assert second.manifest["inputs"]["carried_from"]["dataset"] == first.dataset_dir.name
    for surface in ("feed", "live_allocation"):
        both = pd.concat([_rows(first.dataset_dir, surface), _rows(second.dataset_dir, surface)])
        one = _rows(whole.dataset_dir, surface)
        columns = [c for c in one.columns if c.startswith("reward_")] + ["done", "step", "session_id"]
        both, one = both.set_index("request_id").sort_index(), one.set_index("request_id").sort_index()
        assert both.index.tolist() == one.index.tolist()  # every decision once, none lost at the cut
        pd.testing.assert_frame_equal(both[columns], one[columns])
        assert [list(s) for s in both["next_state"]] == [list(s) for s in one["next_state"]]
        # a request's pair rewards (the pairs' return among them) count the histories of the run before
        assert [list(s) for s in both["pair_reward"]] == [list(s) for s in one["pair_reward"]]
    # user-author pairs go on from the first run's histories: the same steps, states and rewards as
    # one run's, and the same histories at the end; only a pair's step at the first cut-off is cut short
    key = ["user_id", "author_id", "pair_step"]
    first_pairs = _rows(first.dataset_dir, "user_author")
    both = pd.concat([first_pairs, _rows(second.dataset_dir, "user_author")]).set_index(key).sort_index()
    one = _rows(whole.dataset_dir, "user_author").set_index(key).sort_index()
    assert both.index.tolist() == one.index.tolist()
    columns = [c for c in one.columns if c.startswith("reward_")] + ["event_time_ms"]
    pd.testing.assert_frame_equal(both[columns], one[columns])
    assert [list(s) for s in both["state"]] == [list(s) for s in one["state"]]
    cut_short = both["truncated"].astype(bool) & ~one["truncated"].astype(bool)
    assert cut_short.sum() > 0 and cut_short.sum() == first_pairs["truncated"].sum() - (
        first_pairs.set_index(key).index.isin(one[one["truncated"].astype(bool)].index).sum()
    )
    histories = "pair-histories.jsonl"
    assert (second.dataset_dir / histories).read_bytes() == (whole.dataset_dir / histories).read_bytes()
    # and the feature store, reading both runs' pair rows, holds what one run's rows say
    pd.testing.assert_frame_equal(
        _pair_features(first.dataset_dir, second.dataset_dir), _pair_features(whole.dataset_dir)
    )
    assert len(list((second.dataset_dir / "features" / "user_author_history").glob("*.parquet"))) == 1
