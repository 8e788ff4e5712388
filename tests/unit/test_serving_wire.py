"""The wire-format fast path reads and logs exactly what the protobuf objects hold, or steps aside."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from recsys_rl import contracts
from recsys_rl.serving import wire
from recsys_rl.serving.request_validation import rank_candidates


def request(n: int = 20, seed: int = 0) -> contracts.RankRequest:
    rng = np.random.default_rng(seed)
    out = contracts.RankRequest(schema_version=1, request_id="r", user_id="u", page_size=3)
    for j in range(n):
        candidate = out.candidates.add(item_id=f"v{j}-é", author_id=f"a{j}", item_type=j % 2)
        candidate.predictions.extend(rng.gamma(2.0, 0.3, size=7).tolist())
    return out


def test_columns_match_the_objects_reference_loop():
    req = request()
    columns = wire.candidate_columns(wire.encoded_candidates(req), 7)
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
    spliced = contracts.encode(record) + wire.record_candidates(wire.encoded_candidates(req))
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


SEVEN = [0.5] * 7


@pytest.mark.parametrize(
    "encoded",
    [
        pytest.param([_item(b"a") + _unpacked(SEVEN), _item(b"b") + _packed(SEVEN)], id="unpacked"),
        pytest.param(
            [_item(b"a") + _packed(SEVEN[:3]) + _packed(SEVEN[3:]), _item(b"b") + _packed(SEVEN)], id="split"
        ),
        pytest.param([_item(b"a") + _item(b"x") + _packed(SEVEN), _packed(SEVEN)], id="id-moved"),
        pytest.param([_packed(SEVEN), _item(b"b") + _packed(SEVEN)], id="no-id"),
        pytest.param([_item(b"a") + _packed(SEVEN[:6]), _item(b"b") + _packed([*SEVEN, 0.5])], id="6-and-8"),
        pytest.param([_item(b"a"), _item(b"b") + _packed([*SEVEN, *SEVEN])], id="values-moved"),
    ],
)
def test_any_encoding_but_one_id_and_one_block_per_candidate_is_left_to_the_slow_path(encoded):
    assert wire.candidate_columns(encoded, 7) is None


def test_a_valid_request_the_bulk_read_refuses_is_accepted_the_slow_way(monkeypatch):
    req = request(5)
    monkeypatch.setattr(wire, "candidate_columns", lambda encoded, width: None)
    candidates = rank_candidates(req, 7)
    assert candidates.item_ids == [c.item_id for c in req.candidates]
    np.testing.assert_array_equal(
        candidates.predictions, np.array([list(c.predictions) for c in req.candidates])
    )
    assert candidates.encoded == [c.SerializeToString() for c in req.candidates]
