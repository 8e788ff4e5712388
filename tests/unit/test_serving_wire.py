"""The wire-format fast path reads and logs exactly what the protobuf objects hold, or steps aside."""

from __future__ import annotations

import struct
import subprocess
import sys
from unittest import mock

import numpy as np
import pytest
import recsys_rl_rankwire
from google.protobuf import message
from hypothesis import given, settings
from hypothesis import strategies as st
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


LIMITS = {"width": 7, "item_type": VIDEO, "max_id_chars": 128, "max_prediction": 1e6}


def _read(encoded: list[bytes]) -> tuple[np.ndarray, bytes, list[str], wire.AuthorRows] | None:
    """wire.read_candidates of a request whose candidates are ``encoded``, its item ids as a list."""
    read = wire.read_candidates(wire.RankHead(candidates=encoded), **LIMITS)
    return None if read is None else (read[0], read[1], list(read[2]), read[3]())


def test_the_bulk_read_matches_the_objects_reference_loop():
    req = request()
    read = wire.read_candidates(as_received(req), **LIMITS)
    assert read is not None
    predictions, logged, item_ids, author_rows = read
    assert author_rows()[0] == [c.author_id for c in req.candidates]  # 20 authors, none repeated
    assert list(item_ids) == [c.item_id for c in req.candidates] and len(item_ids) == 20
    assert (item_ids[3], item_ids[-1], item_ids[np.int64(5)]) == ("v3-é", "v19-é", "v5-é")
    with pytest.raises(IndexError):
        item_ids[20]
    np.testing.assert_array_equal(predictions, np.array([list(c.predictions) for c in req.candidates]))
    assert predictions.dtype == np.float64 and predictions.shape == (20, 7)
    assert logged == wire.record_candidates(encoded(req))


@pytest.mark.parametrize("length", [127, 128, 129, 300, 16_384])
def test_the_record_field_frames_candidates_of_every_length_as_protobuf_does(length):
    """A length prefix takes one byte below 128, two from 128, three from 16,384."""
    candidates = (
        contracts.Candidate(item_id="v" * k, item_type=VIDEO, predictions=SEVEN).SerializeToString()
        for k in range(length)
    )
    candidate = next(c for c in candidates if len(c) == length)
    read = wire.read_candidates(wire.RankHead(candidates=[candidate]), **{**LIMITS, "max_id_chars": 20_000})
    assert read is not None and read[1] == wire.record_candidates([candidate])


def test_a_candidates_field_number_with_another_wire_type_is_left_to_the_slow_path():
    """protobuf parsers keep such a field as unknown, not as a candidate: the reader must not read one."""
    candidate = _item(b"a") + V + _packed(SEVEN)
    as_varint = b"\x28" + bytes([len(candidate)]) + candidate  # field 5, wire type 0, then the bytes
    assert recsys_rl_rankwire.rank_candidates(as_varint, **LIMITS) is None
    assert recsys_rl_rankwire.rank_candidates(b"\x2a" + bytes([len(candidate)]) + candidate, **LIMITS)


def test_authors_are_grouped_in_order_of_first_appearance_in_bulk_as_one_by_one(monkeypatch):
    req = request(6)
    for candidate, author in zip(req.candidates, ["b", "", "a", "b", "é", "a"], strict=True):
        candidate.author_id = author
    no_author = _item(b"x") + V + _packed(SEVEN)
    written_empty = _item(b"y") + _author(b"") + V + _packed(SEVEN)  # an empty author sent explicitly
    head = wire.RankHead(candidates=[*encoded(req), no_author, written_empty])
    expected = (["b", "a", "é"], [0, -1, 1, 0, 2, 1, -1, -1])
    authors, rows = rank_candidates(head, 7).author_rows()
    assert (authors, rows.tolist()) == expected and rows.dtype == np.int64
    monkeypatch.setattr(wire, "read_candidates", _never)
    authors, rows = rank_candidates(head, 7).author_rows()
    assert (authors, rows.tolist()) == expected and rows.dtype == np.int64


def test_the_record_with_spliced_candidates_decodes_as_the_record_with_copied_ones():
    req = request()
    record = contracts.DecisionRecord(schema_version=1, request_id="r", user_id="u", action=[0.5, 1.5])
    record.served_item_ids.append("v3-é")
    copied = contracts.DecisionRecord()
    copied.CopyFrom(record)
    copied.candidates.extend(req.candidates)
    read = wire.read_candidates(as_received(req), **LIMITS)
    assert read is not None
    for logged in (wire.record_candidates(encoded(req)), read[1]):
        assert contracts.DecisionRecord.FromString(contracts.encode(record) + logged) == copied


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


def _author(author_id: bytes) -> bytes:
    return b"\x12" + bytes([len(author_id)]) + author_id


def test_one_id_one_type_and_one_block_per_candidate_is_read_in_bulk():
    read = _read([_item(b"a") + V + _packed(SEVEN), _author(b"x") + _item(b"b") + _packed(SEVEN) + V])
    assert read is not None and read[2] == ["a", "b"]


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
        pytest.param(
            [_item(b"a") + V + _packed(SEVEN), _item(b"b") + V + _packed(SEVEN) + b"\x28\x01"],
            id="unknown-field",
        ),
        pytest.param([_item(b"a") + V + _packed(SEVEN) + _author(b"x") + _author(b"y")], id="author-twice"),
        pytest.param([_item(b"a") + _item(b"b") + V + _packed(SEVEN)], id="id-twice"),
        pytest.param([_item(b"a") + V + _packed(SEVEN), _item(b"a") + V + _packed(SEVEN)], id="same-id"),
        pytest.param([_item(b"") + V + _packed(SEVEN)], id="empty-id"),
        pytest.param([_item(b"\xc3") + V + _packed(SEVEN)], id="id-not-utf8"),
        pytest.param([_item(b"a") + _author(b"\xff") + V + _packed(SEVEN)], id="author-not-utf8"),
        pytest.param([_item(b"v" * 129) + V + _packed(SEVEN)], id="id-too-long"),
        pytest.param([_item(b"a") + V + _packed([*SEVEN[:6], -0.5])], id="negative"),
        pytest.param([_item(b"a") + V + _packed([*SEVEN[:6], 2e6])], id="too-large"),
        pytest.param([_item(b"a") + V + _packed([*SEVEN[:6], float("nan")])], id="nan"),
        pytest.param([_item(b"a") + V + _packed(SEVEN)[:-1]], id="truncated"),
        pytest.param(
            [_item(b"a") + V + _packed([*SEVEN, 0.5]), _item(b"b") + V + _packed([*SEVEN, 0.5])], id="eight"
        ),
    ],
)
def test_any_encoding_but_one_id_one_type_and_one_block_per_candidate_is_left_to_the_slow_path(encoded):
    assert _read(encoded) is None


def _rank_request(encoded: list[bytes]) -> contracts.RankRequest:
    """A Rank request whose candidates field holds ``encoded`` exactly (field 5, length-delimited)."""
    return contracts.RankRequest.FromString(b"".join(b"\x2a" + bytes([len(c)]) + c for c in encoded))


def _head_outcome(head: wire.RankHead) -> tuple | str:
    """What rank_candidates makes of ``head`` (every form the server uses), or its refusal."""
    try:
        candidates = rank_candidates(head, 7)
    except InvalidRequest as err:
        return str(err)
    authors, rows = candidates.author_rows()
    return (
        list(candidates.item_ids),
        candidates.predictions.tolist(),
        candidates.logged,
        (authors, rows.tolist()),
    )


def _never(*args, **kwargs) -> None:
    """wire.read_candidates refusing everything: the slow path alone."""
    return None


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
    fast = _head_outcome(as_received(req))
    monkeypatch.setattr(wire, "read_candidates", _never)
    assert fast == _head_outcome(as_received(req))
    accepted = req.candidates[1].item_type == VIDEO
    assert isinstance(fast, tuple) == accepted, fast


_EDIT = st.tuples(
    st.integers(0, 2),  # which candidate
    st.integers(0, 60),  # where in it (past its end: at the end)
    st.sampled_from(["replace", "insert", "delete"]),
    st.one_of(
        st.sampled_from([0x00, 0x01, 0x02, 0x0A, 0x12, 0x18, 0x1A, 0x22, 0x25, 0x7F, 0x80, 0xC3, 0xFF]),
        st.integers(0, 255),
    ),
)


@settings(max_examples=400, deadline=None)
@given(edits=st.lists(_EDIT, min_size=1, max_size=3))
def test_edited_candidate_bytes_get_the_same_answer_in_bulk_as_one_by_one(edits):
    """The bulk read (Rust, on bytes from the network) may step aside for anything, but what it accepts
    must be exactly what the candidate-by-candidate checks accept, read the same."""
    candidates = [bytearray(c) for c in encoded(request(3, seed=1))]
    for which, where, how, byte in edits:
        candidate = candidates[which]
        where = min(where, len(candidate) - (how != "insert"))
        if how == "insert":
            candidate.insert(where, byte)
        elif how == "delete":
            del candidate[where]
        else:
            candidate[where] = byte
    head = wire.RankHead(candidates=[bytes(c) for c in candidates])
    in_bulk = _head_outcome(head)
    with mock.patch.object(wire, "read_candidates", _never):
        assert in_bulk == _head_outcome(head)


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"\x2a" + b"\xff" * 9 + b"\x01", id="length-2**63-and-more"),
        pytest.param(b"\x2a" + b"\x80" * 10 + b"\x00", id="varint-past-ten-bytes"),
        pytest.param(b"\x2a\x05\x0a\x01a", id="length-past-the-end"),
        pytest.param(b"\x02\x00", id="field-number-0"),
        pytest.param(b"\x0b\x0c", id="group"),
        pytest.param(b"\x2a", id="tag-alone"),
        pytest.param(b"\x11\x00\x00", id="fixed64-cut-short"),
    ],
)
def test_malformed_request_bytes_end_the_read_without_an_error(raw):
    assert recsys_rl_rankwire.rank_candidates(raw, **LIMITS) is None


def _field(candidate: bytes) -> bytes:
    return b"\x2a" + bytes([len(candidate)]) + candidate


#: Pieces of Rank requests: candidates fields (valid, with an author, cut short), other fields, garbage.
_PIECES = [
    _field(_item(b"a") + V + _packed(SEVEN)),
    _field(_author(b"x") + _item(b"b") + _packed(SEVEN) + V),
    _field(_item(b"c") + V + _packed(SEVEN))[:-3],
    b"\x08\x01",  # schema_version
    b"\x12\x01r",  # request_id
    b"\x38\x03",  # page_size
    b"\x2a\x00",  # an empty candidate
]


@settings(max_examples=300, deadline=None)
@given(raw=st.lists(st.one_of(st.sampled_from(_PIECES), st.binary(max_size=6)), max_size=6).map(b"".join))
def test_whatever_bytes_it_is_given_the_reader_never_fails_and_reads_what_protobuf_decodes(raw):
    """The reader parses bytes from the network: it must never fail on them, and the candidates it
    accepts must be those protobuf decodes (the server hands it only requests gRPC's decoder took)."""
    read = recsys_rl_rankwire.rank_candidates(raw, **LIMITS)
    try:
        candidates = contracts.RankRequest.FromString(raw).candidates
    except message.DecodeError:
        return
    if read is None:
        return
    assert list(read[2]) == [c.item_id for c in candidates]
    np.testing.assert_array_equal(
        np.frombuffer(read[0], "<f8"), [v for c in candidates for v in c.predictions]
    )


def test_a_valid_request_the_bulk_read_refuses_is_accepted_the_slow_way(monkeypatch):
    req = request(5)
    assert wire.read_candidates(as_received(req), **LIMITS) is not None
    monkeypatch.setattr(wire, "read_candidates", _never)
    candidates = rank_candidates(as_received(req), 7)
    assert candidates.item_ids == [c.item_id for c in req.candidates]
    np.testing.assert_array_equal(
        candidates.predictions, np.array([list(c.predictions) for c in req.candidates])
    )
    assert candidates.logged == wire.record_candidates([c.SerializeToString() for c in req.candidates])


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


def test_a_server_without_its_candidate_reader_says_how_to_build_it():
    blocked = "import sys; sys.modules['recsys_rl_rankwire'] = None; import recsys_rl.serving.wire"
    run = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert "recsys_rl_rankwire is not installed" in run.stderr and "pip install ./rankwire" in run.stderr
