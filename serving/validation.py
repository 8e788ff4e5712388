"""Request checks: every problem becomes INVALID_ARGUMENT with a message that names the field.

Checks run before any work, so a malformed request costs no feature lookup or inference, and the
message points the caller at the exact field (``candidates[3].predictions[2]``) instead of a generic
"bad request".
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from recsys_rl import contracts, signals
from recsys_rl.fusion import FEED_ACTION_NAMES

MAX_ID_LENGTH = 128
MAX_PAGE_INDEX = 10_000
MAX_UTC_OFFSET_MINUTES = 14 * 60
#: The live-candidate predictions Allocate takes, in order (what the live state is built from).
LIVE_PREDICTION_NAMES: tuple[str, ...] = signals.LIVE_SIGNALS


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
    if len(value) > MAX_ID_LENGTH:
        raise InvalidRequest(field, f"should be at most {MAX_ID_LENGTH} characters, but has {len(value)}")


def _check_context(context: contracts.serving_pb2.RequestContext) -> None:
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


def _check_candidate(field: str, candidate: contracts.Candidate, width: int) -> None:
    _check_id(f"{field}.item_id", candidate.item_id)
    if len(candidate.predictions) != width:
        raise InvalidRequest(
            f"{field}.predictions",
            f"should have {width} values, one per prediction name, but has {len(candidate.predictions)}",
        )
    for k, value in enumerate(candidate.predictions):
        if not (math.isfinite(value) and value >= 0):
            raise InvalidRequest(
                f"{field}.predictions[{k}]", f"should be a finite number >= 0, but is {value}"
            )


def _check_common(request: contracts.RankRequest | contracts.AllocateRequest) -> None:
    _check_version(request.schema_version)
    _check_id("request_id", request.request_id)
    _check_id("user_id", request.user_id)
    _check_context(request.context)


def validate_rank(request: contracts.RankRequest, *, max_candidates: int, max_page_size: int) -> np.ndarray:
    """The candidates' predictions (C, K); InvalidRequest for the first field that cannot be ranked."""
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
    return candidate_predictions(request.candidates, len(FEED_ACTION_NAMES))


def candidate_predictions(candidates, width: int) -> np.ndarray:
    """The (candidates, width) prediction matrix, after checking every candidate.

    The common case (everything valid) is checked in bulk, which is what keeps 200 candidates cheap;
    only a request that fails it is walked candidate by candidate to name the first bad field.
    """
    item_ids = [c.item_id for c in candidates]
    if (
        all(0 < len(item) <= MAX_ID_LENGTH for item in item_ids)
        and len(set(item_ids)) == len(item_ids)
        and all(len(c.predictions) == width for c in candidates)
    ):
        values = np.fromiter(
            itertools.chain.from_iterable(c.predictions for c in candidates),
            np.float64,
            count=len(item_ids) * width,
        ).reshape(len(item_ids), width)
        if np.all(np.isfinite(values) & (values >= 0)):
            return values
    seen: set[str] = set()
    for j, candidate in enumerate(candidates):
        _check_candidate(f"candidates[{j}]", candidate, width)
        if candidate.item_id in seen:
            raise InvalidRequest(f"candidates[{j}].item_id", f"repeats {candidate.item_id!r}")
        seen.add(candidate.item_id)
    raise AssertionError("the bulk check and the per-candidate checks disagree")  # unreachable


def validate_allocate(request: contracts.AllocateRequest) -> None:
    """Raise InvalidRequest for the first field of ``request`` that cannot be allocated."""
    _check_common(request)
    _check_prediction_names(request.prediction_names, LIVE_PREDICTION_NAMES)
    if not request.HasField("live_candidate"):
        raise InvalidRequest("live_candidate", "is missing")
    _check_candidate("live_candidate", request.live_candidate, len(LIVE_PREDICTION_NAMES))
