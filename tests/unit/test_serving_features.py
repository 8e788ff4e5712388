"""The user-feature reader: batched reads, and every lookup that misses its budget still fills the cache."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import pytest

import recsys_rl.feature_store
from recsys_rl.pair_state import PAIR_STATE_FEATURES, PairHistory
from recsys_rl.serving.online_features import Lookup, PairHistoryReader, UserFeatureReader
from recsys_rl.state import StoredUserFeatures


def lookup(reader: UserFeatureReader, user_id: str, budget_s: float) -> Lookup:
    """One lookup from a caller outside the event loop (a thread of its own, as these tests are)."""
    return asyncio.run(reader.lookup(user_id, budget_s))


class SlowStore:
    """Stands in for Feast's online read: each call blocks until released; calls and their users are kept."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.release = threading.Event()
        self.fail = False
        self.edits = 0  # added to every view count: a row that changed in the store since it was read

    @property
    def reads(self) -> list[str]:
        return [user for call in self.calls for user in call]

    def read(self, store, user_ids):
        self.calls.append(list(user_ids))
        if user_ids != ["warm-up"]:  # the registry load at warm-up answers at once
            self.release.wait(5.0)
        if self.fail:
            raise OSError("the store is down")
        # a user's row says who it is (its view count); the store knows nothing of a new user
        known = {"activity_group": 1, "day": 100}
        return pd.DataFrame(
            [
                {
                    "user_id": u,
                    **({} if u.startswith("u-new") else {**known, "views": _views(u) + self.edits}),
                }
                for u in user_ids
            ]
        )


@pytest.fixture
def slow_store(monkeypatch) -> SlowStore:
    store = SlowStore()
    monkeypatch.setattr(recsys_rl.feature_store, "online_user_features", store.read, raising=False)
    return store


def _views(user_id: str) -> int:
    return sum(map(ord, user_id))


def _row_of(user: StoredUserFeatures | None) -> int | None:
    """Whose row a lookup answered with: its view count, unique per user id in these tests."""
    if user is None:
        return None
    assert len(user.views) == 1, "a lookup answers with the user's one row"
    return int(user.views[0])


def _wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _burst(reader: UserFeatureReader, users: list[str], budget_s: float) -> list[str | None]:
    """Concurrent lookups, one per user, as 32 callers would send them; the fallback reason of each."""
    with ThreadPoolExecutor(32) as pool:
        return [r.missing for r in pool.map(lambda u: lookup(reader, u, budget_s), users)]


def test_a_late_read_is_served_from_the_cache_next_time(slow_store: SlowStore) -> None:
    reader = UserFeatureReader(object(), readers=2, cache_s=60.0)
    first = lookup(reader, "u1", budget_s=0.01)
    assert first.user is None and first.missing == "timeout"
    slow_store.release.set()
    _wait_for(lambda: lookup(reader, "u1", budget_s=0.0).missing is None)
    second = lookup(reader, "u1", budget_s=0.0)
    assert _row_of(second.user) == _views("u1") and slow_store.reads == ["u1"]  # the store was read once
    # an unknown user is remembered as unknown, and not read again either
    slow_store.calls.clear()
    assert lookup(reader, "u-new", budget_s=1.0).missing == "unknown_user"
    assert lookup(reader, "u-new", budget_s=1.0).missing == "unknown_user"
    assert slow_store.reads == ["u-new"]
    reader.close()


def test_a_cold_burst_that_misses_its_budget_fills_the_cache_for_the_next_one(slow_store: SlowStore) -> None:
    # What went wrong before: with 4 lookups in flight, a refused lookup never started a read, so 96 cold
    # users all fell back and a second burst of the same users still fell back 89 times.
    reader = UserFeatureReader(object(), readers=2)
    users = [f"u{i}" for i in range(96)]
    assert _burst(reader, users, budget_s=0.005) == ["timeout"] * 96
    slow_store.release.set()
    _wait_for(lambda: reader.pending() == 0)
    assert _burst(reader, users, budget_s=0.005) == [None] * 96
    assert sorted(slow_store.reads) == sorted(users)  # each user read once
    # each user got their own row out of the batches they were read in
    assert [_row_of(lookup(reader, u, budget_s=0.0).user) for u in users] == [_views(u) for u in users]
    reader.close()


def test_users_waiting_while_a_reader_is_busy_share_one_store_call(slow_store: SlowStore) -> None:
    reader = UserFeatureReader(object(), readers=1, batch_size=20)
    assert lookup(reader, "first", budget_s=0.0).missing == "timeout"
    _wait_for(lambda: slow_store.calls == [["first"]])  # the only reader is now blocked on it
    assert _burst(reader, [f"u{i}" for i in range(50)], budget_s=0.0) == ["timeout"] * 50
    slow_store.release.set()
    _wait_for(lambda: reader.pending() == 0)
    # the 50 that queued meanwhile took three calls of at most batch_size users, oldest first
    assert [len(call) for call in slow_store.calls] == [1, 20, 20, 10]
    assert sorted(slow_store.reads[1:]) == sorted(f"u{i}" for i in range(50))
    reader.close()


def test_a_full_queue_falls_back_at_once_without_queueing(slow_store: SlowStore) -> None:
    reader = UserFeatureReader(object(), readers=1, max_pending=3)
    assert [lookup(reader, f"u{i}", budget_s=0.0).missing for i in range(5)] == ["timeout"] * 3 + ["busy"] * 2
    assert lookup(reader, "u0", budget_s=0.0).missing == "timeout"  # already queued: waits for that read
    slow_store.release.set()
    _wait_for(lambda: reader.pending() == 0)
    assert lookup(reader, "u0", budget_s=0.0).missing is None
    assert lookup(reader, "u4", budget_s=1.0).missing is None and slow_store.reads[-1] == "u4"
    reader.close()


def test_warm_up_reads_the_expected_users_before_the_first_request(slow_store: SlowStore) -> None:
    slow_store.release.set()
    reader = UserFeatureReader(object(), readers=1, batch_size=2, max_pending=3)
    # more users than the queue holds: they go through it in turns; duplicates are read once
    assert reader.warm_up(["u1", "u2", "u1", "u3", "u4", "u-new"]) == 5
    assert slow_store.calls[0] == ["warm-up"]  # Feast's registry is loaded first
    assert sorted(slow_store.reads[1:]) == ["u-new", "u1", "u2", "u3", "u4"]
    assert _row_of(lookup(reader, "u4", budget_s=0.0).user) == _views("u4")
    assert lookup(reader, "u-new", budget_s=0.0).missing == "unknown_user"
    assert reader.warm_up(["u1"]) == 0 and len(slow_store.reads) == 7  # cached: not read again
    reader.close()
    many = [f"m{i}" for i in range(7)]  # over three turns of a queue of two
    reader = UserFeatureReader(object(), readers=1, max_pending=2)
    assert reader.warm_up(many) == 7 and sorted(slow_store.reads[8:]) == many  # after its registry load
    reader.close()


def test_warm_up_carries_on_when_the_store_cannot_load_its_registry(monkeypatch) -> None:
    """A store down at start-up is the requests' fallback's business: warm-up reads nothing, and says so."""
    from recsys_rl.feature_store import FeatureStoreError

    def down(store, user_ids):
        raise FeatureStoreError("the online store is unreachable")

    monkeypatch.setattr(recsys_rl.feature_store, "online_user_features", down, raising=False)
    reader = UserFeatureReader(object(), readers=1)
    assert reader.warm_up(["u1", "u2"], timeout_s=5.0) == 0
    reader.close()


def test_warm_up_gives_up_on_a_hung_store(slow_store: SlowStore) -> None:
    reader = UserFeatureReader(object(), readers=1)
    assert reader.warm_up(["u1", "u2"], timeout_s=0.2) == 0  # waiting out the hang would have read both
    slow_store.release.set()
    reader.close()


def test_a_failed_read_falls_back_and_is_not_cached(slow_store: SlowStore) -> None:
    slow_store.release.set()
    slow_store.fail = True
    reader = UserFeatureReader(object(), readers=1)
    assert lookup(reader, "u1", budget_s=1.0).missing == "error"
    slow_store.fail = False
    assert lookup(reader, "u1", budget_s=1.0).missing is None
    assert slow_store.reads == ["u1", "u1"]
    reader.close()


def test_closing_releases_queued_lookups(slow_store: SlowStore) -> None:
    reader = UserFeatureReader(object(), readers=1)
    assert lookup(reader, "first", budget_s=0.0).missing == "timeout"
    _wait_for(lambda: slow_store.calls == [["first"]])
    results: list[str | None] = []
    waiting = threading.Thread(target=lambda: results.append(lookup(reader, "queued", budget_s=5.0).missing))
    waiting.start()
    _wait_for(lambda: reader.pending() == 2)  # "first", being read, and "queued"
    reader.close()
    waiting.join(2.0)
    assert results == ["error"]
    assert lookup(reader, "later", budget_s=1.0).missing == "error"
    slow_store.release.set()


class FakeClock:
    """A monotonic clock that moves only when a test moves it."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_entries_expire_and_the_oldest_go_first(slow_store: SlowStore) -> None:
    slow_store.release.set()
    clock = FakeClock()
    reader = UserFeatureReader(object(), readers=2, cache_s=60.0, cache_size=2, clock=clock)
    for user in ("u1", "u2", "u3"):
        assert lookup(reader, user, budget_s=1.0).user is not None
    assert lookup(reader, "u1", budget_s=1.0).user is not None  # u1 was evicted: read again
    assert slow_store.reads == ["u1", "u2", "u3", "u1"]
    clock.now = 1_059.5  # u3 was read at 1000, so it expires at 1060: still fresh, answered without a read
    assert _row_of(lookup(reader, "u3", budget_s=0.0).user) == _views("u3")
    assert len(slow_store.reads) == 4 and reader.pending() == 0
    clock.now = 1_060.0  # at the expiry
    # expired: answered from the cache at once, and read again in the background
    slow_store.release.clear()
    assert _row_of(lookup(reader, "u3", budget_s=0.0).user) == _views("u3")
    _wait_for(lambda: slow_store.reads[-1:] == ["u3"] and len(slow_store.reads) == 5)
    assert _row_of(lookup(reader, "u3", budget_s=0.0).user) == _views(
        "u3"
    )  # the refresh is under way: no second one
    slow_store.release.set()
    _wait_for(lambda: reader.pending() == 0)
    assert len(slow_store.reads) == 5
    reader.close()


def test_a_cache_shorter_than_a_second_still_caches(slow_store: SlowStore) -> None:
    slow_store.release.set()
    clock = FakeClock()
    reader = UserFeatureReader(object(), readers=1, cache_s=0.5, clock=clock)
    assert [_row_of(lookup(reader, "u1", budget_s=1.0).user) for _ in range(2)] == [_views("u1")] * 2
    assert slow_store.reads == ["u1"]
    reader.close()


def test_without_a_store_nothing_is_read_and_every_lookup_says_so() -> None:
    reader = UserFeatureReader(None)
    assert reader.warm_up(["u1"]) == 0
    assert lookup(reader, "u1", budget_s=1.0) == Lookup(None, "no_store")
    assert reader.pending() == 0


def test_without_a_cache_every_lookup_reads(slow_store: SlowStore) -> None:
    slow_store.release.set()
    reader = UserFeatureReader(object(), readers=2, cache_s=0.0)
    for _ in range(3):
        assert lookup(reader, "u1", budget_s=1.0).user is not None
    assert slow_store.reads == ["u1"] * 3
    slow_store.edits = 1  # the store's row changed: the next lookup answers with it, not with a kept one
    assert _row_of(lookup(reader, "u1", budget_s=1.0).user) == _views("u1") + 1
    reader.close()


class PairStore:
    """Stands in for Feast's online read of pairs: answers at once; the user has met author a-met."""

    def __init__(self) -> None:
        self.calls: list[list[tuple[str, str]]] = []
        self.fail = False

    def read(self, store, pairs):
        self.calls.append(list(pairs))
        if self.fail:
            raise OSError("the store is down")
        met = {"views": 5, "clicks": 2, "followed": 1, "gifts": 1.5, "last_interaction_ms": 1_000}
        # as Feast returns them: nullable integers, a pair the store lacks all null
        return pd.DataFrame(
            [{"user_id": u, "author_id": a, **(met if a == "a-met" else {})} for u, a in pairs]
        ).astype({"views": "Int64"})


@pytest.fixture
def pair_store(monkeypatch) -> PairStore:
    store = PairStore()
    monkeypatch.setattr(recsys_rl.feature_store, "online_pair_histories", store.read, raising=False)
    return store


def test_pair_states_read_each_pair_once_and_a_pair_never_met_is_first(pair_store: PairStore) -> None:
    reader = PairHistoryReader(object(), readers=1)
    at_ms = 1_000 + 2 * 86_400_000
    states, missing = asyncio.run(reader.states("u1", ["a-met", "a-new", "a-met"], at_ms, budget_s=5.0))
    assert missing is None
    assert pair_store.calls == [[("u1", "a-met"), ("u1", "a-new")]]  # one read, each pair once
    met = PairHistory(5, 2, True, 1.5, 1_000).state(at_ms)
    np.testing.assert_allclose(states, [met, PairHistory().state(at_ms), met])
    # answered from memory the second time, however many candidates name the author
    again, _ = asyncio.run(reader.states("u1", ["a-new", "a-met"], at_ms, budget_s=0.0))
    np.testing.assert_allclose(again, states[[1, 0]])
    assert len(pair_store.calls) == 1
    reader.close()


def test_pair_states_say_why_when_the_store_fails_or_there_is_none(pair_store: PairStore) -> None:
    pair_store.fail = True
    reader = PairHistoryReader(object(), readers=1)
    assert asyncio.run(reader.states("u1", ["a-met"], 0, budget_s=5.0)) == (None, "error")
    reader.close()
    assert asyncio.run(PairHistoryReader(None).states("u1", ["a-met"], 0, budget_s=5.0)) == (None, "no_store")
    assert asyncio.run(PairHistoryReader(None).states("u1", [], 0, budget_s=5.0)) == (None, "no_store")


def test_a_spent_budget_answers_at_once_and_its_read_fills_the_cache(pair_store: PairStore) -> None:
    """A budget already spent (the deadline passed while the request waited) does not wait for a store
    that would answer a moment later; the read goes on and the next page has the row."""
    reader = PairHistoryReader(object(), readers=1)
    assert asyncio.run(reader.states("u1", ["a-met"], 0, budget_s=-0.5)) == (None, "timeout")
    _wait_for(lambda: reader.pending() == 0)
    states, missing = asyncio.run(reader.states("u1", ["a-met"], 0, budget_s=0.0))
    assert missing is None and states[0, 2] == 1.0  # followed
    assert len(pair_store.calls) == 1
    reader.close()


def test_a_rank_without_author_linked_candidates_reads_no_pair(pair_store: PairStore) -> None:
    reader = PairHistoryReader(object(), readers=1)
    states, missing = asyncio.run(reader.states("u1", [], 0, budget_s=1.0))
    assert missing is None and states.shape == (0, len(PAIR_STATE_FEATURES))
    assert pair_store.calls == []
    reader.close()
