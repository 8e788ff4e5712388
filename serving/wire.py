"""Rank candidates read, checked and logged as encoded bytes, without a Python object per candidate.

A Rank request carries up to ``max_candidates`` candidates that the server checks and copies into
its decision record. Walked as protobuf objects (a wrapper per candidate, a float per prediction,
``candidates.extend`` for the record) that cost about 1 ms of Python for 200 candidates, most of a
request's CPU. Two facts of the wire format make it cheap instead:

* an embedded message and a ``bytes`` field are encoded alike, so the same bytes parsed by a message
  that declares the field ``bytes`` hand over each candidate's encoding without decoding it, and a
  message that declares DecisionRecord's candidates field ``bytes`` writes them back unchanged. The
  server decodes Rank requests as ``RankHead`` (RankRequest with its candidates declared so): one
  parse of the request's fields, none of its candidates' (a full parse and the re-encoding that got
  the candidates' bytes back were a tenth of the handler);
* encoded messages merge on concatenation (repeated fields append), so ``encode(record) +
  record_candidates(encoded)`` decodes as the record with its candidates, and all candidates joined
  and parsed once by a message with Candidate's ``item_id``, ``item_type`` and ``predictions``
  declared repeated give every item id, item type and packed prediction block in one parse.

The views below are those messages, built from the contract's own descriptors in private descriptor
pools (they are no part of the API). ``candidate_columns`` separates the candidates with an
empty item id, an item type 0 and an empty prediction block: a candidate that lacks a field, repeats
one or sends its predictions unpacked breaks the alternation and is left to the per-candidate checks.
So is one that writes its item type as a packed list: protobuf parsers drop that unread (Candidate's
item type is singular) while the view reads its value, and the view, re-encoding it as a varint, comes
out one byte shorter than the bytes it was parsed from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from google.protobuf import descriptor, descriptor_pb2, descriptor_pool, message, message_factory

from recsys_rl import contracts

_FieldProto = descriptor_pb2.FieldDescriptorProto


def _number(message_type: type, field: str) -> int:
    return message_type.DESCRIPTOR.fields_by_name[field].number


def _views() -> dict[str, type]:
    """name -> message class of each view: (field name, field number, type) per view, all repeated."""
    views = {
        # DecisionRecord's candidates, written from encoded bytes
        "RecordCandidates": [("candidates", _number(contracts.DecisionRecord, "candidates"), "bytes")],
        # Candidate's item id and packed predictions, repeated: many candidates parsed as one
        "CandidateColumns": [
            ("item_id", _number(contracts.Candidate, "item_id"), "string"),
            ("predictions", _number(contracts.Candidate, "predictions"), "bytes"),
            ("author_id", _number(contracts.Candidate, "author_id"), "string"),
            ("item_type", _number(contracts.Candidate, "item_type"), "int32"),
        ],
    }
    types = {
        "bytes": _FieldProto.TYPE_BYTES,
        "string": _FieldProto.TYPE_STRING,
        "int32": _FieldProto.TYPE_INT32,
    }
    file = descriptor_pb2.FileDescriptorProto(
        name="serving/wire_views.proto", package="recsys.serving.wire", syntax="proto3"
    )
    for name, fields in views.items():
        message = file.message_type.add(name=name)
        for field, number, kind in fields:
            added = message.field.add(
                name=field, number=number, type=types[kind], label=_FieldProto.LABEL_REPEATED
            )
            if kind == "int32":  # the separator's item type 0 written as a varint, as a candidate's is
                added.options.packed = False
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{file.package}.{name}"))
        for name in views
    }


_VIEWS = _views()


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
#: Between two candidates when parsing them as one: an empty item id, item type 0, an empty prediction block.
_SEPARATOR = _VIEWS["CandidateColumns"](item_id=[""], item_type=[0], predictions=[b""]).SerializeToString()
_FLOAT32 = np.dtype("<f4")


def full_request(head: RankHead) -> contracts.RankRequest:
    """``head`` with its candidates decoded (DecodeError if one does not decode as a Candidate)."""
    return contracts.RankRequest.FromString(head.SerializeToString())


def record_candidates(encoded: list[bytes]) -> bytes:
    """DecisionRecord's candidates field holding ``encoded``: append it to an encoded record."""
    return _VIEWS["RecordCandidates"](candidates=encoded).SerializeToString()


@dataclass(frozen=True)
class Columns:
    item_ids: list[str]
    predictions: np.ndarray  # (candidates, width), float64 of the float32 values sent
    _author_ids: Sequence[str]  # the parsed view's column; read only when asked

    def longest_author_id(self) -> int:
        """Author ids are optional, so only their longest is read in bulk (each read makes a str)."""
        return max(map(len, self._author_ids), default=0)


def candidate_columns(encoded: list[bytes], width: int, item_type: int) -> Columns | None:
    """Item ids and predictions of the encoded candidates, or None unless each candidate decodes and has
    exactly one item id, one item type, ``item_type`` (as a varint, however protobuf encoders write a set
    enum), and one packed block of ``width`` predictions (the per-candidate checks say why)."""
    joined = _SEPARATOR.join(encoded) + _SEPARATOR
    try:
        columns = _VIEWS["CandidateColumns"].FromString(joined)
    except message.DecodeError:  # an id that is not UTF-8, say: the full parse names it
        return None
    n = len(encoded)
    # the item types, separators' included, compared in one go: reading them out costs more
    if columns.item_type != [item_type, 0] * n:
        return None
    ids, blocks = list(columns.item_id), list(columns.predictions)
    if len(ids) != 2 * n or len(blocks) != 2 * n:
        return None
    if ids[1::2].count("") != n or blocks[1::2].count(b"") != n:
        return None
    if columns.ByteSize() != len(joined):  # an item type sent as a packed list (see the module doc)
        return None
    item_ids, blocks = ids[0::2], blocks[0::2]
    if set(map(len, blocks)) != {width * _FLOAT32.itemsize}:
        return None
    values = np.frombuffer(b"".join(blocks), _FLOAT32).astype(np.float64).reshape(n, width)
    return Columns(item_ids, values, columns.author_id)
