"""From one user's decoded events to constrained-MDP transitions: de-duplicate, join, sessionise, chain.

This is the heart of the transition builder, kept free of Beam so that its rules are tested directly:
the pipeline groups every valid event by user id and calls :func:`build_user_episodes` once per user.
Grouping by user (not by request id) does the request-id join and the sessionisation in one shuffle;
a request belongs to exactly one user, so feedback whose user id disagrees with its decision's cannot
join and is dead-lettered as an orphan, which is also what a wrong request id deserves.

Every input event leaves with exactly one fate (used, filtered or dead-lettered, with a reason), which
is what lets the pipeline prove ``read = used + dead-lettered + filtered``.
"""

from __future__ import annotations

import base64
import operator
import sys
from array import array
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from recsys_rl import contracts, signals
from recsys_rl.pipelines.event_validation import (
    Rejection,
    check_decision_read,
    check_event_time_against_record,
    check_feedback_read,
)

DECISION, FEEDBACK = 0, 1
SURFACE_SIGNALS: dict[str, tuple[str, ...]] = {
    "feed": signals.FEED_SIGNALS,
    "live_allocation": signals.LIVE_SIGNALS,
}
_ITEM_TYPE_NAMES = {v: k for k, v in contracts.ITEM_TYPES.items()}
_DISPLACED = "video_watch_displaced"
_LIVE = contracts.SURFACES["live_allocation"]

# A Kafka record as the builder needs it for a dead letter: (topic, partition, offset, timestamp_ms,
# key, value); `recsys_rl.pipelines.kafka_source.KafkaRecord` is one.
RecordRef = tuple[str, int, int, int, bytes, bytes]


_LITTLE_ENDIAN = sys.byteorder == "little"


def float32_bytes(values: Iterable[float]) -> bytes:
    """Little-endian float32, as protobuf packs them: doubles rounded to nearest, overflowing to inf."""
    floats = array("f", values)
    if not _LITTLE_ENDIAN:
        floats.byteswap()
    return floats.tobytes()


def float32_list(data: bytes) -> list[float]:
    """The inverse of `float32_bytes`."""
    floats = array("f", data)
    if not _LITTLE_ENDIAN:
        floats.byteswap()
    return floats.tolist()


class Decision(NamedTuple):
    """What the builder uses of a valid decision record; the Kafka coordinates order the events."""

    topic: str
    partition: int
    offset: int
    request_id: str
    event_time_ms: int
    surface: str
    user_group: int
    # float32_bytes of the message's floats: the shuffle then writes one field instead of one per value
    state: bytes
    action: bytes
    log_propensity: float
    policy_version: str
    displaced_watch_s: float  # live insertions: the logged prediction of the video watch displaced; else 0
    features_missing_reason: str  # why the state was built from default user features; "" when it was not
    # the action was the policy's mode, not a draw (``contracts.DETERMINISTIC_SELECTIONS``): its
    # log_propensity is no behaviour propensity. Last, so that a carried decision of a run before this
    # field existed is the prefix of one (``pipelines.carry`` fills it in: such decisions were sampled).
    deterministic: bool = False
    # A Rank's user-author term, when one was routed (``DecisionRecord.user_author``): which term
    # function, its weight logit and that draw's log-density; "" and zeros otherwise. Kept also when the
    # pairs' rows did not arrive and the ranking went without the term: the store's failure would have
    # met any weight alike, and a draw that moved nothing re-weights without bias.
    user_author_term_id: str = ""
    user_author_weight_logit: float = 0.0
    user_author_log_propensity: float = 0.0
    # The served items in page order and the upstream model's logged predictions of each, in the
    # surface's signal order (float32_bytes, an item's row after another's; 0 for a signal the record
    # predicted nothing for, and for a served item not among its candidates): what `_predicted_rewards`
    # sums over the viewed items. Empty for a decision carried from a run before they were kept.
    served_item_ids: tuple[str, ...] = ()
    served_predictions: bytes = b""


class Feedback(NamedTuple):
    """What the builder uses of a valid feedback event, with its record's bytes for a dead letter."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes
    value: bytes
    request_id: str
    item_id: str
    position: int
    event_time_ms: int
    author_id: str
    item_type: str
    watch_time_s: float
    click: int
    like: int
    follow: int
    comment: int
    share: int
    hate: int
    gift_value: float
    live_watch_s: float

    @property
    def ref(self) -> RecordRef:
        return self[:6]


# The signals of a feedback event in registry order (contracts.FEEDBACK_SIGNAL_FIELDS), as fields.
_SIGNAL_FIELD_INDEX = {
    name: Feedback._fields.index(field) for name, field in contracts.FEEDBACK_SIGNAL_FIELDS.items()
}
# Per surface: where in the reward vector each signal that feedback reports goes, and those signals'
# fields of a Feedback, read in one call.
_REPORTED_SIGNALS = {
    surface: (
        [i for i, name in enumerate(names) if name in _SIGNAL_FIELD_INDEX],
        operator.itemgetter(*[_SIGNAL_FIELD_INDEX[name] for name in names if name in _SIGNAL_FIELD_INDEX], 0),
    )
    for surface, names in SURFACE_SIGNALS.items()
}  # (the trailing field 0 keeps itemgetter returning a tuple, whatever the count; zip drops it)


EVENT_TYPES: dict[int, type[Decision] | type[Feedback]] = {DECISION: Decision, FEEDBACK: Feedback}


def decode_event(kind: int, ref: RecordRef) -> tuple[str, tuple] | Rejection:
    """A record's (user id, event fields), or the reason it cannot be used: parsed once, validated, trimmed.

    The fields are those of `Decision` or `Feedback` (``EVENT_TYPES[kind]._make`` makes the event), as
    a plain tuple: that is what crosses the shuffle to the per-user builder (Beam would pickle a
    NamedTuple), and a NamedTuple of twenty fields costs microseconds more to build. Events carry only
    what the builder needs; the original bytes ride along only where a dead letter may still need
    them (feedback).
    """
    try:
        if kind == DECISION:
            return _decision_fields(contracts.decode_decision(ref[5]), *ref[:4])
        return _feedback_fields(contracts.decode_feedback(ref[5]), ref)
    except contracts.ContractError as err:
        return Rejection(err.reason, err.detail)


def _decision_fields(
    record: contracts.DecisionRecord, topic: str, partition: int, offset: int, timestamp_ms: int
) -> tuple[str, tuple] | Rejection:
    state, action = record.state[:], record.action[:]
    if problem := check_decision_read(record, state, action) or check_event_time_against_record(
        "DecisionRecord", record.event_time_ms, timestamp_ms
    ):
        return problem
    surface = contracts.SURFACE_NAMES[record.surface]
    served = _served_predictions(record, surface)
    if isinstance(served, Rejection):
        return served
    displaced = 0.0
    if record.surface == _LIVE and action[0] == 1.0 and record.candidates:
        names = record.prediction_names[:]
        if _DISPLACED in names:
            displaced = float(record.candidates[0].predictions[names.index(_DISPLACED)])
    return record.user_id, (  # Decision
        topic,
        partition,
        offset,
        record.request_id,
        record.event_time_ms,
        surface,
        record.user_group,
        float32_bytes(state),
        float32_bytes(action),
        record.log_propensity,
        record.policy_version,
        displaced,
        record.features_missing_reason,
        contracts.action_selection(record) in contracts.DETERMINISTIC_SELECTIONS,
        *_user_author_term(record),
        *served,
    )


def _served_predictions(
    record: contracts.DecisionRecord, surface: str
) -> tuple[tuple[str, ...], bytes] | Rejection:
    """The Decision's ``served_item_ids`` and ``served_predictions``: only the served items' rows cross
    the shuffle (a page is a few of the candidates), read once here. A repeated candidate id (serving
    refuses them) reads as its first."""
    served = tuple(record.served_item_ids)
    names = record.prediction_names[:]
    wanted = SURFACE_SIGNALS[surface]
    columns = None if names == list(wanted) else [names.index(s) if s in names else None for s in wanted]
    candidates = record.candidates
    ids = [candidate.item_id for candidate in candidates]
    rows: list[float] = []
    for item in served:
        if item not in ids:
            rows += [0.0] * len(wanted)
            continue
        values = candidates[ids.index(item)].predictions[:]
        if len(values) != len(names):
            return Rejection(
                "out_of_range",
                f"DecisionRecord.candidates: item {item!r} has {len(values)} predictions, but "
                f"prediction_names names {len(names)}",
            )
        rows += values if columns is None else [0.0 if j is None else values[j] for j in columns]
    return served, float32_bytes(rows)


_NO_TERM = ("", 0.0, 0.0)


def _user_author_term(record: contracts.DecisionRecord) -> tuple[str, float, float]:
    """The Decision fields of the record's user-author term, if one was routed."""
    if not record.HasField("user_author"):
        return _NO_TERM
    term = record.user_author
    return term.term_id, term.weight_logit, term.log_propensity


def _feedback_fields(event: contracts.FeedbackEvent, ref: RecordRef) -> tuple[str, tuple] | Rejection:
    s = event.signals
    event_time_ms, watch, live, gift = event.event_time_ms, s.watch_time_s, s.live_watch_s, s.gift_value
    counters = (s.click, s.like, s.follow, s.comment, s.share, s.hate)
    if problem := check_feedback_read(
        event, event_time_ms, watch, live, gift, counters
    ) or check_event_time_against_record("FeedbackEvent", event_time_ms, ref[3]):
        return problem
    return event.user_id, (  # Feedback
        *ref,
        event.request_id,
        event.item_id,
        event.position,
        event_time_ms,
        event.author_id,
        _ITEM_TYPE_NAMES[event.item_type],
        watch,
        *counters,
        gift,
        live,
    )


@dataclass(frozen=True)
class EpisodeConfig:
    join_window_ms: int = 3_600_000  # feedback later than this after its decision is dead-lettered
    session_gap_ms: int = 1_800_000  # inactivity that ends a session (episode)

    @property
    def open_for_ms(self) -> int:
        """How long after a session's last event it may still change: a later page of it, or feedback
        inside the join window."""
        return max(self.join_window_ms, self.session_gap_ms)

    def __post_init__(self) -> None:
        for name in ("join_window_ms", "session_gap_ms"):
            if getattr(self, name) <= 0:
                raise ValueError(f"EpisodeConfig.{name} should be positive, but is {getattr(self, name)}")


@dataclass
class UserEpisodes:
    transitions: list[dict] = field(default_factory=list)
    view_facts: list[dict] = field(default_factory=list)
    dead_letters: list[dict] = field(default_factory=list)
    fates: Counter = field(default_factory=Counter)
    carried: list[Decision | Feedback] = field(default_factory=list)  # open sessions' events, for next run


def dead_letter(ref: RecordRef, reason: str, detail: str) -> dict:
    """A dead-letter record that keeps the original bytes, so nothing is lost and it can be replayed."""
    topic, partition, offset, timestamp_ms, key, value = ref
    return {
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "timestamp_ms": timestamp_ms,
        "reason": reason,
        "detail": detail,
        "key": base64.b64encode(key).decode("ascii"),
        "value": base64.b64encode(value).decode("ascii"),
    }


def unread_dead_letter(topic: str, partition: int, offset: int, reason: str, detail: str) -> dict:
    """A dead letter whose key, value and timestamp are still at its coordinates in the source topic:
    `build_transitions` reads them back before the dataset is published (``fill_dead_letters``)."""
    return {
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "timestamp_ms": None,
        "reason": reason,
        "detail": detail,
        "key": None,
        "value": None,
    }


# A decision's content: everything but its Kafka coordinates.
_CONTENT = slice(3, None)


def _conflict_letter(decision: Decision, kept: Decision) -> dict:
    """Same request id, other content: two services (or a bug) logged different decisions under one id.

    The first in Kafka order is kept, as for a plain duplicate; this one cannot be both, so it is
    dead-lettered with what differs. Decisions cross the shuffle without their bytes (they are large),
    so the letter is filled from the source by its coordinates."""
    differing = [
        name for name, a, b in zip(Decision._fields[3:], decision[3:], kept[3:], strict=True) if a != b
    ]
    detail = (
        f"decision {decision.request_id!r} at {decision.topic}/{decision.partition}/{decision.offset} "
        f"differs in {', '.join(differing)} from the decision with that request id already read; kept "
        f"the one at offset {kept.offset} of partition {kept.partition}"
    )
    return unread_dead_letter(
        decision.topic, decision.partition, decision.offset, "conflicting_decision", detail
    )


@dataclass
class _Request:
    decision: Decision
    feedback: list[Feedback] = field(default_factory=list)
    last_activity_ms: int = 0


def build_user_episodes(
    user_id: str,
    events: Iterable[Decision | Feedback],
    config: EpisodeConfig,
    open_after_ms: int | None = None,
) -> UserEpisodes:
    """One user's valid events (from `decode_event`, in any order) -> their transitions and fates.

    With ``open_after_ms``, a session active after that event time may still be going on, or still
    waiting for feedback inside its join window: its events are carried (``UserEpisodes.carried``) for
    the next run to build it whole, rather than built now without what comes after the cut-off.
    """
    out = UserEpisodes()
    decisions: list[Decision] = []
    feedback: list[Feedback] = []
    for event in events:
        (decisions if type(event) is Decision else feedback).append(event)
    # Kafka coordinates give a total order that does not depend on how the runner grouped the events.
    decisions.sort(key=_coordinates)
    feedback.sort(key=_coordinates)

    requests: dict[str, _Request] = {}
    for decision in decisions:
        kept = requests.get(decision.request_id)
        if kept is None:
            requests[decision.request_id] = _Request(decision, last_activity_ms=decision.event_time_ms)
        elif decision[_CONTENT] == kept.decision[_CONTENT]:
            out.fates["filtered:duplicate_decision"] += 1  # the same record again: a producer retry
        else:
            out.dead_letters.append(_conflict_letter(decision, kept.decision))
            out.fates["dead_letter:conflicting_decision"] += 1
    seen_views: set[tuple[str, str, int]] = set()
    window = config.join_window_ms
    joined = 0
    facts: list[tuple[str, dict]] = []  # (request id, view fact): a carried request's wait for its run
    for event in feedback:
        view = (event.request_id, event.item_id, event.position)
        if view in seen_views:
            out.fates["filtered:duplicate_feedback"] += 1
            continue
        seen_views.add(view)
        request = requests.get(event.request_id)
        if request is None:
            detail = f"no decision with request_id {event.request_id!r} for user {user_id!r}"
            out.dead_letters.append(dead_letter(event.ref, "orphan_feedback", detail))
            out.fates["dead_letter:orphan_feedback"] += 1
            continue
        delay = event.event_time_ms - request.decision.event_time_ms
        if not 0 <= delay <= window:
            detail = (
                f"feedback for {event.request_id!r} came {delay} ms after its decision; the join window is "
                f"[0, {window}] ms"
            )
            out.dead_letters.append(dead_letter(event.ref, "late_feedback", detail))
            out.fates["dead_letter:late_feedback"] += 1
            continue
        request.feedback.append(event)
        if event.event_time_ms > request.last_activity_ms:
            request.last_activity_ms = event.event_time_ms
        joined += 1
        facts.append((event.request_id, _view_fact(user_id, event)))

    carried_requests: set[str] = set()
    for session in _sessions(requests.values(), config.session_gap_ms):
        if open_after_ms is not None and max(r.last_activity_ms for r in session) > open_after_ms:
            for request in session:
                carried_requests.add(request.decision.request_id)
                out.carried += [request.decision, *request.feedback]
            continue
        for surface in SURFACE_SIGNALS:
            chain = [r for r in session if r.decision.surface == surface]
            out.transitions.extend(_transitions(user_id, chain, surface))
    out.view_facts = [fact for request_id, fact in facts if request_id not in carried_requests]
    if used := len(requests) + joined - len(out.carried):
        out.fates["used"] += used
    if out.carried:
        out.fates["carried"] += len(out.carried)
    return out


def _coordinates(event: Decision | Feedback) -> tuple[str, int, int]:
    return event[:3]


def _sessions(requests: Iterable[_Request], gap_ms: int) -> list[list[_Request]]:
    ordered = sorted(requests, key=lambda r: (r.decision.event_time_ms, r.decision.request_id))
    sessions: list[list[_Request]] = []
    last_activity = None
    for request in ordered:
        if last_activity is None or request.decision.event_time_ms - last_activity > gap_ms:
            sessions.append([])
            last_activity = request.decision.event_time_ms
        sessions[-1].append(request)
        last_activity = max(last_activity, request.last_activity_ms)
    return sessions


def _rewards(request: _Request, surface: str) -> list[float]:
    """Each signal of the surface summed over the request's feedback, in Kafka order (bit-stable sums)."""
    totals = [0.0] * len(SURFACE_SIGNALS[surface])
    positions, fields = _REPORTED_SIGNALS[surface]
    columns = zip(*map(fields, request.feedback), strict=True)  # none without feedback
    for position, values in zip(positions, columns, strict=False):  # drops the trailing field 0
        totals[position] = float(sum(values))
    return _with_displaced(totals, request, surface)


def _predicted_rewards(request: _Request, surface: str) -> list[float]:
    """Each signal of the surface summed over the request's viewed items as the upstream model predicted
    it when it ranked them, in Kafka order: the expectation the drawn responses of ``_rewards`` scatter
    around. A sparse signal's draws are nearly all 0, so how a ranking moves its rate is lost in their
    noise at any data size a benchmark can train on; the predictions carry it (training's
    ``rewards: predicted``). A viewed item the decision did not serve adds nothing: nothing predicted it.
    """
    decision = request.decision
    width = len(SURFACE_SIGNALS[surface])
    table, served = float32_list(decision.served_predictions), decision.served_item_ids
    starts = [width * served.index(e.item_id) for e in request.feedback if e.item_id in served]
    viewed = [table[start : start + width] for start in starts]
    totals = [float(sum(column)) for column in zip(*viewed, strict=True)] if viewed else [0.0] * width
    return _with_displaced(totals, request, surface)


def _with_displaced(totals: list[float], request: _Request, surface: str) -> list[float]:
    if surface == "live_allocation":
        # The short-video time an insertion displaces is counterfactual: no client can report it. The
        # decision logs the upstream prediction of the displaced video's watch time, and that prediction
        # stands in for it (DESIGN 3.2: displaced time predicted by a supervised model).
        totals[SURFACE_SIGNALS[surface].index(_DISPLACED)] = request.decision.displaced_watch_s
    return totals


def _transitions(user_id: str, chain: list[_Request], surface: str) -> list[dict]:
    if not chain:
        return []
    session_id = f"{user_id}/{chain[0].decision.event_time_ms}"
    states = [float32_list(request.decision.state) for request in chain]
    rows = []
    for step, request in enumerate(chain):
        decision = request.decision
        following = chain[step + 1].decision if step + 1 < len(chain) else None
        rows.append(
            {
                "request_id": decision.request_id,
                "user_id": user_id,
                "session_id": session_id,
                "surface": surface,
                "step": step,
                "event_time_ms": decision.event_time_ms,
                "next_event_time_ms": following.event_time_ms if following else -1,
                "user_group": decision.user_group,
                "state": states[step],
                # a terminal step's next state is zeros; `done` tells learners not to bootstrap from it
                "next_state": states[step + 1] if following else [0.0] * len(states[step]),
                "action": float32_list(decision.action),
                "log_propensity": decision.log_propensity,
                "policy_version": decision.policy_version,
                "features_missing": bool(decision.features_missing_reason),
                "features_missing_reason": decision.features_missing_reason,
                "deterministic": decision.deterministic,
                "user_author_term_id": decision.user_author_term_id,
                "user_author_weight_logit": decision.user_author_weight_logit,
                "user_author_log_propensity": decision.user_author_log_propensity,
                "done": following is None,
                "reward": _rewards(request, surface),
                "predicted_reward": _predicted_rewards(request, surface),
                # the user-author surface's rewards of this request's views (``pipelines.user_author``),
                # filled in where that surface is built; zeros where it is not
                "pair_reward": [0.0] * len(signals.PAIR_SIGNALS),
                "feedback_count": len(request.feedback),
            }
        )
    return rows


def _view_fact(user_id: str, event: Feedback) -> dict:
    return {
        "user_id": user_id,
        "request_id": event.request_id,
        "item_id": event.item_id,
        "author_id": event.author_id,
        "item_type": event.item_type,
        "event_time_ms": event.event_time_ms,
        "watch_time_s": event.watch_time_s,
        "click": event.click,
        "like": event.like,
        "follow": event.follow,
        "comment": event.comment,
        "share": event.share,
        "hate": event.hate,
        "live_watch_s": event.live_watch_s,
        "gift": event.gift_value,
    }
