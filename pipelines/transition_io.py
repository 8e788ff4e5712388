"""Transition records as files: tf.train.Example and Parquet encodings, and deterministic sharding.

Rows are assigned to a shard by a stable hash of their episode and each shard is sorted and handed to
``recsys_rl.pipelines.whole_files.WriteWholeFiles`` as one element, so the same input gives
byte-identical files on any runner.
"""

from __future__ import annotations

import functools
import hashlib
from collections import defaultdict
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa

from recsys_rl.pipelines.episodes import SURFACE_SIGNALS, float32_bytes
from recsys_rl.pipelines.whole_files import parquet_file, tfrecord_file

TFRECORD_SUFFIX = ".tfrecord"
PARQUET_SUFFIX = ".parquet"

_STRING_FIELDS = (
    "request_id",
    "user_id",
    "session_id",
    "surface",
    "policy_version",
    "features_missing_reason",
)
_INT_FIELDS = (
    "step",
    "event_time_ms",
    "next_event_time_ms",
    "user_group",
    "features_missing",
    "deterministic",  # 1: the action was the policy's mode, and log_propensity no behaviour propensity
    "done",
    "feedback_count",
)
_FLOAT_LIST_FIELDS = ("state", "next_state", "action")


def shard_of(session_id: str, num_shards: int) -> int:
    """Stable across processes and Python versions (unlike ``hash``), so reruns shard identically."""
    digest = hashlib.blake2b(session_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % num_shards


def shard_name(surface: str, shard: int, num_shards: int) -> str:
    return f"transitions-{surface}-{shard:05d}-of-{num_shards:05d}"


def _varint(n: int) -> bytes:
    """Protobuf base-128 varint; a negative int64 is written as its 64-bit two's complement."""
    if 0 <= n < 0x80:
        return _SMALL_VARINTS[n]
    n &= 0xFFFF_FFFF_FFFF_FFFF
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL_VARINTS = [bytes((n,)) for n in range(0x80)]
# Tags (field number << 3 | 2, length-delimited) of fields 1, 2 and 3. Every message on the way to a
# value uses field 1 (Example.features, Features.feature, the list's values), except the map entry's
# value (2) and Feature's float_list (2) and int64_list (3).
_TAG_1, _TAG_2 = b"\x0a", b"\x12"
_BYTES, _FLOATS, _INTS = 0x0A, 0x12, 0x1A


def _message(tag: bytes, payload: bytes) -> bytes:
    return tag + _varint(len(payload)) + payload


@functools.cache
def _key(name: str) -> bytes:
    return _message(_TAG_1, name.encode("utf-8"))


def _entry(name: str, kind: int, values: bytes) -> bytes:
    """One ``Features.feature`` map entry, as a field of Features, of a list message's bytes ``values``.

    An entry under 128 bytes, the common case, has one-byte lengths and is put together in one step.
    """
    key = _key(name)
    n = len(values)
    size = len(key) + n + 4
    if size < 0x80:
        return bytes((0x0A, size)) + key + bytes((0x12, n + 2, kind, n)) + values
    return _message(_TAG_1, key + _message(_TAG_2, _message(bytes((kind,)), values)))


def _string_entry(name: str, value: str) -> bytes:
    return _entry(name, _BYTES, _message(_TAG_1, value.encode("utf-8")))


def _int_entry(name: str, value: int) -> bytes:
    return _entry(name, _INTS, _message(_TAG_1, _varint(value)))


# Values repeat from row to row: the int features take few values (step, group, done, counts), a
# step's time is the previous step's next time, a user's and a session's rows are adjacent, and one
# policy version or surface fills many rows. Only the request id is new in every row.
_repeated_int_entry = functools.lru_cache(maxsize=4096)(_int_entry)
_repeated_string_entry = functools.lru_cache(maxsize=4096)(_string_entry)
_REPEATED_STRINGS = tuple(name for name in _STRING_FIELDS if name != "request_id")


@functools.cache
def _float_entry_prefix(name: str, count: int) -> bytes:
    """A float-list entry up to its packed floats: fixed for a name and a count of values."""
    packed = bytes(4 * count)
    entry = _entry(name, _FLOATS, _message(_TAG_1, packed) if count else b"")  # empty list: no field
    return entry[: len(entry) - len(packed)]


@functools.cache
def _example_keys(surface: str) -> tuple[str, ...]:
    """The surface's feature names in the order deterministic serialisation writes map entries.

    That order (protobuf's upb) is by the bytes of the key, except that a key goes after the keys that
    extend it ("features_missing_reason" before "features_missing"): as if each key ended with a byte
    greater than all others.
    """
    names = [*_STRING_FIELDS, *_INT_FIELDS, *_FLOAT_LIST_FIELDS, "log_propensity"]
    names += [f"reward/{signal}" for signal in SURFACE_SIGNALS[surface]]
    return tuple(sorted(names, key=lambda name: (*name.encode("utf-8"), 256)))


def _packed_lists(row: dict) -> list[bytes]:
    """The row's float lists as float32_bytes: both file formats store float32."""
    return [float32_bytes(row[name]) for name in _FLOAT_LIST_FIELDS]


def to_example(row: dict) -> bytes:
    """A transition as a serialized ``tf.train.Example``: a feature per field, rewards as ``reward/<signal>``.

    Written straight in the protobuf wire format, byte for byte what ``SerializeToString(deterministic=
    True)`` of the message gives (map entries sorted by key, packed numbers): building the message
    through the protobuf API cost ~25 us a row, the largest cost of the pipeline after reading.
    """
    return _example(row, _packed_lists(row))


def _example(row: dict, lists: list[bytes]) -> bytes:
    surface = row["surface"]
    entries = {"request_id": _string_entry("request_id", row["request_id"])}
    for name in _REPEATED_STRINGS:
        entries[name] = _repeated_string_entry(name, row[name])
    for name in _INT_FIELDS:
        entries[name] = _repeated_int_entry(name, int(row[name]))
    for name, packed in zip(_FLOAT_LIST_FIELDS, lists, strict=True):
        entries[name] = _float_entry_prefix(name, len(packed) // 4) + packed
    scalars = float32_bytes([row["log_propensity"], *row["reward"]])
    for i, (name, prefix) in enumerate(_scalar_float_prefixes(surface)):
        entries[name] = prefix + scalars[4 * i : 4 * i + 4]
    return _message(_TAG_1, b"".join([entries[name] for name in _example_keys(surface)]))


@functools.cache
def _scalar_float_prefixes(surface: str) -> tuple[tuple[str, bytes], ...]:
    names = ("log_propensity", *(f"reward/{signal}" for signal in SURFACE_SIGNALS[surface]))
    return tuple((name, _float_entry_prefix(name, 1)) for name in names)


@functools.cache
def parquet_schema(surface: str) -> pa.Schema:
    fields = [pa.field(name, pa.string()) for name in _STRING_FIELDS]
    fields += [pa.field(name, pa.int64()) for name in _INT_FIELDS]
    fields += [pa.field(name, pa.list_(pa.float32())) for name in _FLOAT_LIST_FIELDS]
    fields.append(pa.field("log_propensity", pa.float64()))
    fields += [pa.field(f"reward_{signal}", pa.float64()) for signal in SURFACE_SIGNALS[surface]]
    return pa.schema(fields)


def parquet_values(row: dict, lists: list[bytes] | None = None) -> tuple:
    """The row's values in ``parquet_schema`` order, its float lists as float32_bytes (``lists``)."""
    return (
        *[row[name] for name in _STRING_FIELDS],
        *[int(row[name]) for name in _INT_FIELDS],
        *(_packed_lists(row) if lists is None else lists),
        row["log_propensity"],
        *row["reward"],
    )


def parquet_table(surface: str, rows: list[tuple]) -> pa.Table:
    """Rows of `parquet_values` -> the surface's Arrow table; float lists go in as buffers."""
    schema = parquet_schema(surface)
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
    arrays = [
        _float_lists(column) if field.name in _FLOAT_LIST_FIELDS else pa.array(column, type=field.type)
        for column, field in zip(columns, schema, strict=True)
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def _float_lists(column: tuple[bytes, ...]) -> pa.Array:
    offsets = np.zeros(len(column) + 1, dtype=np.int32)
    np.cumsum([len(packed) // 4 for packed in column], out=offsets[1:])
    values = np.frombuffer(b"".join(column), dtype="<f4")
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=pa.float32()))


class ShardTransitions(beam.PTransform):
    """Lists of transitions (dicts) -> (file name, file bytes) elements: TFRecord and Parquet per shard.

    Rows come in lists (a user's, say) and go to the shuffle as one element per shard of the list:
    every element costs the runner microseconds, whatever it holds. Every shard of every surface is
    produced, empty ones too, so a dataset's layout depends only on ``num_shards`` and never on what
    the data happened to contain.
    """

    def __init__(self, num_shards: int) -> None:
        super().__init__()
        if num_shards < 1:
            raise ValueError(f"num_shards should be at least 1, but is {num_shards}")
        self._num_shards = num_shards

    def expand(self, row_lists):
        n = self._num_shards
        # Encoding happens before the shuffle, fused with whatever produced the rows: the shuffle then
        # carries compact bytes and tuples instead of dicts of lists.
        grouped = (
            row_lists | "EncodeAndKey" >> beam.FlatMap(_encode_rows, n) | "GroupShards" >> beam.GroupByKey()
        )
        files = grouped | "ShardFiles" >> beam.FlatMap(_shard_files, n)
        # Shards no row fell in get their (empty) files from a few static elements, told by a side
        # input which shards had rows. Flattening those elements into the shuffle's input instead
        # would make a runner like the FnApiRunner copy every encoded row through one more stage.
        empty = (
            row_lists.pipeline
            | "EveryShard"
            >> beam.Create(
                [(surface, shard) for surface in SURFACE_SIGNALS for shard in range(n)], reshuffle=False
            )
            | "EmptyShardFiles"
            >> beam.FlatMap(
                _empty_shard_files, n, beam.pvalue.AsList(grouped | "ShardsWithRows" >> beam.Keys())
            )
        )
        return (files, empty) | "AllShardFiles" >> beam.Flatten()


def _encode_rows(rows: list[dict], num_shards: int):
    """((surface, shard), [(Example bytes, Parquet values), ...]) for each shard the rows fall in."""
    by_shard = defaultdict(list)
    shards: dict[str, int] = {}  # a session's rows are adjacent and share a shard
    for row in rows:
        session_id = row["session_id"]
        shard = shards.get(session_id)
        if shard is None:
            shard = shards[session_id] = shard_of(session_id, num_shards)
        lists = _packed_lists(row)
        by_shard[(row["surface"], shard)].append((_example(row, lists), parquet_values(row, lists)))
    return by_shard.items()


# a shard's rows are sorted by (session_id, step, request_id): the positions of those in the values
_SORT_FIELDS = tuple(parquet_schema("feed").names.index(n) for n in ("session_id", "step", "request_id"))


def _shard_files(element: tuple[tuple[str, int], Any], num_shards: int):
    (surface, shard), encoded = element
    session, step, request = _SORT_FIELDS
    ordered = sorted(
        (item for items in encoded for item in items),
        key=lambda item: (item[1][session], item[1][step], item[1][request]),
    )
    name = shard_name(surface, shard, num_shards)
    yield name + TFRECORD_SUFFIX, tfrecord_file([example for example, _ in ordered])
    yield name + PARQUET_SUFFIX, parquet_file(parquet_table(surface, [values for _, values in ordered]))


def _empty_shard_files(key: tuple[str, int], num_shards: int, shards_with_rows: list[tuple[str, int]]):
    if key not in shards_with_rows:
        yield from _shard_files((key, []), num_shards)
