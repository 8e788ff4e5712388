"""Whole-file JSON writes: a reader (a scheduler, a dashboard, a resumed job) never sees half a file."""

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
