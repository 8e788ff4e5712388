"""Issue 22: a Rank adds the routed user-author version's term to each author-linked candidate's score.

The handlers run on their own (no sockets, ``serving_fakes``) with a pair reader that answers from a
dict and a linear stand-in for the trained value, so every number can be computed here by hand.
"""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
from serving_fakes import RANK_PREDICTIONS, Context, Holder, KeptLog, NoStore, as_received, rank_request

from recsys_rl import contracts
from recsys_rl.fusion import fusion_scores
from recsys_rl.gaussian import ScalarGaussian, standard_log_density
from recsys_rl.pair_state import PairHistory
from recsys_rl.serving.metrics import ServingMetrics
from recsys_rl.serving.policies import (
    NoUserAuthorTerm,
    UserAuthorTermDecider,
    feed_fallback,
    request_seed,
    seeded_generator,
)
from recsys_rl.serving.routing import ServingSet
from recsys_rl.serving.service import Handlers
from recsys_rl.serving.settings import ServeConfig

NOW_MS = 1_700_000_000_000
DAY_MS = 86_400_000
#: Candidate j's author; candidate 2 names none. Candidate 0 has the lowest fusion score of the page.
AUTHORS = ("a-fan", "a-new", "", "a-x", "a-new", "a-y", "a-x", "a-y")
#: What the store knows: the user has met a-fan often and follows them; a-x once, long ago.
KNOWN = {
    "a-fan": PairHistory(views=40, clicks=12, followed=True, gifts=3.0, last_time_ms=NOW_MS - DAY_MS),
    "a-x": PairHistory(views=1, clicks=0, followed=False, gifts=0.0, last_time_ms=NOW_MS - 90 * DAY_MS),
}


class DictPairs:
    """A pair reader answering from KNOWN (a pair it lacks never met), or failing with ``missing``."""

    def __init__(self, missing: str | None = None) -> None:
        self.missing = missing
        self.calls: list[list[str]] = []

    async def states(self, user_id, author_ids, at_ms, budget_s):
        # the request's user, at the request's time, within the server's feature budget
        assert (user_id, at_ms, budget_s) == ("u-1", NOW_MS, pytest.approx(0.005))
        self.calls.append(list(author_ids))
        if self.missing is not None:
            return None, self.missing
        return np.array([KNOWN.get(a, PairHistory()).state(at_ms) for a in author_ids]), None


class LinearValue:
    """Stands in for the trained value: views count, a follow counts 3."""

    def of_states(self, states: np.ndarray) -> np.ndarray:
        return states[:, 0] + 3.0 * states[:, 2]


TERM = UserAuthorTermDecider(
    LinearValue(), weight=ScalarGaussian(math.log(2.0), 0.3, "ua-1"), term_id="linear-1", version="ua-1"
)


def handlers(
    user_author: ServingSet,
    pairs: DictPairs,
    log: KeptLog,
    metrics: ServingMetrics | None = None,
    explore: bool = True,
) -> Handlers:
    fallback = feed_fallback()
    holders = {
        "feed": Holder(ServingSet(fallback, since_ms=0, revision=1, stable=fallback)),
        "user_author": Holder(user_author),
    }
    config = ServeConfig(explore=explore, decisions_topic="decisions", shadow_topic="shadow")
    return Handlers(
        config, holders, NoStore(), pairs, log, metrics or ServingMetrics(), lambda: True, started_at_ms=0
    )


def stable(decider) -> ServingSet:
    return ServingSet(NoUserAuthorTerm(), since_ms=0, revision=1, stable=decider)


def rank(user_author: ServingSet, pairs: DictPairs, request_id: str = "r-1", metrics=None):
    log = KeptLog()
    request = rank_request(request_id, AUTHORS)
    request.context.event_time_ms = NOW_MS
    response = asyncio.run(handlers(user_author, pairs, log, metrics).rank(as_received(request), Context()))
    return response, log.records


def expected_terms() -> np.ndarray:
    return np.array(
        [
            0.0
            if not a
            else LinearValue().of_states(np.array([KNOWN.get(a, PairHistory()).state(NOW_MS)]))[0]
            for a in AUTHORS
        ]
    )


def test_the_term_adds_exp_weight_times_each_candidates_pair_value_and_the_record_keeps_it():
    pairs = DictPairs()
    response, records = rank(stable(TERM), pairs)
    [(topic, record)] = records
    assert topic == "decisions"
    logged = record.user_author
    # the weight logit: the version's Gaussian, drawn from the request's own user-author seed
    noise = (logged.weight_logit - math.log(2.0)) / 0.3
    assert logged.log_propensity == pytest.approx(
        float(standard_log_density(np.array([noise]), np.array([0.3])))
    )
    assert (logged.policy_version, logged.routing_arm) == ("ua-1", contracts.ROUTING_ARMS["stable"])
    assert (logged.missing_reason, logged.term_id) == ("", "linear-1")
    np.testing.assert_allclose(logged.terms, expected_terms(), rtol=1e-6)
    scores = fusion_scores(RANK_PREDICTIONS[None], np.array(record.action)[None])[0]
    scores = scores + np.exp(logged.weight_logit) * expected_terms()
    order = np.argsort(-scores, kind="stable")[:3]
    assert list(response.item_ids) == list(record.served_item_ids) == [f"v{j}" for j in order]
    np.testing.assert_allclose(response.scores, scores[order], rtol=1e-5)
    assert response.user_author_version == "ua-1"
    assert (response.request_id, response.schema_version) == ("r-1", contracts.SERVING_SCHEMA_VERSION)
    assert list(response.action) == list(record.action)
    assert (response.log_propensity, response.policy_version) == (
        record.log_propensity,
        record.policy_version,
    )
    assert response.routing_arm == record.routing_arm == contracts.ROUTING_ARMS["stable"]
    assert pairs.calls == [["a-fan", "a-new", "a-x", "a-y"]]  # each author once, in order of appearance
    # the term matters here: the followed author's candidate, last on fusion alone, is ranked first
    assert response.item_ids[0] == "v0"


def test_the_weight_draw_is_its_own_and_leaves_the_fusion_action_as_without_a_term():
    with_term = [rank(stable(TERM), DictPairs(), request_id)[1][0][1] for request_id in ("r-1", "r-1", "r-2")]
    without = rank(stable(NoUserAuthorTerm()), DictPairs())[1][0][1]
    assert list(with_term[0].action) == list(without.action)
    assert with_term[0].log_propensity == without.log_propensity
    assert not without.HasField("user_author")
    logits = [r.user_author.weight_logit for r in with_term]
    assert logits[0] == logits[1] != logits[2]  # a retry draws the same weight; another request another
    # not the fusion action's first noise: the two draws come from different seeds
    fusion_noise = seeded_generator(request_seed("r-1")).standard_normal(1)[0]
    assert logits[0] != pytest.approx(np.float32(math.log(2.0) + 0.3 * fusion_noise))


def test_no_explore_serves_the_weights_mean():
    log = KeptLog()
    request = rank_request("r-1", AUTHORS)
    asyncio.run(handlers(stable(TERM), DictPairs(), log, explore=False).rank(as_received(request), Context()))
    assert log.records[0][1].user_author.weight_logit == pytest.approx(math.log(2.0))


@pytest.mark.parametrize("missing", ["timeout", "busy", "error", "no_store"])
def test_pairs_that_cannot_be_read_leave_the_term_out_and_say_why(missing):
    metrics = ServingMetrics()
    response, [(_, record)] = rank(stable(TERM), DictPairs(missing), metrics=metrics)
    assert record.user_author.missing_reason == missing
    assert list(record.user_author.terms) == []
    assert response.user_author_version == ""
    scores = fusion_scores(RANK_PREDICTIONS[None], np.array(record.action)[None])[0]
    assert list(response.item_ids) == [f"v{j}" for j in np.argsort(-scores, kind="stable")[:3]]
    assert metrics.value("recsys_serving_user_author_terms_missing_total", reason=missing) == 1


def test_without_a_routed_term_no_pair_is_read():
    pairs = DictPairs()
    rank(stable(NoUserAuthorTerm()), pairs)
    rank(ServingSet(NoUserAuthorTerm(), since_ms=0), pairs)
    assert pairs.calls == []


def test_a_user_author_shadow_is_logged_on_the_shadow_topic_and_never_served():
    shadow_only = ServingSet(NoUserAuthorTerm(), since_ms=0, revision=1, shadow=TERM)
    response, records = rank(shadow_only, DictPairs())
    (served_topic, served), (shadow_topic, shadow) = records
    assert (served_topic, shadow_topic) == ("decisions", "shadow")
    assert not served.HasField("user_author") and response.user_author_version == ""
    assert response.item_ids[0] != "v0"  # served on fusion alone
    assert shadow.user_author.routing_arm == contracts.ROUTING_ARMS["shadow"]
    assert shadow.routing_arm == contracts.ROUTING_ARMS["shadow"]
    assert list(shadow.action) == list(served.action)  # the feed has no shadow: what it served
    assert shadow.served_item_ids[0] == "v0"  # what the shadow term would have shown
