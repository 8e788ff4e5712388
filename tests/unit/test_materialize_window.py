"""Materialisation's window follows the offline data, and a window that writes nothing says so.

The simulator dates its days from 2026-01-01, and backfills are older still: with the window taken from
"now", such data was never written while the views' watermarks moved past it (issue 23). Each test
builds a small offline root in Parquet and materialises it with the installed feature repo into a SQLite
online store under tmp_path.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import recsys_rl.feature_store
from recsys_rl.cli.main import build_parser, main
from recsys_rl.config import ConfigError, load_config
from recsys_rl.feature_store import (
    FeatureStoreError,
    MaterializeConfig,
    materialize_repo,
    online_user_features,
    open_store,
)
from recsys_rl.feature_tables import AGGREGATE_TABLES, TIMESTAMP_COLUMN, USER_ENGAGEMENT, write_user_activity
from recsys_rl.pipelines.pipeline_runs import PipelineError
from recsys_rl.pipelines.training_pipeline import PipelineConfig, _Steps

REPO = Path(__file__).resolve().parents[2] / "features"
DAY_END = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)  # the simulator's first day, 2026-01-01, is over
AS_OF = DAY_END - dt.timedelta(days=1)  # the user table's snapshot
USERS = ("ann", "ben")
KEYS = {"user_id": USERS, "item_id": ("video-1",), "author_id": ("author-1",)}
ENTITIES = {"user_engagement": 2, "user_activity": 2, "item_stats": 1, "author_stats": 1}
#: A week after the data, like the default window before issue 23 (now - ttl .. now): it misses every row.
MISSED = {"start_date": "2026-02-01", "end_date": "2026-02-08"}


def _write_day(offline: Path, views: int) -> None:
    """One day of aggregates, each row stamped with the day's end; ``views`` tells runs apart online."""
    for table in AGGREGATE_TABLES:
        keys = KEYS[table.join_key]
        columns = {
            table.join_key: list(keys),
            TIMESTAMP_COLUMN: [DAY_END] * len(keys),
            **{c.name: [views if c.dtype == "int64" else None] * len(keys) for c in table.columns},
        }
        (offline / table.name).mkdir(parents=True, exist_ok=True)
        pq.write_table(
            pa.Table.from_pydict(columns, schema=table.arrow_schema()), offline / table.name / "day-0.parquet"
        )


@pytest.fixture
def settings(tmp_path: Path) -> dict[str, str]:
    _write_day(tmp_path / "offline", views=1)
    write_user_activity(tmp_path / "users", USERS, [1, 2], int(AS_OF.timestamp() * 1000))
    return {
        "repo": str(REPO),
        "offline": str(tmp_path / "offline"),
        "user_table": str(tmp_path / "users"),
        "state_dir": str(tmp_path / "state"),
    }


def _online_views(settings: dict[str, str]) -> list[int]:
    """Each user's online ``views``; 0 for a user the online store does not have."""
    frame = online_user_features(open_store(REPO, state_dir=settings["state_dir"]), list(USERS))
    return frame["views"].fillna(0).tolist()


def _entities(report) -> dict[str, int]:
    return {view.name: view.entities for view in report.views}


def test_simulated_days_are_materialised_with_no_dates_given(settings) -> None:
    report = materialize_repo(MaterializeConfig(**settings))
    assert _entities(report) == ENTITIES
    windows = {view.name: (view.start, view.end) for view in report.views}
    assert windows["user_engagement"] == (DAY_END, DAY_END)  # each view's own data, not the latest of all
    assert windows["user_activity"] == (AS_OF, AS_OF)
    assert report.empty_windows("fix") == []
    assert _online_views(settings) == [1, 1]
    again = materialize_repo(MaterializeConfig(**settings))  # nothing new: already materialised, quietly
    assert {view.start for view in again.views} == {None} and again.empty_windows("fix") == []


@pytest.mark.parametrize(
    ("dates", "window"),
    [
        pytest.param(MISSED, ("2026-02-01", "2026-02-08"), id="after"),
        pytest.param({"start_date": "2026-02-01"}, ("2026-02-01", "2026-02-01"), id="start-after"),
        pytest.param({"end_date": "2025-12-01"}, ("2025-12-01", "2025-12-01"), id="end-before"),
    ],
)
def test_a_run_that_writes_nothing_leaves_the_next_run_its_data(settings, dates, window) -> None:
    missed = materialize_repo(MaterializeConfig(**settings, **dates))
    assert set(_entities(missed).values()) == {0} and len(missed.empty_windows("fix")) == 4
    expected = tuple(dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC) for day in window)
    assert {(view.start, view.end) for view in missed.views} == {expected}  # not past the data, not swapped
    corrected = materialize_repo(MaterializeConfig(**settings))
    assert _entities(corrected) == ENTITIES
    assert _online_views(settings) == [1, 1]


def test_a_later_day_with_nothing_new_for_a_view_is_no_miss(settings) -> None:
    """The demo materialises up to the end of each day it ingested; the user table got no rows after day
    0, so day 1's window of it is empty, and that is no error: nothing new, no rows left behind."""
    materialize_repo(MaterializeConfig(**settings, end_date="2026-01-02"))
    later = materialize_repo(MaterializeConfig(**settings, end_date="2026-01-03"))
    activity = next(view for view in later.views if view.name == "user_activity")
    assert (activity.start, activity.entities, activity.resumed) == (DAY_END, 0, True)
    assert later.empty_windows("fix") == []


@pytest.mark.parametrize("rerun", [{"reset": True}, {"start_date": "2026-01-01"}], ids=["reset", "start"])
def test_rows_behind_the_watermark_are_written_again_on_request(settings, rerun) -> None:
    materialize_repo(MaterializeConfig(**settings, end_date="2026-06-01"))  # watermarks well past the data
    _write_day(Path(settings["offline"]), views=5)  # the day's aggregates corrected in place
    assert {view.start for view in materialize_repo(MaterializeConfig(**settings)).views} == {None}
    assert _online_views(settings) == [1, 1]
    again = materialize_repo(MaterializeConfig(**settings, **rerun))
    assert _entities(again) == ENTITIES
    assert _online_views(settings) == [5, 5]  # re-materialised rows replace the online values


def test_the_command_warns_on_stderr_and_exits_0_when_a_view_writes_nothing(settings, capsys) -> None:
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in settings.items()]
    window = [f"--start-date={MISSED['start_date']}", f"--end-date={MISSED['end_date']}"]
    assert main(["features", "materialize", *flags, *window]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if ": warning: " in line]
    assert len(warnings) == 4
    assert (
        "recsys-rl features materialize: warning: 0 rows of user_engagement materialised between "
        "2026-02-01 00:00:00 and 2026-02-08 00:00:00 UTC; its offline data spans 2026-01-02 00:00:00 to "
        "2026-01-02 00:00:00 UTC: pass --start-date/--end-date to cover it, or --reset to start at its "
        "earliest row"
    ) in warnings
    assert main(["features", "materialize", *flags]) == 0
    captured = capsys.readouterr()
    assert ": warning: " not in captured.err and "user_engagement          2 entities" in captured.out


def test_the_pipelines_features_step_fails_when_a_view_writes_nothing(settings, tmp_path) -> None:
    dataset = tmp_path / "datasets" / "transitions-0"
    dataset.mkdir(parents=True)
    Path(settings["offline"]).rename(dataset / "features")  # the step points the repo at it
    features = {k: v for k, v in settings.items() if k != "offline"}

    def features_step(**dates) -> dict:
        config = load_config(
            PipelineConfig,
            None,
            {
                "work_dir": str(tmp_path / "work"),
                "registry": str(tmp_path / "registry"),
                "ingest": {"bootstrap_servers": "127.0.0.1:9092", "group": "g", "out": str(dataset.parent)},
                "features": {**features, **dates},
            },
        )
        record = {"steps": {"ingest": {"outputs": {"dataset": str(dataset), "version": dataset.name}}}}
        run_dir = tmp_path / "work" / "runs" / "r"
        run_dir.mkdir(parents=True, exist_ok=True)
        return _Steps(config, tmp_path / "work", record, run_dir, lambda event, fields: None).run("features")

    with pytest.raises(PipelineError, match=r"0 rows of user_engagement materialised .*features\.reset"):
        features_step(**MISSED)
    assert features_step()["outputs"]["views"] == ENTITIES


def test_offline_files_without_rows_are_a_feature_store_error(settings) -> None:
    # no rows, no window to take from them; and nothing to materialise, which would pass unnoticed
    empty = USER_ENGAGEMENT.arrow_schema().empty_table()
    pq.write_table(empty, Path(settings["offline"]) / USER_ENGAGEMENT.name / "day-0.parquet")
    with pytest.raises(FeatureStoreError, match="no offline data for feature view 'user_engagement'"):
        materialize_repo(MaterializeConfig(**settings))


def test_a_start_after_the_end_is_refused_naming_both() -> None:
    with pytest.raises(
        ConfigError, match=re.escape("start_date (2026-01-03) should be at or before end_date (2026-01-02)")
    ):
        load_config(MaterializeConfig, None, {"start_date": "2026-01-03", "end_date": "2026-01-02"})
    with pytest.raises(ConfigError, match="start_date should be an ISO date or date-time, but is 'monday'"):
        load_config(MaterializeConfig, None, {"start_date": "monday"})
    # naive values are UTC, so the same instant with an offset is no later
    load_config(MaterializeConfig, None, {"start_date": "2026-01-02T01:00+01:00", "end_date": "2026-01-02"})


def test_the_command_line_takes_the_window_flags(monkeypatch) -> None:
    parser = build_parser()
    assert parser.parse_args(["features", "materialize"]).reset is None  # leaves a config file's value
    configs = []

    def materialize_repo(config: MaterializeConfig):
        configs.append(config)
        raise KeyboardInterrupt  # stop here: the configuration is what this test is about

    monkeypatch.setattr(recsys_rl.feature_store, "materialize_repo", materialize_repo)
    window = ["--start-date", "2026-01-01", "--end-date", "2026-01-03T12:00", "--reset"]
    assert main(["features", "materialize", *window]) == 130
    [config] = configs
    assert (config.start_date, config.end_date, config.reset) == ("2026-01-01", "2026-01-03T12:00", True)
