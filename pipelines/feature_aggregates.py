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
from collections.abc import Mapping
from typing import Any

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa
from apache_beam.metrics import Metrics
from apache_beam.utils.windowed_value import WindowedValue

from recsys_rl.feature_sums import AGGREGATIONS, FACT_COLUMNS, increments
from recsys_rl.feature_tables import PARQUET_SUFFIX, TIMESTAMP_COLUMN, FeatureTable
from recsys_rl.pipelines.whole_files import WriteWholeFiles, parquet_file
from recsys_rl.state import DAY_MS

ITEM_TYPES = ("video", "live")

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
    "request_id": str,  # not aggregated here: the user-author surface sums its rewards per request by it
    "item_id": str,
    "author_id": str,
    "item_type": str,
    "event_time_ms": int,
    **{name: (int, float) for name in _SIGNAL_FIELDS},
}

_BY_TABLE = {agg.table.name: agg for agg in AGGREGATIONS}


class _SumInBundle(beam.DoFn):
    """Lists of view facts -> the bundle's exact partial sums, keyed by the file they belong in.

    Emits ((table, day, shard), (entity id, sums)) once per entity and day of the bundle,
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
            columns = self._columns[window] = {name: [] for name in FACT_COLUMNS}
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
    day_codes, days = pd.factorize(times // DAY_MS)
    for agg, table_increments in zip(AGGREGATIONS, increments(columns), strict=True):
        table = agg.table
        # number each (entity, day) in hashed C code: Python dicts of tuples cost ~1 us a view
        entity_codes, entities = pd.factorize(np.array(columns[table.join_key], dtype=object))
        keys, codes = np.unique(entity_codes * len(days) + day_codes, return_inverse=True)
        sums = np.zeros((len(keys), table_increments.shape[1]), dtype=np.int64)
        np.add.at(sums, codes, table_increments)
        index = [(entities[key // len(days)], int(days[key % len(days)])) for key in keys.tolist()]
        for (entity_id, day), day_sums in zip(index, sums.tolist(), strict=True):
            yield (table.name, day, shard_of(entity_id, num_shards)), (entity_id, day_sums)
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
    """One file's partial sums (from any number of bundles) -> its path and its rows, sorted by entity.

    Integer sums are order-free, so any bundling and merge order agree.
    """
    (table, day, shard), parts = element
    by_entity: dict[str, list[int]] = {}
    for part in parts:
        if part is None:
            continue
        entity_id, sums = part
        total = by_entity.setdefault(entity_id, [0] * len(sums))
        for i, value in enumerate(sums):
            total[i] += value
    agg = _BY_TABLE[table]
    rows = [
        {agg.table.join_key: entity_id, **agg.features(sums, day)}
        for entity_id, sums in sorted(by_entity.items())
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
