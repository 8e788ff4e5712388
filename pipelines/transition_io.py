"""Deterministic, sharded output of a transition dataset through Beam's fileio.

Beam's ready-made sinks (WriteToTFRecord, WriteToParquet) write each shard's records in whatever order
the runner delivers them, so two runs over the same offsets would give the same records in different
bytes. Here rows are assigned to a shard by a stable hash of their episode, each shard is sorted, and
the whole sorted shard is one element that ``fileio.WriteToFiles`` hands to our sinks: the same input
gives byte-identical files on any runner.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io import fileio
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.tfrecordio import _TFRecordUtil
from apache_beam.options.value_provider import StaticValueProvider

from pipelines.episodes import SURFACE_SIGNALS
from recsys_rl import contracts

TFRECORD_SUFFIX = ".tfrecord"
PARQUET_SUFFIX = ".parquet"

_STRING_FIELDS = ("request_id", "user_id", "session_id", "surface", "policy_version")
_INT_FIELDS = ("step", "event_time_ms", "next_event_time_ms", "user_group", "done", "feedback_count")
_FLOAT_LIST_FIELDS = ("state", "next_state", "action")


def shard_of(session_id: str, num_shards: int) -> int:
    """Stable across processes and Python versions (unlike ``hash``), so reruns shard identically."""
    digest = hashlib.blake2b(session_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % num_shards


def shard_name(surface: str, shard: int, num_shards: int) -> str:
    return f"transitions-{surface}-{shard:05d}-of-{num_shards:05d}"


def row_sort_key(row: dict) -> tuple:
    return (row["session_id"], row["step"], row["request_id"])


def to_example(row: dict) -> bytes:
    """A transition as a ``tf.train.Example``: one feature per field, rewards as ``reward/<signal>``."""
    example = contracts.TFExample()
    feature = example.features.feature
    for name in _STRING_FIELDS:
        feature[name].bytes_list.value.append(row[name].encode("utf-8"))
    for name in _INT_FIELDS:
        feature[name].int64_list.value.append(int(row[name]))
    for name in _FLOAT_LIST_FIELDS:
        feature[name].float_list.value.extend(row[name])
    feature["log_propensity"].float_list.value.append(row["log_propensity"])
    for signal, value in zip(SURFACE_SIGNALS[row["surface"]], row["reward"], strict=True):
        feature[f"reward/{signal}"].float_list.value.append(value)
    return example.SerializeToString(deterministic=True)


@functools.cache
def parquet_schema(surface: str) -> pa.Schema:
    fields = [pa.field(name, pa.string()) for name in _STRING_FIELDS]
    fields += [pa.field(name, pa.int64()) for name in _INT_FIELDS]
    fields += [pa.field(name, pa.list_(pa.float32())) for name in _FLOAT_LIST_FIELDS]
    fields.append(pa.field("log_propensity", pa.float64()))
    fields += [pa.field(f"reward_{signal}", pa.float64()) for signal in SURFACE_SIGNALS[surface]]
    return pa.schema(fields)


def to_parquet_row(row: dict) -> dict:
    flat = {k: v for k, v in row.items() if k != "reward"}
    flat["done"] = int(row["done"])
    for signal, value in zip(SURFACE_SIGNALS[row["surface"]], row["reward"], strict=True):
        flat[f"reward_{signal}"] = value
    return flat


class _WholeFileSink(fileio.FileSink):
    """A sink that receives one element per file: (file name, payload), already in file order."""

    def create_metadata(self, destination: str, full_file_name: str) -> fileio.FileMetadata:
        # Our formats carry their own framing and compression; never let a name suffix add a codec.
        return fileio.FileMetadata(
            mime_type="application/octet-stream", compression_type=CompressionTypes.UNCOMPRESSED
        )

    def open(self, fh) -> None:
        self._fh = fh

    def write(self, record: tuple[str, Any]) -> None:
        self._write_payload(record[0], record[1])

    def flush(self) -> None:
        self._fh.flush()

    def _write_payload(self, name: str, payload: Any) -> None:
        raise NotImplementedError


class TFRecordShardSink(_WholeFileSink):
    def _write_payload(self, name: str, payload: list[bytes]) -> None:
        # Beam's own TFRecord framing (length, masked CRC32C, data, masked CRC32C), as WriteToTFRecord uses
        for value in payload:
            _TFRecordUtil.write_record(self._fh, value)


class ParquetShardSink(_WholeFileSink):
    def _write_payload(self, name: str, payload: tuple[str, list[tuple]]) -> None:
        surface, rows = payload
        schema = parquet_schema(surface)
        columns = list(zip(*rows, strict=True)) if rows else [[] for _ in schema]
        arrays = [pa.array(column, type=field.type) for column, field in zip(columns, schema, strict=True)]
        pq.write_table(pa.Table.from_arrays(arrays, schema=schema), self._fh, compression="zstd")


class JsonLinesSink(_WholeFileSink):
    def _write_payload(self, name: str, payload: list[dict]) -> None:
        for item in payload:
            self._fh.write(json.dumps(item, sort_keys=True).encode("utf-8") + b"\n")


_SINKS = {TFRECORD_SUFFIX: TFRecordShardSink, PARQUET_SUFFIX: ParquetShardSink, ".jsonl": JsonLinesSink}


def _sink_for(file_name: str) -> fileio.FileSink:
    for suffix, sink in _SINKS.items():
        if file_name.endswith(suffix):
            return sink()
    raise ValueError(f"no sink for output file {file_name!r}")


class WriteWholeFiles(beam.PTransform):
    """Write (file name, payload) elements, one element per file, under ``directory`` with those names."""

    def __init__(self, directory: str, temp_directory: str) -> None:
        super().__init__()
        self._directory = directory
        self._temp_directory = temp_directory

    def expand(self, files):
        return files | fileio.WriteToFiles(
            path=self._directory,
            destination=lambda element: element[0],
            sink=_sink_for,
            file_naming=lambda window, pane, shard, total, compression, destination: destination,
            temp_directory=StaticValueProvider(str, self._temp_directory),
            shards=1,
        )


class ShardTransitions(beam.PTransform):
    """Transitions (dicts) -> (file name, payload) elements: TFRecord and Parquet per surface and shard.

    Every shard of every surface is produced, empty ones too, so a dataset's layout depends only on
    ``num_shards`` and never on what the data happened to contain.
    """

    def __init__(self, num_shards: int) -> None:
        super().__init__()
        if num_shards < 1:
            raise ValueError(f"num_shards should be at least 1, but is {num_shards}")
        self._num_shards = num_shards

    def expand(self, transitions):
        n = self._num_shards
        placeholders = transitions.pipeline | "EveryShard" >> beam.Create(
            [((surface, shard), None) for surface in SURFACE_SIGNALS for shard in range(n)]
        )
        # Encoding happens before the shuffle, fused with whatever produced the rows: the shuffle then
        # carries compact bytes and tuples instead of dicts of lists.
        keyed = transitions | "EncodeAndKey" >> beam.Map(_encode_row, n)
        return (
            (keyed, placeholders)
            | "AllShards" >> beam.Flatten()
            | "GroupShards" >> beam.GroupByKey()
            | "ShardFiles" >> beam.FlatMap(_shard_files, n)
        )


def _encode_row(row: dict, num_shards: int):
    """((surface, shard), (sort key, Example bytes, Parquet values in schema order))."""
    parquet_row = to_parquet_row(row)
    values = tuple(parquet_row[name] for name in parquet_schema(row["surface"]).names)
    return (row["surface"], shard_of(row["session_id"], num_shards)), (
        row_sort_key(row),
        to_example(row),
        values,
    )


def _shard_files(element: tuple[tuple[str, int], Any], num_shards: int):
    (surface, shard), encoded = element
    ordered = sorted((item for item in encoded if item is not None), key=lambda item: item[0])
    name = shard_name(surface, shard, num_shards)
    yield name + TFRECORD_SUFFIX, [example for _, example, _ in ordered]
    yield name + PARQUET_SUFFIX, (surface, [values for _, _, values in ordered])
