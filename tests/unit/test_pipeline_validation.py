"""Each validation rule, fed the bad value it exists for: (mutation, reason, words of the message)."""

import math

import pytest

from recsys_rl import contracts, signals
from recsys_rl.pipelines.episodes import DECISION, FEEDBACK, Decision, decode_event
from recsys_rl.pipelines.event_validation import (
    Rejection,
    check_decision,
    check_event_time_against_record,
    check_feedback,
)
from recsys_rl.state import FEATURE_VERSION, FEED_STATE_FEATURES, LIVE_STATE_FEATURES

T0 = 1_767_225_600_000


def feed_decision() -> contracts.DecisionRecord:
    return contracts.DecisionRecord(
        schema_version=1,
        request_id="r1",
        user_id="u1",
        surface=contracts.SURFACES["feed"],
        event_time_ms=T0,
        state=[0.0] * len(FEED_STATE_FEATURES),
        feature_names=FEED_STATE_FEATURES,
        feature_version=FEATURE_VERSION,
        user_group=1,
        action=[0.0] * len(signals.FEED_SIGNALS),
        log_propensity=-2.0,
    )


def live_decision() -> contracts.DecisionRecord:
    record = feed_decision()
    record.surface = contracts.SURFACES["live_allocation"]
    del record.state[:], record.feature_names[:], record.action[:]
    record.state.extend([0.0] * len(LIVE_STATE_FEATURES))
    record.action.append(1.0)
    record.log_propensity = -0.1
    return record


def feedback() -> contracts.FeedbackEvent:
    return contracts.FeedbackEvent(
        schema_version=1,
        request_id="r1",
        user_id="u1",
        item_id="v1",
        event_time_ms=T0 + 1000,
        item_type=contracts.ITEM_TYPES["video"],
        signals=contracts.FeedbackSignals(watch_time_s=12.0, click=1),
    )


def test_valid_records_pass():
    assert check_decision(feed_decision()) is None
    fallback = feed_decision()
    fallback.features_missing, fallback.features_missing_reason = True, "unknown_user"
    assert check_decision(fallback) is None
    assert check_decision(live_decision()) is None
    assert check_feedback(feedback()) is None
    for selection in contracts.ACTION_SELECTIONS.values():  # version 2 says how the action was chosen
        chosen = feed_decision()
        chosen.schema_version, chosen.action_selection = 2, selection
        assert check_decision(chosen) is None


def _set(**fields):
    def mutate(message):
        for name, value in fields.items():
            target = message
            *path, last = name.split("__")
            for part in path:
                target = getattr(target, part)
            if isinstance(value, list):
                del getattr(target, last)[:]
                getattr(target, last).extend(value)
            else:
                setattr(target, last, value)

    return mutate


@pytest.mark.parametrize(
    ("make", "mutate", "reason", "words"),
    [
        pytest.param(feed_decision, _set(surface=0), "missing_field", "surface should be", id="no-surface"),
        pytest.param(
            feed_decision,
            _set(event_time_ms=1_767_225_600),
            "out_of_range",
            "event_time_ms",
            id="seconds-not-ms",
        ),
        pytest.param(
            feed_decision,
            _set(state=[0.0] * 3),
            "out_of_range",
            "should have 14 values, but has 3",
            id="short-state",
        ),
        pytest.param(
            feed_decision,
            _set(feature_names=["x"] * 14),
            "out_of_range",
            "feature_names",
            id="wrong-features",
        ),
        pytest.param(
            feed_decision, _set(action=[0.0]), "out_of_range", "action of a feed decision", id="short-action"
        ),
        pytest.param(
            feed_decision,
            _set(feature_version="state-v0"),
            "out_of_range",
            f"feature_version should be '{FEATURE_VERSION}' (the state's names, order and scaling), "
            "but is 'state-v0'",
            id="old-feature-version",
        ),
        pytest.param(
            feed_decision, _set(feature_version=""), "out_of_range", "but is ''", id="no-feature-version"
        ),
        pytest.param(
            feed_decision,
            _set(features_missing=True),
            "out_of_range",
            "DecisionRecord.features_missing_reason should be one of "
            "['no_store', 'unknown_user', 'timeout', 'busy', 'error'] exactly when features_missing is set, "
            "but is '' with features_missing=True",
            id="missing-without-reason",
        ),
        pytest.param(
            feed_decision,
            _set(features_missing_reason="timeout"),
            "out_of_range",
            "but is 'timeout' with features_missing=False",
            id="reason-without-missing",
        ),
        pytest.param(
            feed_decision,
            _set(features_missing=True, features_missing_reason="gremlins"),
            "out_of_range",
            "but is 'gremlins'",
            id="unknown-reason",
        ),
        pytest.param(
            feed_decision,
            _set(user_group=7),
            "out_of_range",
            "user_group should be below 4, but is 7",
            id="group",
        ),
        pytest.param(
            feed_decision,
            _set(log_propensity=math.nan),
            "out_of_range",
            "DecisionRecord.log_propensity should be finite, but holds nan",
            id="nan-propensity",
        ),
        pytest.param(
            feed_decision,
            _set(state=[math.inf] + [0.0] * 13),
            "out_of_range",
            "DecisionRecord.state should be finite, but holds inf",
            id="inf-state",
        ),
        pytest.param(
            feed_decision,
            _set(action=[0.0, -math.inf] + [0.0] * (len(signals.FEED_SIGNALS) - 2)),
            "out_of_range",
            "DecisionRecord.action should be finite, but holds -inf",
            id="inf-action",
        ),
        pytest.param(
            live_decision,
            _set(action=[0.5]),
            "out_of_range",
            "should be 0 or 1, but is 0.5",
            id="fractional-allocation",
        ),
        pytest.param(
            live_decision,
            _set(log_propensity=0.3),
            "out_of_range",
            "should be <= 0",
            id="probability-above-one",
        ),
        pytest.param(
            feedback,
            _set(signals__watch_time_s=-1.0),
            "out_of_range",
            "watch_time_s should be in",
            id="negative-watch",
        ),
        pytest.param(
            feedback,
            _set(signals__live_watch_s=1e9),
            "out_of_range",
            "live_watch_s should be in",
            id="huge-live-watch",
        ),
        pytest.param(
            feedback,
            _set(signals__like=3),
            "out_of_range",
            "like should be 0 or 1 per view, but is 3",
            id="like-count",
        ),
        pytest.param(
            feedback,
            _set(signals__gift_value=-5.0),
            "out_of_range",
            "gift_value should be finite and >= 0",
            id="negative-gift",
        ),
        pytest.param(feedback, _set(event_time_ms=0), "out_of_range", "event_time_ms", id="no-time"),
        pytest.param(
            feed_decision,
            _set(request_id="r" * 129),
            "too_long",
            "DecisionRecord.request_id should be at most 128 characters, but has 129",
            id="long-request-id",
        ),
        pytest.param(
            feed_decision,
            _set(policy_version="v" * 300),
            "too_long",
            "policy_version should be at most 128 characters",
            id="long-version",
        ),
        pytest.param(
            feed_decision, _set(session_id="s" * 200), "too_long", "session_id should be", id="long-session"
        ),
        pytest.param(feedback, _set(user_id="u" * 129), "too_long", "FeedbackEvent.user_id", id="long-user"),
        pytest.param(
            feedback, _set(author_id="a" * 129), "too_long", "author_id should be", id="long-author"
        ),
        pytest.param(
            feedback,
            _set(item_type=7),
            "unknown_item_type",
            "FeedbackEvent.item_type should be one of ['video', 'live'] (1, 2), but is 7",
            id="unknown-item-type",
        ),
        pytest.param(
            feedback, _set(item_type=0), "unknown_item_type", "but is 0", id="unspecified-item-type"
        ),
        pytest.param(
            feed_decision,
            _set(schema_version=2),
            "missing_field",
            "DecisionRecord.action_selection of a version-2 record should be one of ['sampled', 'mode'] "
            "(1, 2), but is 0",
            id="v2-without-action-selection",
        ),
        pytest.param(
            live_decision,
            _set(schema_version=2, action_selection=9),
            "out_of_range",
            "action_selection of a version-2 record should be one of ['sampled', 'mode'] (1, 2), but is 9",
            id="v2-unknown-action-selection",
        ),
    ],
)
def test_bad_values_are_rejected_with_reason_and_field(make, mutate, reason, words):
    message = make()
    mutate(message)
    check = check_decision if isinstance(message, contracts.DecisionRecord) else check_feedback
    rejection = check(message)
    assert rejection is not None and rejection.reason == reason
    assert words in rejection.detail


@pytest.mark.parametrize("make", [feed_decision, feedback], ids=["decision", "feedback"])
def test_an_event_time_more_than_a_day_after_its_record_was_written_is_rejected(make):
    """A client clock a day fast would put its events in tomorrow's dataset; the record's own Kafka
    timestamp (when it was produced) is the reference, so a replay judges it the same way."""
    message = make()
    day_ms = 86_400_000
    assert check_event_time_against_record(type(message).__name__, message.event_time_ms, T0) is None
    written = message.event_time_ms - day_ms  # the event claims to happen a day after it was written
    assert check_event_time_against_record("X", message.event_time_ms, written) is None  # at the bound
    rejection = check_event_time_against_record("FeedbackEvent", message.event_time_ms, written - 1)
    assert rejection is not None and rejection.reason == "future_event_time"
    assert "FeedbackEvent.event_time_ms is 86400001 ms after its record's Kafka timestamp" in rejection.detail
    # a record without a broker timestamp (-1, or 0) is not judged by it
    assert check_event_time_against_record("X", message.event_time_ms, -1) is None
    assert check_event_time_against_record("X", message.event_time_ms, 0) is None


def _decoded(message, kafka_timestamp_ms: int):
    """What the pipeline's decoder makes of the message's bytes: fields, or the dead letter's reason."""
    kind = DECISION if isinstance(message, contracts.DecisionRecord) else FEEDBACK
    return decode_event(kind, ("t", 0, 0, kafka_timestamp_ms, b"u1", contracts.encode(message)))


@pytest.mark.parametrize("make", [feed_decision, feedback], ids=["decision", "feedback"])
@pytest.mark.parametrize(
    ("event_time_ms", "usable"),
    [
        pytest.param(T0 * 1000, False, id="microseconds"),
        pytest.param(T0 // 1000, False, id="seconds"),
        # 2000-01-01T00:00:00Z and 2100-01-01T00:00:00Z in milliseconds
        pytest.param(946_684_800_000 - 1, False, id="just-before-2000"),
        pytest.param(946_684_800_000, True, id="at-2000"),
        pytest.param(4_102_444_800_000, True, id="at-2100"),
        pytest.param(4_102_444_800_000 + 1, False, id="just-after-2100"),
    ],
)
def test_event_times_outside_2000_to_2100_in_milliseconds_are_dead_lettered(make, event_time_ms, usable):
    message = make()
    message.event_time_ms = event_time_ms
    check = check_decision if isinstance(message, contracts.DecisionRecord) else check_feedback
    rejection = check(message)
    if usable:
        assert rejection is None
    else:
        assert rejection == Rejection(
            "out_of_range",
            f"{type(message).__name__}.event_time_ms should be a millisecond time in 2000-2100, "
            f"but is {event_time_ms}",
        )
    # the pipeline's decoder, on a record without a broker timestamp (so only the range can refuse it)
    decoded = _decoded(message, -1)
    assert (type(decoded) is not Rejection) if usable else (decoded == rejection)


@pytest.mark.parametrize(
    ("gift", "usable"),
    [
        pytest.param(0.0, True, id="zero"),
        pytest.param(1e12, True, id="large-but-finite"),
        pytest.param(math.inf, False, id="inf"),
        pytest.param(math.nan, False, id="nan"),
        pytest.param(-math.inf, False, id="minus-inf"),
        pytest.param(-1e-9, False, id="just-negative"),
    ],
)
def test_a_gift_value_must_be_finite_and_non_negative(gift, usable):
    message = feedback()
    message.signals.gift_value = gift
    rejection = check_feedback(message)
    decoded = _decoded(message, T0)
    if usable:
        assert rejection is None and type(decoded) is not Rejection
    else:
        assert rejection is not None and rejection.reason == "out_of_range"
        assert (
            f"FeedbackEvent.signals.gift_value should be finite and >= 0, but is {gift}" in rejection.detail
        )
        assert decoded == rejection


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (feed_decision, "request_id"),
        (feed_decision, "user_id"),
        (feedback, "request_id"),
        (feedback, "user_id"),
        (feedback, "item_id"),
    ],
)
def test_each_required_id_left_empty_is_dead_lettered_by_name(make, field):
    message = make()
    setattr(message, field, "")
    check = check_decision if isinstance(message, contracts.DecisionRecord) else check_feedback
    assert check(message) == Rejection("missing_field", f"{type(message).__name__}.{field} is empty")


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (feed_decision, "request_id"),
        (feed_decision, "user_id"),
        (feed_decision, "session_id"),
        (feed_decision, "policy_version"),
        (feedback, "request_id"),
        (feedback, "user_id"),
        (feedback, "item_id"),
        (feedback, "author_id"),
    ],
)
def test_an_id_of_128_characters_passes_and_one_of_129_is_too_long(make, field):
    check = check_decision if make is feed_decision else check_feedback
    at_limit = make()
    setattr(at_limit, field, "x" * 128)
    assert check(at_limit) is None
    over = make()
    setattr(over, field, "x" * 129)
    assert check(over) == Rejection(
        "too_long", f"{type(over).__name__}.{field} should be at most 128 characters, but has 129"
    )


def test_user_groups_are_the_four_activity_groups():
    """Groups 0..3 (high, full, middle, low-or-unknown activity) are usable; 4 is past the last one."""
    last = feed_decision()
    last.user_group = 3
    assert check_decision(last) is None
    past = feed_decision()
    past.user_group = 4
    assert check_decision(past) == Rejection(
        "out_of_range", "DecisionRecord.user_group should be below 4, but is 4"
    )


@pytest.mark.parametrize("allocated", [0.0, 1.0], ids=["not-allocated", "allocated"])
def test_an_allocation_of_0_or_1_with_a_certain_propensity_is_usable(allocated):
    """A deterministic allocation has probability 1, i.e. log-propensity 0: the bound itself is usable."""
    record = live_decision()
    record.action[0] = allocated
    assert check_decision(record) is None
    record.log_propensity = 0.0
    assert check_decision(record) is None
    record.log_propensity = 1e-9  # just above probability 1
    assert check_decision(record) == Rejection(
        "out_of_range",
        "DecisionRecord.log_propensity of an allocation is a log-probability and should be <= 0, "
        "but is 1e-09",
    )


@pytest.mark.parametrize("field", ["watch_time_s", "live_watch_s"])
def test_a_view_of_exactly_six_hours_is_believable_and_a_longer_one_is_not(field):
    message = feedback()
    for seconds in (0.0, 6 * 3600.0):
        setattr(message.signals, field, seconds)
        assert check_feedback(message) is None
    setattr(message.signals, field, 21600.5)
    assert check_feedback(message) == Rejection(
        "out_of_range", f"FeedbackEvent.signals.{field} should be in [0, 21600], but is 21600.5"
    )


@pytest.mark.parametrize("counter", ["click", "like", "follow", "comment", "share", "hate"])
def test_each_interaction_counter_is_0_or_1_per_view(counter):
    message = feedback()
    setattr(message.signals, counter, 1)
    assert check_feedback(message) is None
    setattr(message.signals, counter, 2)  # the smallest count that cannot be one view's
    assert check_feedback(message) == Rejection(
        "out_of_range", f"FeedbackEvent.signals.{counter} should be 0 or 1 per view, but is 2"
    )


def test_a_kafka_timestamp_of_1_ms_is_a_timestamp_and_judges_the_event_time():
    """Only -1 and 0 mean the record has no broker timestamp; any positive one is the reference."""
    rejection = check_event_time_against_record("DecisionRecord", T0, 1)
    assert rejection is not None and rejection.reason == "future_event_time"
    assert (
        f"DecisionRecord.event_time_ms is {T0 - 1} ms after its record's Kafka timestamp" in rejection.detail
    )


def ranked_with_term(**term) -> contracts.DecisionRecord:
    """A feed decision of two candidates whose ranking had a user-author term (issue 22)."""
    record = feed_decision()
    for item in ("v1", "v2"):
        record.candidates.add(item_id=item, item_type=contracts.ITEM_TYPES["video"])
    settings = {
        "policy_version": "ua1",
        "term_id": "t" * 16,
        "weight_logit": 0.2,
        "log_propensity": -0.4,
        "terms": [0.5, 0.0],
        **term,
    }
    record.user_author.CopyFrom(contracts.events_pb2.UserAuthorTerm(**settings))
    return record


@pytest.mark.parametrize(
    ("term", "reason", "words"),
    [
        (
            {"terms": [0.5]},
            "out_of_range",
            "user_author.terms should have one value per candidate (2), but has 1",
        ),
        ({"terms": [0.5, math.inf]}, "out_of_range", "user_author.terms should be finite"),
        ({"weight_logit": math.nan}, "out_of_range", "weight_logit and log_propensity should be finite"),
        ({"missing_reason": "unknown_user", "terms": []}, "out_of_range", "missing_reason should be one of"),
        ({"missing_reason": "timeout"}, "out_of_range", "with no terms, but is 'timeout' with 2 terms"),
        ({"term_id": ""}, "missing_field", "DecisionRecord.user_author.term_id is empty"),
        ({"policy_version": ""}, "missing_field", "DecisionRecord.user_author.policy_version is empty"),
        ({"policy_version": "v" * 129}, "too_long", "user_author.policy_version should be at most 128"),
        ({"term_id": "t" * 129}, "too_long", "user_author.term_id should be at most 128"),
    ],
)
def test_a_bad_user_author_term_is_dead_lettered_naming_the_field(term, reason, words):
    rejection = check_decision(ranked_with_term(**term))
    assert rejection is not None and rejection.reason == reason and words in rejection.detail, rejection


def test_a_user_author_term_is_carried_into_the_decision_whenever_it_was_routed():
    assert check_decision(ranked_with_term()) is None
    assert check_decision(ranked_with_term(missing_reason="busy", terms=[])) is None
    live = live_decision()
    live.user_author.CopyFrom(ranked_with_term().user_author)
    assert check_decision(live) == Rejection(
        "out_of_range", "DecisionRecord.user_author is set on a live_allocation decision"
    )

    def decoded(record: contracts.DecisionRecord):
        _, fields = decode_event(DECISION, ("decisions", 0, 0, T0, b"", contracts.encode(record)))
        decision = Decision._make(fields)
        return (
            decision.user_author_term_id,
            decision.user_author_weight_logit,
            decision.user_author_log_propensity,
        )

    term_id, logit, log_propensity = decoded(ranked_with_term())
    assert (term_id, log_propensity) == ("t" * 16, -0.4) and logit == pytest.approx(0.2)
    # a draw the ranking could not use (the pairs' rows did not arrive) is kept: it moved nothing
    term_id, _, log_propensity = decoded(ranked_with_term(missing_reason="error", terms=[]))
    assert (term_id, log_propensity) == ("t" * 16, -0.4)
    assert decoded(feed_decision()) == ("", 0.0, 0.0)
