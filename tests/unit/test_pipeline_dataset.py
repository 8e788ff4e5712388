"""Dataset versions, the accounting equation, the manifest and the atomic publish."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recsys_rl.dataset_contract import DATASET_SCHEMA_VERSION
from recsys_rl.pipelines.dataset import (
    INVENTORY_FILE,
    AccountingError,
    DatasetError,
    DatasetPaths,
    accounting_summary,
    dataset_version,
    exclusive_output,
    finalize,
    inventory_entry,
    read_manifest,
    verify,
)
from recsys_rl.pipelines.transition_io import parquet_schema

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
    assert manifest["schema_version"] == DATASET_SCHEMA_VERSION == 2
    assert manifest["surfaces"]["feed"]["deterministic"] == {"rows": 2}
    assert manifest["surfaces"]["live_allocation"]["deterministic"] == {"rows": 0}


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


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        pytest.param(_lose, rf"{FEATURE_FILE} \(missing\)", id="file-lost"),
        pytest.param(_truncate, rf"{FEATURE_FILE} \(0 bytes, written 1\)", id="file-short"),
        pytest.param(_corrupt, rf"{FEATURE_FILE} \(sha256 differs", id="file-changed"),
        pytest.param(_add_stray, r"features/stray.parquet \(not written by the pipeline\)", id="stray-file"),
        pytest.param(_lose_inventory, r"inventory.jsonl is missing", id="inventory-lost"),
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
