"""Transition records as files: tf.train.Example and Parquet encodings, and deterministic sharding.

Rows are assigned to a shard by a stable hash of their episode and each shard is sorted and handed to
``pipelines.whole_files.WriteWholeFiles`` as one element, so the same input gives byte-identical files
on any runner.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

import apache_beam as beam
import pyarrow as pa

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
    yield name + PARQUET_SUFFIX, _arrow_table(surface, [values for _, _, values in ordered])


def _arrow_table(surface: str, rows: list[tuple]) -> pa.Table:
    schema = parquet_schema(surface)
    columns = list(zip(*rows, strict=True)) if rows else [[] for _ in schema]
    arrays = [pa.array(column, type=field.type) for column, field in zip(columns, schema, strict=True)]
    return pa.Table.from_arrays(arrays, schema=schema)
