"""Dataset versions, the accounting equation, the manifest and the atomic publish."""

import datetime as dt
import hashlib
import json
import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recsys_rl.dataset_contract import DATASET_SCHEMA_VERSION, MANIFEST, STATE_FEATURES
from recsys_rl.pipelines.dataset import (
    INVENTORY_FILE,
    ORPHANED_DIR,
    ORPHANED_NOTE,
    AccountingError,
    DatasetError,
    DatasetPaths,
    accounting_summary,
    clear_leftovers,
    dataset_version,
    exclusive_output,
    finalize,
    inventory_entry,
    orphan_overlapping,
    read_manifest,
    replace_staged_file,
    verify,
)
from recsys_rl.pipelines.episodes import SURFACE_SIGNALS
from recsys_rl.pipelines.transition_io import parquet_schema
from recsys_rl.state import FEATURE_VERSION

RANGES = {"ranges": [{"topic": "d", "partition": 0, "start": 0, "end": 10}]}
SETTINGS = {"num_shards": 1}


def test_version_depends_on_offsets_and_settings_only():
    assert dataset_version(RANGES, SETTINGS) == dataset_version(RANGES, SETTINGS)
    moved = {"ranges": [{"topic": "d", "partition": 0, "start": 0, "end": 11}]}
    assert dataset_version(moved, SETTINGS) != dataset_version(RANGES, SETTINGS)
    assert dataset_version(RANGES, {"num_shards": 2}) != dataset_version(RANGES, SETTINGS)


def test_accounting_splits_reasons_and_checks_the_equation():
    fates = {
        "read": 10,
        "used": 6,
        "dead_letter:orphan_feedback": 2,
        "dead_letter:malformed_bytes": 1,
        "filtered:duplicate_decision": 1,
        "built:feed": 4,
    }
    summary = accounting_summary(fates)
    assert summary["balanced"]
    assert summary["transitions_built"] == {"feed": 4}
    assert summary["dead_lettered"] == 3 and summary["filtered"] == 1
    assert summary["dead_lettered_by_reason"] == {"malformed_bytes": 1, "orphan_feedback": 2}
    assert not accounting_summary({**fates, "read": 11})["balanced"]
    # events the previous run carried in come in beside those read; those carried on go out beside used
    carrying = {**fates, "released": 5, "carried": 3, "used": 8}
    assert accounting_summary(carrying)["balanced"]
    assert (accounting_summary(carrying)["released"], accounting_summary(carrying)["carried"]) == (5, 3)
    assert not accounting_summary({**carrying, "carried": 4})["balanced"]


BALANCED = {
    "read": 10,
    "released": 2,
    "used": 7,
    "dead_letter:late": 2,
    "filtered:duplicate": 1,
    "carried": 2,
}


@pytest.mark.parametrize(
    ("change", "balanced"),
    [
        pytest.param({}, True, id="exact"),
        # one record more accounted for than came in, on each outgoing side
        pytest.param({"used": 8}, False, id="over-counted-used"),
        pytest.param({"dead_letter:late": 3}, False, id="over-counted-dead-letters"),
        pytest.param({"filtered:duplicate": 2}, False, id="over-counted-filtered"),
        pytest.param({"carried": 3}, False, id="over-counted-carried"),
        pytest.param({"dead_letter:other": 1}, False, id="over-counted-by-a-new-reason"),
        # one record fewer accounted for than came in
        pytest.param({"read": 11}, False, id="under-counted-read"),
        pytest.param({"released": 3}, False, id="under-counted-released"),
        pytest.param({"used": 6}, False, id="under-counted-used"),
    ],
)
def test_the_accounting_balances_only_when_every_record_is_counted_exactly_once(change, balanced):
    # came: 10 read + 2 released = 12; went: 7 used + 2 dead-lettered + 1 filtered + 2 carried = 12
    assert accounting_summary({**BALANCED, **change})["balanced"] is balanced


def test_over_counted_accounting_refuses_to_publish(tmp_path):
    paths = DatasetPaths(tmp_path, "transitions-over")
    _stage(paths, {"read": 3, "used": 3, "dead_letter:orphan_feedback": 1})
    with pytest.raises(
        AccountingError, match=r"records read \(3\) \+ released \(0\) != used \(3\) \+ dead-lettered \(1\)"
    ):
        finalize(paths, {}, SETTINGS)
    assert paths.staging.exists() and not paths.final.exists()


def test_a_run_whose_counts_were_never_written_refuses_to_publish(tmp_path):
    """Issue 21: a runner whose workers wrote elsewhere (their own working directory) can leave staging
    without the accounting file; missing counts must never read as zero."""
    paths = DatasetPaths(tmp_path, "transitions-uncounted")
    _stage(paths, {"read": 0, "used": 0})
    (paths.staging / "accounting.jsonl").unlink()
    _write_inventory(paths)  # the inventory agrees: the pipeline never produced the file
    with pytest.raises(
        AccountingError,
        match=r"accounting\.jsonl is missing from .*counts are unknown; staged output kept for inspection$",
    ):
        finalize(paths, {}, SETTINGS)
    assert paths.staging.exists() and not paths.final.exists()


def _stage(
    paths: DatasetPaths,
    fates: dict,
    rows: int = 0,
    reasons: tuple[str, ...] = (),
    deterministic: tuple[int, ...] = (),
) -> None:
    paths.staging.mkdir(parents=True)
    (paths.staging / "accounting.jsonl").write_text(json.dumps(fates) + "\n")
    schema = parquet_schema("feed")
    reasons = reasons or ("",) * (rows or len(deterministic))
    deterministic = deterministic or (0,) * len(reasons)
    table = pa.Table.from_pylist(
        [
            {**dict.fromkeys(schema.names), "features_missing_reason": reason, "deterministic": flag}
            for reason, flag in zip(reasons, deterministic, strict=True)
        ],
        schema=schema,
    )
    pq.write_table(table, paths.staging / "transitions-feed-00000-of-00001.parquet")
    (paths.staging / "transitions-feed-00000-of-00001.tfrecord").write_bytes(b"")
    (paths.staging / "features" / "user_engagement").mkdir(parents=True)
    (paths.staging / "features" / "user_engagement" / "2026-01-01-00000-of-00001.parquet").write_bytes(b"P")
    _write_inventory(paths)


def _write_inventory(paths: DatasetPaths) -> None:
    """The inventory the pipeline writes: every staged file, as it is now."""
    files = sorted(p for p in paths.staging.rglob("*") if p.is_file() and p.name != INVENTORY_FILE)
    entries = [inventory_entry(str(p.relative_to(paths.staging)), p.read_bytes()) for p in files]
    (paths.staging / INVENTORY_FILE).write_text("".join(json.dumps(e) + "\n" for e in entries))


def test_finalize_writes_the_manifest_and_renames_staging_into_place(tmp_path):
    paths = DatasetPaths(tmp_path, "transitions-abc")
    _stage(paths, {"read": 3, "used": 3})
    manifest = finalize(paths, {"ranges": []}, SETTINGS)
    assert not paths.staging.exists() and paths.final.is_dir()
    assert read_manifest(paths.final) == manifest
    assert manifest["surfaces"]["feed"]["rows"] == 0
    assert manifest["surfaces"]["feed"]["features_missing"] == {"rows": 0, "by_reason": {}}
    assert manifest["surfaces"]["feed"]["tfrecord_shards"] == ["transitions-feed-00000-of-00001.tfrecord"]
    assert "accounting.jsonl" not in manifest["sha256"] and INVENTORY_FILE not in manifest["sha256"]
    assert "features/user_engagement/2026-01-01-00000-of-00001.parquet" in manifest["sha256"]
    assert verify(paths.final) == []
    (paths.final / "transitions-feed-00000-of-00001.tfrecord").write_bytes(b"tampered")
    assert verify(paths.final) == ["transitions-feed-00000-of-00001.tfrecord"]


def test_unbalanced_accounting_refuses_to_publish(tmp_path):
    paths = DatasetPaths(tmp_path, "transitions-bad")
    _stage(paths, {"read": 5, "used": 3, "dead_letter:orphan_feedback": 1})
    with pytest.raises(
        AccountingError, match=r"records read \(5\) \+ released \(0\) != used \(3\) \+ dead-lettered \(1\)"
    ):
        finalize(paths, {}, SETTINGS)
    assert paths.staging.exists() and not paths.final.exists()


@pytest.mark.parametrize("built", [0, 2], ids=["none-made", "fewer-made"])
def test_files_holding_other_than_the_transitions_made_refuse_to_publish(tmp_path, built):
    """A runner that drops (or repeats) transitions between stages leaves the record fates balanced."""
    paths = DatasetPaths(tmp_path, "transitions-short")
    _stage(paths, {"read": 3, "used": 3, "built:feed": built}, rows=1)
    message = rf"feed transitions made \({built}\) != rows in its files \(1\)"
    with pytest.raises(AccountingError, match=message):
        finalize(paths, {}, SETTINGS)
    assert paths.staging.exists() and not paths.final.exists()


def test_the_manifest_counts_transitions_decided_on_default_features_by_reason(tmp_path):
    paths = DatasetPaths(tmp_path, "transitions-fallbacks")
    reasons = ("", "timeout", "", "unknown_user", "timeout")
    _stage(paths, {"read": 5, "used": 5, "built:feed": 5}, reasons=reasons)
    feed = finalize(paths, {}, SETTINGS)["surfaces"]["feed"]
    assert feed["rows"] == 5
    assert feed["features_missing"] == {"rows": 3, "by_reason": {"timeout": 2, "unknown_user": 1}}


def test_the_manifest_counts_transitions_that_served_the_policys_mode(tmp_path):
    """Issue 19: version 2 of the dataset says how many decisions were the policy's mode (their
    log_propensity is no propensity); version 1 could not."""
    paths = DatasetPaths(tmp_path, "transitions-modes")
    _stage(paths, {"read": 4, "used": 4, "built:feed": 4}, deterministic=(0, 1, 1, 0))
    manifest = finalize(paths, {}, SETTINGS)
    assert manifest["schema_version"] == DATASET_SCHEMA_VERSION == 6
    assert manifest["surfaces"]["feed"]["deterministic"] == {"rows": 2}
    assert manifest["surfaces"]["live_allocation"]["deterministic"] == {"rows": 0}


def test_the_manifest_counts_the_user_author_surfaces_pairs_and_rows_ending_at_the_cut_off(tmp_path):
    """Issue 22: a dataset built with the surface says how many pairs its rows belong to and how many rows
    end waiting at the cut-off; one built without it has no such section."""
    paths = DatasetPaths(tmp_path, "transitions-pairs")
    # three pairs in two shards: (u1, a1) meets twice, once in each shard, the second meeting waiting at
    # the cut-off; (u1, a2) and (u2, a1) once, (u2, a1) waiting. A pair is the user and the author
    # together, not either alone, and the first shard has no row waiting.
    shards = {
        "transitions-user_author-00000-of-00002.parquet": [("u1", "a1", 0), ("u1", "a2", 0)],
        "transitions-user_author-00001-of-00002.parquet": [("u1", "a1", 1), ("u2", "a1", 1)],
    }
    _stage(paths, {"read": 4, "used": 4, "built:user_author": 4})
    schema = parquet_schema("user_author")
    for name, rows in shards.items():
        table = pa.Table.from_pylist(
            [
                {**dict.fromkeys(schema.names), "user_id": user, "author_id": author, "truncated": truncated}
                for user, author, truncated in rows
            ],
            schema=schema,
        )
        pq.write_table(table, paths.staging / name)
    _write_inventory(paths)
    manifest = finalize(paths, {}, {**SETTINGS, "user_author_surface": True})
    pairs = manifest["surfaces"]["user_author"]
    assert (pairs["rows"], pairs["pairs"], pairs["truncated"]) == (4, 3, 2)
    assert pairs["signals"] == ["click", "follow", "gift", "author_return"]
    assert pairs["feature_names"] == list(STATE_FEATURES["user_author"])
    assert sorted(pairs["parquet_shards"]) == sorted(shards)

    without = DatasetPaths(tmp_path, "transitions-no-pairs")
    _stage(without, {"read": 1, "used": 1})
    assert "user_author" not in finalize(without, {}, SETTINGS)["surfaces"]


FEATURE_FILE = "features/user_engagement/2026-01-01-00000-of-00001.parquet"


def _lose(paths: DatasetPaths) -> None:
    (paths.staging / FEATURE_FILE).unlink()


def _truncate(paths: DatasetPaths) -> None:
    (paths.staging / FEATURE_FILE).write_bytes(b"")


def _corrupt(paths: DatasetPaths) -> None:
    (paths.staging / FEATURE_FILE).write_bytes(b"Q")


def _add_stray(paths: DatasetPaths) -> None:
    (paths.staging / "features" / "stray.parquet").write_bytes(b"S")


def _lose_inventory(paths: DatasetPaths) -> None:
    (paths.staging / INVENTORY_FILE).unlink()


def _lose_and_add_stray(paths: DatasetPaths) -> None:
    _lose(paths)
    _add_stray(paths)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        pytest.param(_lose, rf"{FEATURE_FILE} \(missing\)", id="file-lost"),
        pytest.param(_truncate, rf"{FEATURE_FILE} \(0 bytes, written 1\)", id="file-short"),
        pytest.param(_corrupt, rf"{FEATURE_FILE} \(sha256 differs", id="file-changed"),
        pytest.param(_add_stray, r"features/stray.parquet \(not written by the pipeline\)", id="stray-file"),
        pytest.param(
            _lose_inventory,
            r"inventory.jsonl is missing from .*; staged output kept for inspection$",
            id="inventory-lost",
        ),
        pytest.param(
            _lose_and_add_stray,
            rf"parquet \(not written by the pipeline\), {FEATURE_FILE} \(missing\); staged output kept at",
            id="two-problems",
        ),
    ],
)
def test_staged_files_that_differ_from_what_the_pipeline_wrote_refuse_to_publish(tmp_path, damage, message):
    """A writer can lose a file without failing (Beam's WriteToFiles on a failed rename): a dataset
    missing one of its feature files must never be published, nor its offsets committed."""
    paths = DatasetPaths(tmp_path, "transitions-damaged")
    _stage(paths, {"read": 3, "used": 3})
    damage(paths)
    with pytest.raises(AccountingError, match=message):
        finalize(paths, {}, SETTINGS)
    assert paths.staging.exists() and not paths.final.exists()


def test_one_build_at_a_time_per_output_directory(tmp_path):
    """The lock that makes cleaning up after dead runs safe: a second build into the same output fails
    with one line, and the lock goes with the holder."""
    busy = pytest.raises(DatasetError, match="another build is writing to")
    with exclusive_output(tmp_path), busy, exclusive_output(tmp_path):
        pass
    with exclusive_output(tmp_path):  # released
        pass


def test_clear_leftovers_removes_what_dead_runs_left_and_nothing_else(tmp_path):
    (tmp_path / ".staging-transitions-a" / "features").mkdir(parents=True)
    (tmp_path / ".staging-transitions-a" / "features" / "x.parquet").write_bytes(b"P")
    (tmp_path / ".staging-transitions-b").mkdir()
    (tmp_path / ".offsets.json.tmp").write_text("{")  # an atomic write in the root, cut short
    dataset = tmp_path / "transitions-c"
    dataset.mkdir()
    (dataset / MANIFEST).write_text("{}")
    (dataset / ".dead-letters.jsonl.tmp").write_text("")  # and one in a published dataset
    # a dataset whose publication to an object store was cut short, file by file, before its manifest
    (tmp_path / "transitions-e" / "features").mkdir(parents=True)
    (tmp_path / "transitions-e" / "features" / "x.parquet").write_bytes(b"P")
    kept = [
        dataset / MANIFEST,
        dataset / "dead-letters.jsonl",
        tmp_path / ".build.lock",  # held by the run that clears
        tmp_path / ORPHANED_DIR / "transitions-d" / MANIFEST,
        tmp_path / "notes.tmp",  # not an atomic write's temporary file (those are hidden)
        tmp_path / "reports" / "r.json",  # not a dataset's directory, manifest or not
    ]
    for path in kept[1:]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    with exclusive_output(tmp_path):
        cleared = clear_leftovers(tmp_path)
    assert cleared == [
        ".offsets.json.tmp",
        ".staging-transitions-a",
        ".staging-transitions-b",
        "transitions-c/.dead-letters.jsonl.tmp",
        "transitions-e",
    ]
    assert all(path.exists() for path in kept)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".build.lock",
        ORPHANED_DIR,
        "notes.tmp",
        "reports",
        "transitions-c",
    ]
    assert clear_leftovers(tmp_path) == []


def test_clear_leftovers_removes_a_staging_directory_with_a_cut_short_write_in_it(tmp_path):
    """A run that died writing the manifest into staging leaves its temporary file there."""
    staging = tmp_path / ".staging-transitions-a"
    staging.mkdir()
    (staging / f".{MANIFEST}.tmp").write_text("{")
    assert clear_leftovers(tmp_path) == [".staging-transitions-a"]
    assert list(tmp_path.iterdir()) == []


GROUP = "transitions-builder"
#: the group's committed offsets, where the run about to build starts reading
STARTS = {("decisions", 0): 100, ("feedback", 0): 50}


def _publish(root, name, ranges=(), group=GROUP):
    """A published dataset: its manifest's inputs name the group and the offset ranges it holds."""
    directory = root / name
    directory.mkdir(parents=True)
    rows = [{"topic": t, "partition": p, "start": s, "end": e} for t, p, s, e in ranges]
    inputs = {"group": group, **({"ranges": rows} if ranges else {})}
    (directory / MANIFEST).write_text(json.dumps({"version": name, "inputs": inputs}))
    (directory / "transitions-feed-00000-of-00001.parquet").write_bytes(b"P")
    return directory


def test_orphan_overlapping_moves_aside_the_groups_datasets_holding_offsets_past_the_start(tmp_path):
    (tmp_path / "transitions-0-unfinished").mkdir()  # no manifest: not a dataset
    _publish(tmp_path, "transitions-0-no-ranges")
    _publish(tmp_path, "transitions-a", [("decisions", 0, 90, 101)])
    _publish(tmp_path, "transitions-b", [("decisions", 0, 0, 100)])  # ends where the run starts
    _publish(tmp_path, "transitions-c", [("feedback", 0, 0, 60)], group="another-group")
    _publish(tmp_path, "transitions-d", [("feedback", 1, 0, 500)])  # a partition the run does not read
    _publish(tmp_path, "transitions-e", [("decisions", 0, 0, 100), ("feedback", 0, 40, 51)])
    _publish(tmp_path, "transitions-keep", [("decisions", 0, 100, 120)])  # the run's own
    _publish(tmp_path, ".staging-transitions-f", [("decisions", 0, 100, 120)])  # hidden: not published
    orphaned = orphan_overlapping(tmp_path, GROUP, STARTS, keep="transitions-keep")
    assert orphaned == ["transitions-a", "transitions-e"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".orphaned",
        ".staging-transitions-f",
        "transitions-0-no-ranges",
        "transitions-0-unfinished",
        "transitions-b",
        "transitions-c",
        "transitions-d",
        "transitions-keep",
    ]
    for name in orphaned:
        moved = tmp_path / ORPHANED_DIR / name
        assert read_manifest(moved)["version"] == name  # moved whole
        assert (moved / "transitions-feed-00000-of-00001.parquet").read_bytes() == b"P"
        note = json.loads((moved / ORPHANED_NOTE).read_text())
        assert note["superseded_by"] == "transitions-keep"
        assert note["reason"].startswith("its offsets were never committed for the group")
    assert orphan_overlapping(tmp_path, GROUP, STARTS, keep="transitions-keep") == []


def test_a_dataset_orphaned_again_replaces_its_earlier_orphan(tmp_path):
    """Orphaned, rebuilt over the same offsets since and orphaned again: the same dataset."""
    earlier = tmp_path / ORPHANED_DIR / "transitions-a"
    earlier.mkdir(parents=True)
    (earlier / "stale").write_text("")
    _publish(tmp_path, "transitions-a", [("decisions", 0, 90, 101)])
    assert orphan_overlapping(tmp_path, GROUP, STARTS, keep="transitions-b") == ["transitions-a"]
    assert sorted(p.name for p in earlier.iterdir()) == [
        MANIFEST,
        ORPHANED_NOTE,
        "transitions-feed-00000-of-00001.parquet",
    ]
    assert json.loads((earlier / ORPHANED_NOTE).read_text())["superseded_by"] == "transitions-b"


def test_replace_staged_file_replaces_a_file_and_its_inventory_entry(tmp_path):
    """How dead letters get their bytes after the pipeline: the inventory check still passes."""
    paths = DatasetPaths(tmp_path, "transitions-letters")
    _stage(paths, {"read": 3, "used": 2, "dead_letter:conflicting_decision": 1})
    (paths.staging / "dead-letters.jsonl").write_bytes(b'{"offset": 7}\n')
    _write_inventory(paths)
    filled = b'{"offset": 7, "value": "AAE="}\n'
    replace_staged_file(paths.staging, "dead-letters.jsonl", filled)
    assert (paths.staging / "dead-letters.jsonl").read_bytes() == filled
    manifest = finalize(paths, {}, SETTINGS)
    assert manifest["sha256"]["dead-letters.jsonl"] == inventory_entry("", filled)["sha256"]
    assert verify(paths.final) == []
    assert not [p for p in paths.final.rglob("*.tmp")]


def test_replace_staged_file_refuses_a_file_the_pipeline_never_wrote(tmp_path):
    paths = DatasetPaths(tmp_path, "transitions-letters")
    _stage(paths, {"read": 3, "used": 3})
    inventory = (paths.staging / INVENTORY_FILE).read_bytes()
    with pytest.raises(AccountingError, match=r"dead-letters\.jsonl is not in the inventory of"):
        replace_staged_file(paths.staging, "dead-letters.jsonl", b"{}\n")
    assert not (paths.staging / "dead-letters.jsonl").exists()
    assert (paths.staging / INVENTORY_FILE).read_bytes() == inventory


def test_the_version_is_the_first_16_hex_digits_of_the_sha256_of_inputs_and_settings_as_sorted_json():
    """Versions name datasets across releases: the same offsets and settings must keep their name."""
    canonical = (
        '{"kafka": {"ranges": [{"end": 10, "partition": 0, "start": 0, "topic": "d"}]}, '
        '"settings": {"num_shards": 1}}'
    )
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    assert dataset_version(RANGES, SETTINGS) == f"transitions-{digest[:16]}"


def test_version_does_not_depend_on_the_order_keys_were_written_in():
    carried = {"dataset": "transitions-0", "sha256": "ab"}
    inputs = {**RANGES, "carried_from": carried}
    reordered = {"carried_from": dict(reversed(carried.items())), **RANGES}
    settings = {"num_shards": 1, "session_gap_ms": 5}
    assert dataset_version(inputs, settings) == dataset_version(reordered, dict(reversed(settings.items())))


def test_fates_never_counted_are_zero():
    """A run that read nothing has every count at zero, and its (empty) accounting balances."""
    assert accounting_summary({}) == {
        "read": 0,
        "released": 0,
        "carried": 0,
        "used_in_transitions": 0,
        "dead_lettered": 0,
        "filtered": 0,
        "dead_lettered_by_reason": {},
        "filtered_by_reason": {},
        "transitions_built": {},
        "balanced": True,
    }
    only_dead = accounting_summary({"read": 2, "dead_letter:malformed_bytes": 2})
    assert only_dead["balanced"] and only_dead["used_in_transitions"] == 0
    assert accounting_summary({"read": 1, "filtered:duplicate_decision": 1})["filtered_by_reason"] == {
        "duplicate_decision": 1
    }


@pytest.fixture
def far_from_utc(monkeypatch):
    """A local time zone 5 h 30 min ahead of UTC (a POSIX rule: no time zone database needed)."""
    monkeypatch.setenv("TZ", "IST-5:30")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_the_manifest_records_what_the_readers_look_up(tmp_path, far_from_utc):
    paths = DatasetPaths(tmp_path, "transitions-full")
    fates = {"read": 4, "used": 3, "dead_letter:orphan_feedback": 1, "built:feed": 2}
    _stage(paths, fates, deterministic=(0, 0))
    (paths.staging / ".beam-temp" / "0a1b").mkdir(parents=True)  # Beam's writer's leftovers
    (paths.staging / ".beam-temp" / "0a1b" / "shard").write_bytes(b"T")
    inputs = {"group": GROUP, **RANGES}
    manifest = finalize(paths, inputs, SETTINGS)
    assert not (paths.final / ".beam-temp").exists()
    feed = manifest["surfaces"]["feed"]
    assert feed["signals"] == list(SURFACE_SIGNALS["feed"])
    assert feed["feature_names"] == list(STATE_FEATURES["feed"])
    assert feed["parquet_shards"] == ["transitions-feed-00000-of-00001.parquet"]
    assert feed["rows"] == 2 and feed["deterministic"] == {"rows": 0}
    assert manifest["kind"] == "transitions" and manifest["version"] == paths.version
    assert manifest["feature_version"] == FEATURE_VERSION
    assert manifest["inputs"] == inputs and manifest["settings"] == SETTINGS
    assert manifest["accounting"] == accounting_summary(fates)
    assert manifest["dead_letters"] == {"file": "dead-letters.jsonl", "count": 1}
    assert manifest["features_dir"] == "features"
    created = dt.datetime.strptime(manifest["created_at"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    assert abs(created.timestamp() - time.time()) < 60  # UTC, whatever the local zone
    assert os.environ["TZ"] == "IST-5:30" and time.localtime().tm_gmtoff == 19800
