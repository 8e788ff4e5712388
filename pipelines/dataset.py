"""Versioned transition datasets: staging, the accounting check, the manifest and the atomic publish.

A dataset's version is a digest of what it was built from (the Kafka offset ranges and the builder
settings), so a rerun over the same offsets maps to the same directory: if that directory exists the
earlier run finished its write, and the rerun only has to finish what came after (dead-letter
publication, offset commit). The pipeline writes into a staging directory that is renamed into place
only after the manifest is written: readers never see a half-written dataset.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from recsys_rl.atomic_json import jsonl_file, write_bytes_atomic, write_json_atomic
from recsys_rl.dataset_contract import (
    DATASET_SCHEMA_VERSION,
    DATASET_SIGNALS,
    MANIFEST,
    STATE_FEATURES,
    USER_AUTHOR,
    dataset_surfaces,
)
from recsys_rl.errors import OperationalError
from recsys_rl.pipelines.transition_io import PARQUET_SUFFIX, TFRECORD_SUFFIX
from recsys_rl.state import FEATURE_VERSION
from recsys_rl.storage import Location, ObjectPath, arrow_source, file_sizes, move_tree, remove_tree

ACCOUNTING_FILE = "accounting.jsonl"  # fate counts from the pipeline; folded into the manifest
BUILT_PREFIX = "built:"  # the accounting's count of transitions made per surface: built:<surface>
DEAD_LETTER_FILE = "dead-letters.jsonl"
#: Every file the pipeline handed to its writer, as JSON lines {"name", "bytes", "sha256"}: what
#: publishing checks the staging directory against, since a writer can lose a file without failing.
INVENTORY_FILE = "inventory.jsonl"
FEATURES_DIR = "features"  # the Feast offline store's Parquet for this dataset


class DatasetError(OperationalError):
    """An existing dataset directory does not match its manifest, or another build holds the output."""


class AccountingError(OperationalError):
    """Records, transitions or files were lost or counted twice on the way to the dataset.

    read != used + dead-lettered + filtered, a surface's files hold other than the transitions made, or
    the staging directory holds other files, or other bytes, than the pipeline wrote.
    """


@dataclass(frozen=True)
class DatasetPaths:
    root: Location
    version: str

    @property
    def final(self) -> Location:
        return self.root / self.version

    @property
    def staging(self) -> Location:
        return self.root / f".staging-{self.version}"


#: Where datasets that a later run found uncommitted and overlapping its own go (see `orphan_overlapping`).
ORPHANED_DIR = ".orphaned"
ORPHANED_NOTE = "orphaned.json"  # in an orphan: the dataset that superseded it, and why
_LOCK_FILE = ".build.lock"
VERSION_PREFIX = "transitions-"  # every dataset directory's name starts with it


@contextlib.contextmanager
def exclusive_output(root: Location) -> Iterator[None]:
    """Hold the output directory for one build at a time (a lock the kernel drops if the process dies),
    so that what another run left behind can be cleaned up without touching a run in progress.

    An object store has no such lock, and Beam's filesystem layer no conditional write to make one:
    there, one build at a time per output root is up to whoever schedules the builds (``storage``)."""
    if isinstance(root, ObjectPath):
        yield
        return
    root.mkdir(parents=True, exist_ok=True)
    with open(root / _LOCK_FILE, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DatasetError(
                f"another build is writing to {root}; one at a time per output directory"
            ) from None
        yield


def clear_leftovers(root: Location) -> list[str]:
    """Remove what dead runs left in ``root`` (held with `exclusive_output`): staging directories,
    temporary files of atomic writes (in the root and in the datasets), and dataset directories without
    a manifest: a publication to an object store cut short (locally, publication is one rename and
    leaves none). Returns their names."""
    found = {*root.glob(".staging-*"), *root.glob(".*.tmp"), *root.glob("*/.*.tmp")}
    found |= {path for path in root.glob(f"{VERSION_PREFIX}*") if not (path / MANIFEST).is_file()}
    # a temporary file in a staging directory (a manifest write cut short) goes with its directory
    leftovers = [path for path in found if path.parent not in found]
    for path in leftovers:
        if path.is_dir():
            remove_tree(path)
        else:
            path.unlink()
    return sorted(str(path.relative_to(root)) for path in leftovers)


def orphan_overlapping(
    root: Location, group: str | None, starts: Mapping[tuple[str, int], int], keep: str
) -> list[str]:
    """Move aside every published dataset of ``group`` (other than ``keep``) that holds offsets at or
    past the group's committed ``starts``: such a dataset was written but its offsets never committed
    (the run died before the commit), and the run about to read from ``starts`` covers them again, so
    both would count those events. It goes to ``ORPHANED_DIR`` with a note of why. Returns the names."""
    orphaned = []
    for dataset in sorted(p for p in root.iterdir() if not p.name.startswith(".") and p.name != keep):
        if not (dataset / MANIFEST).is_file():
            continue
        inputs = read_manifest(dataset)["inputs"]
        overlaps = any(
            (r["topic"], r["partition"]) in starts and r["end"] > starts[(r["topic"], r["partition"])]
            for r in inputs.get("ranges", [])
        )
        if inputs.get("group") != group or not overlaps:
            continue
        destination = root / ORPHANED_DIR / dataset.name
        destination.parent.mkdir(exist_ok=True)
        if destination.exists():
            remove_tree(destination)  # orphaned before, rebuilt since and orphaned again: same offsets
        write_json_atomic(
            dataset / ORPHANED_NOTE,
            {
                "superseded_by": keep,
                "reason": "its offsets were never committed for the group, and a later run read them again",
            },
        )
        move_tree(dataset, destination)
        orphaned.append(dataset.name)
    return orphaned


def dataset_version(kafka_ranges: Mapping[str, Any], settings: Mapping[str, Any]) -> str:
    """A digest of the inputs (offset ranges, not broker addresses) and of the settings that shape output."""
    canonical = json.dumps({"kafka": kafka_ranges, "settings": settings}, sort_keys=True).encode("utf-8")
    return VERSION_PREFIX + hashlib.sha256(canonical).hexdigest()[:16]


def sha256_of(path: Location) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def accounting_summary(fates: Mapping[str, int]) -> dict[str, Any]:
    """Split fate counts into the accounting record of the manifest and check the equation."""
    dead = {k.split(":", 1)[1]: v for k, v in fates.items() if k.startswith("dead_letter:")}
    filtered = {k.split(":", 1)[1]: v for k, v in fates.items() if k.startswith("filtered:")}
    built = {k.removeprefix(BUILT_PREFIX): int(v) for k, v in fates.items() if k.startswith(BUILT_PREFIX)}
    summary = {
        "read": int(fates.get("read", 0)),
        # events of open sessions that the previous run carried into this one, and that this run
        # carries on to the next (``pipelines.carry``)
        "released": int(fates.get("released", 0)),
        "carried": int(fates.get("carried", 0)),
        "used_in_transitions": int(fates.get("used", 0)),
        "dead_lettered": sum(dead.values()),
        "filtered": sum(filtered.values()),
        "dead_lettered_by_reason": dict(sorted(dead.items())),
        "filtered_by_reason": dict(sorted(filtered.items())),
        "transitions_built": dict(sorted(built.items())),
    }
    came = summary["read"] + summary["released"]
    went = sum(summary[k] for k in ("used_in_transitions", "dead_lettered", "filtered", "carried"))
    summary["balanced"] = came == went
    return summary


def finalize(paths: DatasetPaths, inputs: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """Check accounting, write the manifest into staging and rename staging into the final directory."""
    staging = paths.staging
    if (staging / ".beam-temp").is_dir():
        remove_tree(staging / ".beam-temp")
    files = _check_inventory(staging)
    if ACCOUNTING_FILE not in files:  # never zero counts: without them nothing says what the run read
        raise AccountingError(
            f"{ACCOUNTING_FILE} is missing from {staging}: the run's record counts are unknown; "
            "staged output kept for inspection"
        )
    accounting = accounting_summary(json.loads((staging / ACCOUNTING_FILE).read_text()))
    if not accounting["balanced"]:
        raise AccountingError(
            f"records read ({accounting['read']}) + released ({accounting['released']}) != used "
            f"({accounting['used_in_transitions']}) + dead-lettered ({accounting['dead_lettered']}) + "
            f"filtered ({accounting['filtered']}) + carried ({accounting['carried']}); "
            f"staged output kept at {staging} for inspection"
        )
    surfaces = {}
    for surface in dataset_surfaces(bool(settings.get("user_author_surface"))):
        signal_names = DATASET_SIGNALS[surface]
        shards = [staging / name for name in files if name.startswith(f"transitions-{surface}-")]
        parquet_shards = [p for p in shards if p.suffix == PARQUET_SUFFIX]
        # the columns the manifest counts, each shard read once: from an object store, a read costs
        columns = _COUNTED_COLUMNS[surface == USER_AUTHOR]
        tables = [pq.read_table(arrow_source(p), columns=columns) for p in parquet_shards]
        rows = sum(table.num_rows for table in tables)
        built = accounting["transitions_built"].get(surface, 0)
        if rows != built:
            raise AccountingError(
                f"{surface} transitions made ({built}) != rows in its files ({rows}); "
                f"staged output kept at {staging} for inspection"
            )
        counts = _pair_counts(tables) if surface == USER_AUTHOR else _request_counts(tables)
        surfaces[surface] = {
            "signals": list(signal_names),
            "feature_names": list(STATE_FEATURES[surface]),
            "rows": rows,
            **counts,
            "tfrecord_shards": [p.name for p in shards if p.suffix == TFRECORD_SUFFIX],
            "parquet_shards": [p.name for p in parquet_shards],
        }
    manifest = {
        "schema_version": DATASET_SCHEMA_VERSION,
        "kind": "transitions",
        "version": paths.version,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "feature_version": FEATURE_VERSION,
        "surfaces": surfaces,
        "inputs": dict(inputs),
        "settings": dict(settings),
        "accounting": accounting,
        "dead_letters": {"file": DEAD_LETTER_FILE, "count": accounting["dead_lettered"]},
        "features_dir": FEATURES_DIR,
        "sha256": {name: digest for name, digest in files.items() if name != ACCOUNTING_FILE},
    }
    (staging / ACCOUNTING_FILE).unlink()
    (staging / INVENTORY_FILE).unlink()
    write_json_atomic(staging / MANIFEST, manifest)
    move_tree(staging, paths.final)  # fails rather than replace an existing dataset
    return manifest


def inventory_entry(name: str, data: bytes) -> dict[str, Any]:
    """What the inventory records of one file the pipeline writes."""
    return {"name": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def replace_staged_file(staging: Location, name: str, data: bytes) -> None:
    """Replace a file the pipeline staged, and its inventory entry with it, each atomically: the one way
    for a step after the pipeline (filling dead letters' bytes) to change its output, so that the
    inventory check still proves every file is the one meant to be published."""
    entries = [json.loads(line) for line in (staging / INVENTORY_FILE).read_text().splitlines()]
    if not any(entry["name"] == name for entry in entries):
        raise AccountingError(f"{name} is not in the inventory of {staging}: the pipeline never wrote it")
    updated = [inventory_entry(name, data) if entry["name"] == name else entry for entry in entries]
    write_bytes_atomic(staging / name, data)
    write_bytes_atomic(staging / INVENTORY_FILE, jsonl_file(updated))


def _check_inventory(staging: Location) -> dict[str, str]:
    """Every file the pipeline wrote, by name -> sha256, checked against its inventory; else AccountingError.

    The check that catches a file lost after the pipeline produced it (a failed directory or rename
    that Beam's writer does not report, a full disk): nothing is published or committed then.
    """
    inventory_path = staging / INVENTORY_FILE
    if not inventory_path.is_file():
        raise AccountingError(
            f"{INVENTORY_FILE} is missing from {staging}: the pipeline's writes did not all land; "
            "staged output kept for inspection"
        )
    expected = [json.loads(line) for line in inventory_path.read_text().splitlines()]
    found = file_sizes(staging)
    del found[INVENTORY_FILE]
    written = {entry["name"] for entry in expected}
    problems = [f"{name} (not written by the pipeline)" for name in sorted(found.keys() - written)]
    digests = {}
    for entry in expected:
        size = found.get(entry["name"])
        if size is None:
            problems.append(f"{entry['name']} (missing)")
        elif size != entry["bytes"]:
            problems.append(f"{entry['name']} ({size} bytes, written {entry['bytes']})")
        elif (digest := sha256_of(staging / entry["name"])) != entry["sha256"]:
            problems.append(f"{entry['name']} (sha256 differs from what was written)")
        else:
            digests[entry["name"]] = digest
    if problems:
        raise AccountingError(
            f"the staged files differ from what the pipeline wrote: {', '.join(problems)}; "
            f"staged output kept at {staging} for inspection"
        )
    return dict(sorted(digests.items()))


#: The columns the manifest counts, of a request surface and of the user-author surface.
_COUNTED_COLUMNS = (["features_missing_reason", "deterministic"], ["user_id", "author_id", "truncated"])


def _request_counts(tables: list[pa.Table]) -> dict[str, Any]:
    return {"features_missing": _features_missing(tables), "deterministic": _deterministic(tables)}


def _pair_counts(tables: list[pa.Table]) -> dict[str, Any]:
    """How many pairs the user-author surface's rows belong to, and how many of those rows end at the
    run's cut-off, their next state standing in for an interaction not seen yet (``truncated``)."""
    pairs = {
        pair
        for table in tables
        for pair in zip(
            table.column("user_id").to_pylist(), table.column("author_id").to_pylist(), strict=True
        )
    }
    truncated = sum(pc.sum(table.column("truncated")).as_py() or 0 for table in tables)
    return {"pairs": len(pairs), "truncated": int(truncated)}


def _features_missing(tables: list[pa.Table]) -> dict[str, Any]:
    """How many of a surface's transitions were decided on default user features, and why."""
    reasons: Counter[str] = Counter()
    for table in tables:
        reasons.update(table.column("features_missing_reason").to_pylist())
    del reasons[""]  # the store answered
    return {"rows": sum(reasons.values()), "by_reason": dict(sorted(reasons.items()))}


def _deterministic(tables: list[pa.Table]) -> dict[str, int]:
    """How many of a surface's transitions served the policy's mode (``serve --no-explore``): their
    log_propensity is no behaviour propensity, and OPE leaves their sessions out."""
    rows = sum(pc.sum(table.column("deterministic")).as_py() or 0 for table in tables)
    return {"rows": int(rows)}


def read_manifest(directory: Location) -> dict[str, Any]:
    return json.loads((directory / MANIFEST).read_text())


def verify(directory: Location) -> list[str]:
    """Files whose sha256 differs from the manifest (or that are missing): empty for a sound dataset."""
    manifest = read_manifest(directory)
    present = file_sizes(directory)
    return [
        name
        for name, digest in manifest["sha256"].items()
        if name not in present or sha256_of(directory / name) != digest
    ]
