"""The tables behind the Feast views (DESIGN 6): their names, keys and columns, and the user table's writer.

Two producers write them. The feature pipeline (``recsys_rl.pipelines.feature_aggregates``) writes the
per-day aggregates of joined feedback: ``user_engagement``, ``item_stats``, ``author_stats``. The
platform writes its user table, ``user_activity``: the activity group of each registered user, an
attribute of the account as KuaiRand's ``user_active_degree`` is (its ``user_features`` table), not
something read back from earlier decisions. A group taken from served states would be the default
"unknown" whenever a decision fell back to default features, and tomorrow's state would inherit it.

Every table has the entity key column, ``event_timestamp`` (UTC) and its feature columns; the Feast
definitions (``features/feature_definitions.py``) are built from these, so views and data cannot drift.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recsys_rl.state import ACTIVITY_GROUPS

TIMESTAMP_COLUMN = "event_timestamp"
PARQUET_SUFFIX = ".parquet"


@dataclass(frozen=True)
class FeatureColumn:
    name: str
    dtype: str  # "int64" | "float64"; rates are null when their denominator is zero
    description: str


@dataclass(frozen=True)
class FeatureTable:
    """One Feast feature view's offline data: its directory name, entity key column and feature columns."""

    name: str
    join_keys: tuple[str, ...]  # the entity's key columns: one, or (user_id, author_id) for a pair
    columns: tuple[FeatureColumn, ...]

    @property
    def join_key(self) -> str:
        """The key column of a table keyed by one entity."""
        if len(self.join_keys) != 1:
            raise ValueError(f"{self.name} is keyed by {list(self.join_keys)}, not one column")
        return self.join_keys[0]

    @property
    def feature_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def arrow_schema(self) -> pa.Schema:
        types = {"int64": pa.int64(), "float64": pa.float64()}
        return pa.schema(
            [
                *(pa.field(key, pa.string(), nullable=False) for key in self.join_keys),
                pa.field(TIMESTAMP_COLUMN, pa.timestamp("us", tz="UTC"), nullable=False),
                *(pa.field(c.name, types[c.dtype]) for c in self.columns),
            ]
        )


def _views(what: str) -> FeatureColumn:
    return FeatureColumn("views", "int64", f"{what} in the UTC day")


def _rate(name: str, what: str, per: str = "view") -> FeatureColumn:
    return FeatureColumn(name, "float64", f"{what} per {per} in the UTC day; null without any {per}")


_VIDEO_VIEW = "short-video view"  # feed engagement is measured on short videos, live engagement on lives
USER_ENGAGEMENT = FeatureTable(
    "user_engagement",
    ("user_id",),
    (
        # the row's own day: a point-in-time read returns features but not their timestamps, and the state
        # needs the age of a user's history (returned yesterday or not, expired or not)
        FeatureColumn("day", "int64", "the UTC day the row covers, in days since 1970-01-01"),
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
_GROUP_NAMES = ", ".join(f"{i} {name}" for i, name in enumerate(ACTIVITY_GROUPS))
USER_ACTIVITY = FeatureTable(
    "user_activity",
    ("user_id",),
    (FeatureColumn("activity_group", "int64", f"the account's activity group ({_GROUP_NAMES})"),),
)
ITEM_STATS = FeatureTable(
    "item_stats",
    ("item_id",),
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
    ("author_id",),
    (_views("views of the author's items"), _rate("follow_rate", "follows of the author")),
)
#: The tables the feature pipeline writes, one subdirectory each under its offline root.
AGGREGATE_TABLES: tuple[FeatureTable, ...] = (USER_ENGAGEMENT, ITEM_STATS, AUTHOR_STATS)
#: Each user-author pair's history (issue 22), written by the transition pipeline when it builds the
#: user-author surface (``pipelines.user_author``): one row per pair met in the run, its totals through its
#: last interaction, stamped at the end of that interaction's UTC day, so that a read on a later day gets
#: what the pair's state is built from (``recsys_rl.pair_state``). Cumulative, not per day: a pair's state
#: is its whole history, which a point-in-time read of daily rows could not sum.
USER_AUTHOR_HISTORY = FeatureTable(
    "user_author_history",
    ("user_id", "author_id"),
    (
        FeatureColumn("views", "int64", "the pair's interactions so far (views of the author's items)"),
        FeatureColumn("clicks", "int64", "clicks among them"),
        FeatureColumn("followed", "int64", "1 once the user follows the author (follows persist)"),
        FeatureColumn("gifts", "float64", "value of the user's gifts to the author's live streams"),
        FeatureColumn("last_interaction_ms", "int64", "time of the pair's last interaction, ms since 1970"),
    ),
)


def write_user_activity(directory: str | Path, user_ids: Sequence[str], groups, as_of_ms: int) -> Path:
    """One snapshot of the user table: each user's group as of ``as_of_ms``, as one Parquet file.

    Snapshots add up (Feast reads the latest row of each user at or before a time); the file appears
    whole or not at all. Returns its path.
    """
    groups = np.asarray(groups, dtype=np.int64)
    if len(user_ids) != groups.size:
        raise ValueError(
            f"user_ids and groups should have one entry per user, but have {len(user_ids)} and {groups.size}"
        )
    bad = groups[(groups < 0) | (groups >= len(ACTIVITY_GROUPS))]
    if bad.size:
        raise ValueError(
            f"activity groups should be in [0, {len(ACTIVITY_GROUPS)}), but include {int(bad[0])}"
        )
    timestamp = pa.array(np.full(groups.size, as_of_ms * 1000, np.int64), pa.timestamp("us", tz="UTC"))
    table = pa.Table.from_arrays(
        [pa.array(list(user_ids), pa.string()), timestamp, pa.array(groups)],
        schema=USER_ACTIVITY.arrow_schema(),
    )
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"as-of-{as_of_ms}{PARQUET_SUFFIX}"
    tmp = directory / f".{path.name}.{uuid.uuid4().hex}.tmp"
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)
    return path
