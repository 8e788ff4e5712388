"""Online user features within a latency budget, with a fallback that never stalls a request.

Feast reads block (a Redis client retries a refused connection for seconds), so lookups run on a
small thread pool and the request waits at most its budget. At most ``max_in_flight`` lookups run at
once: while the store hangs, later requests skip the lookup at once instead of queueing behind
stuck ones. Feast is imported only when a store is configured (it is slow to import, and its import
switches prometheus_client into multiprocess mode; see recsys_rl.serving.metrics). Every fallback says why
(``MISSING_REASONS``), for the metrics; the decision record carries ``features_missing``.

A Feast online read costs milliseconds of Python (request planning and type checks) before the store
is even asked, more than a request's whole budget on a busy machine. The rows it returns change once a
day, when the pipeline materialises, so each answer is kept for ``cache_s`` seconds: a lookup that
missed its budget still finishes in the background and fills the cache, and the user's next request
(the next page of the session) is answered from memory.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING

from recsys_rl.serving.online_state import UserFeatures

if TYPE_CHECKING:
    from feast import FeatureStore

MISSING_REASONS = ("no_store", "unknown_user", "timeout", "busy", "error")
_FAILED = object()  # a read that raised: nothing to cache


@dataclass(frozen=True)
class Lookup:
    user: UserFeatures | None
    missing: str | None  # None when the store answered with the user's row; else one of MISSING_REASONS


def _answer(user: UserFeatures | None) -> Lookup:
    return Lookup(user, None if user is not None else "unknown_user")


class UserFeatureReader:
    def __init__(
        self, store: FeatureStore | None, max_in_flight: int, cache_s: float = 60.0, cache_size: int = 100_000
    ) -> None:
        self._store = store
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._pool = ThreadPoolExecutor(max_in_flight, thread_name_prefix="features") if store else None
        self._cache_s, self._cache_size = cache_s, cache_size
        self._cache: OrderedDict[str, tuple[float, UserFeatures | None]] = (
            OrderedDict()
        )  # id -> (expiry, row)
        self._pending: dict[str, Future] = {}  # reads under way, by user id
        self._cache_lock = threading.Lock()

    def warm_up(self) -> None:
        """Load Feast's registry before the first request needs it (the first read otherwise pays for it)."""
        if self._store is not None:
            from recsys_rl.feature_store import FeatureStoreError, online_user_features

            # a store that is down now is the per-request fallback's business
            with contextlib.suppress(FeatureStoreError):
                online_user_features(self._store, ["warm-up"])

    def lookup(self, user_id: str, budget_s: float) -> Lookup:
        if self._store is None or self._pool is None:
            return Lookup(None, "no_store")
        with self._cache_lock:
            cached = self._fresh(user_id)
            future = self._pending.get(user_id)  # a read of this user already under way: wait for it
        if cached is not None:
            return _answer(cached[1])
        if future is None:
            if not self._slots.acquire(blocking=False):
                return Lookup(None, "busy")
            try:
                future = self._start_read(user_id)
            except RuntimeError:  # the pool is shut down: the server is stopping
                self._slots.release()
                return Lookup(None, "error")
        try:
            user = future.result(timeout=max(budget_s, 0.0))
        except FutureTimeout:
            return Lookup(None, "timeout")
        except Exception:  # any store failure, known (FeatureStoreError) or not, must not fail the request
            return Lookup(None, "error")
        return _answer(user)

    def _start_read(self, user_id: str) -> Future:
        with self._cache_lock:
            future = self._pending.get(user_id)
            if future is None:
                future = self._pending[user_id] = self._pool.submit(self._read, user_id)
                return future
        self._slots.release()  # another request started the same read meanwhile
        return future

    def _fresh(self, user_id: str) -> tuple[float, UserFeatures | None] | None:
        """The cached entry of ``user_id`` if it has not expired; the caller holds the cache lock."""
        entry = self._cache.get(user_id)
        if entry is None or entry[0] <= time.monotonic():
            return None
        self._cache.move_to_end(user_id)
        return entry

    def _remember(self, user_id: str, user: UserFeatures | None) -> None:
        with self._cache_lock:
            self._pending.pop(user_id, None)
            if user is _FAILED:
                return
            self._cache[user_id] = (time.monotonic() + self._cache_s, user)
            self._cache.move_to_end(user_id)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    def _read(self, user_id: str) -> UserFeatures | None:
        from recsys_rl.feature_store import online_user_features  # imported with the store, by open_store

        user = _FAILED
        try:
            frame = online_user_features(self._store, [user_id], include_event_timestamps=True)
            user = UserFeatures.from_row(frame.iloc[0].to_dict())
            return user
        finally:
            self._remember(user_id, user)  # also when the request gave up waiting: the next one finds it
            self._slots.release()  # when the read ends, not when the request stops waiting for it

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
