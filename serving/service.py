"""The RPC handlers: validate, read features, decide, answer, log. No blocking I/O on this path.

They run on the server's asyncio event loop (grpc.aio): computing inline, awaiting only the feature read.

Each handler reads its surface's current ``ServingSet`` once, so a reload mid-request changes nothing
for that request. A Rank reads two: the feed's (the fusion action) and the user_author surface's (a term
added to each author-linked candidate's score, issue 22), each routed and explored on its own.

The served decision is logged to the decisions topic; a shadow policy's decision on the same state is
logged to the shadow topic (kept apart because it was never shown: the transition pipeline joins
feedback to decisions by request id and must see the served one only). A Rank logs one shadow record
when either surface has a shadow: what the shadows would have shown, each surface's shadow standing in
for what it served.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import numpy as np

from recsys_rl import contracts
from recsys_rl.fusion import fusion_scores, top_k
from recsys_rl.logs import get_logger
from recsys_rl.serving import wire
from recsys_rl.serving.decision_log import DecisionLog
from recsys_rl.serving.metrics import MetricChildren, ServingMetrics
from recsys_rl.serving.online_features import PairHistoryReader, UserFeatureReader
from recsys_rl.serving.online_state import event_time_ms, feed_state, live_state, user_group
from recsys_rl.serving.policies import Decider, PairTerm, request_seed, user_author_seed
from recsys_rl.serving.request_validation import (
    InvalidRequest,
    RankCandidates,
    validate_allocate,
    validate_rank,
)
from recsys_rl.serving.routing import PolicyHolder
from recsys_rl.serving.settings import ServeConfig
from recsys_rl.state import FEATURE_VERSION, FEED_STATE_FEATURES, LIVE_STATE_FEATURES

#: Time kept back from the client's deadline for inference and the answer, when budgeting the lookup.
_DEADLINE_RESERVE_S = 0.002

_logger = get_logger("serve")


class Abort(Exception):
    """Ends an RPC with ``code``; raised by handlers, turned into the gRPC status by ``instrumented``."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Decision:
    arm: str
    decider: Decider
    action: np.ndarray
    log_propensity: float
    # how the action was chosen (a key of contracts.ACTION_SELECTIONS): "sampled" from the policy, or
    # its "mode" (serve --no-explore), when log_propensity is only the density at that point
    selection: str


@dataclass(frozen=True)
class CandidatePairs:
    """The user's pairs with the authors of a Rank's candidates, as the store has them: one state per
    author, however many candidates name it (a page's 200 candidates come from a few dozen authors, and
    the values cost per row)."""

    candidates: int
    linked: np.ndarray  # indices of the candidates that name an author
    author_rows: np.ndarray  # for each linked candidate, its author's row of ``states``
    states: np.ndarray | None  # (authors, D) pair states; None when the rows could not be read
    missing: str | None  # why states is None

    def terms(self, term: PairTerm) -> np.ndarray | None:
        """``term`` of every candidate (0 for one without an author), or None without the pairs' rows."""
        if self.states is None:
            return None
        terms = np.zeros(self.candidates)
        terms[self.linked] = term.of_states(self.states)[self.author_rows]
        return terms


@dataclass(frozen=True)
class TermDecision:
    """A user-author version's part in one Rank: its weight logit and each candidate's term."""

    arm: str
    decider: Decider
    weight_logit: float
    log_propensity: float
    terms: np.ndarray | None  # (candidates,); None when the pairs' rows could not be read
    missing: str | None  # why terms is None

    @property
    def added(self) -> np.ndarray | float:
        """What the term adds to each candidate's fusion score (nothing when it is left out)."""
        return 0.0 if self.terms is None else np.exp(self.weight_logit) * self.terms

    def logged(self) -> contracts.events_pb2.UserAuthorTerm:
        return contracts.events_pb2.UserAuthorTerm(
            policy_version=self.decider.version,
            routing_arm=contracts.ROUTING_ARMS[self.arm],
            weight_logit=self.weight_logit,
            log_propensity=self.log_propensity,
            terms=() if self.terms is None else self.terms.tolist(),
            missing_reason=self.missing or "",
            term_id=self.decider.term_id,
        )


class Handlers:
    def __init__(
        self,
        config: ServeConfig,
        holders: dict[str, PolicyHolder],
        features: UserFeatureReader,
        pairs: PairHistoryReader,
        log: DecisionLog,
        metrics: ServingMetrics,
        is_ready: Callable[[], bool],
        started_at_ms: int,
    ) -> None:
        self._started_at_ms = started_at_ms
        self._config = config
        self._holders = holders
        self._features = features
        self._pairs = pairs
        self._log = log
        self._metrics = metrics
        self._is_ready = is_ready
        # labelled metric children, looked up once each (prometheus' labels() takes a lock per call)
        self._decision_counts = MetricChildren(metrics.decisions)
        self._features_missing = MetricChildren(metrics.features_missing)
        self._terms_missing = MetricChildren(metrics.user_author_terms_missing)

    def instrumented(self, method: str, handle: Callable) -> Callable:
        """``handle`` as a gRPC asyncio method: latency and status metrics, errors mapped to status codes.

        ``handle`` may be a plain function (it runs inline on the event loop: the handlers compute, and
        only wait where they await) or a coroutine function.
        """

        latency = self._metrics.latency.labels(method)
        counts = MetricChildren(self._metrics.requests)

        async def rpc(request, context: grpc.aio.ServicerContext):
            started = time.perf_counter()
            code, message = grpc.StatusCode.OK, ""
            try:
                _still_in_time(context)
                answer = handle(request, context)
                return await answer if inspect.isawaitable(answer) else answer
            except InvalidRequest as err:
                code, message = grpc.StatusCode.INVALID_ARGUMENT, str(err)
            except Abort as err:
                code, message = err.code, str(err)
            except asyncio.CancelledError:  # the client went away while the handler awaited
                code = grpc.StatusCode.CANCELLED
                raise
            except Exception:
                code, message = grpc.StatusCode.INTERNAL, "internal error; the server log has the details"
                _logger.exception("rpc_failed", extra={"kv": {"method": method}})
            finally:
                counts.get(method, code.name).inc()
                latency.observe(time.perf_counter() - started)
            await context.abort(code, message)

        return rpc

    # --- shared steps ----------------------------------------------------------------------------------

    def _budget_s(self, context: grpc.aio.ServicerContext) -> float:
        """The feature lookup's budget: the configured one, cut short by the client's deadline."""
        if not self._is_ready():
            raise Abort(grpc.StatusCode.UNAVAILABLE, "the server is still loading its policies")
        budget = self._config.feature_budget_ms / 1000.0
        remaining = context.time_remaining()
        if remaining is not None:
            if remaining <= 0:
                raise Abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the deadline passed before the request ran")
            budget = min(budget, remaining - _DEADLINE_RESERVE_S)
        return budget

    async def _state(self, request, time_ms: int, budget_s: float) -> tuple[np.ndarray, str | None]:
        """(feed state, why features are missing or None) of a Rank or Allocate request."""
        lookup = await self._features.lookup(request.user_id, budget_s)
        if lookup.missing is not None:
            self._features_missing.get(lookup.missing).inc()
        return feed_state(lookup.user, request.context, time_ms), lookup.missing

    @staticmethod
    def _time_ms(request) -> int:
        return event_time_ms(request.context, time.time_ns() // 1_000_000)

    @staticmethod
    def _still_wanted(context: grpc.aio.ServicerContext) -> None:
        """A client that gave up gets no answer, and its decision is not logged as served."""
        if context.cancelled():
            raise Abort(grpc.StatusCode.CANCELLED, "the client went away before the answer")

    def _record(
        self, request, surface: str, state: np.ndarray, missing: str | None, time_ms: int, decision: Decision
    ) -> contracts.DecisionRecord:
        values = state.tolist()
        return contracts.DecisionRecord(
            schema_version=contracts.DECISION_SCHEMA_VERSION,
            request_id=request.request_id,
            user_id=request.user_id,
            surface=contracts.SURFACES[surface],
            event_time_ms=time_ms,
            state=values,
            feature_names=FEED_STATE_FEATURES if surface == "feed" else LIVE_STATE_FEATURES,
            feature_version=FEATURE_VERSION,
            user_group=user_group(values),
            prediction_names=request.prediction_names,
            action=decision.action.tolist(),
            log_propensity=decision.log_propensity,
            policy_version=decision.decider.version,
            routing_arm=contracts.ROUTING_ARMS[decision.arm],
            features_missing=missing is not None,
            features_missing_reason=missing or "",
            session_id=request.context.session_id,
            action_selection=contracts.ACTION_SELECTIONS[decision.selection],
        )

    def _emit(
        self, surface: str, record: contracts.DecisionRecord, arm: str, candidates: bytes = b""
    ) -> None:
        topic = self._config.shadow_topic if arm == "shadow" else self._config.decisions_topic
        self._log.submit(topic, record, candidates)
        self._decision_counts.get(surface, arm).inc()

    def _decide(self, surface: str, user_id: str, state: np.ndarray, seed: tuple[int, int]):
        """The served decision and, when a shadow is routed, the shadow's decision on the same state."""
        snapshot = self._holders[surface].current
        arm, decider = snapshot.route(user_id)
        explore = self._config.explore
        selection = "sampled" if explore else "mode"
        served = Decision(arm, decider, *decider.decide(state, seed, explore), selection)
        shadow = None
        if snapshot.shadow is not None:
            shadow = Decision(
                "shadow", snapshot.shadow, *snapshot.shadow.decide(state, seed, explore), selection
            )
        return served, shadow

    # --- RankingService --------------------------------------------------------------------------------

    async def rank(self, request: wire.RankHead, context: grpc.aio.ServicerContext) -> contracts.RankResponse:
        candidates = validate_rank(
            request, max_candidates=self._config.max_candidates, max_page_size=self._config.max_page_size
        )
        time_ms, budget_s = self._time_ms(request), self._budget_s(context)
        user_author = self._holders["user_author"].current
        arm, term_decider = user_author.route(request.user_id)
        if term_decider.term is None and user_author.shadow is None:  # no term: no pair rows to read
            state, missing = await self._state(request, time_ms, budget_s)
            term = shadow_term = None
        else:
            (state, missing), pairs = await asyncio.gather(  # the two reads wait at the same time
                self._state(request, time_ms, budget_s),
                self._candidate_pairs(request.user_id, candidates, time_ms, budget_s),
            )
            seed = user_author_seed(request.request_id)
            term = self._term(arm, term_decider, pairs, seed)
            shadow_term = self._term("shadow", user_author.shadow, pairs, seed)
        served, shadow = self._decide("feed", request.user_id, state, request_seed(request.request_id))
        scores, order = _ranking(candidates.predictions, served.action, request.page_size, term)
        self._still_wanted(context)
        item_ids = [candidates.item_ids[j] for j in order.tolist()]
        record = self._ranking_record(request, state, missing, time_ms, served, term, item_ids)
        # the candidates go into the served and shadow records as they came, encoded once
        self._emit("feed", record, served.arm, candidates.logged)
        if shadow is not None or shadow_term is not None:
            # what the shadow configuration would have shown: each surface's shadow, or what it served
            shadow = shadow or dataclasses.replace(served, arm="shadow")
            shadow_term = shadow_term or term
            _, shadow_order = _ranking(candidates.predictions, shadow.action, request.page_size, shadow_term)
            shadow_items = [candidates.item_ids[j] for j in shadow_order.tolist()]
            shadow_record = self._ranking_record(
                request, state, missing, time_ms, shadow, shadow_term, shadow_items
            )
            self._emit("feed", shadow_record, "shadow", candidates.logged)
        return contracts.RankResponse(
            schema_version=contracts.SERVING_SCHEMA_VERSION,
            request_id=request.request_id,
            item_ids=item_ids,
            scores=scores[order].tolist(),
            action=served.action.tolist(),
            log_propensity=served.log_propensity,
            policy_version=served.decider.version,
            routing_arm=contracts.ROUTING_ARMS[served.arm],
            user_author_version=term.decider.version if term is not None and term.terms is not None else "",
        )

    async def _candidate_pairs(
        self, user_id: str, candidates: RankCandidates, time_ms: int, budget_s: float
    ) -> CandidatePairs:
        authors, rows = candidates.author_rows()
        linked = np.flatnonzero(rows >= 0)
        states, missing = await self._pairs.states(user_id, authors, time_ms, budget_s)
        if missing is not None:
            self._terms_missing.get(missing).inc()
        return CandidatePairs(len(rows), linked, rows[linked], states, missing)

    def _term(
        self, arm: str, decider: Decider | None, pairs: CandidatePairs, seed: tuple[int, int]
    ) -> TermDecision | None:
        """``decider``'s term decision, or None for no decider or one without a term (the fallback)."""
        if decider is None or decider.term is None:
            return None
        action, log_propensity = decider.decide(np.zeros(0), seed, self._config.explore)
        terms = pairs.terms(decider.term)
        return TermDecision(arm, decider, float(action[0]), log_propensity, terms, pairs.missing)

    def _ranking_record(
        self,
        request,
        state: np.ndarray,
        missing: str | None,
        time_ms: int,
        decision: Decision,
        term: TermDecision | None,
        item_ids: list[str],
    ) -> contracts.DecisionRecord:
        record = self._record(request, "feed", state, missing, time_ms, decision)
        record.served_item_ids.extend(item_ids)
        if term is not None:
            record.user_author.CopyFrom(term.logged())
        return record

    # --- AllocationService -----------------------------------------------------------------------------

    async def allocate(
        self, request: contracts.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> contracts.AllocateResponse:
        validate_allocate(request)
        time_ms = self._time_ms(request)
        feed, missing = await self._state(request, time_ms, self._budget_s(context))
        state = live_state(feed, np.array(request.live_candidate.predictions))
        served, shadow = self._decide(
            "live_allocation", request.user_id, state, request_seed(request.request_id)
        )
        self._still_wanted(context)
        for decision in (served, shadow):
            if decision is None:
                continue
            record = self._record(request, "live_allocation", state, missing, time_ms, decision)
            record.candidates.append(request.live_candidate)
            if decision.action[0] == 1:
                record.served_item_ids.append(request.live_candidate.item_id)
            self._emit("live_allocation", record, decision.arm)
        insert = bool(served.action[0] == 1)
        return contracts.AllocateResponse(
            schema_version=contracts.SERVING_SCHEMA_VERSION,
            request_id=request.request_id,
            insert=insert,
            position=self._config.live_position if insert else 0,
            log_propensity=served.log_propensity,
            policy_version=served.decider.version,
            routing_arm=contracts.ROUTING_ARMS[served.arm],
        )

    # --- StatusService and AdminService ---------------------------------------------------------------

    def status(self, request, context: grpc.aio.ServicerContext) -> contracts.serving_pb2.StatusResponse:
        return contracts.serving_pb2.StatusResponse(
            surfaces=self._surface_statuses(), ready=self._is_ready(), started_at_ms=self._started_at_ms
        )

    async def reload(self, request, context) -> contracts.serving_pb2.ReloadResponse:
        """Loads policies (seconds of TensorFlow) on a thread of its own, off the event loop."""
        for holder in self._holders.values():
            await asyncio.to_thread(holder.refresh, force=True)
        return contracts.serving_pb2.ReloadResponse(surfaces=self._surface_statuses())

    def _surface_statuses(self) -> list[contracts.serving_pb2.SurfaceStatus]:
        statuses = []
        for surface, holder in self._holders.items():
            current = holder.current
            statuses.append(
                contracts.serving_pb2.SurfaceStatus(
                    surface=surface,
                    routing_revision=current.revision,
                    stable_version=current.stable.version if current.stable else "",
                    canary_version=current.canary.version if current.canary else "",
                    canary_fraction=current.canary_fraction,
                    shadow_version=current.shadow.version if current.shadow else "",
                    last_error=holder.status.last_error or "",
                    serving_since_ms=current.since_ms,
                    fallback_version=current.fallback.version,
                )
            )
        return statuses


def _still_in_time(context: grpc.aio.ServicerContext) -> None:
    """Refuse, before any work, a request whose client has already given up or whose deadline passed.

    Under overload requests wait for the event loop; doing the full work for ones nobody is waiting
    for any more would spend the capacity the fresh ones need, and throughput would collapse.
    """
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        raise Abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the deadline passed while the request waited")
    if context.cancelled():
        raise Abort(grpc.StatusCode.CANCELLED, "the client went away while the request waited")


def _ranking(
    predictions: np.ndarray, action: np.ndarray, page_size: int, term: TermDecision | None
) -> tuple[np.ndarray, np.ndarray]:
    """Scores of all candidates and the indices of the best ``page_size``, exactly as the simulator ranks
    (``Simulator._run_page``: the fusion scores plus the user-author term, when there is one)."""
    scores = fusion_scores(predictions[None], action[None])[0]
    if term is not None:
        scores = scores + term.added
    return scores, top_k(scores[None], page_size)[0]
