"""Transition records as files: tf.train.Example and Parquet encodings, and deterministic sharding.

Rows are assigned to a shard by a stable hash of their episode and each shard is sorted and handed to
``recsys_rl.pipelines.whole_files.WriteWholeFiles`` as one element, so the same input gives
byte-identical files on any runner.
"""

from __future__ import annotations

import functools
import hashlib
import operator
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import apache_beam as beam
import numpy as np
import pyarrow as pa

from recsys_rl.dataset_contract import DATASET_SIGNALS, REQUEST_SURFACES, USER_AUTHOR
from recsys_rl.pipelines.episodes import float32_bytes
from recsys_rl.pipelines.whole_files import parquet_file, tfrecord_file

if TYPE_CHECKING:
    from recsys_rl.ope.logged import LoggedSteps

TFRECORD_SUFFIX = ".tfrecord"
PARQUET_SUFFIX = ".parquet"


@dataclass(frozen=True)
class RowLayout:
    """The fields of one kind of transition row, by type, and how its rows are sharded and ordered.

    Every file of a surface holds its layout's fields and ``reward/<signal>`` (``reward_<signal>`` in
    Parquet) per signal of the surface; scalar floats are float32 in Examples and float64 in Parquet,
    as the rewards are.
    """

    strings: tuple[str, ...]
    ints: tuple[str, ...]
    float_lists: tuple[str, ...]
    floats: tuple[str, ...]
    unique: str  # the string field new in nearly every row: not worth caching its encoded entry
    shard_by: str  # rows that share its value share a shard
    order: tuple[str, ...]  # a shard's rows are sorted by these

    @functools.cached_property
    def repeated_strings(self) -> tuple[str, ...]:
        """The string fields but ``unique``: read for every row, so made once."""
        return tuple(name for name in self.strings if name != self.unique)


#: Rows of the request surfaces (feed, live allocation): one per decision, sharded by session.
REQUEST_LAYOUT = RowLayout(
    strings=(
        "request_id",
        "user_id",
        "session_id",
        "surface",
        "policy_version",
        "features_missing_reason",
        "user_author_term_id",  # the term function a Rank's user-author term used; "" for none
    ),
    ints=(
        "step",
        "event_time_ms",
        "next_event_time_ms",
        "user_group",
        "features_missing",
        "deterministic",  # 1: the action was the policy's mode, and log_propensity no behaviour propensity
        "done",
        "feedback_count",
    ),
    # predicted_reward: per signal of the surface, the upstream model's predictions summed over the viewed
    # items (``pipelines.episodes._predicted_rewards``); pair_reward: per signal of the user-author
    # surface, its rewards summed over the request's views (``pipelines.user_author.with_pair_rewards``;
    # zeros in a dataset built without that surface)
    float_lists=("state", "next_state", "action", "predicted_reward", "pair_reward"),
    floats=("log_propensity", "user_author_weight_logit", "user_author_log_propensity"),
    unique="request_id",
    shard_by="session_id",
    order=("session_id", "step", "request_id"),
)
#: Rows of the user-author surface (``pipelines.user_author``): one per interaction of a pair, sharded
#: by user so that a pair's chain of steps stays in one shard.
PAIR_LAYOUT = RowLayout(
    strings=("user_id", "author_id", "request_id", "item_id", "item_type", "surface"),
    ints=("pair_step", "event_time_ms", "next_event_time_ms", "truncated"),
    float_lists=("state", "next_state"),
    floats=("gap_days",),
    unique="item_id",
    shard_by="user_id",
    order=("user_id", "author_id", "pair_step"),
)
LAYOUTS: dict[str, RowLayout] = {
    surface: PAIR_LAYOUT if surface == USER_AUTHOR else REQUEST_LAYOUT for surface in DATASET_SIGNALS
}


def shard_of(key: str, num_shards: int) -> int:
    """Stable across processes and Python versions (unlike ``hash``), so reruns shard identically."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
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
# policy version or surface fills many rows. Only the layout's ``unique`` field is new in every row.
_repeated_int_entry = functools.lru_cache(maxsize=4096)(_int_entry)
_repeated_string_entry = functools.lru_cache(maxsize=4096)(_string_entry)


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
    layout = LAYOUTS[surface]
    names = [*layout.strings, *layout.ints, *layout.float_lists, *layout.floats]
    names += [f"reward/{signal}" for signal in DATASET_SIGNALS[surface]]
    return tuple(sorted(names, key=lambda name: (*name.encode("utf-8"), 256)))


def _packed_lists(row: dict, layout: RowLayout) -> list[bytes]:
    """The row's float lists as float32_bytes: both file formats store float32."""
    return [float32_bytes(row[name]) for name in layout.float_lists]


def to_example(row: dict) -> bytes:
    """A transition as a serialized ``tf.train.Example``: a feature per field, rewards as ``reward/<signal>``.

    Written straight in the protobuf wire format, byte for byte what ``SerializeToString(deterministic=
    True)`` of the message gives (map entries sorted by key, packed numbers): building the message
    through the protobuf API cost ~25 us a row, the largest cost of the pipeline after reading.
    """
    layout = LAYOUTS[row["surface"]]
    return _example(row, layout, _packed_lists(row, layout))


def _example(row: dict, layout: RowLayout, lists: list[bytes]) -> bytes:
    surface = row["surface"]
    entries = {layout.unique: _string_entry(layout.unique, row[layout.unique])}
    for name in layout.repeated_strings:
        entries[name] = _repeated_string_entry(name, row[name])
    for name in layout.ints:
        entries[name] = _repeated_int_entry(name, int(row[name]))
    for name, packed in zip(layout.float_lists, lists, strict=True):
        entries[name] = _float_entry_prefix(name, len(packed) // 4) + packed
    scalars = float32_bytes([*map(row.__getitem__, layout.floats), *row["reward"]])
    for i, (name, prefix) in enumerate(_scalar_float_prefixes(surface)):
        entries[name] = prefix + scalars[4 * i : 4 * i + 4]
    return _message(_TAG_1, b"".join([entries[name] for name in _example_keys(surface)]))


@functools.cache
def _scalar_float_prefixes(surface: str) -> tuple[tuple[str, bytes], ...]:
    names = (*LAYOUTS[surface].floats, *(f"reward/{signal}" for signal in DATASET_SIGNALS[surface]))
    return tuple((name, _float_entry_prefix(name, 1)) for name in names)


@functools.cache
def parquet_schema(surface: str) -> pa.Schema:
    layout = LAYOUTS[surface]
    fields = [pa.field(name, pa.string()) for name in layout.strings]
    fields += [pa.field(name, pa.int64()) for name in layout.ints]
    fields += [pa.field(name, pa.list_(pa.float32())) for name in layout.float_lists]
    fields += [pa.field(name, pa.float64()) for name in layout.floats]
    fields += [pa.field(f"reward_{signal}", pa.float64()) for signal in DATASET_SIGNALS[surface]]
    return pa.schema(fields)


def feed_steps_table(logged: LoggedSteps, **columns: Any) -> pa.Table:
    """Logged feed steps as a feed shard's table in the pipeline's schema, in their order: what OPE reads
    back (``LoggedSteps.from_parquet``), for benchmarks and tests that log without Kafka. ``columns``
    replace the defaults (a 2-D array stands for a float-list column): blank ids and times, nothing
    deterministic, no user-author term, no predictions (predicted rewards 0), pair rewards 0."""
    n = logged.rows

    def lists(matrix: np.ndarray) -> pa.Array:
        offsets = pa.array(np.arange(n + 1, dtype=np.int32) * matrix.shape[1])
        return pa.ListArray.from_arrays(offsets, pa.array(matrix.astype(np.float32).ravel()))

    blank, zeros = [""] * n, np.zeros(n, np.int64)
    table = {
        "request_id": [f"r{i}" for i in range(n)],
        "user_id": [f"u{u}" for u in logged.user],
        "session_id": [f"s{s:06d}" for s in logged.session],  # zero-padded: string order is session order
        "surface": ["feed"] * n,
        "policy_version": blank,
        "features_missing_reason": blank,
        "user_author_term_id": blank,
        "step": logged.step,
        "event_time_ms": zeros,
        "next_event_time_ms": zeros,
        "user_group": logged.groups,
        "features_missing": zeros,
        "deterministic": zeros,
        "done": logged.done.astype(np.int64),
        "feedback_count": zeros,
        "state": lists(logged.states),
        "next_state": lists(logged.next_states),
        "action": lists(logged.actions),
        "predicted_reward": lists(np.zeros_like(logged.rewards)),
        "pair_reward": lists(np.zeros((n, len(DATASET_SIGNALS[USER_AUTHOR])))),
        "log_propensity": logged.behaviour_log_prob,
        "user_author_weight_logit": np.zeros(n),
        "user_author_log_propensity": np.zeros(n),
        **{f"reward_{s}": logged.rewards[:, i] for i, s in enumerate(DATASET_SIGNALS["feed"])},
        **{name: lists(np.asarray(v)) if np.ndim(v) == 2 else v for name, v in columns.items()},
    }
    return pa.Table.from_pydict(table, schema=parquet_schema("feed"))


def parquet_values(row: dict, lists: list[bytes] | None = None) -> tuple:
    """The row's values in ``parquet_schema`` order, its float lists as float32_bytes (``lists``)."""
    layout = LAYOUTS[row["surface"]]
    return (
        *[row[name] for name in layout.strings],
        *[int(row[name]) for name in layout.ints],
        *(_packed_lists(row, layout) if lists is None else lists),
        *[row[name] for name in layout.floats],
        *row["reward"],
    )


def parquet_table(surface: str, rows: list[tuple]) -> pa.Table:
    """Rows of `parquet_values` -> the surface's Arrow table; float lists go in as buffers."""
    schema = parquet_schema(surface)
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
    float_lists = LAYOUTS[surface].float_lists
    arrays = [
        _float_lists(column) if field.name in float_lists else pa.array(column, type=field.type)
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
    every element costs the runner microseconds, whatever it holds. Every shard of every one of
    ``surfaces`` is produced, empty ones too, so a dataset's layout depends only on them and
    ``num_shards`` and never on what the data happened to contain.
    """

    def __init__(self, num_shards: int, surfaces: Sequence[str] = REQUEST_SURFACES) -> None:
        super().__init__()
        if num_shards < 1:
            raise ValueError(f"num_shards should be at least 1, but is {num_shards}")
        self._num_shards = num_shards
        self._surfaces = tuple(surfaces)

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
                [(surface, shard) for surface in self._surfaces for shard in range(n)], reshuffle=False
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
    shards: dict[str, int] = {}  # rows that share a shard key are adjacent (a session's, a user's)
    for row in rows:
        surface = row["surface"]
        layout = LAYOUTS[surface]
        key = row[layout.shard_by]
        shard = shards.get(key)
        if shard is None:
            shard = shards[key] = shard_of(key, num_shards)
        lists = _packed_lists(row, layout)
        by_shard[(surface, shard)].append((_example(row, layout, lists), parquet_values(row, lists)))
    return by_shard.items()


@functools.cache
def _sort_key(surface: str) -> operator.itemgetter:
    """A row's Parquet values -> the fields its shard is sorted by."""
    names = parquet_schema(surface).names
    return operator.itemgetter(*(names.index(name) for name in LAYOUTS[surface].order))


def _shard_files(element: tuple[tuple[str, int], Any], num_shards: int):
    (surface, shard), encoded = element
    key = _sort_key(surface)
    ordered = sorted((item for items in encoded for item in items), key=lambda item: key(item[1]))
    name = shard_name(surface, shard, num_shards)
    yield name + TFRECORD_SUFFIX, tfrecord_file([example for example, _ in ordered])
    yield name + PARQUET_SUFFIX, parquet_file(parquet_table(surface, [values for _, values in ordered]))


def _empty_shard_files(key: tuple[str, int], num_shards: int, shards_with_rows: list[tuple[str, int]]):
    if key not in shards_with_rows:
        yield from _shard_files((key, []), num_shards)
