"""Per-day user, item and author aggregates of view facts, written as Feast's offline store (DESIGN 5, 6).

Input: one view fact per joined, validated feedback event (a dict, see ``FACT_FIELDS``). Output, per
feature table, Parquet files under ``<offline_root>/<table name>/``, one file per UTC day and shard, named
``<YYYY-MM-DD>-<shard>-of-<shards>.parquet``. A rerun over the same days replaces those days' files, so
successive runs over disjoint days add up in one offline root, and a rerun over the same facts rewrites
byte-identical files.

Each row holds one entity's statistics of one UTC day, stamped with the *end* of that day (midnight
UTC that starts the next day). Feast's point-in-time join takes the latest row whose timestamp is at or
before the entity timestamp, so a training example from the middle of a day never sees the statistics
of that same day, which include what happened after it: the leak that would make offline training
disagree with serving, where only finished days have been materialised.

Determinism on any runner and bundle order: sums are exact integers of micro-units (a millionth of a
second, count or coin), so the order of addition cannot change a bit, and a day's rates are exact to
that resolution; each file's rows are grouped,
sorted by entity id and written as one element; the shard of an entity is a stable hash of its id.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics

from pipelines.whole_files import WriteWholeFiles
from recsys_rl.state import ACTIVITY_GROUPS

TIMESTAMP_COLUMN = "event_timestamp"
PARQUET_SUFFIX = ".parquet"
ITEM_TYPES = ("video", "live")

_DAY_MS = 86_400_000
_SIGNAL_FIELDS = (
    "watch_time_s",
    "click",
    "like",
    "follow",
    "comment",
    "share",
    "hate",
    "live_watch_s",
    "gift",
)
FACT_FIELDS: dict[str, type | tuple[type, ...]] = {
    "user_id": str,
    "user_group": int,
    "item_id": str,
    "author_id": str,
    "item_type": str,
    "event_time_ms": int,
    **{name: (int, float) for name in _SIGNAL_FIELDS},
}

# Fixed point: sums of these integers are exact in any order, and int / int (correctly rounded in
# Python) turns them back into rates.
_ONE = 1_000_000  # micro-units: small integers keep the per-view arithmetic on Python's fast path


@dataclass(frozen=True)
class FeatureColumn:
    name: str
    dtype: str  # "int64" | "float64"; rates are null when their denominator is zero
    description: str


@dataclass(frozen=True)
class FeatureTable:
    """One Feast feature view's offline data: its directory, entity key column and feature columns."""

    name: str
    join_key: str
    columns: tuple[FeatureColumn, ...]

    @property
    def feature_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def arrow_schema(self) -> pa.Schema:
        types = {"int64": pa.int64(), "float64": pa.float64()}
        return pa.schema(
            [
                pa.field(self.join_key, pa.string(), nullable=False),
                pa.field(TIMESTAMP_COLUMN, pa.timestamp("us", tz="UTC"), nullable=False),
                *(pa.field(c.name, types[c.dtype]) for c in self.columns),
            ]
        )


def _views(what: str) -> FeatureColumn:
    return FeatureColumn("views", "int64", f"{what} in the UTC day")


def _rate(name: str, what: str, per: str = "view") -> FeatureColumn:
    return FeatureColumn(name, "float64", f"{what} per {per} in the UTC day; null without any {per}")


_GROUP_NAMES = ", ".join(f"{i} {name}" for i, name in enumerate(ACTIVITY_GROUPS))
_VIDEO_VIEW = "short-video view"  # a user's feed engagement, as in recsys_rl.sim.history
USER_ENGAGEMENT = FeatureTable(
    "user_engagement",
    "user_id",
    (
        FeatureColumn("activity_group", "int64", f"activity group at the day's last view ({_GROUP_NAMES})"),
        _views("short-video views"),
        _rate("click_rate", "clicks", per=_VIDEO_VIEW),
        _rate("like_rate", "likes", per=_VIDEO_VIEW),
        _rate("watch_s_per_view", "watch seconds", per=_VIDEO_VIEW),
        _rate("interaction_rate", "likes + follows + comments + shares", per=_VIDEO_VIEW),
        _rate("hate_rate", "'not interested' marks", per=_VIDEO_VIEW),
        FeatureColumn("live_views", "int64", "live-stream views in the UTC day"),
        _rate("live_watch_s_per_live_view", "live watch seconds", per="live view"),
    ),
)
ITEM_STATS = FeatureTable(
    "item_stats",
    "item_id",
    (
        _views("views of the item"),
        _rate("click_rate", "clicks"),
        _rate("watch_s_per_view", "watch seconds (live seconds for a live stream)"),
        _rate("like_rate", "likes"),
        _rate("hate_rate", "'not interested' marks"),
    ),
)
AUTHOR_STATS = FeatureTable(
    "author_stats",
    "author_id",
    (_views("views of the author's items"), _rate("follow_rate", "follows of the author")),
)
FEATURE_TABLES: tuple[FeatureTable, ...] = (USER_ENGAGEMENT, ITEM_STATS, AUTHOR_STATS)


def _exact(value: float) -> int:
    return round(value * _ONE)


def _ratio(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


def _count(exact: int) -> int:
    return exact // _ONE


# Per table: the exact increments one fact contributes (all scaled by _ONE), and the feature values of
# a day's sums. The user view follows the simulator's history (recsys_rl.sim.history): feed engagement
# is measured on short-video views, live engagement on live views.
def _user_increments(f: Mapping[str, Any]) -> tuple[int, ...]:
    if f["item_type"] == "live":
        return (0, 0, 0, 0, 0, 0, _ONE, _exact(f["live_watch_s"]))
    interactions = _exact(f["like"]) + _exact(f["follow"]) + _exact(f["comment"]) + _exact(f["share"])
    return (
        _ONE,
        *(_exact(f[k]) for k in ("click", "like", "watch_time_s")),
        interactions,
        _exact(f["hate"]),
        0,
        0,
    )


def _user_features(s: tuple[int, ...], group: int | None) -> dict[str, Any]:
    views, clicks, likes, watch, interactions, hates, live_views, live_watch = s
    return {
        "activity_group": group,
        "views": _count(views),
        "click_rate": _ratio(clicks, views),
        "like_rate": _ratio(likes, views),
        "watch_s_per_view": _ratio(watch, views),
        "interaction_rate": _ratio(interactions, views),
        "hate_rate": _ratio(hates, views),
        "live_views": _count(live_views),
        "live_watch_s_per_live_view": _ratio(live_watch, live_views),
    }


def _item_increments(f: Mapping[str, Any]) -> tuple[int, ...]:
    watch = _exact(f["watch_time_s"]) + _exact(f["live_watch_s"])  # the contract zeroes the other one
    return (_ONE, _exact(f["click"]), watch, _exact(f["like"]), _exact(f["hate"]))


def _item_features(s: tuple[int, ...], group: int | None) -> dict[str, Any]:
    views, clicks, watch, likes, hates = s
    return {
        "views": _count(views),
        "click_rate": _ratio(clicks, views),
        "watch_s_per_view": _ratio(watch, views),
        "like_rate": _ratio(likes, views),
        "hate_rate": _ratio(hates, views),
    }


def _author_increments(f: Mapping[str, Any]) -> tuple[int, ...]:
    return (_ONE, _exact(f["follow"]))


def _author_features(s: tuple[int, ...], group: int | None) -> dict[str, Any]:
    views, follows = s
    return {"views": _count(views), "follow_rate": _ratio(follows, views)}


@dataclass(frozen=True)
class _Aggregation:
    table: FeatureTable
    increments: Callable[[Mapping[str, Any]], tuple[int, ...]]
    features: Callable[[tuple[int, ...], int | None], dict[str, Any]]
    tracks_group: bool = False


_AGGREGATIONS = (
    _Aggregation(USER_ENGAGEMENT, _user_increments, _user_features, tracks_group=True),
    _Aggregation(ITEM_STATS, _item_increments, _item_features),
    _Aggregation(AUTHOR_STATS, _author_increments, _author_features),
)
_BY_TABLE = {agg.table.name: agg for agg in _AGGREGATIONS}
_TABLE_INDEX = {table.name: i for i, table in enumerate(FEATURE_TABLES)}

# (sums, latest (event_time_ms, group) or None)
_Accumulator = tuple[tuple[int, ...], tuple[int, int] | None]


class _ExactDaySums(beam.CombineFn):
    """Element-wise exact sums, plus the group of the latest view; order-free, so any bundling agrees.

    Two views in the same millisecond with different groups resolve to the higher id (the less active
    group), the conservative reading of an ambiguous day.
    """

    # The accumulator is mutated in place: this combine sees every view fact three times (user, item,
    # author), so allocating new tuples per input was the aggregation's largest cost.
    def create_accumulator(self) -> list:
        return [[], None]

    def add_input(self, acc: list, value: _Accumulator) -> list:
        sums, latest = acc
        part, part_latest = value
        if len(part) > len(sums):
            sums.extend([0] * (len(part) - len(sums)))
        for i, v in enumerate(part):
            sums[i] += v
        if part_latest is not None and (latest is None or part_latest > latest):
            acc[1] = part_latest
        return acc

    def merge_accumulators(self, accumulators: Iterable[list]) -> list:
        merged = self.create_accumulator()
        for acc in accumulators:
            self.add_input(merged, (acc[0], acc[1]))
        return merged

    def extract_output(self, acc: list) -> _Accumulator:
        return tuple(acc[0]), acc[1]


def _day_of(event_time_ms: int) -> int:
    return event_time_ms // _DAY_MS


def day_end(day: int) -> dt.datetime:
    """The timestamp of a day's row: the first instant after the day (see the module docstring)."""
    return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(days=day + 1)


def shard_of(entity_id: str, num_shards: int) -> int:
    """Stable across processes and Python versions (unlike ``hash``), so reruns shard identically."""
    digest = hashlib.blake2b(entity_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % num_shards


def file_name(day: int, shard: int, num_shards: int) -> str:
    date = (dt.date(1970, 1, 1) + dt.timedelta(days=day)).isoformat()
    return f"{date}-{shard:05d}-of-{num_shards:05d}{PARQUET_SUFFIX}"


def _increments(fact: Mapping[str, Any]):
    """((table, entity id, day), (exact increments, latest view or None)) for each table."""
    Metrics.counter("feature_aggregates", "view_facts").inc()
    day = _day_of(fact["event_time_ms"])
    for agg in _AGGREGATIONS:
        latest = (fact["event_time_ms"], fact["user_group"]) if agg.tracks_group else None
        yield (agg.table.name, fact[agg.table.join_key], day), (agg.increments(fact), latest)


def _to_row(element) -> tuple[str, int, dict[str, Any]]:
    (table, entity_id, day), (sums, latest) = element
    agg = _BY_TABLE[table]
    Metrics.counter("feature_aggregates", f"rows_{table}").inc()
    row = {agg.table.join_key: entity_id, **agg.features(sums, latest[1] if latest else None)}
    return table, day, row


def _table_of(rows: Iterable[dict[str, Any]], table: FeatureTable, day: int) -> pa.Table:
    ordered = sorted(rows, key=lambda row: row[table.join_key])
    columns: dict[str, list[Any]] = {table.join_key: [row[table.join_key] for row in ordered]}
    columns[TIMESTAMP_COLUMN] = [day_end(day)] * len(ordered)
    for name in table.feature_names:
        columns[name] = [row[name] for row in ordered]
    return pa.Table.from_pydict(columns, schema=table.arrow_schema())


def _file_of(element, num_shards: int) -> tuple[str, pa.Table]:
    (table, day, shard), rows = element
    return file_name(day, shard, num_shards), _table_of(
        (r for r in rows if r is not None), _BY_TABLE[table].table, day
    )


class WriteFeatureAggregates(beam.PTransform):
    """View facts -> per-day user, item and author aggregates as Parquet under ``offline_root/<table>/``.

    Returns the paths of the files written. ``num_shards`` files per table and day bound the rows one
    worker sorts; keep it fixed for an offline root, since it is part of the file names. Temporary files
    go under ``offline_root/.beam-temp`` (Parquet readers skip it: it starts with a dot).
    """

    def __init__(self, offline_root: str, *, num_shards: int = 1) -> None:
        super().__init__()
        if not offline_root:
            raise ValueError("offline_root should be a directory, but is empty")
        if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
            raise ValueError(f"num_shards should be a whole number >= 1, but is {num_shards!r}")
        self._root = offline_root.rstrip("/")
        self._num_shards = num_shards

    def expand(self, facts):
        n = self._num_shards
        rows = (
            facts
            | "Increments" >> beam.FlatMap(_increments)
            | "SumPerEntityDay" >> beam.CombinePerKey(_ExactDaySums())
            | "ToRow" >> beam.Map(_to_row)
        )
        # Every shard of every day with data gets a file, empty or not: the layout of a day depends on
        # num_shards only, never on which ids happened to hash where.
        placeholders = (
            rows
            | "TableDays" >> beam.Map(lambda row: row[:2])
            | "DistinctTableDays" >> beam.Distinct()
            | "EveryShard" >> beam.FlatMap(lambda td: [((*td, shard), None) for shard in range(n)])
        )
        keyed = rows | "KeyByFile" >> beam.Map(
            lambda r: ((r[0], r[1], shard_of(r[2][_BY_TABLE[r[0]].table.join_key], n)), r[2])
        )
        by_table = (
            (keyed, placeholders)
            | "AllFiles" >> beam.Flatten()
            | "GroupByFile" >> beam.GroupByKey()
            | "ByTable" >> beam.Partition(lambda element, _: _TABLE_INDEX[element[0][0]], len(FEATURE_TABLES))
        )
        written = [
            by_table[i]
            | f"ToTable_{table.name}" >> beam.Map(_file_of, n)
            | f"Write_{table.name}"
            >> WriteWholeFiles(f"{self._root}/{table.name}", f"{self._root}/.beam-temp/{table.name}")
            for i, table in enumerate(FEATURE_TABLES)
        ]
        return written | "AllWritten" >> beam.Flatten()
