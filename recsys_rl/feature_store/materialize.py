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
    FeatureStoreError,
    apply_definitions,
    check_offline_data,
    check_online_store,
    describe_online_store,
    load_definitions,
    open_store,
    progress_to_stderr,
    source_dir,
    store_errors,
    views_without_data,
)


@dataclass(frozen=True)
class MaterializedView:
    name: str
    start: dt.datetime | None  # None: already materialised up to `end`
    end: dt.datetime
    entities: int  # entities written to the online store (latest row of each in [start, end])
    data_start: dt.datetime  # the earliest and latest row of the view's offline data
    data_end: dt.datetime
    resumed: bool = False  # the window began where the view's last run stopped

    @property
    def missed_rows(self) -> bool:
        """Wrote nothing while the data holds rows no run has reached: later than the window, or, unless
        an earlier run wrote up to its start, earlier. A window past the data's end that resumes where
        the last run stopped wrote nothing because nothing is new (the user table on a later day)."""
        if self.start is None or self.entities:
            return False
        return self.data_end > self.end or (not self.resumed and self.data_start < self.start)


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
    # ISO dates or date-times, UTC if naive. None: each view's window follows its offline data, from where
    # its last run stopped (or its first row) to its last row.
    start_date: str | None = None  # every view starts here, however far earlier runs got
    end_date: str | None = None
    reset: bool = False  # ignore how far earlier runs got: start at each view's first row

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"profile should be one of {list(PROFILES)}, but is {self.profile!r}")
        start, end = self.start(), self.end()
        if start is not None and end is not None and start > end:
            raise ValueError(
                f"start_date ({self.start_date}) should be at or before end_date ({self.end_date})"
            )

    def start(self) -> dt.datetime | None:
        return parse_date(self.start_date, "start_date") if self.start_date is not None else None

    def end(self) -> dt.datetime | None:
        return parse_date(self.end_date, "end_date") if self.end_date is not None else None


@dataclass(frozen=True)
class MaterializeReport:
    profile: str
    online_store: str  # where the features went (no credentials)
    registry: str
    offline_root: str
    views: tuple[MaterializedView, ...]
    apply_s: float
    materialize_s: float
    without_data: tuple[str, ...] = ()  # optional views applied but not materialised: no offline data

    def empty_windows(self, fix: str) -> list[str]:
        """One line per view whose window wrote nothing while its data holds rows no run has reached
        (`MaterializedView.missed_rows`), ending in ``fix``: its dates miss the data. The caller says how
        its user moves them (flags on the command line, keys in a pipeline config)."""
        return [
            f"0 rows of {view.name} materialised between {_shown(view.start)} and {_shown(view.end)} UTC; "
            f"its offline data spans {_shown(view.data_start)} to {_shown(view.data_end)} UTC: {fix}"
            for view in self.views
            if view.missed_rows
        ]


def _shown(value: dt.datetime) -> str:
    return f"{value:%Y-%m-%d %H:%M:%S}"


def _utc(value: dt.datetime) -> dt.datetime:
    # naive values are UTC, as Feast reads naive timestamps, and feature timestamps are UTC day ends
    return value.astimezone(dt.UTC) if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def parse_date(text: str, setting: str = "end_date") -> dt.datetime:
    """An ISO date or date-time as UTC; ``setting`` names it in the error."""
    try:
        return _utc(dt.datetime.fromisoformat(text))
    except ValueError:
        raise ValueError(f"{setting} should be an ISO date or date-time, but is {text!r}") from None


def _offline(path: Path) -> pads.Dataset:
    return pads.dataset(str(path), format="parquet", ignore_prefixes=[".", "_"])


def _data_span(path: Path, view: str) -> tuple[dt.datetime, dt.datetime]:
    """The earliest and latest entity timestamp of a view's offline data: what Feast will read."""
    stamps = _offline(path).to_table(columns=[ENTITY_TIMESTAMP])[ENTITY_TIMESTAMP]
    if not len(stamps):
        raise FeatureStoreError(
            f"no offline data for feature view {view!r}: the Parquet files in {path} hold no rows; "
            "write its rows there (or point the repo at the directory that has them) first"
        )
    span = pc.min_max(stamps)
    return _utc(span["min"].as_py()), _utc(span["max"].as_py())


def _entities_in_window(path: Path, join_keys: Sequence[str], start: dt.datetime, end: dt.datetime) -> int:
    # Feast's file offline store takes rows with start <= timestamp <= end, the latest per entity (a
    # pair's entity is its (user, author) key).
    ts = pads.field(ENTITY_TIMESTAMP)
    table = _offline(path).to_table(columns=list(join_keys), filter=(ts >= start) & (ts <= end))
    return table.group_by(list(join_keys)).aggregate([]).num_rows if table.num_rows else 0


def _window(
    view: FeatureView,
    data: tuple[dt.datetime, dt.datetime],
    start: dt.datetime | None,
    end: dt.datetime | None,
    reset: bool,
) -> tuple[dt.datetime, dt.datetime, bool] | None:
    """The view's start, end and whether it resumes from the last run's end; None when an earlier run
    already reached its end."""
    end = _utc(end) if end is not None else data[1]
    if start is not None:
        start = _utc(start)
        # a start past the data: an empty window there, not a swapped one
        return start, max(start, end), False
    last = None if reset else view.most_recent_end_time
    if last is not None and _utc(last) >= end:
        return None
    first = _utc(last) if last is not None else data[0]
    return min(first, end), end, last is not None


def materialize(
    store: FeatureStore,
    end: dt.datetime | None = None,
    views: Sequence[FeatureView] | None = None,
    *,
    start: dt.datetime | None = None,
    reset: bool = False,
) -> list[MaterializedView]:
    """Incremental materialisation of each view, from where its last one stopped to ``end``.

    The window follows the offline data unless dates are given. Without ``end``, a view ends at its own
    latest row, not now: backfills and simulated days (the simulator's start on 2026-01-01) are far
    from now, and a window from ``now - ttl`` to now (Feast's default for a first run, and this
    function's once) wrote none of their rows while moving the view's watermark past them,
    so that every later run found nothing left to do. Not the latest row of all views either: a
    watermark moved to another view's later rows would pass over this view's next ones. A first run
    (or one with ``reset``) starts at the view's earliest row, so each entity's latest row is written
    even when it is older than the view's ttl before ``end`` (a window from ``end - ttl`` left such
    entities out); an online row may be of any age anyway, since Feast applies ttls to point-in-time
    reads only and the state builder ages engagement rows by their own day. ``start`` overrides where
    every view starts, watermark or not.

    A window without rows is not handed to Feast: its watermark would move past data it never wrote.
    ``reset`` re-writes rows the watermark had passed: SQLite takes them as they are, Redis keeps a
    stored row whose timestamp is not older (Feast's check against out-of-order writes).
    """
    done: list[MaterializedView] = []
    for view in views if views is not None else store.list_feature_views():
        path = source_dir(store, view)
        data = _data_span(path, view.name)
        window = _window(view, data, start, end, reset)
        if window is None:
            done.append(MaterializedView(view.name, None, _utc(view.most_recent_end_time), 0, *data))
            continue
        first, last, resumed = window
        count = _entities_in_window(path, view.join_keys, first, last)
        if count:
            with store_errors(store, f"materialising {view.name}"), progress_to_stderr():
                store.materialize(first, last, feature_views=[view.name])
        done.append(MaterializedView(view.name, first, last, count, *data, resumed))
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
    without_data = views_without_data(store, definitions)
    views = materialize(
        store,
        config.end(),
        [store.get_feature_view(v.name) for v in definitions.feature_views if v.name not in without_data],
        start=config.start(),
        reset=config.reset,
    )
    return MaterializeReport(
        profile=config.profile,
        online_store=describe_online_store(store),
        registry=str(store.config.repo_path / store.config.registry.path),
        offline_root=str(source_dir(store, definitions.feature_views[0]).parent),
        views=tuple(views),
        apply_s=applied - started,
        materialize_s=time.perf_counter() - applied,
        without_data=without_data,
    )
