"""Every invalid Rank/Allocate field is refused with a message that names it."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest

from recsys_rl import contracts
from recsys_rl.fusion import FEED_ACTION_NAMES
from recsys_rl.serving import wire
from recsys_rl.serving.metrics import ServingMetrics
from recsys_rl.serving.request_validation import (
    LIVE_PREDICTION_NAMES,
    InvalidRequest,
    _ids_within_limits,
    validate_allocate,
    validate_rank,
)
from recsys_rl.serving.service import Abort, Handlers
from recsys_rl.serving.settings import ServeConfig

LIMITS = {"max_candidates": 5, "max_page_size": 3}
VIDEO, LIVE = contracts.ITEM_TYPES["video"], contracts.ITEM_TYPES["live"]


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
    validate_rank(rank_request(), **LIMITS)
    validate_allocate(allocate_request())


@pytest.mark.parametrize("offset", [-840, -330, -1, 0, 840])
def test_utc_offsets_within_fourteen_hours_either_way_are_accepted(offset):
    validate_rank(rank_request(**{"context.utc_offset_minutes": offset}), **LIMITS)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"schema_version": 2}, "schema_version"),
        ({"request_id": ""}, "request_id"),
        ({"request_id": "r" * 129}, "request_id"),
        ({"user_id": ""}, "user_id"),
        ({"page_size": 0}, "page_size"),
        ({"page_size": 4}, "page_size"),
        ({"context.event_time_ms": -1}, "context.event_time_ms"),
        ({"context.page_index": 10_001}, "context.page_index"),
        ({"context.session_watch_s": float("inf")}, "context.session_watch_s"),
        ({"context.session_watch_s": -1.0}, "context.session_watch_s"),
        ({"context.last_page_click_rate": 1.5}, "context.last_page_click_rate"),
        ({"context.last_page_click_rate": float("nan")}, "context.last_page_click_rate"),
        ({"context.utc_offset_minutes": 900}, "context.utc_offset_minutes"),
        ({"context.utc_offset_minutes": 841}, "context.utc_offset_minutes"),
        ({"context.utc_offset_minutes": -841}, "context.utc_offset_minutes"),
        # a 2 MB session id was accepted, and its decision record could never reach Kafka (issue 18)
        ({"context.session_id": "s" * 2_000_000}, "context.session_id"),
    ],
)
def test_each_bad_scalar_field_is_named(changes, field):
    with pytest.raises(InvalidRequest) as err:
        validate_rank(rank_request(**changes), **LIMITS)
    assert err.value.field == field and str(err.value).startswith(field + " ")


def test_prediction_names_must_be_the_policys_in_order():
    request = rank_request()
    request.prediction_names[0], request.prediction_names[1] = FEED_ACTION_NAMES[1], FEED_ACTION_NAMES[0]
    with pytest.raises(InvalidRequest, match=r"^prediction_names should be \['watch_time', 'click'"):
        validate_rank(request, **LIMITS)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda r: r.ClearField("candidates"), "candidates"),
        (lambda r: r.candidates.extend(r.candidates[:3]), "candidates"),  # 6 > max 5
        (lambda r: setattr(r.candidates[1], "item_id", ""), "candidates[1].item_id"),
        (lambda r: setattr(r.candidates[2], "item_id", "v0"), "candidates[2].item_id"),
        (lambda r: r.candidates[1].predictions.pop(), "candidates[1].predictions"),
        (lambda r: r.candidates[2].predictions.__setitem__(3, float("nan")), "candidates[2].predictions[3]"),
        (lambda r: r.candidates[0].predictions.__setitem__(6, -0.5), "candidates[0].predictions[6]"),
        (lambda r: setattr(r.candidates[1], "author_id", "a" * 129), "candidates[1].author_id"),
        # finite, but its fusion score overflowed float32 to -inf (issue 18)
        (lambda r: r.candidates[2].predictions.__setitem__(6, 1e36), "candidates[2].predictions[6]"),
    ],
)
def test_each_bad_candidate_field_is_named(mutate, field):
    request = rank_request()
    mutate(request)
    with pytest.raises(InvalidRequest) as err:
        validate_rank(request, **LIMITS)
    assert err.value.field == field


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
        validate_rank(request, **LIMITS)
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
        assert validate_rank(request, **LIMITS).item_ids[1] == item_id
    else:
        with pytest.raises(InvalidRequest) as err:
            validate_rank(request, **LIMITS)
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
        encoded = wire.encoded_candidates(request)
        columns = wire.candidate_columns(encoded, len(FEED_ACTION_NAMES))
        assert columns is not None  # the fast path reads these candidates
        assert _ids_within_limits(encoded, columns) is _ids_ok_by_the_slow_path(request)


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
        ServeConfig(max_candidates=5, max_page_size=3), {}, None, None, metrics, lambda: True, 0
    )

    async def past_validation(request, context):
        raise Abort(grpc.StatusCode.UNAVAILABLE, "reached the feature read")

    handlers._state = past_validation  # a request that passes validation goes on to read features
    request = rank_request()
    setattr(request.candidates[1], where, "x" * length)
    context = _Context()
    with pytest.raises(grpc.RpcError):
        asyncio.run(handlers.instrumented("Rank", handlers.rank)(request, context))
    code, message = context.aborted
    if refused:
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert message == f"candidates[1].{where} should be at most 128 characters, but has 129"
        assert metrics.value("recsys_serving_requests_total", method="Rank", code="INVALID_ARGUMENT") == 1
    else:
        assert (code, message) == (grpc.StatusCode.UNAVAILABLE, "reached the feature read")
