"""The Feast feature store: open a profile, apply the repo, materialise, and read features (DESIGN 6).

A profile is one ``feature_store*.yaml`` in the repo (``PROFILES``). Relative paths in it (registry,
SQLite file) resolve against a *state directory*, the repo itself by default (its ``data/`` is
gitignored), so tests and deployments keep Feast's files wherever they choose. ``${VAR}`` in a profile
is filled from the environment, with explicit settings on top; unlike Feast's own loader, an unset
variable is an error here rather than a literal ``${VAR}`` path.

Failures a user can act on raise ``ConfigError`` (bad settings) or ``FeatureStoreError`` (missing data,
unreachable Redis); both print as one line in the CLI.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.util
import os
import re
import sqlite3
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pandas as pd
import pyarrow.compute as pc
import pyarrow.dataset as pads
import redis
import yaml
from feast import Entity, FeatureService, FeatureStore, FeatureView, FileSource
from feast.data_source import DataSource
from feast.repo_config import RepoConfig
from feast.repo_operations import get_repo_files
from feast.types import Int64
from pydantic import ValidationError

from recsys_rl import feature_repo
from recsys_rl.config import ConfigError
from recsys_rl.errors import OperationalError

DEFAULT_REPO = str(feature_repo.REPO_DIR)

#: Profile name -> the file in the feature repo that configures it.
PROFILES: dict[str, str] = {"sqlite": "feature_store.yaml", "redis": "feature_store.redis.yaml"}
#: Read by the repo's definitions: the directory WriteFeatureAggregates wrote (one subdirectory per view).
OFFLINE_ROOT_ENV = "RECSYS_RL_FEATURES_OFFLINE"
#: Feast's Redis connection string for the redis profile (``host:port[,db=N,password=...,ssl=true]``).
REDIS_ENV = "RECSYS_RL_REDIS_CONNECTION_STRING"
USER_STATE_SERVICE = "user_state_v1"
CANDIDATE_STATS_SERVICE = "candidate_stats_v1"
ENTITY_TIMESTAMP = "event_timestamp"

_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_REDIS_PING_TIMEOUT_S = 2.0
_KINDS = (FeatureService, FeatureView, Entity, DataSource)


class FeatureStoreError(OperationalError):
    """The feature store cannot do its job: offline data missing, online store unreachable or failing."""


@dataclass(frozen=True)
class Definitions:
    """The Feast objects a feature repo defines, in apply order."""

    entities: tuple[Entity, ...]
    feature_views: tuple[FeatureView, ...]
    feature_services: tuple[FeatureService, ...]

    @property
    def objects(self) -> list[Any]:
        return [*self.entities, *self.feature_views, *self.feature_services]


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


def redis_connection_string(value: str) -> str:
    """Feast's ``host:port[,key=value...]`` form; a ``redis://`` or ``rediss://`` URL is converted."""
    if not value.startswith(("redis://", "rediss://")):
        return value
    url = urlsplit(value)
    if not url.hostname:
        raise ConfigError(f"Redis URL should name a host, but is {value!r}")
    parts = [f"{url.hostname}:{url.port or 6379}"]
    if url.path.strip("/"):
        parts.append(f"db={url.path.strip('/')}")
    if url.username:
        parts.append(f"username={unquote(url.username)}")
    if url.password:
        parts.append(f"password={unquote(url.password)}")
    if url.scheme == "rediss":
        parts.append("ssl=true")
    return ",".join(parts)


def _repo_dir(repo: str | Path) -> Path:
    path = Path(repo).expanduser().resolve()
    if not (path / PROFILES["sqlite"]).is_file():
        raise ConfigError(
            f"feature repo {str(repo)!r} should be a directory with {PROFILES['sqlite']}, but is not"
        )
    return path


def _profile_yaml(repo_dir: Path, profile: str) -> Path:
    if profile not in PROFILES:
        raise ConfigError(f"profile should be one of {list(PROFILES)}, but is {profile!r}")
    path = repo_dir / PROFILES[profile]
    if not path.is_file():
        raise ConfigError(
            f"feature repo {str(repo_dir)!r} has no {PROFILES[profile]} for profile {profile!r}"
        )
    return path


def _substitute(text: str, variables: dict[str, str], source: Path) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if not variables.get(name):
            hint = " (or pass --redis)" if name == REDIS_ENV else ""
            raise ConfigError(f"{source.name} needs ${{{name}}}, but it is not set; set it{hint}")
        return variables[name]

    return _VARIABLE.sub(value, text)


def load_repo_config(
    repo: str | Path, profile: str, *, state_dir: str | Path | None = None, redis: str | None = None
) -> RepoConfig:
    """The profile's RepoConfig, with relative paths anchored at ``state_dir`` (default: the repo)."""
    repo_dir = _repo_dir(repo)
    path = _profile_yaml(repo_dir, profile)
    variables = dict(os.environ)
    if redis:
        variables[REDIS_ENV] = redis
    if variables.get(REDIS_ENV):
        variables[REDIS_ENV] = redis_connection_string(variables[REDIS_ENV])
    try:
        raw = yaml.safe_load(_substitute(path.read_text(), variables, path))
        config = RepoConfig(**raw)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from None
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        raise ConfigError(f"{path} is not a valid Feast config: {problems}") from None
    config.repo_path = Path(state_dir).expanduser().resolve() if state_dir is not None else repo_dir
    return config


def open_store(
    repo: str | Path = DEFAULT_REPO,
    profile: str = "sqlite",
    *,
    state_dir: str | Path | None = None,
    redis: str | None = None,
) -> FeatureStore:
    """A FeatureStore for ``profile`` (nothing applied or contacted yet); serving opens it this way."""
    config = load_repo_config(repo, profile, state_dir=state_dir, redis=redis)
    # Feast's file registry creates only the last directory level of its path, and SQLite none.
    for relative in (config.registry.path, getattr(config.online_store, "path", None)):
        if relative and "://" not in relative:
            (config.repo_path / relative).parent.mkdir(parents=True, exist_ok=True)
    return FeatureStore(repo_path=str(config.repo_path), config=config)


@contextlib.contextmanager
def _environment(name: str, value: str | None) -> Iterator[None]:
    """Set one variable while the definitions run: they read their offline root from the environment."""
    if value is None:
        yield
        return
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            del os.environ[name]
        else:
            os.environ[name] = previous


def load_definitions(repo: str | Path = DEFAULT_REPO, offline_root: str | Path | None = None) -> Definitions:
    """Run the repo's definition files (as ``feast apply`` would) with the given offline root.

    Each call executes the files afresh, without touching ``sys.modules``, so two stores in one process
    can point at different offline roots.
    """
    repo_dir = _repo_dir(repo)
    root = None if offline_root is None else str(Path(offline_root).expanduser().resolve())
    found: dict[type, list[Any]] = {Entity: [], FeatureView: [], FeatureService: []}
    with _environment(OFFLINE_ROOT_ENV, root):
        for i, path in enumerate(get_repo_files(repo_dir)):
            spec = importlib.util.spec_from_file_location(f"_recsys_rl_feature_repo_{i}", path)
            if spec is None or spec.loader is None:
                raise ConfigError(f"feature repo file {str(path)!r} cannot be loaded as Python")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            for value in vars(module).values():
                for kind, objects in found.items():
                    if isinstance(value, kind) and not any(value is seen for seen in objects):
                        objects.append(value)
    return Definitions(tuple(found[Entity]), tuple(found[FeatureView]), tuple(found[FeatureService]))


def _source_dir(store: FeatureStore, view: FeatureView) -> Path:
    source = view.batch_source
    if not isinstance(source, FileSource):
        raise ConfigError(
            f"feature view {view.name!r} should read a FileSource, but reads {type(source).__name__}"
        )
    return Path(FileSource.get_uri_for_file_path(store.config.repo_path, source.path))


def check_offline_data(store: FeatureStore, definitions: Definitions) -> None:
    """Fail before apply if a view has no Parquet to read: materialising would write nothing, silently."""
    for view in definitions.feature_views:
        path = _source_dir(store, view)
        if not path.parent.is_dir():
            raise ConfigError(f"offline directory {str(path.parent)!r} does not exist (see --offline)")
        if not (path.is_dir() and any(path.glob("*.parquet"))):
            raise FeatureStoreError(
                f"no offline data for feature view {view.name!r}: {path} has no Parquet files; "
                "write them with the feature pipeline (recsys_rl.pipelines.feature_aggregates) first"
            )


def describe_online_store(store: FeatureStore) -> str:
    online = store.config.online_store
    if online.type == "sqlite":
        return f"sqlite {store.config.repo_path / online.path}"
    if online.type == "redis":
        host_port, _ = _redis_parts(online.connection_string)
        return f"redis {host_port}"
    return online.type


def _redis_parts(connection_string: str) -> tuple[str, dict[str, str]]:
    parts = [p.strip() for p in connection_string.split(",") if p.strip()]
    hosts = [p for p in parts if "=" not in p]
    params = dict(p.split("=", 1) for p in parts if "=" in p)
    return (hosts[0] if hosts else "localhost:6379"), params


def check_online_store(store: FeatureStore) -> None:
    """Ping Redis with a short timeout: Feast's client retries a refused connection for many seconds."""
    online = store.config.online_store
    if online.type != "redis":
        return
    host_port, params = _redis_parts(online.connection_string)
    host, _, port = host_port.rpartition(":")
    client = redis.Redis(
        host=host or host_port,
        port=int(port) if port.isdigit() else 6379,
        db=int(params.get("db", 0)),
        username=params.get("username"),
        password=params.get("password"),
        ssl=params.get("ssl", "false").lower() == "true",
        socket_connect_timeout=_REDIS_PING_TIMEOUT_S,
        socket_timeout=_REDIS_PING_TIMEOUT_S,
        retry=None,
    )
    try:
        client.ping()
    except redis.exceptions.RedisError as err:
        raise FeatureStoreError(f"cannot reach the Redis online store at {host_port}: {err}") from None
    finally:
        client.close()


@contextlib.contextmanager
def _store_errors(store: FeatureStore, action: str) -> Iterator[None]:
    """Turn online-store failures into FeatureStoreError, which callers (serving) can fall back on."""
    try:
        yield
    except (redis.exceptions.RedisError, sqlite3.Error) as err:
        raise FeatureStoreError(f"{action} failed on {describe_online_store(store)}: {err}") from None


def _progress_to_stderr():
    # Feast prints materialisation progress to stdout, which our commands keep for their results. Not
    # for online reads: redirecting is process-wide, and Feast prints nothing there.
    return contextlib.redirect_stdout(sys.stderr)


def apply_definitions(store: FeatureStore, definitions: Definitions) -> None:
    """Register the definitions and delete what the repo no longer defines, as ``feast apply`` does."""
    sources = [view.batch_source for view in definitions.feature_views]
    ours = {
        (kind, o.name) for o in (*definitions.objects, *sources) for kind in _KINDS if isinstance(o, kind)
    }
    registered = (
        *store.list_feature_services(),
        *store.list_feature_views(),
        *store.list_entities(),
        *store.list_data_sources(),
    )
    stale = [o for o in registered for kind in _KINDS if isinstance(o, kind) and (kind, o.name) not in ours]
    with _store_errors(store, "apply"), _progress_to_stderr():
        store.apply(definitions.objects, objects_to_delete=stale, partial=False)


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
        with _store_errors(store, f"materialising {view.name}"), _progress_to_stderr():
            store.materialize(start, end, feature_views=[view.name])
        count = _entities_in_window(_source_dir(store, view), view.join_keys[0], start, end)
        done.append(MaterializedView(view.name, start, end, count))
    return done


def materialize_repo(config: MaterializeConfig) -> MaterializeReport:
    """What ``recsys-rl features materialize`` does: check inputs, apply the repo, materialise."""
    store = open_store(config.repo, config.profile, state_dir=config.state_dir, redis=config.redis)
    definitions = load_definitions(config.repo, config.offline)
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
        offline_root=str(_source_dir(store, definitions.feature_views[0]).parent),
        views=tuple(views),
        apply_s=applied - started,
        materialize_s=time.perf_counter() - applied,
    )


def _integer_columns(service: FeatureService, full_feature_names: bool) -> list[str]:
    names = []
    for projection in service.feature_view_projections:
        for field in projection.features:
            if field.dtype == Int64:
                names.append(
                    f"{projection.name_to_use()}__{field.name}" if full_feature_names else field.name
                )
    return names


def _with_nullable_ints(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    # A missing value would otherwise turn a whole count column into floats.
    for name in columns:
        if name in frame.columns:
            frame[name] = frame[name].astype("Int64")
    return frame


def online_user_features(
    store: FeatureStore,
    user_ids: Sequence[str],
    service: str = USER_STATE_SERVICE,
    *,
    include_event_timestamps: bool = False,
) -> pd.DataFrame:
    """One row per user id, in order; an unknown or expired user has nulls (serving falls back).

    ``include_event_timestamps`` adds ``<feature>__ts`` columns: the row's timestamp in epoch seconds
    (the end of the day the aggregates cover), which tells serving how recent the user's last day was.
    """
    features = store.get_feature_service(service)
    with _store_errors(store, "online read"):
        frame = store.get_online_features(features=features, entity_rows=[{"user_id": u} for u in user_ids])
        result = frame.to_df(include_event_timestamps=include_event_timestamps)
    return _with_nullable_ints(result, _integer_columns(features, False))


def historical_features(
    store: FeatureStore,
    entity_df: pd.DataFrame,
    service: str = USER_STATE_SERVICE,
    *,
    full_feature_names: bool = False,
) -> pd.DataFrame:
    """Point-in-time features for each row of ``entity_df`` (join keys + ``event_timestamp``), in order.

    Feast 0.67's file offline store drops an entity row whose entity has rows but none in the
    point-in-time window (and collapses repeated rows); training needs every row, with nulls where
    nothing was known (what serving's fallback sees), so distinct rows are queried and joined back.
    """
    features = store.get_feature_service(service)
    keys = sorted(
        {k for p in features.feature_view_projections for k in store.get_feature_view(p.name).join_keys}
    )
    missing = [c for c in (*keys, ENTITY_TIMESTAMP) if c not in entity_df.columns]
    if missing:
        raise ValueError(f"entity_df should have columns {[*keys, ENTITY_TIMESTAMP]}, but lacks {missing}")
    on = [*keys, ENTITY_TIMESTAMP]
    rows = entity_df.reset_index(drop=True)
    rows[ENTITY_TIMESTAMP] = pd.to_datetime(rows[ENTITY_TIMESTAMP], utc=True).astype("datetime64[ns, UTC]")
    with _progress_to_stderr():
        found = store.get_historical_features(
            entity_df=rows[on].drop_duplicates(), features=features, full_feature_names=full_feature_names
        ).to_df()
    found[ENTITY_TIMESTAMP] = found[ENTITY_TIMESTAMP].astype("datetime64[ns, UTC]")
    result = rows.merge(found, on=on, how="left", validate="many_to_one")
    return _with_nullable_ints(result, _integer_columns(features, full_feature_names))


__all__ = [
    "CANDIDATE_STATS_SERVICE",
    "OFFLINE_ROOT_ENV",
    "PROFILES",
    "REDIS_ENV",
    "USER_STATE_SERVICE",
    "Definitions",
    "FeatureStoreError",
    "MaterializeConfig",
    "MaterializeReport",
    "MaterializedView",
    "apply_definitions",
    "check_offline_data",
    "check_online_store",
    "historical_features",
    "load_definitions",
    "load_repo_config",
    "materialize",
    "materialize_repo",
    "online_user_features",
    "open_store",
    "parse_end_date",
    "redis_connection_string",
]
