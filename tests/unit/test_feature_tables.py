"""The platform's user table: one atomic snapshot per call, and bad input refused with what is wrong."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from recsys_rl.feature_tables import USER_ACTIVITY, write_user_activity


def test_a_snapshot_is_one_parquet_file_of_the_tables_schema(tmp_path):
    path = write_user_activity(tmp_path, ["a", "b"], [0, 3], as_of_ms=86_400_000)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind
    table = pq.read_table(path)
    assert table.schema.remove_metadata() == USER_ACTIVITY.arrow_schema()
    assert table.column("activity_group").to_pylist() == [0, 3]
    assert table.column("event_timestamp")[0].as_py().timestamp() == 86_400


@pytest.mark.parametrize(
    ("user_ids", "groups", "message"),
    [
        pytest.param(["a", "b"], [1], "one entry per user, but have 2 and 1", id="lengths"),
        pytest.param(["a"], [4], r"activity groups should be in \[0, 4\), but include 4", id="too-high"),
        pytest.param(["a"], [-1], r"activity groups should be in \[0, 4\), but include -1", id="negative"),
    ],
)
def test_bad_snapshots_are_refused_and_nothing_is_written(tmp_path, user_ids, groups, message):
    with pytest.raises(ValueError, match=message):
        write_user_activity(tmp_path / "users", user_ids, groups, as_of_ms=0)
    assert not (tmp_path / "users").exists()
