"""Write files whose whole content is one pipeline element, through Beam's ``fileio.WriteToFiles``.

Beam's ready-made sinks write a shard's records in whatever order the runner delivers them. Every
output of ours that must be byte-identical across reruns and runners (transition shards, feature
tables, dead letters, accounting) is instead grouped and sorted first, encoded into a file's bytes by
one of the ``*_file`` functions here, and handed over as one element ``(file name, bytes)``.

Files travel as bytes rather than as records or tables: a runner copies elements between stages (one
writer gathers every file of a dataset), and bytes copy without per-record coding.
"""

from __future__ import annotations

import io
from collections.abc import Iterable

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io import fileio
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.tfrecordio import _TFRecordUtil
from apache_beam.options.value_provider import StaticValueProvider

from recsys_rl.storage import write_empty_objects_to_s3


def tfrecord_file(records: Iterable[bytes]) -> bytes:
    """A TFRecord file of ``records``, in order: Beam's own framing (length, masked CRC32C, data, masked
    CRC32C), as ``WriteToTFRecord`` writes it."""
    buffer = io.BytesIO()
    for record in records:
        _TFRecordUtil.write_record(buffer, record)
    return buffer.getvalue()


def parquet_file(table: pa.Table) -> bytes:
    """A zstd-compressed Parquet file of ``table``."""
    buffer = pa.BufferOutputStream()
    pq.write_table(table, buffer, compression="zstd")
    return buffer.getvalue().to_pybytes()


class _BytesSink(fileio.FileSink):
    """Writes an element's bytes as the whole file."""

    def create_metadata(self, destination: str, full_file_name: str) -> fileio.FileMetadata:
        # Our formats carry their own framing and compression; never let a name suffix add a codec.
        return fileio.FileMetadata(
            mime_type="application/octet-stream", compression_type=CompressionTypes.UNCOMPRESSED
        )

    def open(self, fh) -> None:
        write_empty_objects_to_s3()  # before the file closes, in this worker's process
        self._fh = fh

    def write(self, record: tuple[str, bytes]) -> None:
        self._fh.write(record[1])

    def flush(self) -> None:
        self._fh.flush()


class _ExactNaming:
    """WriteToFiles' file naming: the element's name itself, a path relative to the output directory.

    WriteToFiles creates only the output directory before it moves each temporary file into place, and
    a move into a missing subdirectory fails quietly; so the subdirectory is made here, through Beam's
    file systems, just before that move.
    """

    def __init__(self, directory: str) -> None:
        self._directory = directory

    def __call__(self, window, pane, shard: int, total_shards: int, compression, destination: str) -> str:
        if total_shards != 1:  # two temp files would overwrite each other under one name: refuse to lose one
            raise RuntimeError(f"expected one file for {destination}, but the writer produced {total_shards}")
        parent = FileSystems.split(FileSystems.join(self._directory, destination))[0]
        if "/" in destination and not FileSystems.exists(parent):
            try:
                FileSystems.mkdirs(parent)
            except OSError:
                if not FileSystems.exists(parent):  # not made meanwhile by the move of another file
                    raise
        return destination


class WriteWholeFiles(beam.PTransform):
    """(file name, bytes) elements, one per file -> those files in ``directory``; returns their paths.

    A name may hold "/": the file goes into that subdirectory, so one writer serves a whole dataset.
    """

    def __init__(self, directory: str, temp_directory: str) -> None:
        super().__init__()
        self._directory = directory
        self._temp_directory = temp_directory

    def expand(self, files):
        return (
            files
            | "WriteToFiles"
            >> fileio.WriteToFiles(
                path=self._directory,
                destination=lambda element: element[0],
                sink=lambda destination: _BytesSink(),
                file_naming=_ExactNaming(self._directory),
                # WriteToFiles calls .get() on a given temp directory: a plain str fails in the workers
                temp_directory=StaticValueProvider(str, self._temp_directory),
                shards=1,
            )
            | "Paths"
            >> beam.Map(lambda result, directory: f"{directory}/{result.file_name}", self._directory)
        )
