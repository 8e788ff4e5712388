"""``storage.ObjectPath`` on a real S3 API (moto's server): the dataset code's view of a directory,
the same on an object store as on a local disk."""

from __future__ import annotations

import uuid

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from recsys_rl.atomic_json import read_json_file, write_json_atomic
from recsys_rl.storage import ObjectPath, file_sizes, move_tree, remove_tree, use_pipeline_options

pytestmark = pytest.mark.integration

FILES = {
    "transitions-a/manifest.json": b"{}",
    "transitions-a/features/users.parquet": b"PAR1",
    "transitions-a/.manifest.json.tmp": b"{",
    ".staging-transitions-b/shard.tfrecord": b"",  # empty files are part of a dataset's layout
    ".offsets.json.tmp": b"{",
}
PATTERNS = ["*", ".staging-*", ".*.tmp", "*/.*.tmp", "*/manifest.json", "transitions-*", "nothing-*"]


@pytest.fixture
def trees(s3_server, tmp_path):
    """The same files in a local directory and under a fresh S3 prefix."""
    use_pipeline_options(PipelineOptions(s3_server.pipeline_args))
    remote = ObjectPath(f"s3://{s3_server.bucket}/{uuid.uuid4().hex[:8]}")
    for name, data in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
        (remote / name).write_bytes(data)
    return tmp_path, remote


def test_listing_reading_and_sizes_match_a_local_directory(trees):
    local, remote = trees

    def names(paths, root):
        return sorted(str(p.relative_to(root)) for p in paths)

    for pattern in PATTERNS:
        assert names(remote.glob(pattern), remote) == names(local.glob(pattern), local), pattern
    assert names(remote.iterdir(), remote) == names(local.iterdir(), local)
    assert names(remote.rglob("*.parquet"), remote) == names(local.rglob("*.parquet"), local)
    assert file_sizes(remote) == file_sizes(local) == {name: len(data) for name, data in FILES.items()}
    for name, data in FILES.items():
        assert (remote / name).read_bytes() == data and (remote / name).stat().st_size == len(data)
    dataset = remote / "transitions-a"
    assert dataset.is_dir() and not dataset.is_file() and dataset.exists()
    assert (dataset / "manifest.json").is_file() and not (dataset / "manifest.json").is_dir()
    assert not (remote / "transitions-z").exists()
    with pytest.raises(FileNotFoundError, match="transitions-z"):
        (remote / "transitions-z" / "manifest.json").read_bytes()
    with pytest.raises(ValueError, match=r"transitions-z has no manifest\.json: what it is for"):
        read_json_file(remote / "transitions-z" / "manifest.json", ValueError, "what it is for")


def test_json_writes_moves_and_removals(trees):
    _, remote = trees
    write_json_atomic(remote / "transitions-a" / "note.json", {"why": "moved"})
    assert read_json_file(remote / "transitions-a" / "note.json", ValueError, "") == {"why": "moved"}

    move_tree(remote / "transitions-a", remote / ".orphaned" / "transitions-a")
    assert not (remote / "transitions-a").exists()
    moved = remote / ".orphaned" / "transitions-a"
    assert sorted(file_sizes(moved)) == [
        ".manifest.json.tmp",
        "features/users.parquet",
        "manifest.json",
        "note.json",
    ]
    with pytest.raises(FileExistsError):
        move_tree(remote / ".staging-transitions-b", moved)

    remove_tree(moved)
    assert not moved.exists() and (remote / ".staging-transitions-b" / "shard.tfrecord").is_file()
