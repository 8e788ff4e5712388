"""Dataset locations (``recsys_rl.storage``): what is a URI, and the order of an object-store move."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from apache_beam.io.aws import s3io
from apache_beam.io.filesystems import FileSystems

from recsys_rl import storage
from recsys_rl.storage import ObjectPath, is_uri, location, move_tree


@pytest.mark.parametrize(
    ("text", "uri"),
    [("s3://b/x", True), ("gs://b", True), ("hdfs://nn:8020/x", True), ("file:///x", False), ("a/b", False)],
)
def test_a_scheme_other_than_file_makes_a_uri(text, uri):
    assert is_uri(text) is uri


def test_local_locations_are_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert location("data") == tmp_path / "data"
    assert location(f"file://{tmp_path}/x") == tmp_path / "x"
    assert location("s3://b/x/") == ObjectPath("s3://b/x")


def test_object_paths_compose_as_paths_do():
    root = ObjectPath("gs://bucket/datasets")
    child = root / "transitions-1" / "features" / "users.parquet"
    assert str(child) == "gs://bucket/datasets/transitions-1/features/users.parquet"
    assert (child.name, child.suffix, child.parent.parent.name) == (
        "users.parquet",
        ".parquet",
        "transitions-1",
    )
    assert str(child.relative_to(root)) == "transitions-1/features/users.parquet"
    with pytest.raises(ValueError, match="is not under"):
        root.relative_to(child)


def test_an_object_store_move_publishes_the_manifest_last_and_unpublishes_it_first(monkeypatch):
    """A move cut short must never leave a manifest beside missing files, on either side."""
    source, destination = ObjectPath("s3://b/.staging-v"), ObjectPath("s3://b/v")
    names = ["manifest.json", "a.parquet", "features/f.parquet"]
    calls = []
    listing = SimpleNamespace(
        metadata_list=[SimpleNamespace(path=f"{source}/{n}", size_in_bytes=1) for n in names]
    )
    monkeypatch.setattr(FileSystems, "match", lambda patterns: [listing])
    monkeypatch.setattr(FileSystems, "exists", lambda uri: False)
    monkeypatch.setattr(
        FileSystems, "copy", lambda sources, targets: calls.append(("copy", sources, targets))
    )
    monkeypatch.setattr(FileSystems, "delete", lambda uris: calls.append(("delete", uris)))
    move_tree(source, destination)
    assert calls == [
        (
            "copy",
            [f"{source}/a.parquet", f"{source}/features/f.parquet"],
            [f"{destination}/a.parquet", f"{destination}/features/f.parquet"],
        ),
        ("copy", [f"{source}/manifest.json"], [f"{destination}/manifest.json"]),
        ("delete", [f"{source}/manifest.json"]),
        ("delete", [f"{source}/a.parquet", f"{source}/features/f.parquet"]),
    ]


def test_a_move_onto_a_published_dataset_or_across_filesystems_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(FileSystems, "exists", lambda uri: uri == "s3://b/v/manifest.json")
    with pytest.raises(FileExistsError, match="s3://b/v already holds a published dataset"):
        move_tree(ObjectPath("s3://b/w"), ObjectPath("s3://b/v"))
    with pytest.raises(ValueError, match="one is local, the other is not"):
        move_tree(tmp_path, ObjectPath("s3://b/x"))


def test_an_s3_upload_of_no_bytes_sends_one_empty_part_before_completing(monkeypatch):
    """apache/beam#21369: completing a multipart upload without parts is refused by S3."""
    completed = []

    def beam_finish(uploader):
        completed.append(list(uploader.parts))

    monkeypatch.setattr(s3io.S3Uploader, "finish", beam_finish)
    storage.write_empty_objects_to_s3()
    storage.write_empty_objects_to_s3()  # idempotent: one wrapper, not two

    class Uploader:
        def __init__(self, parts, buffer):
            self.parts, self.buffer = parts, buffer

        def _write_to_s3(self, data):
            self.parts.append({"PartNumber": len(self.parts) + 1, "bytes": data})

    s3io.S3Uploader.finish(Uploader([], b""))
    s3io.S3Uploader.finish(Uploader([{"PartNumber": 1}], b""))
    s3io.S3Uploader.finish(Uploader([], b"tail"))  # Beam's own finish sends the buffered tail
    assert completed == [[{"PartNumber": 1, "bytes": b""}], [{"PartNumber": 1}], []]
