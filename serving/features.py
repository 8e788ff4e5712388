"""Online user features within a latency budget, with a fallback that never stalls a request.

Feast reads block (a Redis client retries a refused connection for seconds), so lookups run on a
small thread pool and the request waits at most its budget. At most ``max_in_flight`` lookups run at
once: while the store hangs, later requests skip the lookup at once instead of queueing behind
stuck ones. Feast is imported only when a store is configured (it is slow to import, and its import
switches prometheus_client into multiprocess mode; see serving.metrics). Every fallback says why
(``MISSING_REASONS``), for the metrics; the decision record carries ``features_missing``.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING

from serving.state import UserFeatures

if TYPE_CHECKING:
    from feast import FeatureStore

MISSING_REASONS = ("no_store", "unknown_user", "timeout", "busy", "error")


@dataclass(frozen=True)
class Lookup:
    user: UserFeatures | None
    missing: str | None  # None when the store answered with the user's row; else one of MISSING_REASONS


class UserFeatureReader:
    def __init__(self, store: FeatureStore | None, max_in_flight: int) -> None:
        self._store = store
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._pool = ThreadPoolExecutor(max_in_flight, thread_name_prefix="features") if store else None

    def warm_up(self) -> None:
        """Load Feast's registry before the first request needs it (the first read otherwise pays for it)."""
        if self._store is not None:
            from recsys_rl.features import FeatureStoreError, online_user_features

            # a store that is down now is the per-request fallback's business
            with contextlib.suppress(FeatureStoreError):
                online_user_features(self._store, ["warm-up"])

    def lookup(self, user_id: str, budget_s: float) -> Lookup:
        if self._store is None or self._pool is None:
            return Lookup(None, "no_store")
        if not self._slots.acquire(blocking=False):
            return Lookup(None, "busy")
        try:
            future = self._pool.submit(self._read, user_id)
        except RuntimeError:  # the pool is shut down: the server is stopping
            self._slots.release()
            return Lookup(None, "error")
        try:
            user = future.result(timeout=max(budget_s, 0.0))
        except FutureTimeout:
            return Lookup(None, "timeout")
        except Exception:  # any store failure, known (FeatureStoreError) or not, must not fail the request
            return Lookup(None, "error")
        return Lookup(user, None if user is not None else "unknown_user")

    def _read(self, user_id: str) -> UserFeatures | None:
        from recsys_rl.features import online_user_features  # imported with the store, by open_store

        try:
            frame = online_user_features(self._store, [user_id], include_event_timestamps=True)
            return UserFeatures.from_row(frame.iloc[0].to_dict())
        finally:
            self._slots.release()  # when the read ends, not when the request stops waiting for it

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
