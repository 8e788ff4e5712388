"""The per-user transition builder against the simulator's own record, and its join/dedupe rules."""

import itertools
from collections import Counter, defaultdict

import numpy as np
import pytest

from recsys_rl import contracts, signals
from recsys_rl.pipelines.episodes import (
    DECISION,
    EVENT_TYPES,
    FEEDBACK,
    SURFACE_SIGNALS,
    EpisodeConfig,
    build_user_episodes,
    dead_letter,
    decode_event,
    float32_bytes,
    float32_list,
    unread_dead_letter,
)
from recsys_rl.pipelines.event_validation import Rejection
from recsys_rl.pipelines.feature_aggregates import FACT_FIELDS, ITEM_TYPES
from recsys_rl.sim.events import EventIds
from recsys_rl.sim.simulate import SimulateConfig, day_messages, simulated_days

CONFIG = SimulateConfig(users=80, seed=12)
VIDEO = contracts.ITEM_TYPES["video"]
IDS = EventIds.for_seed(CONFIG.seed)


@pytest.fixture(scope="module")
def simulated():
    """One simulated day: the simulator's record and the Kafka records it produced, by user."""
    sim, next_day = simulated_days(CONFIG)
    log = next_day()
    by_user: dict[str, list] = defaultdict(list)
    offsets: dict[str, int] = defaultdict(int)
    for topic, key, value, ts in day_messages(CONFIG, sim, log):
        kind = DECISION if topic == CONFIG.decisions_topic else FEEDBACK
        by_user[key.decode()].append((kind, topic, 0, offsets[topic], ts, key, value))
        offsets[topic] += 1
    return log, by_user


def build(user: str, refs, config: EpisodeConfig):
    """build_user_episodes on Kafka records given as (kind, topic, partition, offset, ts, key, value)."""
    decoded = [(kind, decode_event(kind, ref)) for kind, *ref in refs]
    assert all(user_id == user for _, (user_id, _) in decoded)
    events = [EVENT_TYPES[kind]._make(fields) for kind, (_, fields) in decoded]
    return build_user_episodes(user, events, config)


def _build(by_user, config: EpisodeConfig | None = None):
    config = config or EpisodeConfig()
    built = {user: build(user, refs, config) for user, refs in by_user.items()}
    rows = [row for b in built.values() for row in b.transitions]
    return built, rows


def test_transitions_match_the_simulators_record(simulated):
    log, by_user = simulated
    built, rows = _build(by_user)
    feed_rows = {r["request_id"]: r for r in rows if r["surface"] == "feed"}
    live_rows = {r["request_id"]: r for r in rows if r["surface"] == "live_allocation"}
    assert len(feed_rows) == log.feed.request.size
    assert len(live_rows) == log.live.request.size
    # rewards of every feed step equal the simulator's, signal by signal
    for i, request in enumerate(log.feed.request):
        row = feed_rows[IDS.request(int(request))]
        np.testing.assert_allclose(row["reward"], log.feed.reward[i], rtol=1e-6, atol=1e-6)
        assert row["done"] == bool(log.feed.done[i])
        assert row["step"] == log.feed.page[i]
    # live steps: watch and gifts as simulated; displaced time is the logged prediction when inserted
    for i, request in enumerate(log.live.request):
        row = live_rows[IDS.live_request(int(request))]
        np.testing.assert_allclose(row["reward"][:2], log.live.reward[i, :2], rtol=1e-6, atol=1e-6)
        expected_displaced = log.live.predictions[i, 2] if log.live.action[i] == 1 else 0.0
        assert row["reward"][2] == pytest.approx(expected_displaced, rel=1e-6)
    # one episode per simulated session, and next states chain within it
    assert len({r["session_id"] for r in feed_rows.values()}) == log.sessions
    by_session = defaultdict(list)
    for row in feed_rows.values():
        by_session[row["session_id"]].append(row)
    for chain in by_session.values():
        chain.sort(key=lambda r: r["step"])
        for current, following in itertools.pairwise(chain):
            assert current["next_state"] == following["state"] and not current["done"]
        assert chain[-1]["done"] and chain[-1]["next_state"] == [0.0] * len(chain[-1]["state"])
    # every record was used: none dead-lettered or filtered
    fates = sum((b.fates for b in built.values()), start=Counter())
    assert dict(fates) == {"used": sum(len(refs) for refs in by_user.values())}
    assert all(len(r["reward"]) == len(signals.FEED_SIGNALS) for r in feed_rows.values())


def test_view_facts_meet_the_feature_aggregates_contract(simulated):
    _, by_user = simulated
    built, _ = _build(by_user)
    facts = [fact for b in built.values() for fact in b.view_facts]
    assert len(facts) == sum(1 for refs in by_user.values() for r in refs if r[0] == FEEDBACK)
    for fact in facts:
        assert set(fact) == set(FACT_FIELDS)
        for name, kind in FACT_FIELDS.items():
            assert isinstance(fact[name], kind), (name, fact[name])
            assert kind is bool or not isinstance(fact[name], bool), (name, fact[name])
        assert fact["item_type"] in ITEM_TYPES


def test_duplicates_are_filtered_by_request_id(simulated):
    _, by_user = simulated
    user, refs = next(iter(by_user.items()))
    resent = [(k, t, p, o + 100_000, ts, key, value) for k, t, p, o, ts, key, value in refs[:5]]
    clean = build(user, refs, EpisodeConfig())
    doubled = build(user, refs + resent, EpisodeConfig())
    assert doubled.transitions == clean.transitions
    decisions = sum(1 for r in resent if r[0] == DECISION)
    assert doubled.fates["filtered:duplicate_decision"] == decisions
    assert doubled.fates["filtered:duplicate_feedback"] == len(resent) - decisions


def test_a_conflicting_duplicate_decision_is_dead_lettered_not_silently_dropped(simulated):
    """Same request id, different content: the first (lowest offset) is kept, the other dead-lettered
    with a reason naming both and what differs, and counted; its bytes are fetched from the source
    later (build_transitions), since decisions cross the shuffle without them."""
    _, by_user = simulated
    user, refs = next(iter(by_user.items()))
    _kind, topic, partition, offset, ts, key, value = next(r for r in refs if r[0] == DECISION)
    changed = contracts.decode_decision(value)
    changed.action[0] += 1.0
    changed.policy_version = "other-version"
    conflicting = (DECISION, topic, partition, 500_000, ts, key, contracts.encode(changed))
    clean = build(user, refs, EpisodeConfig())
    built = build(user, [*refs, conflicting], EpisodeConfig())
    assert built.transitions == clean.transitions  # the first one stays
    assert built.fates["dead_letter:conflicting_decision"] == 1
    assert "filtered:duplicate_decision" not in built.fates
    [letter] = built.dead_letters
    assert (letter["reason"], letter["topic"], letter["partition"], letter["offset"]) == (
        "conflicting_decision",
        topic,
        partition,
        500_000,
    )
    assert letter["value"] is None  # to be read back from the source by its coordinates
    assert f"kept the one at offset {offset} of partition {partition}" in letter["detail"]
    assert "action, policy_version" in letter["detail"] and changed.request_id in letter["detail"]


def _feedback_ref(event, offset):
    return (FEEDBACK, "fb", 0, offset, event.event_time_ms, event.user_id.encode(), contracts.encode(event))


def test_orphan_and_late_feedback_are_dead_lettered(simulated):
    _, by_user = simulated
    user, refs = next(iter(by_user.items()))
    first = contracts.decode_decision(next(r[6] for r in refs if r[0] == DECISION))
    orphan = contracts.FeedbackEvent(
        schema_version=1,
        request_id="nope",
        user_id=user,
        item_id="v1",
        item_type=VIDEO,
        event_time_ms=first.event_time_ms,
    )
    late = contracts.FeedbackEvent(
        schema_version=1,
        request_id=first.request_id,
        user_id=user,
        item_id="v-late",
        item_type=VIDEO,
        position=99,
        event_time_ms=first.event_time_ms + 3_600_001,
    )
    early = contracts.FeedbackEvent(
        schema_version=1,
        request_id=first.request_id,
        user_id=user,
        item_id="v-early",
        item_type=VIDEO,
        position=98,
        event_time_ms=first.event_time_ms - 1,
    )
    extra = [_feedback_ref(e, 900_000 + i) for i, e in enumerate((orphan, late, early))]
    built = build(user, refs + extra, EpisodeConfig())
    reasons = sorted(d["reason"] for d in built.dead_letters)
    assert reasons == ["late_feedback", "late_feedback", "orphan_feedback"]
    assert built.fates["dead_letter:orphan_feedback"] == 1 and built.fates["dead_letter:late_feedback"] == 2
    assert all(d["value"] and d["offset"] >= 900_000 for d in built.dead_letters)
    assert "nope" in next(d["detail"] for d in built.dead_letters if d["reason"] == "orphan_feedback")


def test_a_decision_without_feedback_gets_zero_rewards(simulated):
    _, by_user = simulated
    user, refs = next(iter(by_user.items()))
    decisions_only = [r for r in refs if r[0] == DECISION]
    built = build(user, decisions_only, EpisodeConfig())
    # every reported signal is zero; only a live insertion keeps the displaced time its decision predicted
    displaced = SURFACE_SIGNALS["live_allocation"].index("video_watch_displaced")
    reported = [
        [v for i, v in enumerate(r["reward"]) if r["surface"] == "feed" or i != displaced]
        for r in built.transitions
    ]
    assert built.transitions and not any(any(values) for values in reported)
    records = {d.request_id: d for d in (contracts.decode_decision(r[6]) for r in decisions_only)}
    for row in built.transitions:
        if row["surface"] == "live_allocation":
            record = records[row["request_id"]]
            names = list(record.prediction_names)
            predicted = record.candidates[0].predictions[names.index("video_watch_displaced")]
            assert row["reward"][displaced] == pytest.approx(predicted if record.action[0] == 1 else 0.0)
    assert all(r["feedback_count"] == 0 for r in built.transitions)


def test_inactivity_beyond_the_gap_starts_a_new_episode(simulated):
    _, by_user = simulated
    user, refs = next(iter(by_user.items()))
    template = contracts.decode_decision(next(r[6] for r in refs if r[0] == DECISION))

    def decisions(gap_minutes: float):
        out = []
        for i, t in enumerate((0.0, gap_minutes * 60_000)):
            record = contracts.DecisionRecord()
            record.CopyFrom(template)
            record.request_id, record.event_time_ms = f"req-{i}", template.event_time_ms + int(t)
            out.append((DECISION, "d", 0, i, record.event_time_ms, user.encode(), contracts.encode(record)))
        return out

    within = build(user, decisions(29), EpisodeConfig(session_gap_ms=30 * 60_000))
    beyond = build(user, decisions(31), EpisodeConfig(session_gap_ms=30 * 60_000))
    assert len({r["session_id"] for r in within.transitions}) == 1
    assert [r["done"] for r in within.transitions] == [False, True]
    assert len({r["session_id"] for r in beyond.transitions}) == 2
    assert [r["done"] for r in beyond.transitions] == [True, True]


def _decision_at(template, user: str, request_id: str, event_time_ms: int, offset: int):
    record = contracts.DecisionRecord()
    record.CopyFrom(template)
    record.request_id, record.event_time_ms = request_id, event_time_ms
    return (DECISION, "d", 0, offset, event_time_ms, user.encode(), contracts.encode(record))


def _feedback_at(user: str, request_id: str, event_time_ms: int, offset: int):
    event = contracts.FeedbackEvent(
        schema_version=1,
        request_id=request_id,
        user_id=user,
        item_id=f"v{offset}",
        item_type=VIDEO,
        event_time_ms=event_time_ms,
    )
    return _feedback_ref(event, offset)


HOUR_MS, HALF_HOUR_MS = 3_600_000, 1_800_000  # the documented defaults of EpisodeConfig


@pytest.mark.parametrize(
    ("delay_ms", "joined"),
    [
        pytest.param(-1, False, id="just-before-the-decision"),
        pytest.param(0, True, id="with-the-decision"),
        pytest.param(HOUR_MS - 1, True, id="just-inside-the-window"),
        pytest.param(HOUR_MS, True, id="at-the-window"),
        pytest.param(HOUR_MS + 1, False, id="just-outside-the-window"),
    ],
)
def test_feedback_joins_its_decision_over_the_closed_join_window(simulated, delay_ms, joined):
    _, by_user = simulated
    user, refs = next(iter(by_user.items()))
    template = contracts.decode_decision(next(r[6] for r in refs if r[0] == DECISION))
    t0 = template.event_time_ms
    events = [_decision_at(template, user, "req-0", t0, 0), _feedback_at(user, "req-0", t0 + delay_ms, 1)]
    built = build(user, events, EpisodeConfig())
    (row,) = built.transitions
    assert row["feedback_count"] == (1 if joined else 0)
    if joined:
        assert dict(built.fates) == {"used": 2}
    else:
        assert dict(built.fates) == {"used": 1, "dead_letter:late_feedback": 1}
        (letter,) = built.dead_letters
        assert letter["detail"].endswith(
            f"came {delay_ms} ms after its decision; the join window is [0, 3600000] ms"
        )


@pytest.mark.parametrize(
    ("pause_ms", "sessions"),
    [
        pytest.param(HALF_HOUR_MS - 1, 1, id="just-inside-the-gap"),
        pytest.param(HALF_HOUR_MS, 1, id="at-the-gap"),
        pytest.param(HALF_HOUR_MS + 1, 2, id="just-beyond-the-gap"),
    ],
)
def test_a_session_ends_only_after_more_than_the_gap_since_its_last_activity(simulated, pause_ms, sessions):
    """Last activity includes feedback: the pause is counted from the feedback on the first decision,
    ten seconds after it, not from the decision."""
    _, by_user = simulated
    user, refs = next(iter(by_user.items()))
    template = contracts.decode_decision(next(r[6] for r in refs if r[0] == DECISION))
    t0 = template.event_time_ms
    events = [
        _decision_at(template, user, "req-0", t0, 0),
        _feedback_at(user, "req-0", t0 + 10_000, 1),
        _decision_at(template, user, "req-1", t0 + 10_000 + pause_ms, 2),
    ]
    built = build(user, events, EpisodeConfig())
    rows = sorted(built.transitions, key=lambda r: r["event_time_ms"])
    assert len({r["session_id"] for r in rows}) == sessions
    assert [r["done"] for r in rows] == ([False, True] if sessions == 1 else [True, True])
    assert [r["step"] for r in rows] == ([0, 1] if sessions == 1 else [0, 0])


def test_the_cli_durations_in_seconds_become_the_episode_config_in_milliseconds():
    from recsys_rl.pipelines.build_transitions import BuildTransitionsConfig

    required = {"bootstrap_servers": "localhost:9092", "group": "g", "out": "/tmp/unused"}
    config = BuildTransitionsConfig(**required, join_window_s=1.5, session_gap_s=0.25).episode_config()
    assert (config.join_window_ms, config.session_gap_ms) == (1500, 250)


def test_event_order_does_not_change_the_output(simulated):
    _, by_user = simulated
    user, refs = max(by_user.items(), key=lambda item: len(item[1]))
    forward = build(user, refs, EpisodeConfig())
    backward = build(user, list(reversed(refs)), EpisodeConfig())
    assert forward.transitions == backward.transitions


@pytest.mark.parametrize("field", ["join_window_ms", "session_gap_ms"])
def test_episode_config_rejects_non_positive_durations(field):
    with pytest.raises(ValueError, match=f"{field} should be positive, but is 0"):
        EpisodeConfig(**{field: 0})


def test_a_decision_on_default_features_says_so_in_its_transition(simulated):
    _, by_user = simulated
    user, refs = max(by_user.items(), key=lambda item: len(item[1]))
    first_decision = next(i for i, r in enumerate(refs) if r[0] == DECISION)
    record = contracts.decode_decision(refs[first_decision][6])
    record.features_missing, record.features_missing_reason = True, "timeout"
    changed = list(refs)
    changed[first_decision] = (*refs[first_decision][:6], contracts.encode(record))
    built = build(user, changed, EpisodeConfig())
    flagged = {r["request_id"]: r for r in built.transitions if r["features_missing"]}
    assert (
        list(flagged) == [record.request_id]
        and flagged[record.request_id]["features_missing_reason"] == "timeout"
    )
    others = [r for r in built.transitions if r["request_id"] != record.request_id]
    assert others and all(r["features_missing_reason"] == "" for r in others)


def test_a_ranking_with_a_user_author_term_carries_its_draw_into_its_transition(simulated):
    """Issue 22: the term's function, weight logit and its log-density reach the feed row, for the OPE
    gate to re-weight; a row whose ranking had no term has none."""
    _, by_user = simulated
    user, refs = max(by_user.items(), key=lambda item: len(item[1]))
    first_decision = next(i for i, r in enumerate(refs) if r[0] == DECISION)
    record = contracts.decode_decision(refs[first_decision][6])
    record.user_author.CopyFrom(
        contracts.events_pb2.UserAuthorTerm(
            policy_version="ua1",
            term_id="term-a",
            weight_logit=0.25,
            log_propensity=-0.5,
            terms=[0.1] * len(record.candidates),
        )
    )
    changed = list(refs)
    changed[first_decision] = (*refs[first_decision][:6], contracts.encode(record))
    rows = {r["request_id"]: r for r in build(user, changed, EpisodeConfig()).transitions}
    termed = rows.pop(record.request_id)
    assert (termed["user_author_term_id"], termed["user_author_log_propensity"]) == ("term-a", -0.5)
    assert termed["user_author_weight_logit"] == 0.25
    assert rows and all(
        (r["user_author_term_id"], r["user_author_weight_logit"], r["user_author_log_propensity"])
        == ("", 0.0, 0.0)
        for r in rows.values()
    )


def _first_decision(simulated):
    _, by_user = simulated
    user, refs = next(iter(by_user.items()))
    _kind, *ref = next(r for r in refs if r[0] == DECISION)
    return user, ref


@pytest.mark.parametrize(("selection", "deterministic"), [("sampled", False), ("mode", True)])
def test_a_decision_says_whether_its_action_was_the_policys_mode(simulated, selection, deterministic):
    """Issue 19: the dataset's ``deterministic`` column comes from the record's action_selection."""
    user, (topic, partition, offset, ts, key, value) = _first_decision(simulated)
    record = contracts.decode_decision(value)
    record.action_selection = contracts.ACTION_SELECTIONS[selection]
    user_id, fields = decode_event(DECISION, (topic, partition, offset, ts, key, contracts.encode(record)))
    decision = EVENT_TYPES[DECISION]._make(fields)
    assert user_id == user and decision.deterministic is deterministic
    assert (decision.topic, decision.partition, decision.offset) == (topic, partition, offset)


@pytest.mark.parametrize(("kind", "name"), [(DECISION, "DecisionRecord"), (FEEDBACK, "FeedbackEvent")])
def test_an_event_time_over_a_day_after_its_kafka_timestamp_is_rejected_naming_its_kind(
    simulated, kind, name
):
    _, by_user = simulated
    _kind, *ref = next(r for refs in by_user.values() for r in refs if r[0] == kind)
    decoded = contracts.decode_decision(ref[5]) if kind == DECISION else contracts.decode_feedback(ref[5])
    early_ts = decoded.event_time_ms - 86_400_001  # the record written a day and a millisecond before
    rejection = decode_event(kind, (*ref[:3], early_ts, *ref[4:]))
    assert isinstance(rejection, Rejection) and rejection.reason == "future_event_time"
    assert rejection.detail == (
        f"{name}.event_time_ms is 86400001 ms after its record's Kafka timestamp; at most 86400000 (a day) "
        "is believable"
    )
    assert not isinstance(decode_event(kind, (*ref[:3], early_ts + 1, *ref[4:])), Rejection)  # just a day


def test_a_decision_failing_a_field_check_is_rejected_for_that_field_not_its_time(simulated):
    _user, (topic, partition, offset, ts, key, value) = _first_decision(simulated)
    record = contracts.decode_decision(value)
    record.request_id = ""
    rejection = decode_event(DECISION, (topic, partition, offset, ts, key, contracts.encode(record)))
    assert rejection == Rejection("missing_field", "DecisionRecord.request_id is empty")


def test_undecodable_bytes_are_rejected_with_the_contracts_reason_and_detail():
    rejection = decode_event(DECISION, ("d", 0, 7, 1_700_000_000_000, b"u", b"\xff\x00garbage"))
    assert isinstance(rejection, Rejection) and rejection.reason == "malformed_bytes"
    assert rejection.detail.startswith("DecisionRecord does not parse: ")


def test_a_dead_letter_keeps_the_coordinates_the_reason_and_the_original_bytes_in_base64():
    letter = dead_letter(
        ("decisions", 3, 41, 1_700_000_000_123, b"user-1", b"\x00\xffv"), "malformed_bytes", "x"
    )
    assert letter == {
        "topic": "decisions",
        "partition": 3,
        "offset": 41,
        "timestamp_ms": 1_700_000_000_123,
        "reason": "malformed_bytes",
        "detail": "x",
        "key": "dXNlci0x",
        "value": "AP92",
    }


def test_an_unread_dead_letter_has_the_same_fields_with_its_bytes_still_at_the_source():
    letter = unread_dead_letter("decisions", 2, 9, "conflicting_decision", "y")
    assert letter == {
        "topic": "decisions",
        "partition": 2,
        "offset": 9,
        "timestamp_ms": None,
        "reason": "conflicting_decision",
        "detail": "y",
        "key": None,
        "value": None,
    }


def test_float32_bytes_round_trip_little_endian():
    data = float32_bytes([1.0, -2.5, 0.5])
    assert data == bytes.fromhex("0000803f000020c00000003f") and float32_list(data) == [1.0, -2.5, 0.5]


def _template(simulated):
    _, by_user = simulated
    user, refs = next(iter(by_user.items()))
    return user, contracts.decode_decision(next(r[6] for r in refs if r[0] == DECISION))


def _built_with_cutoff(user, refs, open_after_ms):
    decoded = [(kind, decode_event(kind, ref)) for kind, *ref in refs]
    events = [EVENT_TYPES[kind]._make(fields) for kind, (_, fields) in decoded]
    return build_user_episodes(user, events, EpisodeConfig(), open_after_ms=open_after_ms)


@pytest.mark.parametrize(
    ("cutoff_after_t0_ms", "carried"),
    [
        pytest.param(-1, True, id="active-just-after-the-cutoff"),
        pytest.param(0, False, id="last-active-at-the-cutoff"),
        pytest.param(1, False, id="closed-before-the-cutoff"),
    ],
)
def test_a_session_active_after_the_cutoff_is_carried_whole_even_without_feedback(
    simulated, cutoff_after_t0_ms, carried
):
    """A decision alone is activity: its session may still get feedback after the cut-off."""
    user, template = _template(simulated)
    t0 = template.event_time_ms
    refs = [
        _decision_at(template, user, "req-0", t0 - 60_000, 0),
        _decision_at(template, user, "req-1", t0, 1),
    ]
    built = _built_with_cutoff(user, refs, t0 + cutoff_after_t0_ms)
    if carried:
        assert [d.request_id for d in built.carried] == ["req-0", "req-1"] and built.transitions == []
        assert dict(built.fates) == {"carried": 2}
    else:
        assert built.carried == [] and len(built.transitions) == 2
        assert dict(built.fates) == {"used": 2}


def test_every_duplicate_is_counted_and_a_duplicate_view_does_not_stop_the_join(simulated):
    user, template = _template(simulated)
    t0 = template.event_time_ms
    decision = _decision_at(template, user, "req-0", t0, 0)
    conflicting = contracts.decode_decision(decision[6])
    conflicting.policy_version = "another"
    view = _feedback_at(user, "req-0", t0 + 1_000, 10)
    refs = [
        decision,
        (*decision[:3], 1, *decision[4:]),  # producer retries: the same record at later offsets
        (*decision[:3], 2, *decision[4:]),
        (*decision[:3], 3, decision[4], decision[5], contracts.encode(conflicting)),
        (*decision[:3], 4, decision[4], decision[5], contracts.encode(conflicting)),
        view,
        (*view[:3], 11, *view[4:]),  # the same view twice more
        (*view[:3], 12, *view[4:]),
        _feedback_at(user, "req-0", t0 + 2_000, 13),  # another view, after the duplicates
        _feedback_at(user, "req-9", t0 + 2_000, 14),  # two views of a request never decided
        _feedback_at(user, "req-9", t0 + 3_000, 15),
    ]
    built = build(user, refs, EpisodeConfig())
    assert dict(built.fates) == {
        "used": 3,
        "filtered:duplicate_decision": 2,
        "dead_letter:conflicting_decision": 2,
        "filtered:duplicate_feedback": 2,
        "dead_letter:orphan_feedback": 2,
    }
    (row,) = built.transitions
    assert row["feedback_count"] == 2


@pytest.mark.parametrize("field", ["join_window_ms", "session_gap_ms"])
def test_episode_config_takes_the_shortest_positive_duration(field):
    assert getattr(EpisodeConfig(**{field: 1}), field) == 1


def test_each_step_points_at_the_next_decision_and_the_last_at_none(simulated):
    """next_event_time_ms is the next step's decision time, -1 on the terminal step (its next state is
    zeros): three steps, so that the step before and the step after differ."""
    user, template = _template(simulated)
    t0 = template.event_time_ms
    times = [t0, t0 + 5_000, t0 + 12_000]
    refs = [_decision_at(template, user, f"req-{i}", t, i) for i, t in enumerate(times)]
    rows = sorted(build(user, refs, EpisodeConfig()).transitions, key=lambda r: r["step"])
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert [r["next_event_time_ms"] for r in rows] == [times[1], times[2], -1]
    assert rows[0]["next_state"] == rows[1]["state"] and rows[1]["next_state"] == rows[2]["state"]
    assert rows[2]["next_state"] == [0.0] * len(rows[2]["state"]) and rows[2]["done"]


def test_every_session_after_the_cutoff_is_carried_and_keeps_its_views_for_the_next_run(simulated):
    """Two sessions active after the cut-off (and one closed before it): both are carried whole, and the
    views of carried requests leave this run's feature facts (the next run counts them)."""
    user, template = _template(simulated)
    t0 = template.event_time_ms
    later = t0 + HOUR_MS  # beyond the session gap
    refs = [
        _decision_at(template, user, "closed", t0 - 4 * HOUR_MS, 0),
        _feedback_at(user, "closed", t0 - 4 * HOUR_MS + 1_000, 1),
        _decision_at(template, user, "open-1", t0, 2),
        _feedback_at(user, "open-1", t0 + 1_000, 3),
        _decision_at(template, user, "open-2", later, 4),
        _feedback_at(user, "open-2", later + 1_000, 5),
    ]
    built = _built_with_cutoff(user, refs, t0 - HOUR_MS)
    assert [r["request_id"] for r in built.transitions] == ["closed"]
    assert sorted(event.request_id for event in built.carried) == ["open-1", "open-1", "open-2", "open-2"]
    assert [fact["item_id"] for fact in built.view_facts] == ["v1"]
    assert dict(built.fates) == {"used": 2, "carried": 4}


def _predicted_by_request(log) -> dict[str, np.ndarray]:
    """Each feed request's upstream predictions summed over its viewed videos, from the simulator's arrays."""
    views, feed = log.views, log.feed
    row_of = {int(r): i for i, r in enumerate(feed.request)}
    out = {IDS.request(int(r)): np.zeros(len(signals.FEED_SIGNALS)) for r in feed.request}
    for request, item, is_live in zip(views.request, views.item, views.is_live, strict=True):
        if is_live:
            continue
        i = row_of[int(request)]
        position = np.flatnonzero(feed.candidates[i] == item)[0]  # a repeated candidate: its first
        out[IDS.request(int(request))] += feed.predictions[i, position]
    return out


def test_predicted_rewards_sum_the_viewed_items_logged_predictions(simulated):
    """Training's ``rewards: predicted`` reads these: per signal, the upstream model's prediction of each
    item the user viewed, as the decision logged it, summed over the request's views."""
    log, by_user = simulated
    _, rows = _build(by_user)
    expected = _predicted_by_request(log)
    feed_rows = [r for r in rows if r["surface"] == "feed"]
    assert len(feed_rows) == len(expected)
    for row in feed_rows:
        np.testing.assert_allclose(row["predicted_reward"], expected[row["request_id"]], rtol=1e-5, atol=1e-6)
    assert any(row["predicted_reward"] != row["reward"] for row in feed_rows)
    # the views' pair rewards are the user-author surface's to fill (pipelines.user_author); without it,
    # zeros, though these views have clicks and follows
    assert all(r["pair_reward"] == [0.0] * len(signals.PAIR_SIGNALS) for r in rows)
    assert any(row["reward"][signals.FEED_SIGNALS.index("follow")] > 0 for row in feed_rows)
    # a live stream viewed after its insertion: its predicted watch and gift; the displaced time is the
    # reward's own (already a prediction), viewed or not
    live = {IDS.live_request(int(r)): i for i, r in enumerate(log.live.request)}
    viewed = {int(r) for r, is_live in zip(log.views.request, log.views.is_live, strict=True) if is_live}
    live_rows = [r for r in rows if r["surface"] == "live_allocation"]
    assert any(int(log.live.request[live[r["request_id"]]]) in viewed for r in live_rows)
    for row in live_rows:
        i = live[row["request_id"]]
        seen = int(log.live.request[i]) in viewed
        np.testing.assert_allclose(
            row["predicted_reward"][:2], log.live.predictions[i, :2] if seen else [0.0, 0.0], rtol=1e-6
        )
        assert row["predicted_reward"][2] == row["reward"][2]


def _served_decision(simulated, *, names=None, served=None, width=None) -> tuple[str, tuple]:
    """The first feed decision of a user, re-logged with its predictions named ``names`` (in that order:
    each candidate's values reordered to match) and ``served`` as its page."""
    _, by_user = simulated
    user, refs = next(iter(by_user.items()))
    ref = next(
        r
        for r in refs
        if r[0] == DECISION and contracts.decode_decision(r[6]).surface == contracts.SURFACES["feed"]
    )
    record = contracts.decode_decision(ref[6])
    logged = list(record.prediction_names)
    if names is not None:
        for candidate in record.candidates:
            values = dict(zip(logged, candidate.predictions, strict=True))
            candidate.ClearField("predictions")
            candidate.predictions.extend(values.get(n, 99.0) for n in names)  # 99: a name not read
        record.ClearField("prediction_names")
        record.prediction_names.extend(names)
    if served is not None:
        record.ClearField("served_item_ids")
        record.served_item_ids.extend(served)
    if width is not None:  # the first served item's candidate
        first = next(c for c in record.candidates if c.item_id == record.served_item_ids[0])
        del first.predictions[width:]
    return user, (*ref[:6], contracts.encode(record))


def test_predicted_rewards_follow_the_logged_names_and_count_only_served_items(simulated):
    """The predictions are read by name, whatever order the logger wrote them in; a signal it did not
    predict is 0; a viewed item that was not served (nothing predicted it) adds nothing."""
    user, plain = _served_decision(simulated)
    record = contracts.decode_decision(plain[6])
    by_id = {c.item_id: c for c in reversed(record.candidates)}  # a repeated id: its first
    first, second = (by_id[item] for item in record.served_item_ids[:2])
    names = ["hate", "like", "watch_time", "unknown_signal", "click", "share", "comment"]  # no follow
    _, shuffled = _served_decision(
        simulated, names=names, served=[first.item_id, second.item_id, "never-a-candidate"]
    )

    def views(decision_ref, items):
        events = []
        for offset, item in enumerate(items):
            event = contracts.FeedbackEvent(
                schema_version=1,
                request_id=record.request_id,
                user_id=user,
                item_id=item,
                item_type=VIDEO,
                event_time_ms=record.event_time_ms + 1_000 * (offset + 1),
            )
            events.append(_feedback_ref(event, offset))
        [row] = [r for r in build(user, [decision_ref, *events], EpisodeConfig()).transitions]
        return row["predicted_reward"]

    got = views(shuffled, [first.item_id, second.item_id, "never-a-candidate", "not-served-either"])
    want = [a + b for a, b in zip(first.predictions, second.predictions, strict=True)]
    follow = signals.FEED_SIGNALS.index("follow")
    expected = [0.0 if i == follow else want[i] for i in range(len(want))]
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    # the same views of the plainly logged decision: follow counted
    np.testing.assert_allclose(views(plain, [first.item_id, second.item_id]), want, rtol=1e-6)


def test_a_served_candidate_with_the_wrong_number_of_predictions_is_rejected_naming_it(simulated):
    _, ref = _served_decision(simulated, width=3)
    item = contracts.decode_decision(ref[6]).served_item_ids[0]
    names = len(contracts.decode_decision(ref[6]).prediction_names)
    assert decode_event(DECISION, ref[1:]) == Rejection(
        "out_of_range",
        f"DecisionRecord.candidates: item {item!r} has 3 predictions, but prediction_names names {names}",
    )
