"""Stand-ins for what the RPC handlers talk to, so that unit tests run ``serving.service.Handlers``
without sockets, a store or Kafka: a reader that has no store, a decision log that keeps what it is
given, a context that never times out, a routing holder, and a valid Rank request."""

from __future__ import annotations

import numpy as np

from recsys_rl import contracts
from recsys_rl.fusion import FEED_ACTION_NAMES
from recsys_rl.serving import wire
from recsys_rl.serving.online_features import Lookup
from recsys_rl.serving.routing import ServingSet


class NoStore:
    """A user or pair reader without a store: every lookup falls back at once."""

    async def lookup(self, user_id: str, budget_s: float) -> Lookup:
        return Lookup(None, "no_store")

    async def states(self, user_id, author_ids, at_ms, budget_s):
        return None, "no_store"


class KeptLog:
    def __init__(self) -> None:
        self.records: list[tuple[str, contracts.DecisionRecord]] = []

    def submit(self, topic: str, record: contracts.DecisionRecord, candidates: bytes = b"") -> bool:
        self.records.append((topic, record))
        return True


class Context:
    def time_remaining(self) -> None:
        return None

    def cancelled(self) -> bool:
        return False


class Holder:
    def __init__(self, current: ServingSet) -> None:
        self.current = current


#: Each candidate's predictions: one typical value of every signal, scaled up a little per candidate.
RANK_PREDICTIONS = (
    np.array([13.0, 0.45, 0.014, 0.0005, 0.0028, 0.0011, 0.00035]) * np.linspace(0.5, 2, 8)[:, None]
)


def rank_request(request_id: str = "r-1", author_ids: tuple[str, ...] = ()) -> contracts.RankRequest:
    """A Rank of the 8 candidates of ``RANK_PREDICTIONS``; candidate j names ``author_ids[j]`` if given."""
    return contracts.RankRequest(
        schema_version=contracts.SERVING_SCHEMA_VERSION,
        request_id=request_id,
        user_id="u-1",
        page_size=3,
        prediction_names=FEED_ACTION_NAMES,
        context=contracts.serving_pb2.RequestContext(event_time_ms=1_700_000_000_000, session_id="s1"),
        candidates=[
            contracts.Candidate(
                item_id=f"v{j}",
                item_type=contracts.ITEM_TYPES["video"],
                predictions=row,
                author_id=author_ids[j] if author_ids else "",
            )
            for j, row in enumerate(RANK_PREDICTIONS.tolist())
        ],
    )


def as_received(request: contracts.RankRequest) -> wire.RankHead:
    """``request`` as the server decodes it off the wire (its candidates left encoded)."""
    return wire.RankHead.FromString(request.SerializeToString())


def encoded(request: contracts.RankRequest) -> list[bytes]:
    """Each candidate of ``request`` as its encoded bytes, in order."""
    return list(as_received(request).candidates)
