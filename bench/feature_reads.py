"""Benchmark: online user features for the server, per read and under bursts of cold users.

A Feast online read costs milliseconds of Python whatever the number of users in it, which is why the
server's reader batches (``recsys_rl.serving.online_features``). Measured on the SQLite profile with a
day of aggregates materialised for ``users`` known users:

- ``read_ms``: one ``online_user_features`` call per batch size, the median of ``repeats`` calls, and
  the cost per user; what sizes ``feature_batch_size`` and ``feature_readers``.
- ``bursts``: ``burst`` cold known users looked up at once, awaited together on one event loop as the
  server's handlers await them, then the same users
  again every 50 ms, with the server's default 5 ms budget (the closed loop's pattern: the pages of a
  session follow each other). Reported per reader: the share answered with store features in the first
  burst, and after the first 100 ms (target: at least 95%). The baseline, timed in the same run, is the
  same reader reading one user per call (``batch_size=1``).

    python bench/feature_reads.py --quick --out bench/results/feature_reads.json
"""

from __future__ import annotations

import asyncio
import datetime as dt
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import apache_beam as beam
from common import bench_parser, write_result

from recsys_rl.feature_store import MaterializeConfig, materialize_repo, online_user_features, open_store
from recsys_rl.feature_tables import USER_AUTHOR_HISTORY, write_user_activity
from recsys_rl.pipelines.feature_aggregates import WriteFeatureAggregates
from recsys_rl.pipelines.transitions import pair_history_file
from recsys_rl.serving.online_features import UserFeatureReader

DAY = 20_454  # 2026-01-01, in days since the epoch
BUDGET_S = 0.005  # the server's default feature_budget_ms
TARGET_SERVED_AFTER_100_MS = 0.95
MODES = {
    "quick": {"users": 300, "burst": 96, "bursts": 10, "batch_sizes": [1, 8, 32, 64], "repeats": 5},
    "full": {"users": 3_000, "burst": 96, "bursts": 20, "batch_sizes": [1, 8, 32, 64, 128], "repeats": 21},
}


def _fact(user: int) -> dict[str, Any]:
    return {
        "user_id": f"user-{user}",
        "item_id": f"v{user}",
        "author_id": "a1",
        "item_type": "video",
        "event_time_ms": DAY * 86_400_000 + 3_600_000,
        "watch_time_s": 20.0,
        "click": user % 2,
        **dict.fromkeys(("like", "follow", "comment", "share", "hate"), 0),
        "live_watch_s": 0.0,
        "gift": 0.0,
    }


def materialised_store(users: int, root: Path, pair_rows: list[dict] | None = None):
    """A SQLite feature store holding ``users`` users' accounts and one day of their aggregates, and
    ``pair_rows`` (``feature_tables.USER_AUTHOR_HISTORY`` rows) as a transition run writes them."""
    with beam.Pipeline() as p:
        p | beam.Create([_fact(u) for u in range(users)]) | WriteFeatureAggregates(str(root / "offline"))
    if pair_rows:
        name, parquet = pair_history_file((DAY + 1) * 86_400_000, [pair_rows])
        pairs = root / "offline" / USER_AUTHOR_HISTORY.name
        pairs.mkdir()
        (pairs / Path(name).name).write_bytes(parquet)
    ids = [f"user-{u}" for u in range(users)]
    write_user_activity(root / "users", ids, [u % 4 for u in range(users)], DAY * 86_400_000)
    end = dt.datetime.fromtimestamp((DAY + 1) * 86_400 + 3_600, dt.UTC).isoformat()
    materialize_repo(
        MaterializeConfig(
            offline=str(root / "offline"),
            user_table=str(root / "users"),
            state_dir=str(root / "state"),
            end_date=end,
        )
    )
    return open_store(state_dir=root / "state")


def read_latency(store, batch_sizes: list[int], repeats: int) -> dict[str, Any]:
    out = {}
    for size in batch_sizes:
        users = [f"user-{u}" for u in range(size)]
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            online_user_features(store, users)
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        out[str(size)] = {"ms": median * 1e3, "ms_per_user": median * 1e3 / size, "min_ms": min(times) * 1e3}
    return out


def bursts(store, batch_size: int, users: int, burst: int, count: int) -> dict[str, Any]:
    """Served shares of repeated bursts of the same cold users, for one reader configuration."""
    reader = UserFeatureReader(store, batch_size=batch_size)
    served = []  # (seconds since the first burst, served with store features)

    async def run() -> None:
        start = time.perf_counter()
        for i in range(count):
            # the same users every time: the first burst is cold, the next follow as a session's pages would
            ids = [f"user-{u % users}" for u in range(burst)]
            issued = time.perf_counter() - start
            answers = await asyncio.gather(*(reader.lookup(user, BUDGET_S) for user in ids))
            served.extend((issued, a.missing is None) for a in answers)
            await asyncio.sleep(max(0.0, start + 0.05 * (i + 1) - time.perf_counter()))

    asyncio.run(run())
    reader.close()
    first = [ok for t, ok in served[:burst]]
    later = [ok for t, ok in served if t >= 0.1]
    return {
        "first_burst_served": sum(first) / len(first),
        "served_after_100ms": sum(later) / len(later) if later else None,
        "lookups": len(served),
    }


def main() -> None:
    args = bench_parser(__doc__, "feature_reads").parse_args()
    mode = MODES[args.mode]
    with tempfile.TemporaryDirectory() as tmp:
        store = materialised_store(mode["users"], Path(tmp))
        online_user_features(store, ["warm-up"])  # Feast loads its registry on the first read
        latency = read_latency(store, mode["batch_sizes"], mode["repeats"])
        batched = bursts(store, 64, mode["users"], mode["burst"], mode["bursts"])
        baseline = bursts(store, 1, mode["users"], mode["burst"], mode["bursts"])
    after = batched["served_after_100ms"]
    result = {
        "benchmark": "feature_reads",
        "mode": args.mode,
        "config": {**mode, "budget_ms": BUDGET_S * 1e3, "profile": "sqlite"},
        "read_ms": latency,
        "bursts": {"batched_64": batched, "baseline_one_user_per_read": baseline},
        "target": {
            "served_after_100ms": TARGET_SERVED_AFTER_100_MS,
            "met": after is not None and after >= TARGET_SERVED_AFTER_100_MS,
        },
    }
    write_result(args.out, result)
    per_size = ", ".join(f"{size}: {v['ms']:.1f} ms" for size, v in latency.items())
    print(f"feature reads: one online read by batch size {per_size}")
    print(
        f"bursts of {mode['burst']} cold users, awaited together, {BUDGET_S * 1e3:g} ms budget: "
        f"served {batched['first_burst_served']:.0%} in the first, {after:.1%} after 100 ms "
        f"(one user per read: {baseline['first_burst_served']:.0%}, {baseline['served_after_100ms']:.1%}); "
        f"wrote {args.out}"
    )


if __name__ == "__main__":
    main()
