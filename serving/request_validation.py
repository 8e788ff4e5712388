"""Request checks: every problem becomes INVALID_ARGUMENT with a message that names the field.

Checks run before any work, so a malformed request costs no feature lookup or inference, and the
message points the caller at the exact field (``candidates[3].predictions[2]``) instead of a generic
"bad request".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from google.protobuf import message

from recsys_rl import contracts, signals
from recsys_rl.fusion import FEED_ACTION_NAMES
from recsys_rl.serving import wire

MAX_ID_LENGTH = contracts.MAX_ID_LENGTH
MAX_PAGE_INDEX = 10_000
#: Largest prediction accepted (a watch time of eleven days, a count far past any probability): finite
#: values above it overflowed the float32 fusion scores to infinities.
MAX_PREDICTION = 1e6
MAX_UTC_OFFSET_MINUTES = 14 * 60
#: The live-candidate predictions Allocate takes, in order (what the live state is built from).
LIVE_PREDICTION_NAMES: tuple[str, ...] = signals.LIVE_SIGNALS
#: The item type of every candidate: Rank orders short videos, Allocate decides on one live stream. An
#: unset type (0) is refused too: a client that never sets it would log candidates no one can classify.
RANK_ITEM_TYPE = contracts.ITEM_TYPES["video"]
ALLOCATE_ITEM_TYPE = contracts.ITEM_TYPES["live"]


class InvalidRequest(ValueError):
    """A request field that cannot be served; ``field`` is its path in the request message."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field} {problem}")
        self.field = field


def _check_version(version: int) -> None:
    if version != contracts.SERVING_SCHEMA_VERSION:
        raise InvalidRequest(
            "schema_version", f"should be {contracts.SERVING_SCHEMA_VERSION}, but is {version}"
        )


def _check_id(field: str, value: str) -> None:
    if not value:
        raise InvalidRequest(field, "is empty")
    _check_length(field, value)


def _check_length(field: str, value: str) -> None:
    if len(value) > MAX_ID_LENGTH:
        raise InvalidRequest(field, f"should be at most {MAX_ID_LENGTH} characters, but has {len(value)}")


def _check_context(context: contracts.serving_pb2.RequestContext) -> None:
    # every string a decision record copies is bounded: one oversized record could never reach Kafka
    _check_length("context.session_id", context.session_id)
    if context.event_time_ms < 0:
        raise InvalidRequest("context.event_time_ms", f"should be >= 0, but is {context.event_time_ms}")
    if context.page_index > MAX_PAGE_INDEX:
        raise InvalidRequest(
            "context.page_index", f"should be <= {MAX_PAGE_INDEX}, but is {context.page_index}"
        )
    if not (math.isfinite(context.session_watch_s) and context.session_watch_s >= 0):
        raise InvalidRequest(
            "context.session_watch_s", f"should be a finite number >= 0, but is {context.session_watch_s}"
        )
    if not 0.0 <= context.last_page_click_rate <= 1.0:  # also false for NaN
        raise InvalidRequest(
            "context.last_page_click_rate", f"should be in [0, 1], but is {context.last_page_click_rate}"
        )
    if abs(context.utc_offset_minutes) > MAX_UTC_OFFSET_MINUTES:
        raise InvalidRequest(
            "context.utc_offset_minutes",
            f"should be within +-{MAX_UTC_OFFSET_MINUTES}, but is {context.utc_offset_minutes}",
        )


def _check_prediction_names(names: Sequence[str], expected: tuple[str, ...]) -> None:
    if tuple(names) != expected:
        raise InvalidRequest(
            "prediction_names", f"should be {list(expected)} in this order, but is {list(names)}"
        )


def _item_type_name(value: int) -> str:
    if value == 0:
        return "ITEM_TYPE_UNSPECIFIED (not set)"
    try:
        return contracts.events_pb2.ItemType.Name(value)
    except ValueError:  # a number this contract does not know: proto3 enums keep it
        return str(value)


def _check_candidate(field: str, candidate: contracts.Candidate, width: int, item_type: int) -> None:
    _check_id(f"{field}.item_id", candidate.item_id)
    _check_length(f"{field}.author_id", candidate.author_id)
    if candidate.item_type != item_type:
        raise InvalidRequest(
            f"{field}.item_type",
            f"should be {_item_type_name(item_type)}, but is {_item_type_name(candidate.item_type)}",
        )
    if len(candidate.predictions) != width:
        raise InvalidRequest(
            f"{field}.predictions",
            f"should have {width} values, one per prediction name, but has {len(candidate.predictions)}",
        )
    for k, value in enumerate(candidate.predictions):
        if not 0 <= value <= MAX_PREDICTION:  # also false for NaN
            raise InvalidRequest(
                f"{field}.predictions[{k}]", f"should be a number in [0, {MAX_PREDICTION:g}], but is {value}"
            )


def _check_common(request: wire.RankHead | contracts.AllocateRequest) -> None:
    _check_version(request.schema_version)
    _check_id("request_id", request.request_id)
    _check_id("user_id", request.user_id)
    _check_context(request.context)


@dataclass(frozen=True)
class RankCandidates:
    """A valid Rank request's candidates, in the forms the server uses."""

    logged: bytes  # DecisionRecord's candidates field: each candidate's encoding as it came
    item_ids: Sequence[str]
    predictions: np.ndarray  # (candidates, prediction names)
    author_rows: Callable[[], wire.AuthorRows]  # the candidates' authors, grouped when called


def validate_rank(request: wire.RankHead, *, max_candidates: int, max_page_size: int) -> RankCandidates:
    """The request's candidates; InvalidRequest for the first field that cannot be ranked."""
    _check_common(request)
    _check_prediction_names(request.prediction_names, FEED_ACTION_NAMES)
    if not 1 <= request.page_size <= max_page_size:
        raise InvalidRequest("page_size", f"should be in [1, {max_page_size}], but is {request.page_size}")
    if not request.candidates:
        raise InvalidRequest("candidates", "is empty")
    if len(request.candidates) > max_candidates:
        raise InvalidRequest(
            "candidates", f"should have at most {max_candidates} entries, but has {len(request.candidates)}"
        )
    return rank_candidates(request, len(FEED_ACTION_NAMES))


def rank_candidates(request: wire.RankHead, width: int) -> RankCandidates:
    """The candidates of ``request``, after checking every one (``width`` predictions each, all videos).

    The common case (everything valid, encoded as protobuf encoders do) is read and checked in one pass
    over the encoded bytes (recsys_rl.serving.wire), which is what keeps 200 candidates cheap; any other
    request is decoded in full and walked candidate by candidate, to name the first bad field or to
    accept an unusual encoding.
    """
    read = wire.read_candidates(
        request,
        width=width,
        item_type=RANK_ITEM_TYPE,
        max_id_chars=MAX_ID_LENGTH,
        max_prediction=MAX_PREDICTION,
    )
    if read is not None:
        predictions, logged, item_ids, author_rows = read
        return RankCandidates(logged, item_ids, predictions, author_rows)
    try:
        candidates = wire.full_request(request).candidates
    except message.DecodeError as err:
        expected = contracts.Candidate.DESCRIPTOR.full_name
        raise InvalidRequest("candidates", f"do not decode as {expected}: {err}") from None
    seen: set[str] = set()
    for j, candidate in enumerate(candidates):
        _check_candidate(f"candidates[{j}]", candidate, width, RANK_ITEM_TYPE)
        if candidate.item_id in seen:
            raise InvalidRequest(f"candidates[{j}].item_id", f"repeats {candidate.item_id!r}")
        seen.add(candidate.item_id)
    predictions = np.array([list(c.predictions) for c in candidates], np.float64)
    logged = wire.record_candidates(list(request.candidates))
    authors = wire.author_rows([c.author_id for c in candidates])
    return RankCandidates(
        logged, [c.item_id for c in candidates], predictions.reshape(-1, width), lambda: authors
    )


def validate_allocate(request: contracts.AllocateRequest) -> None:
    """Raise InvalidRequest for the first field of ``request`` that cannot be allocated."""
    _check_common(request)
    _check_prediction_names(request.prediction_names, LIVE_PREDICTION_NAMES)
    if not request.HasField("live_candidate"):
        raise InvalidRequest("live_candidate", "is missing")
    _check_candidate("live_candidate", request.live_candidate, len(LIVE_PREDICTION_NAMES), ALLOCATE_ITEM_TYPE)
