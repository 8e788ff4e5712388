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
from collections.abc import Callable, Iterable
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING

from recsys_rl.state import StoredUserFeatures

if TYPE_CHECKING:
    from feast import FeatureStore


@dataclass(frozen=True)
class Lookup:
    user: StoredUserFeatures | None
    missing: str | None  # None when the store answered with the user's row; else the reason


def _answer(user: StoredUserFeatures | None) -> Lookup:
    return Lookup(user, None if user is not None else "unknown_user")


class UserFeatureReader:
    """Cached, batched reads of users' online rows; see the module docstring for the guarantees."""

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
        # user id -> (expiry, row), least recently used first; a row of None is a user the store lacks
        self._cache: OrderedDict[str, tuple[float, StoredUserFeatures | None]] = OrderedDict()
        self._pending: dict[str, Future] = {}  # users queued or being read, by id
        self._queue: deque[str] = deque()  # users waiting for a reader, oldest first
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._closed = False
        self._readers = [
            threading.Thread(target=self._read_batches, name=f"features-{i}", daemon=True)
            for i in range(readers if store is not None else 0)
        ]
        for thread in self._readers:
            thread.start()

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
        """The user's row from memory at once, or from a read awaited for ``budget_s`` at most.

        The server's handlers run on its event loop: awaiting the reader threads' answer lets the loop
        serve other requests meanwhile, where blocking on it would stall them all.
        """
        if self._store is None:
            return Lookup(None, "no_store")
        with self._lock:
            entry = self._cache.get(user_id)
            if entry is not None:
                self._cache.move_to_end(user_id)
                if entry[0] <= self._clock() and user_id not in self._pending and self._has_room():
                    self._enqueue(user_id)  # a refresh: this request takes the row the cache has
                return _answer(entry[1])
            future = self._pending.get(user_id)  # a read of this user already queued: wait for it
            if future is None:
                if self._closed:  # the server is stopping
                    return Lookup(None, "error")
                if not self._has_room():
                    return Lookup(None, "busy")
                future = self._enqueue(user_id)
        try:
            # shielded: a request that gives up must not cancel the read other requests wait for
            read = asyncio.shield(asyncio.wrap_future(future))
            user = await asyncio.wait_for(read, timeout=max(budget_s, 0.0))
        except TimeoutError:
            return Lookup(None, "timeout")
        except Exception:  # any store failure, known (FeatureStoreError) or not, must not fail the request
            return Lookup(None, "error")
        return _answer(user)

    def pending(self) -> int:
        """Users queued for a read or being read now."""
        with self._lock:
            return len(self._pending)

    def _has_room(self) -> bool:
        """Whether another read may be queued; the caller holds the lock."""
        return not self._closed and len(self._pending) < self._max_pending

    def _enqueue(self, user_id: str) -> Future:
        """A read of ``user_id`` for the next free reader; the caller holds the lock."""
        future: Future = Future()
        self._pending[user_id] = future
        self._queue.append(user_id)
        self._work.notify()
        return future

    def _fresh(self, user_id: str) -> tuple[float, StoredUserFeatures | None] | None:
        """The cached entry of ``user_id`` if it has not expired; the caller holds the lock."""
        entry = self._cache.get(user_id)
        if entry is None or entry[0] <= self._clock():
            return None
        self._cache.move_to_end(user_id)
        return entry

    def _read_batches(self) -> None:
        from recsys_rl.feature_store import online_user_features  # imported with the store, by open_store

        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._work.wait()
                if self._closed:
                    return
                batch = [self._queue.popleft() for _ in range(min(len(self._queue), self._batch_size))]
            try:
                rows = StoredUserFeatures.from_records(
                    online_user_features(self._store, batch).to_dict("records")
                )
                users = [rows.take(slice(i, i + 1)) if rows.known[i] else None for i in range(len(batch))]
            except Exception as err:  # the waiting requests fall back; nothing is cached
                self._settle(batch, None, err)
            else:
                self._settle(batch, users, None)

    def _settle(
        self, batch: list[str], users: list[StoredUserFeatures | None] | None, error: Exception | None
    ) -> None:
        with self._lock:
            futures = [self._pending.pop(user_id) for user_id in batch]
            if users is not None and self._cache_s > 0:
                expiry = self._clock() + self._cache_s
                for user_id, user in zip(batch, users, strict=True):
                    self._cache[user_id] = (expiry, user)
                    self._cache.move_to_end(user_id)
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        for i, future in enumerate(futures):
            if users is not None:
                future.set_result(users[i])
            else:
                future.set_exception(error)

    def close(self) -> None:
        """Stop the readers; requests still waiting fall back (a read in progress is not interrupted)."""
        with self._lock:
            self._closed = True
            abandoned = [self._pending.pop(user_id) for user_id in self._queue]
            self._queue.clear()
            self._work.notify_all()
        for future in abandoned:
            future.set_exception(RuntimeError("the feature reader is closed"))
