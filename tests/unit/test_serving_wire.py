"""The wire-format fast path reads and logs exactly what the protobuf objects hold, or steps aside."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from serving_fakes import as_received, encoded

from recsys_rl import contracts
from recsys_rl.serving import wire
from recsys_rl.serving.request_validation import InvalidRequest, rank_candidates

VIDEO, LIVE = contracts.ITEM_TYPES["video"], contracts.ITEM_TYPES["live"]


def request(n: int = 20, seed: int = 0, item_types: tuple[int, ...] = (VIDEO,)) -> contracts.RankRequest:
    rng = np.random.default_rng(seed)
    out = contracts.RankRequest(schema_version=1, request_id="r", user_id="u", page_size=3)
    for j in range(n):
        item_type = item_types[j % len(item_types)]
        candidate = out.candidates.add(item_id=f"v{j}-é", author_id=f"a{j}", item_type=item_type)
        candidate.predictions.extend(rng.gamma(2.0, 0.3, size=7).tolist())
    return out


def test_columns_match_the_objects_reference_loop():
    req = request()
    columns = wire.candidate_columns(encoded(req), 7, VIDEO)
    assert columns is not None
    assert columns.item_ids == [c.item_id for c in req.candidates]
    np.testing.assert_array_equal(
        columns.predictions, np.array([list(c.predictions) for c in req.candidates])
    )
    assert columns.predictions.dtype == np.float64


def test_the_record_with_spliced_candidates_decodes_as_the_record_with_copied_ones():
    req = request()
    record = contracts.DecisionRecord(schema_version=1, request_id="r", user_id="u", action=[0.5, 1.5])
    record.served_item_ids.append("v3-é")
    spliced = contracts.encode(record) + wire.record_candidates(encoded(req))
    copied = contracts.DecisionRecord()
    copied.CopyFrom(record)
    copied.candidates.extend(req.candidates)
    assert contracts.DecisionRecord.FromString(spliced) == copied


def _item(item_id: bytes) -> bytes:
    return b"\x0a" + bytes([len(item_id)]) + item_id


def _packed(values: list[float]) -> bytes:
    body = struct.pack(f"<{len(values)}f", *values)
    return b"\x22" + bytes([len(body)]) + body


def _unpacked(values: list[float]) -> bytes:
    return b"".join(b"\x25" + struct.pack("<f", v) for v in values)


def _type(value: int) -> bytes:
    return b"\x18" + bytes([value])


def _packed_type(value: int) -> bytes:
    # a singular enum written as a packed list: protobuf parsers keep it as an unknown field
    return b"\x1a\x01" + bytes([value])


SEVEN = [0.5] * 7
V = _type(VIDEO)


def test_one_id_one_type_and_one_block_per_candidate_is_read_in_bulk():
    columns = wire.candidate_columns(
        [_item(b"a") + V + _packed(SEVEN), _item(b"b") + _packed(SEVEN) + V], 7, VIDEO
    )
    assert columns is not None
    assert columns.item_ids == ["a", "b"]


@pytest.mark.parametrize(
    "encoded",
    [
        pytest.param([_item(b"a") + V + _unpacked(SEVEN), _item(b"b") + V + _packed(SEVEN)], id="unpacked"),
        pytest.param(
            [_item(b"a") + V + _packed(SEVEN[:3]) + _packed(SEVEN[3:]), _item(b"b") + V + _packed(SEVEN)],
            id="split",
        ),
        pytest.param([_item(b"a") + V + _item(b"x") + _packed(SEVEN), V + _packed(SEVEN)], id="id-moved"),
        pytest.param([V + _packed(SEVEN), _item(b"b") + V + _packed(SEVEN)], id="no-id"),
        pytest.param(
            [_item(b"a") + V + _packed(SEVEN[:6]), _item(b"b") + V + _packed([*SEVEN, 0.5])], id="6-and-8"
        ),
        pytest.param([_item(b"a") + V, _item(b"b") + V + _packed([*SEVEN, *SEVEN])], id="values-moved"),
        pytest.param([_item(b"a") + _packed(SEVEN), _item(b"b") + V + _packed(SEVEN)], id="no-type"),
        pytest.param([_item(b"a") + V + V + _packed(SEVEN), _item(b"b") + _packed(SEVEN)], id="type-moved"),
        pytest.param(
            [_item(b"a") + _packed_type(VIDEO) + _packed(SEVEN), _item(b"b") + V + _packed(SEVEN)],
            id="packed-type",
        ),
        pytest.param(
            [_item(b"a") + V + _packed(SEVEN), _item(b"b") + _type(LIVE) + _packed(SEVEN)], id="live"
        ),
        pytest.param(
            [_item(b"a") + V + _packed(SEVEN), _item(b"b") + _type(0) + _packed(SEVEN)], id="type-0"
        ),
    ],
)
def test_any_encoding_but_one_id_one_type_and_one_block_per_candidate_is_left_to_the_slow_path(encoded):
    assert wire.candidate_columns(encoded, 7, VIDEO) is None


def _rank_request(encoded: list[bytes]) -> contracts.RankRequest:
    """A Rank request whose candidates field holds ``encoded`` exactly (field 5, length-delimited)."""
    return contracts.RankRequest.FromString(b"".join(b"\x2a" + bytes([len(c)]) + c for c in encoded))


def _outcome(req: contracts.RankRequest) -> tuple[list[str], list[list[float]]] | str:
    try:
        candidates = rank_candidates(as_received(req), 7)
    except InvalidRequest as err:
        return str(err)
    return candidates.item_ids, candidates.predictions.tolist()


TYPE_ENCODINGS = {
    "video": V,
    "live": _type(LIVE),
    "none": b"",
    "explicit-0": _type(0),
    "live-then-video": _type(LIVE) + V,  # the last value wins
    "video-then-live": V + _type(LIVE),
    "packed-video": _packed_type(VIDEO),  # read as unset
    "unknown-7": _type(7),
}


@pytest.mark.parametrize("encoding", list(TYPE_ENCODINGS))
def test_the_bulk_read_accepts_and_refuses_item_types_as_the_reference_loop_does(encoding, monkeypatch):
    encoded = [_item(b"a") + V + _packed(SEVEN), _item(b"b") + TYPE_ENCODINGS[encoding] + _packed(SEVEN)]
    req = _rank_request(encoded)
    fast = _outcome(req)
    monkeypatch.setattr(wire, "candidate_columns", lambda encoded, width, item_type: None)
    assert fast == _outcome(req)
    accepted = req.candidates[1].item_type == VIDEO
    assert isinstance(fast, tuple) == accepted, fast


def test_a_valid_request_the_bulk_read_refuses_is_accepted_the_slow_way(monkeypatch):
    req = request(5)
    assert wire.candidate_columns(encoded(req), 7, VIDEO) is not None
    monkeypatch.setattr(wire, "candidate_columns", lambda encoded, width, item_type: None)
    candidates = rank_candidates(as_received(req), 7)
    assert candidates.item_ids == [c.item_id for c in req.candidates]
    np.testing.assert_array_equal(
        candidates.predictions, np.array([list(c.predictions) for c in req.candidates])
    )
    assert candidates.encoded == [c.SerializeToString() for c in req.candidates]


def test_the_server_decodes_a_rank_request_in_full_but_for_its_candidates_encodings():
    req = request(5)
    req.context.session_id, req.context.page_index = "s-é", 3
    req.prediction_names.extend(["watch_time", "click"])
    head = as_received(req)
    assert [f.name for f in type(head).DESCRIPTOR.fields] == [f.name for f in req.DESCRIPTOR.fields]
    assert head.SerializeToString() == req.SerializeToString()
    for field in req.DESCRIPTOR.fields:
        value, sent = getattr(head, field.name), getattr(req, field.name)
        if field.message_type is None:
            assert value == sent, field.name
        elif field.name != "candidates":  # messages of another pool: compared by their encoding
            assert value.SerializeToString() == sent.SerializeToString() != b"", field.name
    assert list(head.candidates) == [c.SerializeToString() for c in req.candidates]
    assert wire.full_request(head) == req


@pytest.mark.parametrize(
    "candidate",
    [
        pytest.param(_item(b"\xff\xfe") + V + _packed(SEVEN), id="id-not-utf8"),
        pytest.param(b"\x0a\x05ab", id="truncated"),
    ],
)
def test_a_candidate_that_does_not_decode_is_refused_by_name(candidate):
    """The server decodes only the request's head: a broken candidate is found by the checks, not by
    gRPC's decoder, and is refused as INVALID_ARGUMENT naming the candidates field."""
    head = wire.RankHead(candidates=[_item(b"a") + V + _packed(SEVEN), candidate])
    with pytest.raises(InvalidRequest, match=r"^candidates do not decode as recsys\.v1\.Candidate: ") as err:
        rank_candidates(head, 7)
    assert err.value.field == "candidates"
