"""WriteFeatureAggregates: hand-computed per-day aggregates, Feast-ready Parquet, byte-identical reruns."""

import datetime as dt
import random
import shutil
from fractions import Fraction
from pathlib import Path

import apache_beam as beam
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing import test_pipeline  # module import: pytest would collect TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from recsys_rl.feature_tables import (
    AGGREGATE_TABLES,
    AUTHOR_STATS,
    ITEM_STATS,
    TIMESTAMP_COLUMN,
    USER_ENGAGEMENT,
)
from recsys_rl.pipelines.feature_aggregates import WriteFeatureAggregates, shard_of

DAY0 = dt.datetime(2024, 3, 10, tzinfo=dt.UTC)
DAY0_END = DAY0 + dt.timedelta(days=1)
DAY1_END = DAY0 + dt.timedelta(days=2)
D0 = (DAY0 - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)).days  # the UTC day's number, a user row's "day"
DAYS = ("2024-03-10", "2024-03-11", "2024-03-12")
NAN = None  # expected null rate


def at(day: int, hour: int, minute: int = 0, ms: int = 0) -> int:
    moment = DAY0 + dt.timedelta(days=day, hours=hour, minutes=minute, milliseconds=ms)
    return int(moment.timestamp() * 1000)


def fact(user, item, author, when, kind="video", **signals) -> dict:
    values = dict.fromkeys(("watch_time_s", "live_watch_s", "gift"), 0.0)
    values.update(dict.fromkeys(("click", "like", "follow", "comment", "share", "hate"), 0))
    values.update(signals)
    return {
        "user_id": user,
        "item_id": item,
        "author_id": author,
        "item_type": kind,
        "event_time_ms": when,
        **values,
    }


# u1's day 0: two videos (one liked, one followed + commented + hated) and a live stream late in the day.
# u2 views v1 at the last millisecond of day 0 and again at the first millisecond of day 1. u3 watches
# only a live stream on day 1.
FACTS = [
    fact("u1", "v1", "a1", at(0, 8), watch_time_s=10.5, click=1, like=1),
    fact("u1", "v2", "a1", at(0, 9), watch_time_s=3.25, follow=1, comment=1, hate=1),
    fact("u1", "L1", "a2", at(0, 20), kind="live", click=1, live_watch_s=120.0, gift=5.0),
    fact("u2", "v1", "a1", at(0, 23, 59, 59_999), watch_time_s=7.0, click=1, share=1),
    fact("u2", "v1", "a1", at(1, 0), watch_time_s=2.0),
    fact("u2", "v1", "a1", at(1, 5), watch_time_s=2.0),
    fact("u1", "v2", "a1", at(1, 10), watch_time_s=5.0),
    fact("u3", "L1", "a2", at(1, 15), kind="live", click=1, live_watch_s=30.0),
]

USER_ROWS = [
    # user, day end, day, views, click, like, watch/view, interactions/view, hate, live views, live s/view
    ("u1", DAY0_END, D0, 2, 0.5, 0.5, 6.875, 1.5, 0.5, 1, 120.0),
    ("u2", DAY0_END, D0, 1, 1.0, 0.0, 7.0, 1.0, 0.0, 0, NAN),
    ("u1", DAY1_END, D0 + 1, 1, 0.0, 0.0, 5.0, 0.0, 0.0, 0, NAN),
    ("u2", DAY1_END, D0 + 1, 2, 0.0, 0.0, 2.0, 0.0, 0.0, 0, NAN),
    ("u3", DAY1_END, D0 + 1, 0, NAN, NAN, NAN, NAN, NAN, 1, 30.0),
]
ITEM_ROWS = [
    # item, day end, views, click rate, watch/view (live seconds for L1), like rate, hate rate
    ("L1", DAY0_END, 1, 1.0, 120.0, 0.0, 0.0),
    ("v1", DAY0_END, 2, 1.0, 8.75, 0.5, 0.0),
    ("v2", DAY0_END, 1, 0.0, 3.25, 0.0, 1.0),
    ("L1", DAY1_END, 1, 1.0, 30.0, 0.0, 0.0),
    ("v1", DAY1_END, 2, 0.0, 2.0, 0.0, 0.0),
    ("v2", DAY1_END, 1, 0.0, 5.0, 0.0, 0.0),
]
AUTHOR_ROWS = [
    ("a1", DAY0_END, 3, 1 / 3),
    ("a2", DAY0_END, 1, 0.0),
    ("a1", DAY1_END, 3, 0.0),
    ("a2", DAY1_END, 1, 0.0),
]


EXACT_WATCHES = [0.1, 0.2, 0.3, 1e-9, 1e9]  # (0.1 + 0.2) + 0.3 != 0.1 + (0.2 + 0.3) in floating point
EXACT_FACTS = [fact("u", f"v{i}", "a", at(0, i), watch_time_s=w) for i, w in enumerate(EXACT_WATCHES)]
SHARD_FACTS = [fact(f"user-{i}", "v", "a", at(0, 1)) for i in range(20)]
MANY_FACTS = [
    fact(f"u{i % 37}", f"v{i % 53}", f"a{i % 11}", at(i % 3, i % 24, i % 60), watch_time_s=0.1 * i)
    for i in range(600)
]
# name -> (facts, num_shards): one pipeline writes them all, since each Beam run costs seconds
CASES = {
    "hand": (FACTS, 1),
    "mixed": (MANY_FACTS + EXACT_FACTS + SHARD_FACTS, 4),
    "empty": ([], 1),
}


def days_of(facts) -> list[str]:
    return sorted(
        {dt.datetime.fromtimestamp(f["event_time_ms"] / 1000, dt.UTC).date().isoformat() for f in facts}
    )


def expected_paths(root: Path, facts, num_shards: int) -> list[str]:
    return [
        f"{root}/{table.name}/{day}-{shard:05d}-of-{num_shards:05d}.parquet"
        for table in AGGREGATE_TABLES
        for day in days_of(facts)
        for shard in range(num_shards)
    ]


def run(cases: dict, root: Path, options: PipelineOptions | None = None) -> None:
    """Write each case under root/<case> in one pipeline, checking the paths the transform reports."""
    with test_pipeline.TestPipeline(options=options) as p:
        for name, (facts, num_shards) in cases.items():
            written = (
                p
                | f"Create_{name}" >> beam.Create(facts)
                | f"Write_{name}" >> WriteFeatureAggregates(str(root / name), num_shards=num_shards)
            )
            assert_that(
                written, equal_to(expected_paths(root / name, facts, num_shards)), label=f"Paths_{name}"
            )


def parquet_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.parquet"))


def rows(root: Path, table) -> list[tuple]:
    data = pq.read_table(root / table.name).to_pylist()
    ordered = sorted(data, key=lambda r: (r[TIMESTAMP_COLUMN], r[table.join_key]))
    return [(r[table.join_key], r[TIMESTAMP_COLUMN], *(r[n] for n in table.feature_names)) for r in ordered]


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("offline")
    run(CASES, root)
    return root


def test_one_file_per_table_and_day_named_by_date(written):
    assert parquet_files(written / "hand") == sorted(
        f"{t.name}/{day}-00000-of-00001.parquet"
        for t in AGGREGATE_TABLES
        for day in ("2024-03-10", "2024-03-11")
    )


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        pytest.param(USER_ENGAGEMENT, USER_ROWS, id="user"),
        pytest.param(ITEM_STATS, ITEM_ROWS, id="item"),
        pytest.param(AUTHOR_STATS, AUTHOR_ROWS, id="author"),
    ],
)
def test_hand_computed_day_aggregates(written, table, expected):
    assert rows(written / "hand", table) == expected


def test_rows_are_stamped_with_the_end_of_their_utc_day(written):
    # u2's views 1 ms apart fall on two days; each row appears only once its day is over.
    u2 = [r for r in rows(written / "hand", USER_ENGAGEMENT) if r[0] == "u2"]
    assert [r[1] for r in u2] == [
        dt.datetime(2024, 3, 11, tzinfo=dt.UTC),
        dt.datetime(2024, 3, 12, tzinfo=dt.UTC),
    ]


def test_parquet_schema_is_the_feature_tables_contract(written):
    for table in AGGREGATE_TABLES:
        for path in (written / "hand" / table.name).glob("*.parquet"):
            assert pq.read_schema(path).remove_metadata() == table.arrow_schema()


def test_sums_are_exact_so_their_order_cannot_matter(written):
    (row,) = [r for r in rows(written / "mixed", USER_ENGAGEMENT) if r[0] == "u"]
    watch_per_view = row[2 + USER_ENGAGEMENT.feature_names.index("watch_s_per_view")]
    assert watch_per_view == float(sum(map(Fraction, EXACT_WATCHES)) / len(EXACT_WATCHES))


def test_entities_go_to_their_stable_shard_and_every_shard_is_written(written):
    root = written / "mixed"
    for table in AGGREGATE_TABLES:
        names = {
            (day, shard): f"{table.name}/{day}-{shard:05d}-of-00004.parquet"
            for day in DAYS
            for shard in range(4)
        }
        assert [f for f in parquet_files(root) if f.startswith(f"{table.name}/")] == sorted(names.values())
        for (_, shard), name in names.items():
            ids = pq.read_table(root / name).column(table.join_key).to_pylist()
            assert ids == sorted(ids) and all(shard_of(i, 4) == shard for i in ids)
    shard_users = [f["user_id"] for f in SHARD_FACTS]
    assert pq.read_table(root / "user_engagement", filters=[("user_id", "in", shard_users)]).num_rows == 20


def test_no_facts_write_no_files(written):
    assert parquet_files(written / "empty") == []


def test_shuffled_input_and_other_bundling_give_byte_identical_files(written, tmp_path):
    facts, num_shards = CASES["mixed"]
    shuffled = facts[:]
    random.Random(7).shuffle(shuffled)
    # other bundles: two worker processes (threads would do, but Beam's threaded mode loses elements)
    processes = PipelineOptions(direct_num_workers=2, direct_running_mode="multi_processing")
    run({"mixed": (shuffled, num_shards)}, tmp_path, options=processes)
    first, second = parquet_files(written / "mixed"), parquet_files(tmp_path / "mixed")
    assert first == second and len(first) == 3 * 3 * 4  # tables x days x shards
    for name in first:
        assert (written / "mixed" / name).read_bytes() == (tmp_path / "mixed" / name).read_bytes(), name


def test_a_rerun_replaces_the_days_it_covers(written, tmp_path):
    shutil.copytree(written / "hand", tmp_path / "hand")
    run({"hand": ([f for f in FACTS if f["user_id"] == "u3"], 1)}, tmp_path)  # day 1 again, u3 only
    users = [(r[0], r[1]) for r in rows(tmp_path / "hand", USER_ENGAGEMENT)]
    assert users == [("u1", DAY0_END), ("u2", DAY0_END), ("u3", DAY1_END)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"offline_root": ""}, "offline_root should be a directory", id="empty-root"),
        pytest.param({"offline_root": "x", "num_shards": 0}, "num_shards should be", id="zero-shards"),
    ],
)
def test_bad_settings_fail_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WriteFeatureAggregates(**kwargs)
