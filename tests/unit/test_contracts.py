"""Round trips and rejection rules of the event and serving contracts."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recsys_rl import contracts, signals


def _decision() -> contracts.DecisionRecord:
    record = contracts.DecisionRecord(
        schema_version=contracts.DECISION_SCHEMA_VERSION,
        request_id="r1",
        user_id="u7",
        surface=contracts.SURFACES["feed"],
        event_time_ms=1_767_225_600_123,
        state=[0.5, -1.25],
        feature_names=["a", "b"],
        feature_version="state-v1",
        user_group=2,
        prediction_names=signals.FEED_SIGNALS,
        action=[0.1] * len(signals.FEED_SIGNALS),
        log_propensity=-3.5,
        policy_version="behaviour-feed-v1",
        routing_arm=contracts.ROUTING_ARMS["canary"],
        served_item_ids=["v1", "v2"],
        session_id="s1",
        action_selection=contracts.ACTION_SELECTIONS["sampled"],
    )
    record.candidates.add(
        item_id="v1",
        author_id="a1",
        item_type=contracts.ITEM_TYPES["video"],
        predictions=[13.0, 0.5, 0.01, 0.0, 0.0, 0.0, 0.0],
    )
    return record


def test_decision_round_trips_through_bytes():
    record = _decision()
    assert contracts.decode_decision(contracts.encode(record)) == record


def test_encoding_is_deterministic():
    assert contracts.encode(_decision()) == contracts.encode(_decision())


feedback_events = st.builds(
    contracts.FeedbackEvent,
    schema_version=st.just(contracts.FEEDBACK_SCHEMA_VERSION),
    request_id=st.text(max_size=20),
    user_id=st.text(max_size=10),
    item_id=st.text(max_size=10),
    item_type=st.sampled_from(list(contracts.ITEM_TYPES.values())),
    event_time_ms=st.integers(0, 2**62),
    signals=st.builds(
        contracts.FeedbackSignals,
        watch_time_s=st.floats(0, 1e5, allow_nan=False),
        click=st.integers(0, 1),
        hate=st.integers(0, 1),
        live_watch_s=st.floats(0, 1e5, allow_nan=False),
    ),
    session_end=st.booleans(),
    position=st.integers(0, 50),
)


@given(feedback_events)
def test_feedback_round_trips_as_protobuf_and_as_json(event):
    assert contracts.decode_feedback(contracts.encode(event)) == event
    assert contracts.decode_feedback(contracts.feedback_to_json(event)) == event


def test_feedback_signals_map_onto_the_registry():
    event = contracts.FeedbackEvent(
        signals=contracts.FeedbackSignals(watch_time_s=12.5, like=1, gift_value=3.0)
    )
    values = contracts.feedback_signal_values(event)
    assert values["watch_time"] == 12.5 and values["like"] == 1.0 and values["gift"] == 3.0
    assert set(values) <= set(signals.SIGNALS)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        pytest.param(b"\xff\xff\xff", "malformed_bytes", id="garbage-bytes"),
        pytest.param(b'{"request_id": 5', "malformed_json", id="truncated-json"),
        pytest.param(b'{"no_such_field": 1}', "malformed_json", id="unknown-json-field"),
        pytest.param(
            b'{"request_id": "r", "schema_version": 99}', "unknown_schema_version", id="future-version"
        ),
        pytest.param(
            contracts.encode(contracts.FeedbackEvent(request_id="r")),
            "unknown_schema_version",
            id="missing-version",
        ),
        pytest.param(b"", "empty_value", id="empty"),
        pytest.param(b"  \n", "empty_value", id="blank"),
        pytest.param(
            b'\xef\xbb\xbf{"request_id": "r", "schema_version": 1}', "byte_order_mark", id="bom-json"
        ),
    ],
)
def test_bad_feedback_is_rejected_with_a_reason(payload, reason):
    with pytest.raises(contracts.ContractError) as info:
        contracts.decode_feedback(payload)
    assert info.value.reason == reason
    assert "FeedbackEvent" in str(info.value)


def test_an_empty_decision_is_named_empty_not_an_unknown_version():
    with pytest.raises(contracts.ContractError, match="DecisionRecord value is empty") as info:
        contracts.decode_decision(b"")
    assert info.value.reason == "empty_value"


@pytest.mark.parametrize("version", [0, 3, 99])
def test_decision_with_unknown_version_names_the_field(version):
    record = _decision()
    record.schema_version = version
    with pytest.raises(
        contracts.ContractError, match=rf"DecisionRecord\.schema_version should be 1 or 2, but is {version}"
    ) as info:
        contracts.decode_decision(contracts.encode(record))
    assert info.value.reason == "unknown_schema_version"


def test_a_version_1_decision_is_still_read_and_taken_as_sampled():
    """Issue 19: version 2 added action_selection; a version-1 record (written before it) cannot say, and
    a version-1 server sampled unless started with --no-explore, so it is read as sampled."""
    record = _decision()
    record.schema_version = 1
    record.ClearField("action_selection")
    decoded = contracts.decode_decision(contracts.encode(record))
    assert decoded == record
    assert contracts.action_selection(decoded) == "sampled"


@pytest.mark.parametrize(
    ("version", "selection", "expected"),
    [
        pytest.param(2, contracts.ACTION_SELECTIONS["sampled"], "sampled", id="v2-sampled"),
        pytest.param(2, contracts.ACTION_SELECTIONS["mode"], "mode", id="v2-mode"),
        pytest.param(2, 0, None, id="v2-unspecified"),  # a version-2 writer must say
        pytest.param(2, 7, None, id="v2-unknown-number"),
        pytest.param(1, contracts.ACTION_SELECTIONS["mode"], "mode", id="v1-that-says-mode"),
    ],
)
def test_how_a_decision_was_chosen_is_read_by_version(version, selection, expected):
    record = _decision()
    record.schema_version, record.action_selection = version, selection
    assert contracts.action_selection(contracts.decode_decision(contracts.encode(record))) == expected


def test_only_the_mode_is_deterministic():
    assert set(contracts.ACTION_SELECTIONS) == {"sampled", "mode"}
    assert sorted(contracts.DETERMINISTIC_SELECTIONS) == ["mode"]


def test_feedback_keeps_its_own_version_when_decisions_move_on():
    event = contracts.FeedbackEvent(schema_version=contracts.DECISION_SCHEMA_VERSION, request_id="r")
    assert contracts.FEEDBACK_SCHEMA_VERSION == 1 != contracts.DECISION_SCHEMA_VERSION
    with pytest.raises(contracts.ContractError, match=r"FeedbackEvent\.schema_version should be 1, but is 2"):
        contracts.decode_feedback(contracts.encode(event))


def test_serving_messages_carry_a_schema_version():
    for message in (
        contracts.RankRequest,
        contracts.RankResponse,
        contracts.AllocateRequest,
        contracts.AllocateResponse,
        contracts.DecisionRecord,
        contracts.FeedbackEvent,
    ):
        assert "schema_version" in message.DESCRIPTOR.fields_by_name


def test_serving_services_are_generated():
    assert {m.name for m in contracts.serving_pb2.DESCRIPTOR.services_by_name["RankingService"].methods} == {
        "Rank"
    }
    assert hasattr(contracts.serving_pb2_grpc, "AllocationServiceStub")
