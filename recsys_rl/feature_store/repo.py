"""The feature repo and its stores: load a profile, run the definitions, open, check and apply.

A profile is one ``feature_store*.yaml`` in the repo (``PROFILES``). Relative paths in it (registry,
SQLite file) resolve against a *state directory*, the repo itself by default (its ``data/`` is
gitignored), so tests and deployments keep Feast's files wherever they choose. ``${VAR}`` in a profile
is filled from the environment, with explicit settings on top; unlike Feast's own loader, an unset
variable is an error here rather than a literal ``${VAR}`` path.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import yaml
from feast import Entity, FeatureService, FeatureStore, FeatureView, FileSource
from feast.data_source import DataSource
from feast.repo_config import RepoConfig
from feast.repo_operations import get_repo_files
from pydantic import ValidationError

from recsys_rl import feature_repo
from recsys_rl.config import ConfigError
from recsys_rl.errors import OperationalError
from recsys_rl.feature_tables import USER_ACTIVITY, USER_AUTHOR_HISTORY
from recsys_rl.logs import prints_to_stderr

DEFAULT_REPO = str(feature_repo.REPO_DIR)


#: Profile name -> the file in the feature repo that configures it.
PROFILES: dict[str, str] = {"sqlite": "feature_store.yaml", "redis": "feature_store.redis.yaml"}


#: Read by the repo's definitions: the directory WriteFeatureAggregates wrote (one subdirectory per view).
OFFLINE_ROOT_ENV = "RECSYS_RL_FEATURES_OFFLINE"


#: Read by the repo's definitions: the directory of the platform's user table (``user_activity`` snapshots).
USER_TABLE_ENV = "RECSYS_RL_USER_TABLE"


#: Feast's Redis connection string for the redis profile (``host:port[,db=N,password=...,ssl=true]``).
REDIS_ENV = "RECSYS_RL_REDIS_CONNECTION_STRING"


USER_STATE_SERVICE = "user_state_v3"


CANDIDATE_STATS_SERVICE = "candidate_stats_v1"


PAIR_HISTORY_SERVICE = "user_author_pairs_v1"


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
def _environment(values: dict[str, str | Path | None]) -> Iterator[None]:
    """Set variables while the definitions run: they read their source directories from the environment."""
    previous = {name: os.environ.get(name) for name in values}
    try:
        for name, value in values.items():
            if value is not None:
                os.environ[name] = str(Path(value).expanduser().resolve())
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def load_definitions(
    repo: str | Path = DEFAULT_REPO,
    offline_root: str | Path | None = None,
    user_table: str | Path | None = None,
) -> Definitions:
    """Run the repo's definition files (as ``feast apply`` would) with the given source directories.

    Each call executes the files afresh, without touching ``sys.modules``, so two stores in one process
    can point at different offline roots.
    """
    repo_dir = _repo_dir(repo)
    found: dict[type, list[Any]] = {Entity: [], FeatureView: [], FeatureService: []}
    with _environment({OFFLINE_ROOT_ENV: offline_root, USER_TABLE_ENV: user_table}):
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


def source_dir(store: FeatureStore, view: FeatureView) -> Path:
    source = view.batch_source
    if not isinstance(source, FileSource):
        raise ConfigError(
            f"feature view {view.name!r} should read a FileSource, but reads {type(source).__name__}"
        )
    return Path(FileSource.get_uri_for_file_path(store.config.repo_path, source.path))


#: Views whose offline data only some runs write: the pairs' histories come from transition runs with the
#: user-author surface only. Without their directory they are applied but not materialised, nor refused.
OPTIONAL_VIEWS: tuple[str, ...] = (USER_AUTHOR_HISTORY.name,)


def views_without_data(store: FeatureStore, definitions: Definitions) -> tuple[str, ...]:
    """The optional views whose offline directory does not exist (nothing to materialise, no error)."""
    return tuple(
        view.name
        for view in definitions.feature_views
        if view.name in OPTIONAL_VIEWS and not source_dir(store, view).exists()
    )


def check_offline_data(store: FeatureStore, definitions: Definitions) -> None:
    """Fail before apply if a view has no Parquet to read: materialising would write nothing, silently.
    An optional view without its directory is no error (``OPTIONAL_VIEWS``); with it, it needs data."""
    absent = views_without_data(store, definitions)
    for view in definitions.feature_views:
        if view.name in absent:
            continue
        path = source_dir(store, view)
        if view.name == USER_ACTIVITY.name:
            if not (path.is_dir() and any(path.glob("*.parquet"))):
                raise FeatureStoreError(
                    f"no user table for feature view {view.name!r}: {path} has no Parquet files; point "
                    "--user-table at the platform's (`recsys-rl simulate --user-table` writes one)"
                )
            continue
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
def store_errors(store: FeatureStore, action: str) -> Iterator[None]:
    """Turn online-store failures into FeatureStoreError, which callers (serving) can fall back on."""
    try:
        yield
    except (redis.exceptions.RedisError, sqlite3.Error) as err:
        raise FeatureStoreError(f"{action} failed on {describe_online_store(store)}: {err}") from None


def progress_to_stderr():
    # Feast prints materialisation progress to stdout, which our commands keep for their results; off a
    # terminal, its lines become log lines, without the colour codes Feast puts in them. Not for online
    # reads: redirecting is process-wide, and Feast prints nothing there.
    return prints_to_stderr("feast")


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
    with store_errors(store, "apply"), progress_to_stderr():
        store.apply(definitions.objects, objects_to_delete=stale, partial=False)
