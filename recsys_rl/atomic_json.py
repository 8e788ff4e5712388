"""Whole-file JSON: atomic writes (a reader never sees half a file), JSON lines, and manifest reads with
clear errors."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def write_bytes_atomic(path: Any, data: bytes) -> None:
    """Write ``data`` to a temporary sibling, then rename it over ``path``.

    A ``path`` that is neither a string nor path-like is a location with atomic writes of its own
    (``storage.ObjectPath``: one upload), and is written directly."""
    if not isinstance(path, str | os.PathLike):
        path.write_bytes(data)
        return
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_json_atomic(path: Any, payload: Any) -> None:
    """Write ``payload`` as indented JSON, atomically.

    NaN and infinities are refused rather than written as the non-standard tokens other readers reject.
    """
    text = json.dumps(payload, indent=2, sort_keys=True, allow_nan=False) + "\n"
    write_bytes_atomic(path, text.encode("utf-8"))


def jsonl_file(items: Iterable[Any]) -> bytes:
    """JSON lines, one per item, keys sorted."""
    return b"".join(json.dumps(item, sort_keys=True).encode("utf-8") + b"\n" for item in items)


def read_json_file(path: Any, error: type[Exception], missing: str) -> Any:
    """The JSON at ``path`` (a string, a Path or a ``storage.ObjectPath``); a missing or unparsable file
    raises ``error`` (``missing``: what it is for)."""
    path = Path(path) if isinstance(path, str) else path
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise error(f"{path.parent} has no {path.name}: {missing}") from None
    except json.JSONDecodeError as err:
        raise error(f"{path} is not valid JSON: {err}") from None
