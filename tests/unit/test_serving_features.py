"""The user-feature reader: a lookup that misses its budget still fills the cache for the next request."""

from __future__ import annotations

import threading
import time

import pytest

import recsys_rl.feature_store
from recsys_rl.serving.online_features import UserFeatureReader
from recsys_rl.serving.online_state import UserFeatures


class SlowStore:
    """Stands in for Feast's online read: each read blocks until released and is counted."""

    def __init__(self) -> None:
        self.reads: list[str] = []
        self.release = threading.Event()

    def read(self, store, user_ids, include_event_timestamps=False):
        import pandas as pd

        self.reads.extend(user_ids)
        self.release.wait(5.0)
        known = user_ids[0] != "u-new"
        row = {"user_id": user_ids[0], "activity_group": 1 if known else None, "views": 7 if known else None}
        return pd.DataFrame([row])


@pytest.fixture
def slow_store(monkeypatch) -> SlowStore:
    store = SlowStore()
    monkeypatch.setattr(recsys_rl.feature_store, "online_user_features", store.read, raising=False)
    monkeypatch.setattr(UserFeatures, "from_row", classmethod(_from_row))
    return store


def _from_row(cls, row):
    return None if row["activity_group"] is None else (row["user_id"], row["activity_group"], row["views"])


def _wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_late_read_is_served_from_the_cache_next_time(slow_store: SlowStore) -> None:
    reader = UserFeatureReader(object(), max_in_flight=2, cache_s=60.0)
    first = reader.lookup("u1", budget_s=0.01)
    assert first.user is None and first.missing == "timeout"
    slow_store.release.set()
    _wait_for(lambda: reader.lookup("u1", budget_s=0.0).missing is None)
    second = reader.lookup("u1", budget_s=0.0)
    assert second.user == ("u1", 1, 7) and slow_store.reads == ["u1"]  # the store was read once
    # an unknown user is remembered as unknown, and not read again either
    slow_store.reads.clear()
    assert reader.lookup("u-new", budget_s=1.0).missing == "unknown_user"
    assert reader.lookup("u-new", budget_s=1.0).missing == "unknown_user"
    assert slow_store.reads == ["u-new"]
    reader.close()


def test_entries_expire_and_the_oldest_go_first(slow_store: SlowStore) -> None:
    slow_store.release.set()
    reader = UserFeatureReader(object(), max_in_flight=2, cache_s=0.2, cache_size=2)
    for user in ("u1", "u2", "u3"):
        assert reader.lookup(user, budget_s=1.0).user is not None
    assert reader.lookup("u1", budget_s=1.0).user is not None  # u1 was evicted: read again
    assert slow_store.reads == ["u1", "u2", "u3", "u1"]
    time.sleep(0.25)
    reader.lookup("u3", budget_s=1.0)  # expired: read again
    assert slow_store.reads[-1] == "u3" and len(slow_store.reads) == 5
    reader.close()


def test_without_a_cache_every_lookup_reads(slow_store: SlowStore) -> None:
    slow_store.release.set()
    reader = UserFeatureReader(object(), max_in_flight=2, cache_s=0.0)
    for _ in range(3):
        assert reader.lookup("u1", budget_s=1.0).user is not None
    assert slow_store.reads == ["u1"] * 3
    reader.close()
