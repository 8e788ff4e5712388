"""Open sessions carried from one run to the next: their decoded events, as JSON lines in the dataset.

A run's cut-off falls inside some sessions, and some decisions before it still wait for feedback inside
their join window. Building them then would end an episode early and give a decision zero rewards for
feedback that is still coming, biasing every dataset at its edge. Instead the per-user builder hands
back their events (``UserEpisodes.carried``); the run writes them to ``CARRIED_FILE`` in its dataset, and
the group's next run, which starts where this one committed, reads them back and builds the sessions
whole with the feedback it reads. The file holds decoded events, not Kafka records: decisions cross the
shuffle without their bytes, and the next run needs only what the builder uses.

One line per (user, kind): ``{"user_id", "kind", "events"}``, with each event's fields in `Decision` or
`Feedback` order and bytes fields as ``{"b64": ...}``, lines sorted, so reruns write the same bytes.
A decision carried by a run from before `Decision` gained its trailing fields (``deterministic``) is
read back with their defaults: those runs read only version-1 decision records, which count as sampled.
"""

from __future__ import annotations

import base64
import json
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

from recsys_rl.pipelines.episodes import DECISION, FEEDBACK, Decision, Feedback
from recsys_rl.storage import Location

CARRIED_FILE = "carried.jsonl"


def _field(value: Any) -> Any:
    return {"b64": base64.b64encode(value).decode("ascii")} if isinstance(value, bytes) else value


def _unfield(value: Any) -> Any:
    if isinstance(value, list):  # a tuple of strings (a decision's served items) went out as a list
        return tuple(value)
    return base64.b64decode(value["b64"]) if isinstance(value, dict) else value


def carried_lines(user_id: str, events: Iterable[Decision | Feedback]) -> Iterator[dict[str, Any]]:
    """One user's carried events as file lines, one per kind."""
    by_kind: dict[int, list[list[Any]]] = defaultdict(list)
    for event in events:
        by_kind[DECISION if type(event) is Decision else FEEDBACK].append([_field(v) for v in event])
    for kind, rows in sorted(by_kind.items()):
        yield {"user_id": user_id, "kind": kind, "events": rows}


def read_carried(path: Location) -> list[tuple[str, tuple[int, list[tuple]]]]:
    """The carried events of a dataset, as the decoder emits them: (user id, (kind, event tuples))."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_bytes().splitlines():
        entry = json.loads(line)
        events = [tuple(_unfield(v) for v in row) for row in entry["events"]]
        if entry["kind"] == DECISION:
            events = [_with_defaults(event, path) for event in events]
        out.append((entry["user_id"], (entry["kind"], events)))
    return out


def _with_defaults(event: tuple, path: Location) -> tuple:
    """A decision's fields, the trailing ones an older run did not write filled with their defaults."""
    missing = Decision._fields[len(event) :]
    if any(name not in Decision._field_defaults for name in missing):
        raise ValueError(
            f"{path}: a carried decision should have {len(Decision._fields)} fields, but has {len(event)}"
        )
    return event + tuple(Decision._field_defaults[name] for name in missing)


def count_events(carried: Iterable[tuple[str, tuple[int, list[tuple]]]]) -> int:
    return sum(len(events) for _, (_, events) in carried)
