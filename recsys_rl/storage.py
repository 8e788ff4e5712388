"""Where a dataset lives: a local directory, or a URI of any filesystem Apache Beam supports.

The dataset code (``pipelines.dataset``, ``pipelines.build_transitions``) is written against the part
of ``pathlib.Path`` it needs. A local root stays a ``Path``, so local datasets keep what only a local
filesystem gives: a lock the kernel drops when its holder dies, and publication by one atomic rename.
A URI root (``s3://``, ``gs://``, ``hdfs://``, ...) becomes an `ObjectPath`, the same interface over
Beam's ``FileSystems``, the layer the pipeline's workers already write through; its configuration is
the pipeline's own options (``--s3_endpoint_url``, ``--project``, ...), set by `use_pipeline_options`.

Object stores have no directories, no rename and no lock, so two things differ there, by design:

- `move_tree` copies object by object, the manifest last, and deletes the source's manifest first.
  A dataset directory counts as published only when it holds its manifest, so a copy cut short is
  never read as a dataset; the next build clears it (``pipelines.dataset.clear_leftovers``).
- There is no lock (`pipelines.dataset.exclusive_output` holds none): one build at a time per output
  root is the scheduler's job, as a conditional write is beyond what Beam's filesystem layer offers.
"""

from __future__ import annotations

import fnmatch
import io
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pyarrow as pa
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from recsys_rl.dataset_contract import MANIFEST


def is_uri(location: str) -> bool:
    """Whether ``location`` names a filesystem by scheme (``s3://b/x``); ``file://`` counts as local."""
    scheme = FileSystems.get_scheme(location)
    return scheme is not None and scheme != "file"


def location(text: str) -> Location:
    """``text`` as a location: an `ObjectPath` for a URI, else an absolute local path.

    Absolute because the path travels to the pipeline's workers, which would resolve a relative one
    against their own working directories."""
    if is_uri(text):
        try:
            FileSystems.get_filesystem(text)
        except ValueError:
            raise ValueError(
                f"{text}: Beam has no filesystem for {FileSystems.get_scheme(text)}:// here; install "
                "the package that brings it (boto3 for s3://, apache-beam[gcp] for gs://, hdfs for hdfs://)"
            ) from None
        return ObjectPath(text.rstrip("/"))
    return Path(text.removeprefix("file://")).resolve()


def write_empty_objects_to_s3() -> None:
    """Let Beam's S3 writer create empty objects; call before writing, in every process that writes.

    Beam's S3 writer streams through a multipart upload and completes it with the parts it sent, so a
    file of no bytes completes an upload of no parts, which S3 refuses (MalformedXML; apache/beam#21369,
    open in Beam 2.77). A dataset's layout holds empty files on purpose (a shard no row fell in, no dead
    letters): here an upload that is about to complete without parts sends one empty part first, the
    fix other S3 clients made (ex_aws_s3#74). Idempotent; a no-op where Beam's AWS support is missing.
    """
    try:
        from apache_beam.io.aws import s3io
    except ImportError:
        return
    finish = s3io.S3Uploader.finish
    if getattr(finish, "sends_a_part", False):
        return

    def finish_with_a_part(uploader) -> None:
        if not uploader.parts and not uploader.buffer:
            uploader._write_to_s3(b"")
        finish(uploader)

    finish_with_a_part.sends_a_part = True
    s3io.S3Uploader.finish = finish_with_a_part


def use_pipeline_options(options: PipelineOptions) -> None:
    """Configure Beam's filesystems on this process (the driver) as the workers will be configured:
    endpoints, credentials and projects come from the pipeline options."""
    FileSystems.set_options(options)


@dataclass(frozen=True)
class _Stat:
    st_size: int


@dataclass(frozen=True)
class ObjectPath:
    """A path in an object store, with the part of ``pathlib.Path``'s interface the dataset code uses.

    A "directory" is a key prefix: it exists while an object is under it, and making one is a no-op.
    """

    uri: str

    def __str__(self) -> str:
        return self.uri

    # Path arithmetic is on the text, "/"-separated in every scheme: it needs no filesystem installed
    def __truediv__(self, name: str) -> ObjectPath:
        return ObjectPath(f"{self.uri}/{name}")

    @property
    def name(self) -> str:
        return self.uri.rpartition("/")[2]

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.name).suffix

    @property
    def parent(self) -> ObjectPath:
        return ObjectPath(self.uri.rpartition("/")[0])

    def resolve(self) -> ObjectPath:
        return self

    def relative_to(self, other: ObjectPath) -> PurePosixPath:
        prefix = other.uri + "/"
        if not self.uri.startswith(prefix):
            raise ValueError(f"{self.uri} is not under {other.uri}")
        return PurePosixPath(self.uri[len(prefix) :])

    def _objects(self) -> list[Any]:
        """Metadata of every object under this prefix, at any depth."""
        return FileSystems.match([self.uri + "/**"])[0].metadata_list

    def is_file(self) -> bool:
        return FileSystems.exists(self.uri)

    def is_dir(self) -> bool:
        return bool(self._objects())

    def exists(self) -> bool:
        return self.is_file() or self.is_dir()

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing to make: a prefix comes into being with its first object."""

    def glob(self, pattern: str) -> Iterator[ObjectPath]:
        """Files and prefixes under this one whose first path components match ``pattern``'s, as
        ``Path.glob`` with a pattern of one or more components and no ``**``."""
        parts = pattern.split("/")
        found = set()
        for metadata in self._objects():
            names = ObjectPath(metadata.path).relative_to(self).parts
            if len(names) >= len(parts) and all(map(fnmatch.fnmatchcase, names, parts)):
                found.add("/".join(names[: len(parts)]))
        for name in sorted(found):
            yield self / name

    def iterdir(self) -> Iterator[ObjectPath]:
        return self.glob("*")

    def rglob(self, pattern: str) -> Iterator[ObjectPath]:
        """Every object under this prefix whose name matches ``pattern``."""
        for metadata in sorted(self._objects(), key=lambda m: m.path):
            if fnmatch.fnmatchcase(ObjectPath(metadata.path).name, pattern):
                yield ObjectPath(metadata.path)

    def stat(self) -> _Stat:
        [metadata] = FileSystems.match([self.uri])[0].metadata_list
        return _Stat(metadata.size_in_bytes)

    def open(self, mode: str = "rb") -> io.IOBase:
        if mode != "rb":
            raise ValueError(f"objects are opened for reading in binary only, not {mode!r}")
        return FileSystems.open(self.uri, compression_type=CompressionTypes.UNCOMPRESSED)

    def read_bytes(self) -> bytes:
        try:
            with self.open() as f:
                return f.read()
        except Exception as err:  # each filesystem raises its own kind; callers handle a missing file
            if not self.is_file():
                raise FileNotFoundError(self.uri) from err
            raise

    def read_text(self) -> str:
        return self.read_bytes().decode("utf-8")

    def write_bytes(self, data: bytes) -> None:
        """One upload: readers see the old object or the new one whole, never a part."""
        write_empty_objects_to_s3()
        with FileSystems.create(self.uri, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            f.write(data)

    def unlink(self) -> None:
        FileSystems.delete([self.uri])


#: A dataset's location: a local directory, or a path in an object store.
Location = Path | ObjectPath


def arrow_source(path: Location) -> Path | pa.BufferReader:
    """What pyarrow reads ``path`` from: the local path itself, or the object's bytes (pyarrow's own
    S3 and GCS clients would not see the endpoint and credentials configured for Beam)."""
    return pa.BufferReader(path.read_bytes()) if isinstance(path, ObjectPath) else path


def file_sizes(root: Location) -> dict[str, int]:
    """Every file under ``root``, at any depth, by its path relative to ``root`` -> its size in bytes:
    from an object store in one listing, where asking file by file costs a request (and, in Beam 2.77,
    a new S3 client) each."""
    if isinstance(root, ObjectPath):
        return {str(ObjectPath(m.path).relative_to(root)): m.size_in_bytes for m in root._objects()}
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def remove_tree(path: Location) -> None:
    if isinstance(path, ObjectPath):
        FileSystems.delete([path.uri + "/"])
    else:
        shutil.rmtree(path)


def move_tree(source: Location, destination: Location) -> None:
    """Move a directory; refused if ``destination`` holds a published dataset.

    Locally one rename, which fails rather than replace a non-empty directory. In an object store the
    manifest is copied last and deleted from the source first, so neither side is ever a published
    dataset with files missing.
    """
    if isinstance(source, Path) and isinstance(destination, Path):
        os.rename(source, destination)
        return
    if not (isinstance(source, ObjectPath) and isinstance(destination, ObjectPath)):
        raise ValueError(f"cannot move {source} to {destination}: one is local, the other is not")
    if (destination / MANIFEST).is_file():
        raise FileExistsError(f"{destination} already holds a published dataset")
    names = [str(ObjectPath(m.path).relative_to(source)) for m in source._objects()]
    manifest = [n for n in names if n == MANIFEST]
    files = [n for n in names if n != MANIFEST]
    # a batch per step: a filesystem may copy or delete the objects of one call in any order
    for batch in (files, manifest):
        if batch:
            FileSystems.copy([(source / n).uri for n in batch], [(destination / n).uri for n in batch])
    for batch in (manifest, files):
        if batch:
            FileSystems.delete([(source / n).uri for n in batch])
