"""Validation of decoded events against the contracts of DESIGN 4, as reasons rather than exceptions.

Each check returns ``None`` for a usable record or a ``Rejection`` whose ``reason`` is a short stable tag
(dead-letter counts are grouped by it) and whose ``detail`` names the field and the bad value. Keeping
the rules here, free of Beam, lets them be tested as a plain table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from recsys_rl import contracts, signals
from recsys_rl.state import ACTIVITY_GROUPS, FEATURE_VERSION, FEED_STATE_FEATURES, LIVE_STATE_FEATURES

#: Longest believable single view; anything above is a client clock or unit bug.
MAX_VIEW_SECONDS = 6 * 3600.0
#: Event times before 2000-01-01 or after 2100-01-01 are unit errors (seconds for ms, or garbage).
MIN_EVENT_TIME_MS = 946_684_800_000
MAX_EVENT_TIME_MS = 4_102_444_800_000

_SURFACE_SHAPES = {
    contracts.SURFACES["feed"]: (FEED_STATE_FEATURES, len(signals.FEED_SIGNALS)),
    contracts.SURFACES["live_allocation"]: (LIVE_STATE_FEATURES, 1),
}
_COUNTERS = ("click", "like", "follow", "comment", "share", "hate")
_ITEM_TYPE_NUMBERS = tuple(contracts.ITEM_TYPES.values())


@dataclass(frozen=True)
class Rejection:
    reason: str
    detail: str


def _missing(kind: str, **values: str) -> Rejection | None:
    for name, value in values.items():
        if not value:
            return Rejection("missing_field", f"{kind}.{name} is empty")
    return None


def _too_long(kind: str, **values: str) -> Rejection | None:
    for name, value in values.items():
        if len(value) > contracts.MAX_ID_LENGTH:
            return Rejection(
                "too_long",
                f"{kind}.{name} should be at most {contracts.MAX_ID_LENGTH} characters, but has {len(value)}",
            )
    return None


#: How far past its record's Kafka timestamp an event time may lie: client clocks run a little fast, but
#: an event a day ahead would land in a later day's features and join windows.
MAX_CLOCK_LEAD_MS = 86_400_000


def check_event_time_against_record(
    kind: str, event_time_ms: int, record_timestamp_ms: int
) -> Rejection | None:
    """An event time more than ``MAX_CLOCK_LEAD_MS`` after its record was written (the Kafka timestamp,
    so a replay judges the record as the first run did); records without one (-1, or 0) pass."""
    lead = event_time_ms - record_timestamp_ms
    if record_timestamp_ms > 0 and lead > MAX_CLOCK_LEAD_MS:
        return Rejection(
            "future_event_time",
            f"{kind}.event_time_ms is {lead} ms after its record's Kafka timestamp; at most "
            f"{MAX_CLOCK_LEAD_MS} (a day) is believable",
        )
    return None


def _event_time(kind: str, t: int) -> Rejection | None:
    if not MIN_EVENT_TIME_MS <= t <= MAX_EVENT_TIME_MS:
        return Rejection(
            "out_of_range", f"{kind}.event_time_ms should be a millisecond time in 2000-2100, but is {t}"
        )
    return None


def _finite(values: list[float], field: str) -> Rejection | None:
    if all(map(math.isfinite, values)):  # the common case, without a Python-level loop
        return None
    bad = next(v for v in values if not math.isfinite(v))
    return Rejection("out_of_range", f"DecisionRecord.{field} should be finite, but holds {bad}")


def check_decision(record: contracts.DecisionRecord) -> Rejection | None:
    return check_decision_read(record, record.state[:], record.action[:])


def check_decision_read(
    record: contracts.DecisionRecord, state: list[float], action: list[float]
) -> Rejection | None:
    """`check_decision` of a record whose state and action were read already (``record.state[:]``).

    Reading a repeated field of a message costs about a microsecond: a decoder that needs the values
    anyway reads them once, for both.
    """
    if not (record.request_id and record.user_id):
        return _missing("DecisionRecord", request_id=record.request_id, user_id=record.user_id)
    if problem := _too_long(
        "DecisionRecord",
        request_id=record.request_id,
        user_id=record.user_id,
        session_id=record.session_id,
        policy_version=record.policy_version,
    ):
        return problem
    if record.surface not in _SURFACE_SHAPES:
        return Rejection(
            "missing_field",
            f"DecisionRecord.surface should be feed or live_allocation, but is {record.surface}",
        )
    if problem := _event_time("DecisionRecord", record.event_time_ms):
        return problem
    feature_names, action_size = _SURFACE_SHAPES[record.surface]
    surface = contracts.SURFACE_NAMES[record.surface]
    if len(state) != len(feature_names):
        return Rejection(
            "out_of_range",
            f"DecisionRecord.state of a {surface} decision should have {len(feature_names)} values, "
            f"but has {len(state)}",
        )
    if record.feature_names and record.feature_names[:] != list(feature_names):
        return Rejection(
            "out_of_range", f"DecisionRecord.feature_names do not match {surface} state features"
        )
    if len(action) != action_size:
        return Rejection(
            "out_of_range",
            f"DecisionRecord.action of a {surface} decision should have {action_size} values, "
            f"but has {len(action)}",
        )
    if record.surface == contracts.SURFACES["live_allocation"] and action[0] not in (0.0, 1.0):
        return Rejection(
            "out_of_range",
            f"DecisionRecord.action of an allocation should be 0 or 1, but is {action[0]}",
        )
    if record.feature_version != FEATURE_VERSION:
        return Rejection(
            "out_of_range",
            f"DecisionRecord.feature_version should be {FEATURE_VERSION!r} (the state's names, order and "
            f"scaling), but is {record.feature_version!r}",
        )
    reason = record.features_missing_reason
    if record.features_missing != bool(reason) or (
        reason and reason not in contracts.FEATURES_MISSING_REASONS
    ):
        return Rejection(
            "out_of_range",
            "DecisionRecord.features_missing_reason should be one of "
            f"{list(contracts.FEATURES_MISSING_REASONS)} exactly when features_missing is set, but is "
            f"{reason!r} with features_missing={record.features_missing}",
        )
    if contracts.action_selection(record) is None:
        return Rejection(
            "missing_field" if record.action_selection == 0 else "out_of_range",
            "DecisionRecord.action_selection of a version-2 record should be one of "
            f"{list(contracts.ACTION_SELECTIONS)} {tuple(contracts.ACTION_SELECTIONS.values())}, but is "
            f"{record.action_selection}",
        )
    if record.user_group >= len(ACTIVITY_GROUPS):
        return Rejection(
            "out_of_range",
            f"DecisionRecord.user_group should be below {len(ACTIVITY_GROUPS)}, but is {record.user_group}",
        )
    for values, field in (
        (state, "state"),
        (action, "action"),
        ([record.log_propensity], "log_propensity"),
    ):
        if problem := _finite(values, field):
            return problem
    if record.surface == contracts.SURFACES["live_allocation"] and record.log_propensity > 0.0:
        return Rejection(
            "out_of_range",
            f"DecisionRecord.log_propensity of an allocation is a log-probability and should be <= 0, "
            f"but is {record.log_propensity}",
        )
    if record.HasField("user_author"):
        return _check_user_author(record)
    return None


def _check_user_author(record: contracts.DecisionRecord) -> Rejection | None:
    """A Rank's user-author term: named, finite, and one term per candidate when it was applied."""
    term = record.user_author
    if record.surface != contracts.SURFACES["feed"]:
        return Rejection("out_of_range", "DecisionRecord.user_author is set on a live_allocation decision")
    kind = "DecisionRecord.user_author"
    if problem := _missing(kind, policy_version=term.policy_version, term_id=term.term_id) or _too_long(
        kind, policy_version=term.policy_version, term_id=term.term_id
    ):
        return problem
    if term.missing_reason:
        if term.missing_reason not in contracts.USER_AUTHOR_MISSING_REASONS or term.terms:
            return Rejection(
                "out_of_range",
                f"{kind}.missing_reason should be one of {list(contracts.USER_AUTHOR_MISSING_REASONS)}, "
                f"with no terms, but is {term.missing_reason!r} with {len(term.terms)} terms",
            )
        return None
    if len(term.terms) != len(record.candidates):
        return Rejection(
            "out_of_range",
            f"{kind}.terms should have one value per candidate ({len(record.candidates)}), "
            f"but has {len(term.terms)}",
        )
    for values, field in (
        ([term.weight_logit, term.log_propensity], "user_author.weight_logit and log_propensity"),
        (term.terms[:], "user_author.terms"),
    ):
        if problem := _finite(values, field):
            return problem
    return None


def check_feedback(event: contracts.FeedbackEvent) -> Rejection | None:
    s = event.signals
    counters = (s.click, s.like, s.follow, s.comment, s.share, s.hate)
    return check_feedback_read(
        event, event.event_time_ms, s.watch_time_s, s.live_watch_s, s.gift_value, counters
    )


def check_feedback_read(
    event: contracts.FeedbackEvent,
    event_time_ms: int,
    watch_time_s: float,
    live_watch_s: float,
    gift_value: float,
    counters: tuple[int, ...],
) -> Rejection | None:
    """`check_feedback` of an event whose numbers were read already (``counters`` as in _COUNTERS).

    A decoder that keeps the numbers reads each once, for both: every read of a message field costs.
    """
    if not (event.request_id and event.user_id and event.item_id):
        return _missing(
            "FeedbackEvent", request_id=event.request_id, user_id=event.user_id, item_id=event.item_id
        )
    if problem := _too_long(
        "FeedbackEvent",
        request_id=event.request_id,
        user_id=event.user_id,
        item_id=event.item_id,
        author_id=event.author_id,
    ):
        return problem
    if event.item_type not in _ITEM_TYPE_NUMBERS:
        return Rejection(
            "unknown_item_type",
            f"FeedbackEvent.item_type should be one of {list(contracts.ITEM_TYPES)} "
            f"({', '.join(map(str, _ITEM_TYPE_NUMBERS))}), but is {event.item_type}",
        )
    if problem := _event_time("FeedbackEvent", event_time_ms):
        return problem
    for name, value in (("watch_time_s", watch_time_s), ("live_watch_s", live_watch_s)):
        if not 0.0 <= value <= MAX_VIEW_SECONDS:
            return Rejection(
                "out_of_range",
                f"FeedbackEvent.signals.{name} should be in [0, {MAX_VIEW_SECONDS:g}], but is {value}",
            )
    if not 0.0 <= gift_value < math.inf:
        return Rejection(
            "out_of_range", f"FeedbackEvent.signals.gift_value should be finite and >= 0, but is {gift_value}"
        )
    if max(counters) <= 1:  # the common case
        return None
    name, count = next((name, count) for name, count in zip(_COUNTERS, counters, strict=True) if count > 1)
    return Rejection(
        "out_of_range", f"FeedbackEvent.signals.{name} should be 0 or 1 per view, but is {count}"
    )
