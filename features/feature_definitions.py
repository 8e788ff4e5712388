"""recsys-rl's Feast definitions: what serving reads about users and candidates (DESIGN 6).

Definitions only, in dependency order (entities, sources, views, services). The columns come from the
pipeline that writes them (recsys_rl.pipelines.feature_aggregates), so the views cannot drift from the data.

The Parquet sources live under one offline root, ``$RECSYS_RL_FEATURES_OFFLINE`` (default:
``features/data/offline`` next to this file, gitignored). The path is resolved when the definitions are
applied and stored in the registry, so re-apply after pointing the variable at another dataset.
"""

import os
from datetime import timedelta
from pathlib import Path

from feast import Entity, FeatureService, FeatureView, Field, FileSource, ValueType
from feast.types import Float64, Int64

from recsys_rl.pipelines.feature_aggregates import (
    AUTHOR_STATS,
    ITEM_STATS,
    TIMESTAMP_COLUMN,
    USER_ACTIVITY,
    USER_ENGAGEMENT,
    FeatureTable,
)
from recsys_rl.state import FEATURE_VERSION

OFFLINE_ROOT_ENV = "RECSYS_RL_FEATURES_OFFLINE"
OFFLINE_ROOT = Path(os.environ.get(OFFLINE_ROOT_ENV) or Path(__file__).parent / "data" / "offline")
OFFLINE_ROOT = OFFLINE_ROOT.expanduser().resolve()
_FEAST_TYPES = {"int64": Int64, "float64": Float64}
_LINEAGE = {"produced_by": "recsys_rl.pipelines.feature_aggregates.WriteFeatureAggregates"}


def _fields(table: FeatureTable) -> list[Field]:
    return [Field(name=c.name, dtype=_FEAST_TYPES[c.dtype], description=c.description) for c in table.columns]


def _daily_source(table: FeatureTable) -> FileSource:
    # A directory: one Parquet file per UTC day and shard, each row stamped with the end of its day.
    return FileSource(
        name=f"{table.name}_daily",
        path=str(OFFLINE_ROOT / table.name),
        timestamp_field=TIMESTAMP_COLUMN,
        description=f"per-day {table.name} aggregates of joined feedback",
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

# --- Sources: the Parquet the feature pipeline writes ------------------------------------------------

user_engagement_daily = _daily_source(USER_ENGAGEMENT)
user_activity_daily = _daily_source(USER_ACTIVITY)
item_stats_daily = _daily_source(ITEM_STATS)
author_stats_daily = _daily_source(AUTHOR_STATS)

# --- Feature views ------------------------------------------------------------------------------------


def _daily_view(
    table: FeatureTable, entity: Entity, source: FileSource, ttl_days: int, what: str
) -> FeatureView:
    # online: serving reads them; the ttl says how old a day may be and still describe the entity
    return FeatureView(
        name=table.name,
        entities=[entity],
        ttl=timedelta(days=ttl_days),
        schema=_fields(table),
        online=True,
        source=source,
        description=what,
        tags=_LINEAGE,
    )


# The user part of the policy state: recent engagement, and the activity group. A week's ttl: last week's
# habits still describe a returning user, while after a longer absence the serving defaults for an
# unknown user are the better guess.
user_engagement_view = _daily_view(
    USER_ENGAGEMENT, user, user_engagement_daily, 7, "a user's engagement over their last finished day"
)
# Its own view: only days with a decision made on the user's stored features have a row (a decision on
# default features logs the default group), so a fallback day never overwrites the known group.
user_activity_view = _daily_view(
    USER_ACTIVITY,
    user,
    user_activity_daily,
    7,
    "a user's activity group on their last finished day that had one",
)

# Candidate statistics for ranking. Two days' ttl: a short video's popularity fades within days, and
# stale counts would keep promoting last week's hits.
item_stats_view = _daily_view(
    ITEM_STATS, item, item_stats_daily, 2, "an item's views and engagement rates over its last finished day"
)

# The pull of a candidate's author. A week's ttl: an author's audience changes more slowly than one item's.
author_stats_view = _daily_view(
    AUTHOR_STATS,
    author,
    author_stats_daily,
    7,
    "views of an author's items and the follow rate over the author's last finished day",
)

# --- Feature services: what one model version reads; add _v2 rather than change these ----------------

# The user features behind the feed and live-allocation state (recsys_rl.state, tagged with its version).
# v2: the activity group moved to its own view (v1 read it from user_engagement).
user_state_v2 = FeatureService(
    name="user_state_v2",
    features=[user_engagement_view, user_activity_view],
    description="user features the policy state is built from",
    tags={"state_feature_version": FEATURE_VERSION},
)

# Per-candidate statistics. Both views have a "views" feature: read with full feature names.
candidate_stats_v1 = FeatureService(
    name="candidate_stats_v1",
    features=[item_stats_view, author_stats_view],
    description="item and author statistics of ranking candidates",
)
