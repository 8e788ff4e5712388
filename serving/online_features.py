"""Online user features within a latency budget, with a fallback that never stalls a request.

Feast reads block (a Redis client retries a refused connection for seconds), so they run on a few
reader threads and a request waits at most its budget. A Feast online read costs milliseconds of Python
(request planning and type checks) whatever the number of users in it, more than a request's whole
budget on a busy machine, so the readers batch: every user waiting for a read when a reader comes free
goes into its one ``get_online_features`` call (up to ``batch_size``). Under load the batches grow and
the cost per user falls, where one read per user would queue behind itself.

Every lookup that is not answered from memory queues a read, whether or not the request can wait for
it: the read finishes in the background and fills the cache, and the user's next request (the next
page of the session) is answered from memory. The rows change once a day, when the pipeline
materialises, so a cached row is answered for ``cache_s`` seconds and after that still answered while a
refresh is read in the background: a known user never waits on the store twice. ``warm_up`` fills the
cache with the users expected next before the server reports ready. Only while the store hangs does
the queue fill up: beyond ``max_pending`` users a lookup falls back at once instead of queueing behind
the stuck reads.

One reader class serves every keyed online read: users (``UserFeatureReader``, one key a request) and
user-author pairs (``PairHistoryReader``, one key per candidate's author, awaited together).

Feast is imported only when a store is configured (it is slow to import, and its import switches
prometheus_client into multiprocess mode; see recsys_rl.serving.metrics). Every fallback says why
(``contracts.FEATURES_MISSING_REASONS``), in the metrics and in the decision record.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

import numpy as np
import pandas as pd

from recsys_rl.pair_state import PAIR_STATE_FEATURES, PairHistory, pair_states
from recsys_rl.state import StoredUserFeatures

if TYPE_CHECKING:
    from feast import FeatureStore

Key = TypeVar("Key", bound=Hashable)
Row = TypeVar("Row")


@dataclass(frozen=True)
class Lookup:
    user: StoredUserFeatures | None
    missing: str | None  # None when the store answered with the user's row; else the reason


def _answer(user: StoredUserFeatures | None) -> Lookup:
    return Lookup(user, None if user is not None else "unknown_user")


class OnlineRowReader(Generic[Key, Row]):
    """Cached, batched reads of keyed online rows; see the module docstring for the guarantees.

    A subclass says how one batch of keys is read (``_read``: a row per key, None for a key the store
    does not know)."""

    def __init__(
        self,
        store: FeatureStore | None,
        readers: int = 2,
        cache_s: float = 60.0,
        cache_size: int = 100_000,
        batch_size: int = 64,
        max_pending: int = 4_096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock``: seconds on a monotonic scale that cache entries expire on (tests move one by hand
        instead of sleeping past ``cache_s``); the waits on reads are real time."""
        self._store = store
        self._clock = clock
        self._cache_s, self._cache_size = cache_s, cache_size
        self._batch_size, self._max_pending = batch_size, max_pending
        # key -> (expiry, row), least recently used first; a row of None is a key the store lacks
        self._cache: OrderedDict[Key, tuple[float, Row | None]] = OrderedDict()
        self._pending: dict[Key, Future] = {}  # keys queued or being read
        self._queue: deque[Key] = deque()  # keys waiting for a reader, oldest first
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._closed = False
        self._readers = [
            threading.Thread(target=self._read_batches, name=f"features-{i}", daemon=True)
            for i in range(readers if store is not None else 0)
        ]
        for thread in self._readers:
            thread.start()

    async def _await_rows(self, futures: Sequence[Future], budget_s: float) -> tuple[list | None, str | None]:
        """The rows ``futures`` bring, awaited for ``budget_s`` at most; or None and why not.

        The server's handlers run on its event loop: awaiting the reader threads' answer lets the loop
        serve other requests meanwhile, where blocking on it would stall them all. Shielded: a request
        that gives up must not cancel the reads other requests wait for.
        """
        try:
            reads = [asyncio.wrap_future(future) for future in futures]
            read = asyncio.shield(reads[0] if len(reads) == 1 else asyncio.gather(*reads))
            rows = await asyncio.wait_for(read, timeout=max(budget_s, 0.0))
        except TimeoutError:
            return None, "timeout"
        except Exception:  # any store failure, known (FeatureStoreError) or not, must not fail the request
            return None, "error"
        return ([rows] if len(futures) == 1 else rows), None

    def _claim(self, key: Key) -> tuple[float, Row | None] | Future | str:
        """The cached entry of ``key``, or the read to wait for, or why there is none (the server is
        stopping, or too many reads are queued); the caller holds the lock."""
        entry = self._cache.get(key)
        if entry is not None:
            self._cache.move_to_end(key)
            if entry[0] <= self._clock() and key not in self._pending and self._has_room():
                self._enqueue(key)  # a refresh: this request takes the row the cache has
            return entry
        future = self._pending.get(key)  # a read of this key already queued: wait for it
        if future is not None:
            return future
        if self._closed:
            return "error"
        if not self._has_room():
            return "busy"
        return self._enqueue(key)

    def pending(self) -> int:
        """Keys queued for a read or being read now."""
        with self._lock:
            return len(self._pending)

    def _has_room(self) -> bool:
        """Whether another read may be queued; the caller holds the lock."""
        return not self._closed and len(self._pending) < self._max_pending

    def _enqueue(self, key: Key) -> Future:
        """A read of ``key`` for the next free reader; the caller holds the lock."""
        future: Future = Future()
        self._pending[key] = future
        self._queue.append(key)
        self._work.notify()
        return future

    def _fresh(self, key: Key) -> tuple[float, Row | None] | None:
        """The cached entry of ``key`` if it has not expired; the caller holds the lock."""
        entry = self._cache.get(key)
        if entry is None or entry[0] <= self._clock():
            return None
        self._cache.move_to_end(key)
        return entry

    def _read(self, keys: list[Key]) -> list[Row | None]:
        """One online read of ``keys``: a row per key, in order, None where the store has none."""
        raise NotImplementedError

    def _read_batches(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._work.wait()
                if self._closed:
                    return
                batch = [self._queue.popleft() for _ in range(min(len(self._queue), self._batch_size))]
            try:
                rows = self._read(batch)
            except Exception as err:  # the waiting requests fall back; nothing is cached
                self._settle(batch, None, err)
            else:
                self._settle(batch, rows, None)

    def _settle(self, batch: list[Key], rows: list[Row | None] | None, error: Exception | None) -> None:
        with self._lock:
            futures = [self._pending.pop(key) for key in batch]
            if rows is not None and self._cache_s > 0:
                expiry = self._clock() + self._cache_s
                for key, row in zip(batch, rows, strict=True):
                    self._cache[key] = (expiry, row)
                    self._cache.move_to_end(key)
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        for i, future in enumerate(futures):
            if rows is not None:
                future.set_result(rows[i])
            else:
                future.set_exception(error)

    def close(self) -> None:
        """Stop the readers; requests still waiting fall back (a read in progress is not interrupted)."""
        with self._lock:
            self._closed = True
            abandoned = [self._pending.pop(key) for key in self._queue]
            self._queue.clear()
            self._work.notify_all()
        for future in abandoned:
            future.set_exception(RuntimeError("the feature reader is closed"))


class UserFeatureReader(OnlineRowReader[str, StoredUserFeatures]):
    """Users' online rows (the feed and live state), one user a request."""

    def warm_up(self, user_ids: Iterable[str] = (), timeout_s: float = 60.0) -> int:
        """Load Feast's registry, then read ``user_ids`` into the cache; returns how many it read.

        For the users a load balancer is about to send (yesterday's active users of this shard): their
        first page is then answered from memory instead of waiting on a cold read. The reads go through
        the batching readers, ``max_pending`` users at a time; users the store does not know are cached
        as unknown. Gives up after ``timeout_s`` (a hung store), leaving the rest to the first requests.
        """
        if self._store is None:
            return 0
        from recsys_rl.feature_store import FeatureStoreError, online_user_features

        # a store that is down now is the per-request fallback's business
        with contextlib.suppress(FeatureStoreError):
            online_user_features(self._store, ["warm-up"])
        deadline = time.monotonic() + timeout_s
        ids = list(dict.fromkeys(user_ids))
        read = 0
        for start in range(0, len(ids), self._max_pending):
            with self._lock:
                futures = [
                    self._pending.get(user_id) or self._enqueue(user_id)
                    for user_id in ids[start : start + self._max_pending]
                    if self._fresh(user_id) is None and not self._closed
                ]
            done, _ = wait(futures, timeout=max(deadline - time.monotonic(), 0.0))
            read += sum(1 for future in done if future.exception() is None)
            if len(done) < len(futures):
                break
        return read

    async def lookup(self, user_id: str, budget_s: float) -> Lookup:
        """The user's row from memory at once, or from a read awaited for ``budget_s`` at most."""
        if self._store is None:
            return Lookup(None, "no_store")
        with self._lock:
            claimed = self._claim(user_id)
        if isinstance(claimed, str):
            return Lookup(None, claimed)
        if isinstance(claimed, tuple):
            return _answer(claimed[1])
        rows, missing = await self._await_rows([claimed], budget_s)
        return Lookup(None, missing) if rows is None else _answer(rows[0])

    def _read(self, keys: list[str]) -> list[StoredUserFeatures | None]:
        from recsys_rl.feature_store import online_user_features  # imported with the store, by open_store

        rows = StoredUserFeatures.from_records(online_user_features(self._store, keys).to_dict("records"))
        return [rows.take(slice(i, i + 1)) if rows.known[i] else None for i in range(len(keys))]


#: A pair the store does not know has never met.
_NEVER_MET = PairHistory()


class PairHistoryReader(OnlineRowReader[tuple[str, str], PairHistory]):
    """User-author pairs' online rows, read for every author-linked candidate of a Rank at once."""

    async def states(
        self, user_id: str, author_ids: Sequence[str], at_ms: int, budget_s: float
    ) -> tuple[np.ndarray | None, str | None]:
        """The pair states (len(author_ids), D) of ``user_id`` with each author at ``at_ms``, a pair the
        store does not know as never met; or None and why the rows could not be read in time."""
        if self._store is None:
            return None, "no_store"
        if not author_ids:
            return np.zeros((0, len(PAIR_STATE_FEATURES))), None
        entries: dict[tuple[str, str], PairHistory | None] = {}
        waits: dict[tuple[str, str], Future] = {}
        with self._lock:
            for author_id in dict.fromkeys(author_ids):
                claimed = self._claim((user_id, author_id))
                if isinstance(claimed, str):
                    return None, claimed
                if isinstance(claimed, tuple):
                    entries[(user_id, author_id)] = claimed[1]
                else:
                    waits[(user_id, author_id)] = claimed
        if waits:
            rows, missing = await self._await_rows(list(waits.values()), budget_s)
            if rows is None:
                return None, missing
            entries.update(zip(waits, rows, strict=True))
        histories = [entries[(user_id, a)] or _NEVER_MET for a in author_ids]
        views, clicks, followed, gifts, last_ms = zip(*histories, strict=True)
        last_ms = [-1 if t is None else t for t in last_ms]  # pair_states' mark of a pair never met
        columns = (np.array(c) for c in (views, clicks, followed, gifts, last_ms))
        return pair_states(*columns, np.int64(at_ms)), None

    def _read(self, keys: list[tuple[str, str]]) -> list[PairHistory | None]:
        from recsys_rl.feature_store import online_pair_histories  # imported with the store, by open_store

        frame = online_pair_histories(self._store, keys)
        return [
            None
            if pd.isna(row["views"])
            else PairHistory(
                int(row["views"]),
                int(row["clicks"]),
                bool(row["followed"]),
                float(row["gifts"]),
                int(row["last_interaction_ms"]),
            )
            for row in frame.to_dict("records")
        ]
