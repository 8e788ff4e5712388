"""Every invalid Rank/Allocate field is refused with a message that names it."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest
from serving_fakes import as_received

from recsys_rl import contracts
from recsys_rl.fusion import FEED_ACTION_NAMES
from recsys_rl.serving import request_validation, wire
from recsys_rl.serving.metrics import ServingMetrics
from recsys_rl.serving.request_validation import (
    LIVE_PREDICTION_NAMES,
    MAX_ID_LENGTH,
    MAX_PREDICTION,
    InvalidRequest,
    validate_allocate,
    validate_rank,
)
from recsys_rl.serving.service import Abort, Handlers
from recsys_rl.serving.settings import ServeConfig

LIMITS = {"max_candidates": 5, "max_page_size": 3}
VIDEO, LIVE = contracts.ITEM_TYPES["video"], contracts.ITEM_TYPES["live"]
#: The float32 just above 1e6, the largest prediction accepted (float32 steps 2**-4 from 2**19 to 2**20).
JUST_PAST_MAX_PREDICTION = 1_000_000.0625


def rank_request(**changes) -> contracts.RankRequest:
    request = contracts.RankRequest(
        schema_version=1,
        request_id="req-1",
        user_id="u1",
        page_size=2,
        prediction_names=FEED_ACTION_NAMES,
        candidates=[
            contracts.Candidate(
                item_id=f"v{i}", item_type=VIDEO, predictions=[10.0, 0.4, 0.01, 0.0, 0.0, 0.0, 0.0]
            )
            for i in range(3)
        ],
    )
    for path, value in changes.items():
        target, name = request, path
        if "." in path:
            head, name = path.split(".")
            target = getattr(request, head)
        setattr(target, name, value)
    return request


def allocate_request() -> contracts.AllocateRequest:
    return contracts.AllocateRequest(
        schema_version=1,
        request_id="req-1",
        user_id="u1",
        prediction_names=LIVE_PREDICTION_NAMES,
        live_candidate=contracts.Candidate(item_id="l1", item_type=LIVE, predictions=[30.0, 0.1, 13.0]),
    )


def test_a_well_formed_request_passes():
    validate_rank(as_received(rank_request()), **LIMITS)
    validate_allocate(allocate_request())


@pytest.mark.parametrize("offset", [-840, -330, -1, 0, 840])
def test_utc_offsets_within_fourteen_hours_either_way_are_accepted(offset):
    validate_rank(as_received(rank_request(**{"context.utc_offset_minutes": offset})), **LIMITS)


@pytest.mark.parametrize(
    "changes",
    [
        {"page_size": 1},
        {"page_size": 3},  # max_page_size
        {"context.event_time_ms": 0},
        {"context.page_index": 10_000},
        {"context.session_watch_s": 0.0},
        {"context.last_page_click_rate": 0.0},
        {"context.last_page_click_rate": 1.0},
        {"request_id": "r" * 128},
        {"user_id": "u" * 128},
        {"context.session_id": "s" * 128},
    ],
)
def test_values_at_each_documented_limit_are_accepted(changes):
    validate_rank(as_received(rank_request(**changes)), **LIMITS)


@pytest.mark.parametrize("n", [1, 5])
def test_one_to_max_candidates_are_accepted(n):
    request = rank_request()
    del request.candidates[:]
    for j in range(n):
        request.candidates.add(item_id=f"v{j}", item_type=VIDEO, predictions=[0.5] * 7)
    assert list(validate_rank(as_received(request), **LIMITS).item_ids) == [f"v{j}" for j in range(n)]


@pytest.mark.parametrize(
    ("changes", "field", "problem"),
    [
        ({"schema_version": 2}, "schema_version", "should be 1, but is 2"),
        ({"request_id": ""}, "request_id", "is empty"),
        ({"request_id": "r" * 129}, "request_id", "should be at most 128 characters, but has 129"),
        ({"user_id": ""}, "user_id", "is empty"),
        ({"user_id": "u" * 129}, "user_id", "should be at most 128 characters, but has 129"),
        ({"page_size": 0}, "page_size", "should be in [1, 3], but is 0"),
        ({"page_size": 4}, "page_size", "should be in [1, 3], but is 4"),
        ({"context.event_time_ms": -1}, "context.event_time_ms", "should be >= 0, but is -1"),
        ({"context.page_index": 10_001}, "context.page_index", "should be <= 10000, but is 10001"),
        (
            {"context.session_watch_s": float("inf")},
            "context.session_watch_s",
            "should be a finite number >= 0, but is inf",
        ),
        (
            {"context.session_watch_s": -1.0},
            "context.session_watch_s",
            "should be a finite number >= 0, but is -1.0",
        ),
        (
            {"context.last_page_click_rate": 1.5},
            "context.last_page_click_rate",
            "should be in [0, 1], but is 1.5",
        ),
        (  # the float32 just above 1
            {"context.last_page_click_rate": 1.0000001192092896},
            "context.last_page_click_rate",
            "should be in [0, 1], but is 1.0000001192092896",
        ),
        (
            {"context.last_page_click_rate": -0.25},
            "context.last_page_click_rate",
            "should be in [0, 1], but is -0.25",
        ),
        (
            {"context.last_page_click_rate": float("nan")},
            "context.last_page_click_rate",
            "should be in [0, 1], but is nan",
        ),
        (
            {"context.utc_offset_minutes": 900},
            "context.utc_offset_minutes",
            "should be within +-840, but is 900",
        ),
        (
            {"context.utc_offset_minutes": 841},
            "context.utc_offset_minutes",
            "should be within +-840, but is 841",
        ),
        (
            {"context.utc_offset_minutes": -841},
            "context.utc_offset_minutes",
            "should be within +-840, but is -841",
        ),
        (
            {"context.session_id": "s" * 129},
            "context.session_id",
            "should be at most 128 characters, but has 129",
        ),
        # a 2 MB session id was accepted, and its decision record could never reach Kafka (issue 18)
        (
            {"context.session_id": "s" * 2_000_000},
            "context.session_id",
            "should be at most 128 characters, but has 2000000",
        ),
    ],
)
def test_each_bad_scalar_field_is_named_with_what_it_should_be(changes, field, problem):
    with pytest.raises(InvalidRequest) as err:
        validate_rank(as_received(rank_request(**changes)), **LIMITS)
    assert err.value.field == field
    assert str(err.value) == f"{field} {problem}"


def test_prediction_names_must_be_the_policys_in_order():
    request = rank_request()
    request.prediction_names[0], request.prediction_names[1] = FEED_ACTION_NAMES[1], FEED_ACTION_NAMES[0]
    with pytest.raises(InvalidRequest, match=r"^prediction_names should be \['watch_time', 'click'"):
        validate_rank(as_received(request), **LIMITS)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.ClearField("candidates"), "candidates is empty"),
        (  # 6 > max 5
            lambda r: r.candidates.extend(r.candidates[:3]),
            "candidates should have at most 5 entries, but has 6",
        ),
        (lambda r: setattr(r.candidates[1], "item_id", ""), "candidates[1].item_id is empty"),
        (lambda r: setattr(r.candidates[2], "item_id", "v0"), "candidates[2].item_id repeats 'v0'"),
        (
            lambda r: r.candidates[1].predictions.pop(),
            "candidates[1].predictions should have 7 values, one per prediction name, but has 6",
        ),
        (
            lambda r: r.candidates[2].predictions.__setitem__(3, float("nan")),
            "candidates[2].predictions[3] should be a number in [0, 1e+06], but is nan",
        ),
        (
            lambda r: r.candidates[0].predictions.__setitem__(6, -0.5),
            "candidates[0].predictions[6] should be a number in [0, 1e+06], but is -0.5",
        ),
        (
            lambda r: r.candidates[0].predictions.__setitem__(1, JUST_PAST_MAX_PREDICTION),
            "candidates[0].predictions[1] should be a number in [0, 1e+06], but is 1000000.0625",
        ),
        (
            lambda r: setattr(r.candidates[1], "author_id", "a" * 129),
            "candidates[1].author_id should be at most 128 characters, but has 129",
        ),
        # finite, but its fusion score overflowed float32 to -inf (issue 18)
        (
            lambda r: r.candidates[2].predictions.__setitem__(
                6, 1e36
            ),  # stored as the float32 9.999999616903162e+35
            "candidates[2].predictions[6] should be a number in [0, 1e+06], but is 9.999999616903162e+35",
        ),
    ],
)
def test_each_bad_candidate_field_is_named(mutate, message):
    request = rank_request()
    mutate(request)
    with pytest.raises(InvalidRequest) as err:
        validate_rank(as_received(request), **LIMITS)
    assert str(err.value) == message
    assert message.startswith(err.value.field + " ")


def _candidate_bytes(item_id: bytes) -> bytes:
    """A video candidate encoded by hand: item_id (written even when empty), item_type, 7 packed floats."""
    predictions = np.full(7, 0.5, "<f4").tobytes()
    return b"\x0a" + bytes([len(item_id)]) + item_id + b"\x18" + bytes([VIDEO]) + b"\x22\x1c" + predictions


def test_an_item_id_encoded_explicitly_empty_is_refused():
    # protobuf encoders omit an empty string, but the wire format allows writing it, and the server
    # reads the candidates' bytes as they came: still "is empty"
    head = rank_request()
    head.ClearField("candidates")
    candidates = [_candidate_bytes(b"v0"), _candidate_bytes(b""), _candidate_bytes(b"v2")]
    sent = head.SerializeToString() + b"".join(b"\x2a" + bytes([len(c)]) + c for c in candidates)
    assert [c.item_id for c in contracts.RankRequest.FromString(sent).candidates] == ["v0", "", "v2"]
    received = wire.RankHead.FromString(sent)  # as the server decodes it
    assert list(received.candidates) == candidates
    with pytest.raises(InvalidRequest, match=r"^candidates\[1\]\.item_id is empty$"):
        validate_rank(received, **LIMITS)


def test_a_valid_request_as_protobuf_encodes_it_is_checked_in_bulk(monkeypatch):
    """rank_candidates' documented fast path: no candidate-by-candidate walk for the common case, also with
    every value at its limit (predictions 0 and 1e6, ids of 128 characters)."""

    def walked(*args):
        raise AssertionError("a valid, canonically encoded request was checked candidate by candidate")

    monkeypatch.setattr(request_validation, "_check_candidate", walked)
    request = rank_request()
    request.candidates[0].predictions[:] = [1e6, 0.0, 0.5, 1.0, 0.25, 0.0, 1e6]
    request.candidates[2].item_id, request.candidates[2].author_id = "v" * 128, "a" * 128
    candidates = validate_rank(as_received(request), **LIMITS)
    assert list(candidates.item_ids) == ["v0", "v1", "v" * 128]
    expected = [
        [1e6, 0.0, 0.5, 1.0, 0.25, 0.0, 1e6],
        *[[10.0, float(np.float32(0.4)), float(np.float32(0.01)), 0.0, 0.0, 0.0, 0.0]] * 2,
    ]
    np.testing.assert_array_equal(candidates.predictions, np.array(expected))
    assert candidates.predictions.dtype == np.float64
    # the decision record copies each candidate as it came
    assert candidates.logged == wire.record_candidates([c.SerializeToString() for c in request.candidates])


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda r: r.ClearField("live_candidate"), "live_candidate"),
        (lambda r: r.live_candidate.predictions.append(1.0), "live_candidate.predictions"),
        (
            lambda r: r.live_candidate.predictions.__setitem__(0, float("inf")),
            "live_candidate.predictions[0]",
        ),
        (lambda r: r.prediction_names.reverse(), "prediction_names"),
        (lambda r: setattr(r, "user_id", ""), "user_id"),
        (lambda r: setattr(r.live_candidate, "item_type", VIDEO), "live_candidate.item_type"),
    ],
)
def test_each_bad_allocate_field_is_named(mutate, field):
    request = allocate_request()
    mutate(request)
    with pytest.raises(InvalidRequest) as err:
        validate_allocate(request)
    assert err.value.field == field


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.ClearField("live_candidate"), "live_candidate is missing"),
        (
            lambda r: r.live_candidate.predictions.append(1.0),
            "live_candidate.predictions should have 3 values, one per prediction name, but has 4",
        ),
        (
            lambda r: r.live_candidate.predictions.__setitem__(0, float("inf")),
            "live_candidate.predictions[0] should be a number in [0, 1e+06], but is inf",
        ),
        (
            lambda r: r.live_candidate.predictions.__setitem__(2, JUST_PAST_MAX_PREDICTION),
            "live_candidate.predictions[2] should be a number in [0, 1e+06], but is 1000000.0625",
        ),
    ],
)
def test_each_allocate_refusal_says_what_the_field_should_be(mutate, message):
    request = allocate_request()
    mutate(request)
    with pytest.raises(InvalidRequest) as err:
        validate_allocate(request)
    assert str(err.value) == message


def test_live_predictions_at_zero_and_at_1e6_are_accepted():
    request = allocate_request()
    request.live_candidate.predictions[:] = [1e6, 0.0, 1e6]
    validate_allocate(request)


# Rank ranks short videos and Allocate decides on one live stream: a candidate of the other type, or of
# none (UNSPECIFIED, also what a client that never sets the field sends), is refused, not guessed.
@pytest.mark.parametrize(
    ("item_type", "message"),
    [
        pytest.param(
            LIVE, "candidates[1].item_type should be ITEM_TYPE_VIDEO, but is ITEM_TYPE_LIVE", id="live"
        ),
        pytest.param(
            0,
            "candidates[1].item_type should be ITEM_TYPE_VIDEO, but is ITEM_TYPE_UNSPECIFIED (not set)",
            id="unset",
        ),
        pytest.param(7, "candidates[1].item_type should be ITEM_TYPE_VIDEO, but is 7", id="unknown"),
    ],
)
def test_a_rank_candidate_that_is_not_a_video_is_refused(item_type, message):
    request = rank_request()
    request.candidates[1].item_type = item_type
    with pytest.raises(InvalidRequest) as err:
        validate_rank(as_received(request), **LIMITS)
    assert err.value.field == "candidates[1].item_type"
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("item_type", "message"),
    [
        pytest.param(
            VIDEO, "live_candidate.item_type should be ITEM_TYPE_LIVE, but is ITEM_TYPE_VIDEO", id="video"
        ),
        pytest.param(
            0,
            "live_candidate.item_type should be ITEM_TYPE_LIVE, but is ITEM_TYPE_UNSPECIFIED (not set)",
            id="unset",
        ),
    ],
)
def test_a_live_candidate_that_is_not_live_is_refused(item_type, message):
    request = allocate_request()
    request.live_candidate.item_type = item_type
    with pytest.raises(InvalidRequest) as err:
        validate_allocate(request)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("item_id", "author_id", "field"),
    [
        pytest.param("v" * 128, "", None, id="item-id-at-the-limit"),
        pytest.param("v" * 129, "", "candidates[1].item_id", id="item-id-past-the-limit"),
        pytest.param("v1x", "a" * 128, None, id="author-id-at-the-limit"),
        pytest.param("v1x", "a" * 129, "candidates[1].author_id", id="author-id-past-the-limit"),
        # each id within the limit while the candidate's encoding is not: still accepted
        pytest.param("v" * 120, "a" * 120, None, id="both-long-ids-within"),
        pytest.param("é" * 128, "", None, id="multibyte-at-the-limit"),  # 256 bytes, 128 characters
        pytest.param("é" * 129, "", "candidates[1].item_id", id="multibyte-past-the-limit"),
    ],
)
def test_id_lengths_are_checked_at_the_limit_in_characters(item_id, author_id, field):
    request = rank_request()
    request.candidates[1].item_id, request.candidates[1].author_id = item_id, author_id
    if field is None:
        assert validate_rank(as_received(request), **LIMITS).item_ids[1] == item_id
    else:
        with pytest.raises(InvalidRequest) as err:
            validate_rank(as_received(request), **LIMITS)
        assert err.value.field == field


def _ids_ok_by_the_slow_path(request: contracts.RankRequest) -> bool:
    """Reference: every candidate's item and author id at most 128 characters, one by one."""
    return all(len(c.item_id) <= 128 and len(c.author_id) <= 128 for c in request.candidates)


@pytest.mark.parametrize("seed", range(5))
def test_the_bulk_id_length_check_agrees_with_the_per_candidate_loop(seed):
    rng = np.random.default_rng(seed)
    lengths = [0, 1, 60, 120, 127, 128, 129, 200]
    for _ in range(40):
        request = rank_request()
        for j, candidate in enumerate(request.candidates):
            char = str(rng.choice(["v", "é", "\U0001f600"]))  # 1, 2 and 4 bytes a character
            candidate.item_id = f"{j}" + char * (int(rng.choice(lengths[1:])) - 1)
            candidate.author_id = char * int(rng.choice(lengths))
        read = wire.read_candidates(
            as_received(request),
            width=len(FEED_ACTION_NAMES),
            item_type=VIDEO,
            max_id_chars=MAX_ID_LENGTH,
            max_prediction=MAX_PREDICTION,
        )
        assert (read is not None) is _ids_ok_by_the_slow_path(request)


class _Context:
    """The parts of a grpc.aio context a refused request touches; abort raises, as grpc's does."""

    def __init__(self) -> None:
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def time_remaining(self) -> None:
        return None

    def cancelled(self) -> bool:
        return False

    async def abort(self, code: grpc.StatusCode, message: str) -> None:
        self.aborted = (code, message)
        raise grpc.RpcError(message)


@pytest.mark.parametrize(
    ("where", "length", "refused"),
    [
        ("item_id", 128, False),
        ("item_id", 129, True),
        ("author_id", 128, False),
        ("author_id", 129, True),
    ],
)
def test_a_rank_call_with_a_candidate_id_past_128_characters_is_invalid_argument_naming_it(
    where, length, refused
):
    metrics = ServingMetrics()
    handlers = Handlers(
        ServeConfig(max_candidates=5, max_page_size=3), {}, None, None, None, metrics, lambda: True, 0
    )

    def past_validation(context):
        raise Abort(grpc.StatusCode.UNAVAILABLE, "reached the feature read")

    handlers._budget_s = past_validation  # a request that passes validation goes on to read features
    request = rank_request()
    setattr(request.candidates[1], where, "x" * length)
    context = _Context()
    with pytest.raises(grpc.RpcError):
        asyncio.run(handlers.instrumented("Rank", handlers.rank)(as_received(request), context))
    code, message = context.aborted
    if refused:
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert message == f"candidates[1].{where} should be at most 128 characters, but has 129"
        assert metrics.value("recsys_serving_requests_total", method="Rank", code="INVALID_ARGUMENT") == 1
    else:
        assert (code, message) == (grpc.StatusCode.UNAVAILABLE, "reached the feature read")
