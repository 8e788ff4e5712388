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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa
from apache_beam.metrics import Metrics
from apache_beam.utils.windowed_value import WindowedValue

from recsys_rl.pipelines.whole_files import WriteWholeFiles, parquet_file
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
    "features_missing": bool,  # the decision's state came from default features: its group is not the user's
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
# Apart from the engagement, because only some views may set it: a decision served on default features
# logs the default group ("low active or unknown"), which says nothing about the user. A day whose views
# were all served that way writes no row, so the user keeps the group of their last day that had one.
USER_ACTIVITY = FeatureTable(
    "user_activity",
    "user_id",
    (
        FeatureColumn(
            "activity_group",
            "int64",
            f"activity group at the day's last view decided on the user's stored features ({_GROUP_NAMES})",
        ),
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
FEATURE_TABLES: tuple[FeatureTable, ...] = (USER_ENGAGEMENT, USER_ACTIVITY, ITEM_STATS, AUTHOR_STATS)


def _exact(values: list[float]) -> np.ndarray:
    """``round(value * _ONE)`` of each value as int64: the same IEEE product, rounded half to even.

    Exact below 2**53 micro-units (about nine billion seconds); the pipeline validates signals far
    below that, and sums stay in int64 for hundreds of millions of views per entity and day.
    """
    array = np.asarray(values)
    if array.dtype.kind in "iu":
        return array.astype(np.int64) * _ONE
    scaled = array.astype(np.float64) * _ONE
    if not np.all(np.abs(scaled) < 2.0**53):
        raise ValueError(f"view fact signals should be below {2**53 / _ONE:g}, but hold {values!r}")
    return np.rint(scaled).astype(np.int64)


def _ratio(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


def _count(exact: int) -> int:
    return exact // _ONE


def _increments(columns: Mapping[str, list]) -> tuple[np.ndarray, ...]:
    """The exact increments (all scaled by _ONE) each view fact adds to its user's, item's and author's day.

    ``columns`` holds the facts field by field. One row per fact, one column per sum of the table (in
    the order its features function unpacks). The user view follows the simulator's history
    (recsys_rl.sim.history): feed engagement is measured on short-video views, live engagement on
    live views.
    """
    signal = {name: _exact(columns[name]) for name in _USED_SIGNALS}
    live = np.array([item_type == "live" for item_type in columns["item_type"]], dtype=bool)
    video = ~live
    one = np.full(live.size, _ONE, dtype=np.int64)
    interactions = signal["like"] + signal["follow"] + signal["comment"] + signal["share"]
    user = np.stack(
        [
            *(column * video for column in (one, signal["click"], signal["like"], signal["watch_time_s"])),
            interactions * video,
            signal["hate"] * video,
            one * live,
            signal["live_watch_s"] * live,
        ],
        axis=1,
    )
    # the contract zeroes one of the two watches
    item_watch = signal["watch_time_s"] + signal["live_watch_s"]
    item = np.stack([one, signal["click"], item_watch, signal["like"], signal["hate"]], axis=1)
    author = np.stack([one, signal["follow"]], axis=1)
    # the activity table's row is the group of its latest view decided on stored features (see
    # _partial_sums); it sums only the count of such views, which every table's machinery needs
    decided_on_stored = ~np.array(columns["features_missing"], dtype=bool)
    activity = (one * decided_on_stored)[:, None]
    return user, activity, item, author


_USED_SIGNALS = ("watch_time_s", "click", "like", "follow", "comment", "share", "hate", "live_watch_s")
_USED_FIELDS = (
    "user_id",
    "item_id",
    "author_id",
    "item_type",
    "event_time_ms",
    "user_group",
    "features_missing",
    *_USED_SIGNALS,
)


# The feature values of a day's sums, per table (the sums in _fact_increments' order).
def _user_features(s: tuple[int, ...], group: int | None) -> dict[str, Any]:
    views, clicks, likes, watch, interactions, hates, live_views, live_watch = s
    return {
        "views": _count(views),
        "click_rate": _ratio(clicks, views),
        "like_rate": _ratio(likes, views),
        "watch_s_per_view": _ratio(watch, views),
        "interaction_rate": _ratio(interactions, views),
        "hate_rate": _ratio(hates, views),
        "live_views": _count(live_views),
        "live_watch_s_per_live_view": _ratio(live_watch, live_views),
    }


def _activity_features(s: tuple[int, ...], group: int | None) -> dict[str, Any]:
    return {"activity_group": group}


def _item_features(s: tuple[int, ...], group: int | None) -> dict[str, Any]:
    views, clicks, watch, likes, hates = s
    return {
        "views": _count(views),
        "click_rate": _ratio(clicks, views),
        "watch_s_per_view": _ratio(watch, views),
        "like_rate": _ratio(likes, views),
        "hate_rate": _ratio(hates, views),
    }


def _author_features(s: tuple[int, ...], group: int | None) -> dict[str, Any]:
    views, follows = s
    return {"views": _count(views), "follow_rate": _ratio(follows, views)}


@dataclass(frozen=True)
class _Aggregation:
    table: FeatureTable
    features: Callable[[tuple[int, ...], int | None], dict[str, Any]]
    # the table holds the group of the day's last view decided on stored features, and only days with one
    tracks_group: bool = False


# in the order of _increments' results
_AGGREGATIONS = (
    _Aggregation(USER_ENGAGEMENT, _user_features),
    _Aggregation(USER_ACTIVITY, _activity_features, tracks_group=True),
    _Aggregation(ITEM_STATS, _item_features),
    _Aggregation(AUTHOR_STATS, _author_features),
)
_BY_TABLE = {agg.table.name: agg for agg in _AGGREGATIONS}


def _add_into(day_sums: list, sums: Sequence[int], latest: tuple[int, int] | None) -> None:
    """Add exact sums and a latest view (event_time_ms, group) into ``day_sums`` = [sums, latest].

    Integer sums and a maximum are order-free, so any bundling and merge order agree. Two views in the
    same millisecond with different groups resolve to the higher id (the less active group), the
    conservative reading of an ambiguous day.
    """
    total = day_sums[0]
    for i, value in enumerate(sums):
        total[i] += value
    if latest is not None and (day_sums[1] is None or latest > day_sums[1]):
        day_sums[1] = latest


class _SumInBundle(beam.DoFn):
    """Lists of view facts -> the bundle's exact partial sums, keyed by the file they belong in.

    Emits ((table, day, shard), (entity id, sums, latest view)) once per entity and day of the bundle,
    and ((table, day, shard), None) for every shard of every table and day the bundle saw, so that
    every shard of a day with data gets its file. Summing before the shuffle makes one element per
    entity and day of the bundle out of three per view, and keying by file lets one shuffle both
    finish the sums and gather each file's rows. The facts' fields are gathered column by column as
    they come and summed column-wise when the bundle ends: a Python loop over every view and table
    cost ~7 us a view.
    """

    def __init__(self, num_shards: int) -> None:
        self._num_shards = num_shards

    def setup(self) -> None:
        self._facts = Metrics.counter("feature_aggregates", "view_facts")

    def start_bundle(self) -> None:
        self._columns: dict[Any, dict[str, list]] = {}

    def process(self, facts: list[Mapping[str, Any]], window=beam.DoFn.WindowParam) -> None:
        columns = self._columns.get(window)
        if columns is None:
            columns = self._columns[window] = {name: [] for name in _USED_FIELDS}
        for name, column in columns.items():
            column.extend([fact[name] for fact in facts])
        self._facts.inc(len(facts))

    def finish_bundle(self):
        for window, columns in self._columns.items():
            for element in _partial_sums(columns, self._num_shards):
                yield WindowedValue(element, window.max_timestamp(), [window])
        self._columns = {}


def _partial_sums(columns: Mapping[str, list], num_shards: int):
    times = np.array(columns["event_time_ms"], dtype=np.int64)
    day_codes, days = pd.factorize(times // _DAY_MS)
    groups = np.array(columns["user_group"], dtype=np.int64)
    stored = ~np.array(columns["features_missing"], dtype=bool)
    for agg, increments in zip(_AGGREGATIONS, _increments(columns), strict=True):
        table = agg.table
        # number each (entity, day) in hashed C code: Python dicts of tuples cost ~1 us a view
        entity_codes, entities = pd.factorize(np.array(columns[table.join_key], dtype=object))
        keys, codes = np.unique(entity_codes * len(days) + day_codes, return_inverse=True)
        sums = np.zeros((len(keys), increments.shape[1]), dtype=np.int64)
        np.add.at(sums, codes, increments)
        index = [(entities[key // len(days)], int(days[key % len(days)])) for key in keys.tolist()]
        latest: list[tuple[int, int] | None] = [None] * len(index)
        if agg.tracks_group:
            # the latest view decided on stored features of each (entity, day): the last of its run when
            # sorted by code, then such views after the others, then time and group; None if it has none
            order = np.lexsort((groups, times, stored, codes))
            last = order[np.flatnonzero(np.diff(codes[order], append=-1))]
            latest = [
                (t, g) if ok else None
                for t, g, ok in zip(
                    times[last].tolist(), groups[last].tolist(), stored[last].tolist(), strict=True
                )
            ]
        for (entity_id, day), day_sums, day_latest in zip(index, sums.tolist(), latest, strict=True):
            yield (table.name, day, shard_of(entity_id, num_shards)), (entity_id, day_sums, day_latest)
        for day in sorted(days.tolist()):
            for shard in range(num_shards):
                yield (table.name, day, shard), None


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


def _table_of(rows: list[dict[str, Any]], table: FeatureTable, day: int) -> pa.Table:
    columns: dict[str, list[Any]] = {table.join_key: [row[table.join_key] for row in rows]}
    columns[TIMESTAMP_COLUMN] = [day_end(day)] * len(rows)
    for name in table.feature_names:
        columns[name] = [row[name] for row in rows]
    return pa.Table.from_pydict(columns, schema=table.arrow_schema())


def _file_of(element, num_shards: int) -> tuple[str, bytes]:
    """One file's partial sums (from any number of bundles) -> its path and its rows, sorted by entity."""
    (table, day, shard), parts = element
    by_entity: dict[str, list] = {}
    for part in parts:
        if part is None:
            continue
        entity_id, sums, latest = part
        day_sums = by_entity.get(entity_id)
        if day_sums is None:
            by_entity[entity_id] = [list(sums), latest]
        else:
            _add_into(day_sums, sums, latest)
    agg = _BY_TABLE[table]
    rows = [
        {agg.table.join_key: entity_id, **agg.features(tuple(sums), latest[1] if latest else None)}
        for entity_id, (sums, latest) in sorted(by_entity.items())
        if latest is not None or not agg.tracks_group
    ]
    Metrics.counter("feature_aggregates", f"rows_{table}").inc(len(rows))
    return f"{table}/{file_name(day, shard, num_shards)}", parquet_file(_table_of(rows, agg.table, day))


class FeatureAggregateFiles(beam.PTransform):
    """View facts -> per-day user, item and author aggregates as ("<table>/<file name>", Parquet bytes).

    With ``batched``, elements are lists of view facts (a user's, say) rather than single facts.
    ``num_shards`` files per table and day bound the rows one worker sorts; keep it fixed for an
    offline root, since it is part of the file names.
    """

    def __init__(self, *, num_shards: int = 1, batched: bool = False) -> None:
        super().__init__()
        if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
            raise ValueError(f"num_shards should be a whole number >= 1, but is {num_shards!r}")
        self._num_shards = num_shards
        self._batched = batched

    def expand(self, facts):
        if not self._batched:
            facts = facts | "AsLists" >> beam.Map(lambda fact: [fact])
        return (
            facts
            | "SumInBundle" >> beam.ParDo(_SumInBundle(self._num_shards))
            | "GroupByFile" >> beam.GroupByKey()
            | "ToTable" >> beam.Map(_file_of, self._num_shards)
        )


class WriteFeatureAggregates(beam.PTransform):
    """View facts -> `FeatureAggregateFiles` written under ``offline_root`` (``<table>/<file>``).

    Returns the paths of the files written. Temporary files go under ``offline_root/.beam-temp``
    (Parquet readers skip it: it starts with a dot).
    """

    def __init__(self, offline_root: str, *, num_shards: int = 1, batched: bool = False) -> None:
        super().__init__()
        if not offline_root:
            raise ValueError("offline_root should be a directory, but is empty")
        self._root = offline_root.rstrip("/")
        self._files = FeatureAggregateFiles(num_shards=num_shards, batched=batched)

    def expand(self, facts):
        return (
            facts
            | "Aggregate" >> self._files
            | "Write" >> WriteWholeFiles(self._root, f"{self._root}/.beam-temp")
        )
