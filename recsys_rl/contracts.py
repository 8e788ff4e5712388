"""The one import point for the protobuf contracts, plus their schema versions and decoding rules.

Stubs are generated from ``protos/`` when the package is built or installed (see setup.py) and are not in
version control; importing them through this module gives one clear error when they are missing instead
of a bare ModuleNotFoundError deep inside a pipeline.
"""

from __future__ import annotations

import json

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

try:
    from recsys_rl.proto import events_pb2, serving_pb2, serving_pb2_grpc, tf_example_pb2
except ImportError as err:  # pragma: no cover - exercised only on a broken install
    raise ImportError(
        "recsys_rl.proto stubs are missing: they are generated from protos/ at install time; "
        "run 'make install' (or 'pip install -e .') to build them"
    ) from err

from recsys_rl import signals

#: Version serving writes into a DecisionRecord. Version 2 added ``action_selection``.
DECISION_SCHEMA_VERSION = 2
#: DecisionRecord versions readers accept; any other is dead-lettered. A version-1 record cannot say how
#: its action was chosen and is read as sampled (see :func:`action_selection`).
READABLE_DECISION_SCHEMA_VERSIONS: tuple[int, ...] = (1, 2)
#: Version of a FeedbackEvent; readers reject any other value.
FEEDBACK_SCHEMA_VERSION = 1
#: Version of the serving request/response messages.
SERVING_SCHEMA_VERSION = 1

DecisionRecord = events_pb2.DecisionRecord
FeedbackEvent = events_pb2.FeedbackEvent
Candidate = events_pb2.Candidate
FeedbackSignals = events_pb2.Signals
RankRequest = serving_pb2.RankRequest
RankResponse = serving_pb2.RankResponse
AllocateRequest = serving_pb2.AllocateRequest
AllocateResponse = serving_pb2.AllocateResponse
#: tf.train.Example, wire-compatible, for writing TFRecord datasets without importing TensorFlow
TFExample = tf_example_pb2.Example

SURFACES: dict[str, int] = {
    "feed": events_pb2.SURFACE_FEED,
    "live_allocation": events_pb2.SURFACE_LIVE_ALLOCATION,
}
SURFACE_NAMES: dict[int, str] = {v: k for k, v in SURFACES.items()}

ITEM_TYPES: dict[str, int] = {"video": events_pb2.ITEM_TYPE_VIDEO, "live": events_pb2.ITEM_TYPE_LIVE}

ROUTING_ARMS: dict[str, int] = {
    "stable": events_pb2.ROUTING_ARM_STABLE,
    "canary": events_pb2.ROUTING_ARM_CANARY,
    "shadow": events_pb2.ROUTING_ARM_SHADOW,
    "fallback": events_pb2.ROUTING_ARM_FALLBACK,
    "behaviour": events_pb2.ROUTING_ARM_BEHAVIOUR,
}

#: How serving chose a decision's action (``DecisionRecord.action_selection``): drawn from the policy, whose
#: log-propensity the record then carries, or the policy's mode (``serve --no-explore``), a point mass
#: whose logged "propensity" is only the policy's density at that point.
ACTION_SELECTIONS: dict[str, int] = {
    "sampled": events_pb2.ACTION_SELECTION_SAMPLED,
    "mode": events_pb2.ACTION_SELECTION_MODE,
}
ACTION_SELECTION_NAMES: dict[int, str] = {v: k for k, v in ACTION_SELECTIONS.items()}
#: Selections whose logged log_propensity is not a behaviour propensity: OPE must not weight by it.
DETERMINISTIC_SELECTIONS = frozenset({"mode"})

#: Why a decision's state was built from default user features (``DecisionRecord.features_missing_reason``):
#: no feature store configured, a user the store does not know, a read slower than the request's budget,
#: too many reads queued (a hung store), or a failed read.
FEATURES_MISSING_REASONS: tuple[str, ...] = ("no_store", "unknown_user", "timeout", "busy", "error")
#: Why a Rank's user-author term was left out (``UserAuthorTerm.missing_reason``): its pairs' rows could
#: not be read. A pair the store does not know is no reason: it has never met.
USER_AUTHOR_MISSING_REASONS: tuple[str, ...] = ("no_store", "timeout", "busy", "error")

#: Which field of the feedback ``Signals`` message carries each registry signal. The displaced
#: short-video time of a live insertion is counterfactual, so no client can report it.
FEEDBACK_SIGNAL_FIELDS: dict[str, str] = {
    "watch_time": "watch_time_s",
    "click": "click",
    "like": "like",
    "follow": "follow",
    "comment": "comment",
    "share": "share",
    "hate": "hate",
    "gift": "gift_value",
    "live_watch_time": "live_watch_s",
}
for _name in FEEDBACK_SIGNAL_FIELDS:
    signals.get(_name)  # fail at import if the registry and the contract disagree


#: Longest id or version string serving accepts and the pipelines keep (request, user, session, item and
#: author ids, policy versions): longer is a client bug, and would bloat every key and shard it lands in.
MAX_ID_LENGTH = 128
_UTF8_BOM = b"\xef\xbb\xbf"


class ContractError(ValueError):
    """A record that does not honour its contract; ``reason`` is a short stable tag for dead-letter counts."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def encode(message: Message) -> bytes:
    """Serialise deterministically, so that the same record always has the same bytes (idempotent reruns)."""
    return message.SerializeToString(deterministic=True)


def _check_version(message: DecisionRecord | FeedbackEvent, readable: tuple[int, ...]) -> None:
    if message.schema_version not in readable:
        expected = " or ".join(map(str, readable))
        raise ContractError(
            "unknown_schema_version",
            f"{type(message).__name__}.schema_version should be {expected}, but is {message.schema_version}",
        )


def _check_not_empty(kind: type[Message], data: bytes) -> None:
    # an empty protobuf parses as every field unset, which would read as "schema version 0"
    if not data.strip():
        raise ContractError("empty_value", f"{kind.__name__} value is empty ({len(data)} bytes, all blank)")


def _parse_binary(message: Message, data: bytes) -> None:
    try:
        message.ParseFromString(data)
    except DecodeError as err:
        raise ContractError("malformed_bytes", f"{type(message).__name__} does not parse: {err}") from None


def decode_decision(data: bytes) -> DecisionRecord:
    """Parse a decision record written by serving (protobuf only: serving is ours)."""
    _check_not_empty(DecisionRecord, data)
    record = DecisionRecord()
    _parse_binary(record, data)
    _check_version(record, READABLE_DECISION_SCHEMA_VERSIONS)
    return record


def action_selection(record: DecisionRecord) -> str | None:
    """How the record's action was chosen, as a key of ``ACTION_SELECTIONS``; None when it does not say.

    A version-1 record has no such field and is read as ``"sampled"``: a version-1 server sampled unless
    it was started with ``--no-explore``, and nothing in its records tells the two apart. A version-2
    record must say: None for one that does not (unset, or a number this reader does not know).
    """
    selection = record.action_selection
    if selection == events_pb2.ACTION_SELECTION_UNSPECIFIED and record.schema_version == 1:
        return "sampled"
    return ACTION_SELECTION_NAMES.get(selection)


def decode_feedback(data: bytes) -> FeedbackEvent:
    """Parse a feedback event: protobuf, or its JSON encoding for clients that cannot speak protobuf.

    A payload whose first non-blank byte is ``{`` is taken as JSON: a serialised FeedbackEvent starts
    with the tag of one of its fields (numbers 1-10), and ``{`` would be the tag of field 15.
    """
    _check_not_empty(FeedbackEvent, data)
    if data.startswith(_UTF8_BOM):
        raise ContractError(
            "byte_order_mark",
            "FeedbackEvent starts with a UTF-8 byte-order mark, which JSON on the wire must not (RFC 8259)",
        )
    event = FeedbackEvent()
    if data.lstrip()[:1] == b"{":
        try:
            json_format.Parse(data.decode("utf-8"), event)
        except (json_format.ParseError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ContractError("malformed_json", f"FeedbackEvent JSON does not parse: {err}") from None
    else:
        _parse_binary(event, data)
    _check_version(event, (FEEDBACK_SCHEMA_VERSION,))
    return event


def feedback_to_json(event: FeedbackEvent) -> bytes:
    """The JSON encoding :func:`decode_feedback` accepts: proto3 JSON mapping, field names as in .proto."""
    return json_format.MessageToJson(event, preserving_proto_field_name=True, indent=None).encode("utf-8")


def feedback_signal_values(event: FeedbackEvent) -> dict[str, float]:
    """The event's signals keyed by registry signal name."""
    return {name: float(getattr(event.signals, field)) for name, field in FEEDBACK_SIGNAL_FIELDS.items()}


__all__ = [
    "ACTION_SELECTIONS",
    "ACTION_SELECTION_NAMES",
    "DECISION_SCHEMA_VERSION",
    "DETERMINISTIC_SELECTIONS",
    "FEATURES_MISSING_REASONS",
    "FEEDBACK_SCHEMA_VERSION",
    "FEEDBACK_SIGNAL_FIELDS",
    "ITEM_TYPES",
    "MAX_ID_LENGTH",
    "READABLE_DECISION_SCHEMA_VERSIONS",
    "ROUTING_ARMS",
    "SERVING_SCHEMA_VERSION",
    "SURFACES",
    "SURFACE_NAMES",
    "USER_AUTHOR_MISSING_REASONS",
    "AllocateRequest",
    "AllocateResponse",
    "Candidate",
    "ContractError",
    "DecisionRecord",
    "FeedbackEvent",
    "FeedbackSignals",
    "RankRequest",
    "RankResponse",
    "TFExample",
    "action_selection",
    "decode_decision",
    "decode_feedback",
    "encode",
    "events_pb2",
    "feedback_signal_values",
    "feedback_to_json",
    "serving_pb2",
    "serving_pb2_grpc",
    "tf_example_pb2",
]
