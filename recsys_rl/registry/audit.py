"""How every registry write is made: under one lock, assembled in staging, then recorded in the audit log.

Writers serialise on ``.lock``; a writer killed midway leaves debris only under ``.staging/``, which the
next writer sweeps. The audit log is one JSON line per committed change, for all surfaces.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from recsys_rl.ope.blessing import utc_now
from recsys_rl.registry.layout import (
    AUDIT_LOG,
    LOCK_FILE,
    LOCK_TIMEOUT_S,
    STAGING,
    SURFACES,
    RegistryError,
    open_registry,
)


def read_audit(registry: str | Path, surface: str | None = None) -> list[dict[str, Any]]:
    """The audit records, oldest first (of ``surface`` only, if given).

    A line that does not parse is one a writer was killed in the middle of; it is skipped.
    """
    path = open_registry(registry) / AUDIT_LOG
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return [r for r in records if surface is None or r.get("surface") == surface]


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """Hold the registry's write lock, after sweeping what writers killed earlier left in staging."""
    root.mkdir(parents=True, exist_ok=True)
    lock_path = root / LOCK_FILE
    with open(lock_path, "a") as handle:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise RegistryError(
                        f"{lock_path} is still held by another writer after {LOCK_TIMEOUT_S:g} s; try again "
                        "when it has finished"
                    ) from None
                time.sleep(0.05)
        try:
            for surface in SURFACES:
                shutil.rmtree(root / surface / STAGING, ignore_errors=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def new_staging(root: Path, surface: str) -> Path:
    staging = root / surface / STAGING / uuid.uuid4().hex
    staging.mkdir(parents=True)
    return staging


def append_audit(root: Path, action: str, surface: str, actor: str | None, **fields: Any) -> None:
    record = {
        "time": utc_now(),
        "actor": actor or os.environ.get("USER") or "unknown",
        "action": action,
        "surface": surface,
        **fields,
    }
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    with open(root / AUDIT_LOG, "a+b") as log:
        size = log.seek(0, os.SEEK_END)
        if size:
            log.seek(size - 1)
            if log.read(1) != b"\n":  # a writer killed mid-line: start afresh so this record parses
                line = b"\n" + line
        log.write(line)
