"""The feature repo end to end: Beam-written aggregates -> Feast apply/materialise -> Redis and SQLite reads.

One offline root (two days of aggregates written by WriteFeatureAggregates), one user table (two
snapshots) and one materialised store per profile are shared by the module: Feast's import, apply and
materialise take seconds each.
"""

import argparse
import asyncio
import datetime as dt
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import apache_beam as beam
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recsys_rl.cli import features as features_cmd
from recsys_rl.cli.options import OneLineParser
from recsys_rl.config import ConfigError, load_config
from recsys_rl.feature_store import (
    PROFILES,
    REDIS_ENV,
    FeatureStoreError,
    MaterializeConfig,
    historical_features,
    materialize_repo,
    online_user_features,
    open_store,
    redis_connection_string,
)
from recsys_rl.feature_tables import USER_ENGAGEMENT, write_user_activity
from recsys_rl.kafka.broker import free_port
from recsys_rl.pipelines.feature_aggregates import WriteFeatureAggregates

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2] / "features"
DAY1 = dt.datetime(2024, 3, 10, tzinfo=dt.UTC)
DAY1_END, DAY2_END = DAY1 + dt.timedelta(days=1), DAY1 + dt.timedelta(days=2)
END = "2024-03-12T06:00:00"  # after day 2 ends


def _at(day_end: dt.datetime, hours_before: float) -> int:
    return int((day_end - dt.timedelta(hours=hours_before)).timestamp() * 1000)


def _fact(user, item, when, watch=0.0, click=0, like=0, live_s=0.0) -> dict:
    live = item.startswith("live")
    return {
        "user_id": user,
        "item_id": item,
        "author_id": "author-" + item[-1],
        "item_type": "live" if live else "video",
        "event_time_ms": when,
        "watch_time_s": watch,
        "click": click,
        "like": like,
        "follow": 0,
        "comment": 0,
        "share": 0,
        "hate": 0,
        "live_watch_s": live_s,
        "gift": 0.0,
    }


# alice: active both days; bob: day 1 only; carol: day 2 only, live only; dave: both days.
FACTS = [
    _fact("alice", "video-1", _at(DAY1_END, 10), watch=12.0, click=1, like=1),
    _fact("alice", "video-2", _at(DAY1_END, 9), watch=4.0),
    _fact("bob", "video-1", _at(DAY1_END, 3), watch=30.0, click=1),
    _fact("alice", "video-2", _at(DAY2_END, 5), watch=8.0, click=1),
    _fact("carol", "live-3", _at(DAY2_END, 2), click=1, live_s=90.0),
    _fact("dave", "video-1", _at(DAY1_END, 4), watch=6.0),
    _fact("dave", "video-1", _at(DAY2_END, 4), watch=3.0),
]
# The platform's user table: every account's group as day 1 starts, then alice moves to group 1.
ALICE_MOVES = DAY1_END + dt.timedelta(hours=6)
SNAPSHOTS = [
    (DAY1, {"alice": 2, "bob": 0, "carol": 3, "dave": 2}),
    (ALICE_MOVES, {"alice": 1}),
]


@pytest.fixture(scope="module")
def offline_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("features") / "offline"
    with beam.Pipeline() as p:
        p | beam.Create(FACTS) | WriteFeatureAggregates(str(root))
    return root


@pytest.fixture(scope="module")
def user_table(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("features") / "user_table"
    for as_of, groups in SNAPSHOTS:
        write_user_activity(directory, list(groups), list(groups.values()), int(as_of.timestamp() * 1000))
    return directory


def _user_rows(offline_root: Path) -> pd.DataFrame:
    return pq.read_table(offline_root / USER_ENGAGEMENT.name).to_pandas()


@pytest.fixture(scope="module")
def sqlite_report(offline_root, user_table, tmp_path_factory):
    state = tmp_path_factory.mktemp("sqlite-state")
    config = MaterializeConfig(
        repo=str(REPO),
        profile="sqlite",
        offline=str(offline_root),
        user_table=str(user_table),
        state_dir=str(state),
        end_date=END,
    )
    return materialize_repo(config), state


@pytest.fixture(scope="module")
def redis_report(offline_root, user_table, redis_server, tmp_path_factory):
    state = tmp_path_factory.mktemp("redis-state")
    config = MaterializeConfig(
        repo=str(REPO),
        profile="redis",
        offline=str(offline_root),
        user_table=str(user_table),
        state_dir=str(state),
        redis=redis_server.url,
        end_date=END,
    )
    return materialize_repo(config), state


def _latest_per_user(offline_root: Path) -> pd.DataFrame:
    rows = _user_rows(offline_root).sort_values("event_timestamp").groupby("user_id").tail(1)
    return rows.set_index("user_id")


def _same(got, want) -> bool:
    return bool(pd.isna(got) and pd.isna(want)) or got == want


def _assert_online_equals_latest_day(frame: pd.DataFrame, offline_root: Path) -> None:
    latest = _latest_per_user(offline_root)
    frame = frame.set_index("user_id")
    for user in ("alice", "bob", "carol"):
        for name in USER_ENGAGEMENT.feature_names:
            got, want = frame.at[user, name], latest.at[user, name]
            assert _same(got, want), (user, name, got, want)
    assert frame.loc["nobody"].isna().all()


def test_redis_profile_serves_each_users_latest_day(redis_report, redis_server, offline_root):
    report, state = redis_report
    assert report.online_store == f"redis {redis_server.host}:{redis_server.port}"
    assert {v.name: v.entities for v in report.views} == {
        "user_engagement": 4,
        "user_activity": 4,
        "item_stats": 3,
        "author_stats": 3,
    }
    assert report.without_data == ("user_author_history",)  # no transition run with pairs wrote any
    store = open_store(REPO, "redis", state_dir=state, redis=redis_server.url)
    frame = online_user_features(store, ["alice", "bob", "carol", "nobody"])
    _assert_online_equals_latest_day(frame, offline_root)
    # spot checks by hand: alice's day 2 (one clicked 8 s view) and her latest group; carol watched only live
    alice, carol = frame.iloc[0], frame.iloc[2]
    assert (alice.activity_group, alice.views, alice.click_rate, alice.watch_s_per_view) == (1, 1, 1.0, 8.0)
    assert alice.day == (DAY2_END - dt.datetime(1970, 1, 2, tzinfo=dt.UTC)).days  # the UTC day it covers
    assert carol.views == 0 and pd.isna(carol.click_rate) and carol.live_watch_s_per_live_view == 90.0
    assert carol.activity_group == 3 and pd.isna(frame.iloc[3].activity_group)  # nobody has no account


def test_sqlite_profile_serves_the_same(sqlite_report, offline_root):
    report, state = sqlite_report
    assert report.online_store == f"sqlite {state / 'data' / 'sqlite-online.db'}"
    assert Path(report.registry) == state / "data" / "sqlite-registry.db" and Path(report.registry).is_file()
    store = open_store(REPO, "sqlite", state_dir=state)
    _assert_online_equals_latest_day(
        online_user_features(store, ["alice", "bob", "carol", "nobody"]), offline_root
    )


def test_a_second_run_continues_where_the_first_stopped(sqlite_report, offline_root, user_table):
    report, state = sqlite_report
    settings = {
        "repo": str(REPO),
        "offline": str(offline_root),
        "user_table": str(user_table),
        "state_dir": str(state),
    }
    again = materialize_repo(MaterializeConfig(**settings, end_date="2024-03-13"))
    assert {v.start for v in again.views} == {report.views[0].end}
    assert {v.entities for v in again.views} == {0}
    # an end that is already covered is a no-op, reported as such
    older = materialize_repo(MaterializeConfig(**settings, end_date="2024-03-12"))
    assert {v.start for v in older.views} == {None}


def test_reset_writes_rows_behind_the_watermark_into_redis(offline_root, user_table, redis_server, tmp_path):
    """A user backfilled after a run had passed their day: only --reset brings them online.

    Rows already stored are not rewritten by Redis (Feast skips a row not newer than the stored one).
    """
    offline = tmp_path / "offline"
    shutil.copytree(offline_root, offline)
    settings = {
        "repo": str(REPO),
        "profile": "redis",
        "offline": str(offline),
        "user_table": str(user_table),
        "state_dir": str(tmp_path / "state"),
        "redis": f"{redis_server.host}:{redis_server.port},db=3",  # apart from the module's store
    }
    materialize_repo(MaterializeConfig(**settings, end_date="2024-06-01"))
    erin = [{"user_id": "erin", "event_timestamp": DAY1_END, "views": 7}]  # other features null
    backfill = pa.Table.from_pylist(erin, schema=USER_ENGAGEMENT.arrow_schema())
    pq.write_table(backfill, offline / USER_ENGAGEMENT.name / "backfill.parquet")
    store = open_store(REPO, "redis", state_dir=settings["state_dir"], redis=settings["redis"])

    default = materialize_repo(MaterializeConfig(**settings))
    assert {v.start for v in default.views} == {None}  # the watermarks are past all of the data
    assert pd.isna(online_user_features(store, ["erin"]).views[0])
    reset = materialize_repo(MaterializeConfig(**settings, reset=True))
    assert {v.name: v.entities for v in reset.views}["user_engagement"] == 5
    frame = online_user_features(store, ["erin", "alice"])
    assert frame.views.tolist() == [7, 1]  # alice keeps her day 2


def test_historical_features_are_point_in_time_correct(sqlite_report, offline_root):
    _, state = sqlite_report
    store = open_store(REPO, "sqlite", state_dir=state)
    when = [
        DAY1_END - dt.timedelta(hours=1),  # day 1 not over: nothing known yet
        DAY1_END,  # the instant day 1 ends: day 1
        DAY1_END + dt.timedelta(hours=12),  # between the day ends: day 1
        DAY2_END + dt.timedelta(hours=1),  # after day 2: day 2
        DAY1_END + dt.timedelta(hours=12),  # a repeated row keeps its place and values
    ]
    entity_df = pd.DataFrame({"user_id": ["alice"] * len(when), "event_timestamp": when, "label": range(5)})
    frame = historical_features(store, entity_df)
    rows = _user_rows(offline_root).set_index(["user_id", "event_timestamp"])
    day1, day2 = rows.loc[("alice", DAY1_END)], rows.loc[("alice", DAY2_END)]
    assert list(frame.label) == list(range(5))
    assert frame.loc[0, list(USER_ENGAGEMENT.feature_names)].isna().all()
    for i, expected in ((1, day1), (2, day1), (3, day2), (4, day1)):
        for name in USER_ENGAGEMENT.feature_names:
            assert _same(frame.loc[i, name], expected[name]), (i, name)
    # the user table's snapshot at each time: alice's first group until she moved, whatever her days
    assert frame.activity_group.tolist() == [2, 2, 1, 1, 1]


def test_historical_features_outside_the_ttl_are_null(sqlite_report):
    _, state = sqlite_report
    store = open_store(REPO, "sqlite", state_dir=state)
    entity_df = pd.DataFrame(
        {
            "user_id": ["bob", "bob", "nobody"],
            "event_timestamp": [DAY2_END, DAY1_END + dt.timedelta(days=8), DAY2_END],
        }
    )
    frame = historical_features(store, entity_df)
    assert frame.loc[0, "views"] == 1 and frame.loc[1:, "views"].isna().all()  # the user view's ttl is 7 days


def test_cli_verb_prints_what_it_materialised_and_where(offline_root, user_table, tmp_path, capsys):
    parser = OneLineParser(prog="recsys-rl")
    features_cmd.register(parser.add_subparsers(dest="verb", required=True, parser_class=OneLineParser))
    args = parser.parse_args(
        [
            *("features", "materialize", "--repo", str(REPO), "--offline", str(offline_root)),
            *("--user-table", str(user_table)),
            *("--state-dir", str(tmp_path), "--end-date", END),
        ]
    )
    assert args.handler(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert (
        out[0] == f"applied feature repo {REPO} (sqlite profile), registry {tmp_path}/data/sqlite-registry.db"
    )
    assert out[1] == f"materialised from {offline_root} into sqlite {tmp_path}/data/sqlite-online.db:"
    assert sorted(line.split()[:2] for line in out[2:]) == [
        ["author_stats", "3"],
        ["item_stats", "3"],
        ["user_activity", "4"],
        ["user_author_history", "no"],
        ["user_engagement", "4"],
    ]
    by_view = {line.split()[0]: line for line in out[2:]}
    # a first run starts at the view's earliest row, the end of day 1
    assert by_view["user_engagement"].endswith("rows stamped 2024-03-11 00:00:00 .. 2024-03-12 06:00:00 UTC")


def _pair_row(user, author, views, clicks, followed, gifts, last) -> dict:
    keys = ("user_id", "author_id", "views", "clicks", "followed", "gifts", "last_interaction_ms")
    return dict(zip(keys, (user, author, views, clicks, followed, gifts, last), strict=True))


# Two transition runs' pair rows: the second run's are the same pairs' totals after more meetings (alice
# and author-1 met again on day 2 and she followed), plus a pair met only then; bob's pair only in the first.
PAIR_RUNS = [
    (
        _at(DAY1_END, 1),
        [
            [_pair_row("alice", "author-1", 2, 1, 0, 0.0, _at(DAY1_END, 10))],
            [_pair_row("bob", "author-1", 1, 1, 0, 5.0, _at(DAY1_END, 3))],
        ],
    ),
    (
        _at(DAY2_END, 1),
        [
            [
                _pair_row("alice", "author-1", 3, 2, 1, 0.0, _at(DAY2_END, 5)),
                _pair_row("alice", "author-2", 1, 0, 0, 0.0, _at(DAY2_END, 4)),
            ]
        ],
    ),
]


def test_pair_histories_from_two_runs_serve_each_pairs_latest_totals(offline_root, user_table, tmp_path):
    from recsys_rl.pipelines.transitions import PairHistoryFiles
    from recsys_rl.pipelines.whole_files import WriteWholeFiles

    dataset = tmp_path / "dataset"  # as a transition run lays it out: its Feast rows under features/
    root = dataset / "features"
    shutil.copytree(offline_root, root)
    with beam.Pipeline() as p:
        (
            p
            | beam.Create([(cut, rows) for cut, users in PAIR_RUNS for rows in users])
            | PairHistoryFiles()
            | WriteWholeFiles(str(dataset), str(tmp_path / "beam-temp"))
        )
    assert sorted(p.name for p in (root / "user_author_history").iterdir()) == [
        f"as-of-{cut}.parquet" for cut, _ in PAIR_RUNS
    ]
    config = MaterializeConfig(
        repo=str(REPO), offline=str(root), user_table=str(user_table), state_dir=str(tmp_path), end_date=END
    )
    report = materialize_repo(config)
    assert report.without_data == ()
    assert {v.name: v.entities for v in report.views}["user_author_history"] == 3  # pairs, not users
    store = open_store(REPO, "sqlite", state_dir=tmp_path)
    pairs = [("alice", "author-1"), ("bob", "author-1"), ("alice", "author-2"), ("bob", "author-2")]
    names = ("views", "clicks", "followed", "gifts", "last_interaction_ms")
    online = store.get_online_features(
        features=[f"user_author_history:{n}" for n in names],
        entity_rows=[{"user_id": u, "author_id": a} for u, a in pairs],
    ).to_df()
    got = [tuple(row) for row in online[list(names)].itertuples(index=False)]
    assert got[:3] == [
        (3, 2, 1, 0.0, _at(DAY2_END, 5)),  # the second run's totals supersede the first's
        (1, 1, 0, 5.0, _at(DAY1_END, 3)),  # a pair the second run did not meet keeps its row
        (1, 0, 0, 0.0, _at(DAY2_END, 4)),
    ]
    assert online.iloc[3][list(names)].isna().all()  # never met


def test_cli_profiles_match_the_library():
    assert tuple(PROFILES) == features_cmd._PROFILES
    assert REDIS_ENV == features_cmd._REDIS_ENV


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        pytest.param(
            {"repo": "/nonexistent/features"}, ConfigError, "feature repo '/nonexistent/features'", id="repo"
        ),
        pytest.param({"offline": "/nonexistent/offline"}, ConfigError, "offline directory", id="offline-dir"),
        pytest.param(
            {"profile": "redis", "redis": None}, ConfigError, f"needs ${{{REDIS_ENV}}}", id="no-redis"
        ),
        pytest.param(
            {"profile": "redis", "redis": "redis://"}, ConfigError, "should name a host", id="bad-url"
        ),
    ],
)
def test_bad_settings_are_one_clear_error(
    changes, error, message, offline_root, user_table, tmp_path, monkeypatch
):
    monkeypatch.delenv(REDIS_ENV, raising=False)
    settings = {
        "repo": str(REPO),
        "offline": str(offline_root),
        "user_table": str(user_table),
        "state_dir": str(tmp_path),
        **changes,
    }
    with pytest.raises(error, match=re.escape(message)):
        materialize_repo(MaterializeConfig(**settings))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        pytest.param(
            {"profile": "mysql"}, "profile should be one of ['sqlite', 'redis'], but is 'mysql'", id="profile"
        ),
        pytest.param({"end_date": "yesterday"}, "end_date should be an ISO date or date-time", id="end-date"),
    ],
)
def test_bad_config_values_are_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(MaterializeConfig, None, overrides)


def test_missing_offline_data_is_a_feature_store_error(user_table, tmp_path):
    (tmp_path / "offline" / "user_engagement").mkdir(parents=True)
    config = MaterializeConfig(
        repo=str(REPO), offline=str(tmp_path / "offline"), user_table=str(user_table), state_dir=str(tmp_path)
    )
    with pytest.raises(FeatureStoreError, match="no offline data for feature view 'user_engagement'"):
        materialize_repo(config)


def test_a_missing_user_table_is_a_feature_store_error(offline_root, tmp_path):
    config = MaterializeConfig(
        repo=str(REPO), offline=str(offline_root), user_table=str(tmp_path / "none"), state_dir=str(tmp_path)
    )
    with pytest.raises(FeatureStoreError, match="no user table for feature view 'user_activity'"):
        materialize_repo(config)


def test_unreachable_redis_is_a_quick_clear_error(offline_root, user_table, tmp_path):
    port = free_port()  # nothing listens there
    config = MaterializeConfig(
        repo=str(REPO),
        profile="redis",
        offline=str(offline_root),
        user_table=str(user_table),
        state_dir=str(tmp_path),
        redis=f"127.0.0.1:{port}",
    )
    with pytest.raises(FeatureStoreError, match=f"cannot reach the Redis online store at 127.0.0.1:{port}"):
        materialize_repo(config)


@pytest.mark.slow  # Feast's Redis client retries a refused connection for about 7 s before it gives up
def test_online_reads_fail_with_a_feature_store_error_when_redis_goes_away(redis_report, tmp_path):
    _, state = redis_report
    store = open_store(
        REPO, "redis", state_dir=state, redis=f"127.0.0.1:{free_port()},socket_connect_timeout=0.5"
    )
    with pytest.raises(FeatureStoreError, match=r"online read failed on redis 127\.0\.0\.1"):
        online_user_features(store, ["alice"])


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("localhost:6379", "localhost:6379"),
        ("redis://10.0.0.5:6380/2", "10.0.0.5:6380,db=2"),
        ("rediss://user:p%40ss@cache:6379", "cache:6379,username=user,password=p@ss,ssl=true"),
        ("redis://cache", "cache:6379"),
    ],
)
def test_redis_urls_become_feast_connection_strings(given, expected):
    assert redis_connection_string(given) == expected


@pytest.mark.slow  # a fresh process imports Feast and Beam: about 8 s
def test_the_feast_cli_applies_the_same_repo(offline_root, user_table, tmp_path):
    """`feast -c <repo> -f <profile yaml> apply` works on the repo as it is (on a copy, to keep data/ out)."""
    repo = tmp_path / "repo"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns("data", "__pycache__"))
    feast = Path(sys.executable).with_name("feast")
    result = subprocess.run(
        [str(feast), "-c", str(repo), "-f", str(repo / "feature_store.yaml"), "apply"],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "RECSYS_RL_FEATURES_OFFLINE": str(offline_root),
            "RECSYS_RL_USER_TABLE": str(user_table),
        },
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Created feature service user_state_v3" in result.stdout
    assert (repo / "data" / "sqlite-registry.db").is_file()


def test_the_verb_raises_config_error_for_main_to_print_as_one_line():
    args = argparse.Namespace(
        config=None,
        repo="/nonexistent",
        profile=None,
        offline=None,
        user_table=None,
        state_dir=None,
        redis=None,
        start_date=None,
        end_date=None,
        reset=None,
    )
    with pytest.raises(ConfigError, match="feature repo '/nonexistent'"):
        features_cmd.run_materialize(args)


def test_a_cold_burst_of_known_users_fills_the_cache_for_their_next_pages(tmp_path):
    """The server's reader on a real store: 32 callers, 96 cold known users, the default 5 ms budget.

    What the closed loop saw before: with four lookups in flight, a refused lookup never started a read,
    so the second burst of the same users (their next pages) still fell back 89 times in 96.
    """
    from concurrent.futures import ThreadPoolExecutor

    from recsys_rl.serving.online_features import UserFeatureReader

    users = {f"user-{i}": i % 4 for i in range(96)}
    facts = [_fact(user, "video-1", _at(DAY1_END, 2), watch=10.0) for user in users]
    with beam.Pipeline() as p:
        p | beam.Create(facts) | WriteFeatureAggregates(str(tmp_path / "offline"))
    write_user_activity(tmp_path / "users", list(users), list(users.values()), int(DAY1.timestamp() * 1000))
    config = MaterializeConfig(
        repo=str(REPO),
        offline=str(tmp_path / "offline"),
        user_table=str(tmp_path / "users"),
        state_dir=str(tmp_path / "state"),
        end_date=END,
    )
    materialize_repo(config)
    reader = UserFeatureReader(open_store(REPO, state_dir=tmp_path / "state"))
    reader.warm_up()

    def burst():
        with ThreadPoolExecutor(32) as callers:
            return list(callers.map(lambda user: asyncio.run(reader.lookup(user, 0.005)), users))

    burst()  # cold: how many make the budget depends on the machine; every one queues a read
    deadline = time.monotonic() + 30.0
    while reader.pending() and time.monotonic() < deadline:
        time.sleep(0.01)
    second = burst()
    reader.close()
    assert [lookup.missing for lookup in second] == [None] * 96
    assert [int(lookup.user.activity_group[0]) for lookup in second] == list(users.values())
