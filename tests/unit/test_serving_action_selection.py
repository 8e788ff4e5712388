"""Issue 19: every logged decision says how its action was chosen, for Rank and Allocate, served and shadow.

With ``explore`` off (``serve --no-explore``) the policy's mode is served and its log_propensity is only
the policy's density at that point; nothing in the record said so, and OPE weighted by it. The handlers
run here on their own (no sockets): a fake feature reader, a decision log that keeps what it is given.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np
import pytest

from recsys_rl import contracts
from recsys_rl.fusion import FEED_ACTION_NAMES
from recsys_rl.serving.metrics import ServingMetrics
from recsys_rl.serving.online_features import Lookup
from recsys_rl.serving.policies import allocation_fallback, feed_fallback
from recsys_rl.serving.request_validation import LIVE_PREDICTION_NAMES
from recsys_rl.serving.routing import ServingSet
from recsys_rl.serving.service import Handlers
from recsys_rl.serving.settings import ServeConfig


class NoStore:
    async def lookup(self, user_id: str, budget_s: float) -> Lookup:
        return Lookup(None, "no_store")


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


def _with_shadow(fallback) -> ServingSet:
    """The fallback as stable, and a second copy of it, under another version, as the shadow."""
    return ServingSet(
        fallback, since_ms=0, revision=1, stable=fallback, shadow=replace(fallback, version="shadow-v")
    )


def _handlers(explore: bool, log: KeptLog) -> Handlers:
    holders = {
        "feed": Holder(_with_shadow(feed_fallback())),
        "live_allocation": Holder(_with_shadow(allocation_fallback())),
    }
    config = ServeConfig(explore=explore, decisions_topic="decisions", shadow_topic="shadow")
    return Handlers(config, holders, NoStore(), log, ServingMetrics(), lambda: True, started_at_ms=0)


def _rank() -> contracts.RankRequest:
    predictions = (
        np.array([13.0, 0.45, 0.014, 0.0005, 0.0028, 0.0011, 0.00035]) * np.linspace(0.5, 2, 8)[:, None]
    )
    return contracts.RankRequest(
        schema_version=contracts.SERVING_SCHEMA_VERSION,
        request_id="r-1",
        user_id="u-1",
        page_size=3,
        prediction_names=FEED_ACTION_NAMES,
        context=contracts.serving_pb2.RequestContext(event_time_ms=1_700_000_000_000, session_id="s1"),
        candidates=[
            contracts.Candidate(item_id=f"v{j}", item_type=contracts.ITEM_TYPES["video"], predictions=row)
            for j, row in enumerate(predictions.tolist())
        ],
    )


def _allocate() -> contracts.AllocateRequest:
    return contracts.AllocateRequest(
        schema_version=contracts.SERVING_SCHEMA_VERSION,
        request_id="l-1",
        user_id="u-1",
        prediction_names=LIVE_PREDICTION_NAMES,
        live_candidate=contracts.Candidate(
            item_id="l1", item_type=contracts.ITEM_TYPES["live"], predictions=[90.0, 0.3, 5.0]
        ),
    )


@pytest.mark.parametrize(
    ("explore", "selection"), [(True, "sampled"), (False, "mode")], ids=["explore", "mode"]
)
def test_every_logged_record_says_how_its_action_was_chosen(explore, selection):
    log = KeptLog()
    handlers = _handlers(explore, log)
    asyncio.run(handlers.rank(_rank(), Context()))
    asyncio.run(handlers.allocate(_allocate(), Context()))
    arms = contracts.ROUTING_ARMS
    logged = [
        (topic, contracts.SURFACE_NAMES[r.surface], r.routing_arm, r.action_selection)
        for topic, r in log.records
    ]
    marked = contracts.ACTION_SELECTIONS[selection]
    assert logged == [
        ("decisions", "feed", arms["stable"], marked),
        ("shadow", "feed", arms["shadow"], marked),
        ("decisions", "live_allocation", arms["stable"], marked),
        ("shadow", "live_allocation", arms["shadow"], marked),
    ]
    for _, record in log.records:
        assert record.schema_version == contracts.DECISION_SCHEMA_VERSION == 2
        # what the pipeline reads back from the wire
        assert contracts.action_selection(contracts.decode_decision(contracts.encode(record))) == selection


def test_the_mode_is_what_no_explore_serves():
    """The mark matches the action: without exploration the feed action is the policy's mean, the same
    for every request id; with it, two request ids draw two actions."""
    actions = {}
    for explore in (True, False):
        for request_id in ("r-1", "r-2"):
            log = KeptLog()
            asyncio.run(_handlers(explore, log).rank(replace_id(_rank(), request_id), Context()))
            actions[explore, request_id] = list(log.records[0][1].action)
    assert actions[False, "r-1"] == actions[False, "r-2"]
    assert actions[True, "r-1"] != actions[True, "r-2"]


def replace_id(request: contracts.RankRequest, request_id: str) -> contracts.RankRequest:
    request.request_id = request_id
    return request
