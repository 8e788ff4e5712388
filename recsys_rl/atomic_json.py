"""Whole-file JSON: atomic writes (a reader never sees half a file) and manifest reads with clear errors."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json_atomic(path: str | Path, payload: Any) -> None:
    """Write ``payload`` as indented JSON to a temporary sibling, then rename it over ``path``.

    NaN and infinities are refused rather than written as the non-standard tokens other readers reject.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True, allow_nan=False) + "\n")
    os.replace(tmp, path)


def read_json_file(path: str | Path, error: type[Exception], missing: str) -> Any:
    """The JSON at ``path``; a missing or unparsable file raises ``error`` (``missing``: what it is for)."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise error(f"{path.parent} has no {path.name}: {missing}") from None
    except json.JSONDecodeError as err:
        raise error(f"{path} is not valid JSON: {err}") from None
