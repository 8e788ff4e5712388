"""Issue 19: every logged decision says how its action was chosen, for Rank and Allocate, served and shadow.

With ``explore`` off (``serve --no-explore``) the policy's mode is served and its log_propensity is only
the policy's density at that point; nothing in the record said so, and OPE weighted by it. The handlers
run here on their own (no sockets): a fake feature reader, a decision log that keeps what it is given.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from serving_fakes import Context, Holder, KeptLog, NoStore, as_received, rank_request

from recsys_rl import contracts
from recsys_rl.serving.metrics import ServingMetrics
from recsys_rl.serving.policies import NoUserAuthorTerm, allocation_fallback, feed_fallback
from recsys_rl.serving.request_validation import LIVE_PREDICTION_NAMES
from recsys_rl.serving.routing import ServingSet
from recsys_rl.serving.service import Handlers
from recsys_rl.serving.settings import ServeConfig


def _with_shadow(fallback) -> ServingSet:
    """The fallback as stable, and a second copy of it, under another version, as the shadow."""
    return ServingSet(
        fallback, since_ms=0, revision=1, stable=fallback, shadow=replace(fallback, version="shadow-v")
    )


def _handlers(explore: bool, log: KeptLog) -> Handlers:
    holders = {
        "feed": Holder(_with_shadow(feed_fallback())),
        "live_allocation": Holder(_with_shadow(allocation_fallback())),
        "user_author": Holder(ServingSet(NoUserAuthorTerm(), since_ms=0)),
    }
    config = ServeConfig(explore=explore, decisions_topic="decisions", shadow_topic="shadow")
    return Handlers(
        config, holders, NoStore(), NoStore(), log, ServingMetrics(), lambda: True, started_at_ms=0
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
    asyncio.run(handlers.rank(as_received(rank_request()), Context()))
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
            asyncio.run(_handlers(explore, log).rank(as_received(rank_request(request_id)), Context()))
            actions[explore, request_id] = list(log.records[0][1].action)
    assert actions[False, "r-1"] == actions[False, "r-2"]
    assert actions[True, "r-1"] != actions[True, "r-2"]
