"""``recsys-rl features materialize``: the offline aggregates of a dataset copied into the online store.

The command-line side is ``recsys_rl.cli.features``; the training pipeline's features step calls
``materialize_repo`` with the dataset's own offline root.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.dataset as pads
from feast import FeatureStore, FeatureView

from recsys_rl.config import ConfigError
from recsys_rl.feature_store.repo import (
    DEFAULT_REPO,
    ENTITY_TIMESTAMP,
    PROFILES,
    apply_definitions,
    check_offline_data,
    check_online_store,
    describe_online_store,
    load_definitions,
    open_store,
    progress_to_stderr,
    source_dir,
    store_errors,
)


@dataclass(frozen=True)
class MaterializedView:
    name: str
    start: dt.datetime | None  # None: already materialised up to `end`
    end: dt.datetime
    entities: int  # entities written to the online store (latest row of each in [start, end])


@dataclass(frozen=True)
class MaterializeConfig:
    """Apply a feature repo and materialise its offline data into one profile's online store (DESIGN 6)."""

    repo: str = DEFAULT_REPO  # Feast repo: definitions plus one feature_store*.yaml per profile
    profile: str = "sqlite"  # sqlite: embedded online store file; redis: the production online store
    offline: str | None = None  # offline root (WriteFeatureAggregates' output); None: the repo's default
    user_table: str | None = (
        None  # the platform's user table (user_activity snapshots); None: the repo's default
    )
    state_dir: str | None = None  # where the registry and SQLite file go; None: the repo (data/, gitignored)
    redis: str | None = None  # redis profile: host:port[,db=N,...] or redis://URL; None: env REDIS_ENV
    end_date: str | None = None  # materialise rows stamped up to this ISO date/time (UTC if naive); None: now

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"profile should be one of {list(PROFILES)}, but is {self.profile!r}")
        if self.end_date is not None:
            parse_end_date(self.end_date)

    def end(self) -> dt.datetime:
        return parse_end_date(self.end_date) if self.end_date is not None else dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class MaterializeReport:
    profile: str
    online_store: str  # where the features went (no credentials)
    registry: str
    offline_root: str
    views: tuple[MaterializedView, ...]
    apply_s: float
    materialize_s: float


def parse_end_date(text: str) -> dt.datetime:
    """An ISO date or date-time; naive values are UTC, since feature timestamps are UTC day ends."""
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"end_date should be an ISO date or date-time, but is {text!r}") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def _entities_in_window(path: Path, join_key: str, start: dt.datetime, end: dt.datetime) -> int:
    # Feast's file offline store takes rows with start <= timestamp <= end, the latest per entity.
    dataset = pads.dataset(str(path), format="parquet", ignore_prefixes=[".", "_"])
    ts = pads.field(ENTITY_TIMESTAMP)
    table = dataset.to_table(columns=[join_key], filter=(ts >= start) & (ts <= end))
    return int(pc.count_distinct(table[join_key]).as_py()) if table.num_rows else 0


def materialize(
    store: FeatureStore, end: dt.datetime, views: Sequence[FeatureView] | None = None
) -> list[MaterializedView]:
    """Incremental materialisation up to ``end`` of each view, from where its last one stopped.

    A view's first run starts at ``end - ttl``: Feast's materialize_incremental starts it at
    ``now - ttl``, which writes nothing when ``end`` is a backfill date older than that.
    """
    end = end.astimezone(dt.UTC)
    done: list[MaterializedView] = []
    for view in views if views is not None else store.list_feature_views():
        if not view.ttl:
            raise ConfigError(f"feature view {view.name!r} should have a ttl, but has {view.ttl!r}")
        last = view.most_recent_end_time
        start = last.astimezone(dt.UTC) if last is not None else end - view.ttl
        if start >= end:
            done.append(MaterializedView(view.name, None, last or end, 0))
            continue
        with store_errors(store, f"materialising {view.name}"), progress_to_stderr():
            store.materialize(start, end, feature_views=[view.name])
        count = _entities_in_window(source_dir(store, view), view.join_keys[0], start, end)
        done.append(MaterializedView(view.name, start, end, count))
    return done


def materialize_repo(config: MaterializeConfig) -> MaterializeReport:
    """What ``recsys-rl features materialize`` does: check inputs, apply the repo, materialise."""
    store = open_store(config.repo, config.profile, state_dir=config.state_dir, redis=config.redis)
    definitions = load_definitions(config.repo, config.offline, config.user_table)
    if not definitions.feature_views:
        raise ConfigError(f"feature repo {config.repo!r} defines no feature views")
    check_offline_data(store, definitions)
    check_online_store(store)
    started = time.perf_counter()
    apply_definitions(store, definitions)
    applied = time.perf_counter()
    views = materialize(
        store, config.end(), [store.get_feature_view(v.name) for v in definitions.feature_views]
    )
    return MaterializeReport(
        profile=config.profile,
        online_store=describe_online_store(store),
        registry=str(store.config.repo_path / store.config.registry.path),
        offline_root=str(source_dir(store, definitions.feature_views[0]).parent),
        views=tuple(views),
        apply_s=applied - started,
        materialize_s=time.perf_counter() - applied,
    )
