"""recsys-rl's Feast definitions: what serving reads about users and candidates (DESIGN 6).

Definitions only, in dependency order (entities, sources, views, services). The columns come from the
pipeline that writes them (recsys_rl.pipelines.feature_aggregates), so the views cannot drift from the data.

The aggregates' Parquet sources live under one offline root, ``$RECSYS_RL_FEATURES_OFFLINE`` (default:
``features/data/offline`` next to this file, gitignored); the platform's user table in its own directory,
``$RECSYS_RL_USER_TABLE`` (default: ``features/data/user_table``). The paths are resolved when the
definitions are applied and stored in the registry, so re-apply after pointing a variable elsewhere.
"""

import os
from datetime import timedelta
from pathlib import Path

from feast import Entity, FeatureService, FeatureView, Field, FileSource, ValueType
from feast.types import Float64, Int64

from recsys_rl.feature_tables import (
    AUTHOR_STATS,
    ITEM_STATS,
    TIMESTAMP_COLUMN,
    USER_ACTIVITY,
    USER_AUTHOR_HISTORY,
    USER_ENGAGEMENT,
    FeatureTable,
)
from recsys_rl.state import ENGAGEMENT_TTL_DAYS, FEATURE_VERSION


def _directory(variable: str, default: str) -> Path:
    return Path(os.environ.get(variable) or Path(__file__).parent / "data" / default).expanduser().resolve()


OFFLINE_ROOT = _directory("RECSYS_RL_FEATURES_OFFLINE", "offline")
USER_TABLE = _directory("RECSYS_RL_USER_TABLE", "user_table")
_FEAST_TYPES = {"int64": Int64, "float64": Float64}
_AGGREGATES = "recsys_rl.pipelines.feature_aggregates.WriteFeatureAggregates"
_PRODUCERS = {
    USER_ENGAGEMENT.name: _AGGREGATES,
    USER_ACTIVITY.name: "the platform's user table (simulated: recsys_rl.feature_tables.write_user_activity)",
    ITEM_STATS.name: _AGGREGATES,
    AUTHOR_STATS.name: _AGGREGATES,
    USER_AUTHOR_HISTORY.name: "recsys_rl.pipelines.transitions.PairHistoryFiles (--user-author-surface)",
}


def _fields(table: FeatureTable) -> list[Field]:
    return [Field(name=c.name, dtype=_FEAST_TYPES[c.dtype], description=c.description) for c in table.columns]


def _source(name: str, path: Path, what: str) -> FileSource:
    return FileSource(name=name, path=str(path), timestamp_field=TIMESTAMP_COLUMN, description=what)


def _daily_source(table: FeatureTable) -> FileSource:
    # A directory: one Parquet file per UTC day and shard, each row stamped with the end of its day.
    return _source(
        f"{table.name}_daily",
        OFFLINE_ROOT / table.name,
        f"per-day {table.name} aggregates of joined feedback",
    )


# --- Entities: the keys serving looks features up by -------------------------------------------------

# The user a feed or live-allocation request is for.
user = Entity(
    name="user", join_keys=[USER_ENGAGEMENT.join_key], value_type=ValueType.STRING, description="app user"
)
# A candidate item: a short video or a live stream.
item = Entity(
    name="item", join_keys=[ITEM_STATS.join_key], value_type=ValueType.STRING, description="video or live"
)
# The creator of an item; follows go to authors, not items.
author = Entity(
    name="author", join_keys=[AUTHOR_STATS.join_key], value_type=ValueType.STRING, description="item author"
)

# --- Sources: the Parquet the feature pipeline and the platform write ---------------------------------

user_engagement_daily = _daily_source(USER_ENGAGEMENT)
# The platform's snapshots, one Parquet file each (recsys_rl.feature_tables.write_user_activity).
user_table = _source("user_table", USER_TABLE, "the platform's user table: each account's activity group")
item_stats_daily = _daily_source(ITEM_STATS)
author_stats_daily = _daily_source(AUTHOR_STATS)
# A directory: one Parquet file per transition run, each pair's running totals (cumulative, not per day).
user_author_histories = _source(
    "user_author_histories",
    OFFLINE_ROOT / USER_AUTHOR_HISTORY.name,
    "each user-author pair's history through its last interaction, one file per transition run",
)

# --- Feature views ------------------------------------------------------------------------------------


def _view(
    table: FeatureTable, entity: Entity | list[Entity], source: FileSource, ttl_days: int, what: str
) -> FeatureView:
    # online: serving reads them; the ttl says how old a row may be and still describe the entity
    return FeatureView(
        name=table.name,
        entities=entity if isinstance(entity, list) else [entity],
        ttl=timedelta(days=ttl_days),
        schema=_fields(table),
        online=True,
        source=source,
        description=what,
        tags={"produced_by": _PRODUCERS[table.name]},
    )


# The user part of the policy state: recent engagement. A week's ttl (shared with the state builder,
# which applies it to online rows too): last week's habits still describe a returning user, while after a
# longer absence the defaults for a user without history are the better guess.
user_engagement_view = _view(
    USER_ENGAGEMENT,
    user,
    user_engagement_daily,
    ENGAGEMENT_TTL_DAYS,
    "a user's engagement over their last finished day",
)
# And the account's activity group. A year's ttl: a snapshot holds until the platform writes the next.
user_activity_view = _view(
    USER_ACTIVITY, user, user_table, 365, "an account's activity group, from the platform's user table"
)

# Candidate statistics for ranking. Two days' ttl: a short video's popularity fades within days, and
# stale counts would keep promoting last week's hits.
item_stats_view = _view(
    ITEM_STATS, item, item_stats_daily, 2, "an item's views and engagement rates over its last finished day"
)

# The pull of a candidate's author. A week's ttl: an author's audience changes more slowly than one item's.
author_stats_view = _view(
    AUTHOR_STATS,
    author,
    author_stats_daily,
    7,
    "views of an author's items and the follow rate over the author's last finished day",
)

# A user-author pair's history (issue 22), keyed by both: the pair's state at request time
# (recsys_rl.pair_state) is built from it and the time since its last interaction. A year's ttl: a pair's
# history is all of it, however long ago they last met; that gap is a feature, not staleness. Written only
# by runs with the user-author surface: without its directory the view is left out (feature_store.repo).
user_author_history_view = _view(
    USER_AUTHOR_HISTORY,
    [user, author],
    user_author_histories,
    365,
    "a user-author pair's interactions, clicks, follow and gifts so far, and its last interaction's time",
)

# --- Feature services: what one model version reads; add _v2 rather than change these ----------------

# The user features behind the feed and live-allocation state (recsys_rl.state, tagged with its version).
# v3: the activity group comes from the user table and engagement rows carry their day (v2 read the group
# back from earlier states; v1 from user_engagement).
user_state_v3 = FeatureService(
    name="user_state_v3",
    features=[user_engagement_view, user_activity_view],
    description="user features the policy state is built from",
    tags={"state_feature_version": FEATURE_VERSION},
)

# The user-author pairs' histories a Rank's user-author term reads, one row per candidate's author.
user_author_pairs_v1 = FeatureService(
    name="user_author_pairs_v1",
    features=[user_author_history_view],
    description="a user-author pair's history, for the user-author ranking term (issue 22)",
)

# Per-candidate statistics. Both views have a "views" feature: read with full feature names.
candidate_stats_v1 = FeatureService(
    name="candidate_stats_v1",
    features=[item_stats_view, author_stats_view],
    description="item and author statistics of ranking candidates",
)
