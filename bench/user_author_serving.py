"""Benchmark: what the user-author term adds to a Rank, against the same Rank without it, in one process.

Set-up: a SQLite feature store holding ``users`` users' rows and, for each, the histories of the pairs
with ``met`` of the 50 authors a request's 200 candidates name (the other authors never met the user, so
the store has no row for them, as in production); an exported user-author value (the default 64x64 MTCL
critic, exported with PolicySaver and loaded as the server loads it; untrained, since a network call
costs the same whatever its weights). The server's own RPC handlers (``serving.service.Handlers``) run
on one event loop with the real store readers, the feed's fallback policy and a decision log that only
encodes each record (Kafka's cost is the same with and without the term).

Measured, interleaved in rounds over the same requests: the wall time of a Rank's handler with the
term routed as stable and with no term (the user_author fallback, which reads no pair), both with every
row already cached (a session's later pages, the steady state), and the ratio of the two means. Beside
them, the cold read: one Rank's 50 pairs read from the store at once, as a user's first page reads them.

    python bench/user_author_serving.py --quick --out bench/results/user_author_serving.json
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from common import bench_parser, write_result
from feature_reads import DAY, materialised_store
from serving_load import requests

from recsys_rl.pair_state import PAIR_STATE_FEATURES
from recsys_rl.serving import wire
from recsys_rl.serving.metrics import ServingMetrics
from recsys_rl.serving.online_features import PairHistoryReader, UserFeatureReader
from recsys_rl.serving.policies import (
    NoUserAuthorTerm,
    feed_fallback,
    load_feed_decider,
    load_user_author_decider,
)
from recsys_rl.serving.routing import PolicyHolder, ServingSet
from recsys_rl.serving.service import Handlers
from recsys_rl.serving.settings import ServeConfig
from recsys_rl.signals import PAIR_SIGNALS

AUTHORS = 50  # the distinct authors of a request's 200 candidates (bench/serving_load.py's requests)
MODES = {
    "quick": {"users": 64, "met": 20, "rounds": 5, "cold_users": 16},
    "full": {"users": 512, "met": 20, "rounds": 20, "cold_users": 64},
}


def pair_rows(users: int, met: int) -> list[dict[str, Any]]:
    """Each user's history with the first ``met`` authors: a few meetings each, the last on DAY."""
    rng = np.random.default_rng(0)
    return [
        {
            "user_id": f"user-{u}",
            "author_id": f"a{a}",
            "views": int(views),
            "clicks": int(rng.integers(0, views + 1)),
            "followed": int(rng.random() < 0.1),
            "gifts": 0.0,
            "last_interaction_ms": DAY * 86_400_000 + int(rng.integers(0, 86_400_000)),
        }
        for u in range(users)
        for a in range(met)
        for views in [rng.integers(1, 30)]
    ]


def exported_pair_value(directory: Path) -> Path:
    # TensorFlow only here: the agent is built and exported once
    from recsys_rl.training.agents.data import statistics_of
    from recsys_rl.training.agents.policy_io import export_pair_value_policy
    from recsys_rl.training.pair_value import PairValueAgent, PairValueConfig

    rng = np.random.default_rng(0)
    states = rng.random((256, len(PAIR_STATE_FEATURES)))
    rewards = rng.random((256, len(PAIR_SIGNALS)))
    agent = PairValueAgent(
        statistics_of(states, rewards, np.zeros((256, 0))), PairValueConfig(), critic="mtcl"
    )
    export_pair_value_policy(agent, directory, {"version": "ua-bench"})
    return directory


class EncodingLog:
    """The decision log's work on the request path, without Kafka: each record encoded, then dropped."""

    def submit(self, topic: str, record, candidates: bytes = b"") -> bool:
        record.SerializeToString()
        return True


#: The parts of a grpc.aio context a served Rank touches: no deadline, never cancelled.
CONTEXT = SimpleNamespace(time_remaining=lambda: None, cancelled=lambda: False)


def _summary(seconds: list[float]) -> dict[str, float]:
    ms = np.array(seconds) * 1e3
    return {
        "mean_ms": float(ms.mean()),
        "median_ms": float(np.median(ms)),
        "p99_ms": float(np.quantile(ms, 0.99)),
        "calls": int(ms.size),
    }


def main() -> None:
    args = bench_parser(__doc__, "user_author_serving").parse_args()
    mode = MODES[args.mode]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = materialised_store(mode["users"], root, pair_rows(mode["users"], mode["met"]))
        term = load_user_author_decider(exported_pair_value(root / "policy"), "ua-bench")
        users, pairs = UserFeatureReader(store), PairHistoryReader(store, batch_size=256)
        loop = asyncio.new_event_loop()
        try:
            cold = [
                _timed(loop, pairs.states(f"user-{u}", [f"a{a}" for a in range(AUTHORS)], 0, 30.0))
                for u in range(mode["cold_users"])
            ]
            fallback = feed_fallback()
            arms = {
                "without_term": ServingSet(NoUserAuthorTerm(), since_ms=0),
                "with_term": ServingSet(NoUserAuthorTerm(), since_ms=0, revision=1, stable=term),
            }
            # holders without a registry: what they serve is set here, arm by arm
            holders = {
                "feed": PolicyHolder(None, "feed", load_feed_decider, fallback),
                "user_author": PolicyHolder(
                    None, "user_author", load_user_author_decider, NoUserAuthorTerm()
                ),
            }
            holders["feed"].current = ServingSet(fallback, since_ms=0, revision=1, stable=fallback)
            config = ServeConfig(feature_budget_ms=30_000.0)  # the steady state: rows come from the cache
            handlers = Handlers(
                config, holders, users, pairs, EncodingLog(), ServingMetrics(), lambda: True, started_at_ms=0
            )
            pool = requests(200, args.seed)
            for i, request in enumerate(pool):
                request.user_id = f"user-{i % mode['users']}"
                request.context.event_time_ms = (DAY + 1) * 86_400_000 + 9 * 3_600_000
            # the requests as the server decodes them
            received = [wire.RankHead.FromString(r.SerializeToString()) for r in pool]
            times: dict[str, list[float]] = {arm: [] for arm in arms}
            for round_ in range(mode["rounds"] + 1):  # round 0 fills the caches and is not counted
                for arm, routing in arms.items():
                    holders["user_author"].current = routing
                    for request in received:
                        took = _timed(loop, handlers.rank(request, CONTEXT))
                        if round_:
                            times[arm].append(took)
        finally:
            loop.close()
            users.close()
            pairs.close()
    per_rank = {arm: _summary(seconds) for arm, seconds in times.items()}
    ratio = per_rank["with_term"]["mean_ms"] / per_rank["without_term"]["mean_ms"]
    result = {
        "benchmark": "user_author_serving",
        "mode": args.mode,
        "seed": args.seed,
        "config": {
            **mode,
            "candidates": 200,
            "authors": AUTHORS,
            "profile": "sqlite",
            "critic": "mtcl 64x64",
        },
        "per_rank": per_rank,
        "ratio_with_term": ratio,
        "added_ms_per_rank": per_rank["with_term"]["mean_ms"] - per_rank["without_term"]["mean_ms"],
        "cold_pair_read": {**_summary(cold), "pairs": AUTHORS},
    }
    write_result(args.out, result)
    with_term, without = per_rank["with_term"], per_rank["without_term"]
    print(
        f"user-author term: {with_term['mean_ms']:.2f} ms a Rank against {without['mean_ms']:.2f} ms "
        f"without (ratio {ratio:.2f}; p99 {with_term['p99_ms']:.2f} and {without['p99_ms']:.2f} ms); a cold "
        f"read of a Rank's {AUTHORS} pairs: {statistics.median(cold) * 1e3:.1f} ms median; wrote {args.out}"
    )


def _timed(loop: asyncio.AbstractEventLoop, coroutine) -> float:
    start = time.perf_counter()
    loop.run_until_complete(coroutine)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
