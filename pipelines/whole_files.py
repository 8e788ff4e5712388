"""Write files whose whole content is one pipeline element, through Beam's ``fileio.WriteToFiles``.

Beam's ready-made sinks write a shard's records in whatever order the runner delivers them. Every
output of ours that must be byte-identical across reruns and runners (transition shards, feature
tables, dead letters, accounting) is instead grouped and sorted first and handed over as one element
``(file name, payload)``; the sink for the name's suffix writes the payload as the whole file.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io import fileio
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.tfrecordio import _TFRecordUtil
from apache_beam.options.value_provider import StaticValueProvider


class _WholeFileSink(fileio.FileSink):
    def create_metadata(self, destination: str, full_file_name: str) -> fileio.FileMetadata:
        # Our formats carry their own framing and compression; never let a name suffix add a codec.
        return fileio.FileMetadata(
            mime_type="application/octet-stream", compression_type=CompressionTypes.UNCOMPRESSED
        )

    def open(self, fh) -> None:
        self._fh = fh

    def write(self, record: tuple[str, Any]) -> None:
        self._write_payload(record[1])

    def flush(self) -> None:
        self._fh.flush()

    def _write_payload(self, payload: Any) -> None:
        raise NotImplementedError


class TFRecordSink(_WholeFileSink):
    """Payload: serialized records, in file order."""

    def _write_payload(self, payload: list[bytes]) -> None:
        # Beam's own TFRecord framing (length, masked CRC32C, data, masked CRC32C), as WriteToTFRecord uses
        for value in payload:
            _TFRecordUtil.write_record(self._fh, value)


class ParquetSink(_WholeFileSink):
    """Payload: a ``pyarrow.Table``."""

    def _write_payload(self, payload: pa.Table) -> None:
        pq.write_table(payload, self._fh, compression="zstd")


class JsonLinesSink(_WholeFileSink):
    """Payload: JSON-able items, one line each, keys sorted."""

    def _write_payload(self, payload: list[Any]) -> None:
        for item in payload:
            self._fh.write(json.dumps(item, sort_keys=True).encode("utf-8") + b"\n")


SINKS: dict[str, type[_WholeFileSink]] = {
    ".tfrecord": TFRecordSink,
    ".parquet": ParquetSink,
    ".jsonl": JsonLinesSink,
}


def _sink_for(file_name: str) -> fileio.FileSink:
    for suffix, sink in SINKS.items():
        if file_name.endswith(suffix):
            return sink()
    raise ValueError(f"no sink for output file {file_name!r}; known suffixes are {sorted(SINKS)}")


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
            with contextlib.suppress(OSError):  # made meanwhile by the move of another file
                FileSystems.mkdirs(parent)
        return destination


class WriteWholeFiles(beam.PTransform):
    """(file name, payload) elements, one per file -> those files in ``directory``; returns their paths.

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
                sink=_sink_for,
                file_naming=_ExactNaming(self._directory),
                # WriteToFiles calls .get() on a given temp directory: a plain str fails in the workers
                temp_directory=StaticValueProvider(str, self._temp_directory),
                shards=1,
            )
            | "Paths"
            >> beam.Map(lambda result, directory: f"{directory}/{result.file_name}", self._directory)
        )
