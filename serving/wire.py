"""Rank candidates read, checked and logged from their encoding, without a Python object per candidate.

A Rank request carries up to ``max_candidates`` candidates that the server checks and copies into
its decision record. Walked as protobuf objects (a wrapper per candidate, a float per prediction,
``candidates.extend`` for the record) that cost about 1 ms of Python for 200 candidates, most of a
request's CPU. Instead:

* the server decodes Rank requests as ``RankHead``: RankRequest with its candidates declared ``repeated
  bytes`` (an embedded message and a ``bytes`` field are encoded alike), so one parse reads the request's
  other fields and none of its candidates';
* ``read_candidates`` hands the request's encoding to ``recsys_rl_rankwire`` (Rust, ``rankwire/``), which
  checks every candidate and reads its id and predictions in one pass, and writes DecisionRecord's
  candidates field from the candidates' bytes as they came (encoded messages merge on concatenation, so
  ``encode(record) + that field`` decodes as the record with its candidates). In Python, through protobuf
  views of the candidates, the same reading made about a thousand objects and was a quarter of a loaded
  server's CPU a Rank;
* a request it does not take (any candidate not encoded as protobuf encoders write one, or not valid) is
  decoded in full and walked candidate by candidate (``serving.request_validation``), which names the
  first bad field or accepts the unusual encoding; ``record_candidates`` writes that one's record field.

Encoded as protobuf encoders write it, a candidate has exactly one item id, at most one author id, one
item type written as a varint (however an encoder writes a set enum) and one packed block of
predictions, and no other field. Not so, for example: an item type written as a packed list, which
protobuf parsers drop unread (the type is singular), or predictions written unpacked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from google.protobuf import descriptor, descriptor_pb2, descriptor_pool, message_factory

from recsys_rl import contracts

try:
    import recsys_rl_rankwire
except ModuleNotFoundError as err:  # built apart from the package (README, Packaging)
    raise ModuleNotFoundError(
        "the server's Rank candidate reader recsys_rl_rankwire is not installed: it is built from "
        "rankwire/ (Rust, needs cargo) by `pip install ./rankwire`, which `make install` runs",
        name=err.name,
    ) from err

_FieldProto = descriptor_pb2.FieldDescriptorProto


def _record_candidates_view() -> type:
    """DecisionRecord's candidates declared ``repeated bytes``: written from encoded candidates."""
    number = contracts.DecisionRecord.DESCRIPTOR.fields_by_name["candidates"].number
    file = descriptor_pb2.FileDescriptorProto(
        name="serving/wire_views.proto", package="recsys.serving.wire", syntax="proto3"
    )
    view = file.message_type.add(name="RecordCandidates")
    view.field.add(
        name="candidates", number=number, type=_FieldProto.TYPE_BYTES, label=_FieldProto.LABEL_REPEATED
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{file.package}.{view.name}"))


_RECORD_CANDIDATES = _record_candidates_view()


def _rank_head() -> type:
    """RankRequest with ``candidates`` declared ``repeated bytes``: every other field as the contract
    has it (names, types, UTF-8 checks), from a copy of the contract's files in a private pool."""
    pool = descriptor_pool.DescriptorPool()

    def add(file: descriptor.FileDescriptor, candidates_as_bytes: bool) -> None:
        for dependency in file.dependencies:
            add(dependency, False)
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        if candidates_as_bytes:
            (rank,) = (m for m in proto.message_type if m.name == contracts.RankRequest.DESCRIPTOR.name)
            (field,) = (f for f in rank.field if f.name == "candidates")
            field.type = _FieldProto.TYPE_BYTES
            field.ClearField("type_name")
        try:
            pool.FindFileByName(proto.name)
        except KeyError:
            pool.Add(proto)

    request = contracts.RankRequest.DESCRIPTOR
    add(request.file, True)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(request.full_name))


#: What the server decodes a Rank request as: ``candidates`` holds each candidate's encoding, in order.
RankHead = _rank_head()


def full_request(head: RankHead) -> contracts.RankRequest:
    """``head`` with its candidates decoded (DecodeError if one does not decode as a Candidate)."""
    return contracts.RankRequest.FromString(head.SerializeToString())


def record_candidates(encoded: list[bytes]) -> bytes:
    """DecisionRecord's candidates field holding ``encoded``: append it to an encoded record."""
    return _RECORD_CANDIDATES(candidates=encoded).SerializeToString()


#: (each distinct author id in order of first appearance, each candidate's author's index in it or -1
#: for a candidate without one): what a Rank's user-author term reads its pairs by.
AuthorRows = tuple[list[str], np.ndarray]


def author_rows(author_ids: Sequence[str]) -> AuthorRows:
    """``AuthorRows`` of candidates with ``author_ids`` ("" for none), as the Rust reader groups them."""
    index: dict[str, int] = {}
    rows = [index.setdefault(author, len(index)) if author else -1 for author in author_ids]
    return list(index), np.array(rows, np.int64)


def read_candidates(
    head: RankHead, *, width: int, item_type: int, max_id_chars: int, max_prediction: float
) -> tuple[np.ndarray, bytes, Sequence[str], Callable[[], AuthorRows]] | None:
    """(predictions, DecisionRecord's candidates field, item ids, their ``AuthorRows`` when called) of
    ``head``'s candidates, or None unless every candidate is encoded as protobuf encoders write one and is
    valid: ``item_type``, ``width`` predictions in [0, ``max_prediction``], a non-empty item id and an
    author id of at most ``max_id_chars`` characters each, no item id twice.

    predictions: (candidates, width) float64 of the float32 values sent, read-only. The item ids are a
    sequence that makes each string when it is read (a Rank reads its page's); the authors are grouped
    only for a Rank with a user-author term.
    """
    read = recsys_rl_rankwire.rank_candidates(
        head.SerializeToString(),  # written back by upb, each candidate's bytes as they came
        width=width,
        item_type=item_type,
        max_id_chars=max_id_chars,
        max_prediction=max_prediction,
    )
    if read is None:
        return None
    predictions, record_field, item_ids, authors = read

    def grouped() -> AuthorRows:
        ids, rows = authors.rows()
        return ids, np.frombuffer(rows, "<i8")

    return np.frombuffer(predictions, "<f8").reshape(-1, width), record_field, item_ids, grouped
