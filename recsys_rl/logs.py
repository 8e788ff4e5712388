"""Structured logging: one ``key=value`` line per event, tagged with the run id, on stderr.

stdout stays for a command's result (what it produced and where), so scripts can parse it while people
watch progress on stderr.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

_CONFIGURED = False


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        fields.update(getattr(record, "kv", {}))
        return " ".join(f"{k}={_quote(v)}" for k, v in fields.items())


class _CurrentStderrHandler(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is at each record, not as it was when logging was configured.

    A command run in-process (tests, notebooks, ``contextlib.redirect_stderr``) swaps ``sys.stderr``;
    a handler holding the first stream would write to a closed or stale one instead.
    """

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr


def _quote(value: object) -> str:
    """A value as logfmt reads it: nested values as compact JSON (never a Python repr), and anything with
    a space, ``=`` or quote inside as a JSON string, so the line splits back into exactly its fields."""
    if isinstance(value, dict | list | tuple):
        text = json.dumps(value, default=str, separators=(",", ":"))
    else:
        text = str(value)
    return json.dumps(text) if (" " in text or "=" in text or '"' in text or not text) else text


#: Warnings third-party packages log at import time that say nothing about a recsys-rl run: Beam warns
#: about BigQuery client libraries we never use on every import of apache_beam.
_IMPORT_NOISE = ("apitools not found, and bigquery client libraries",)


def _not_import_noise(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_IMPORT_NOISE)


def silence_import_noise() -> None:
    """Keep known import-time warnings of dependencies off the user's terminal (root logger only)."""
    root = logging.getLogger()
    if _not_import_noise not in root.filters:
        root.addFilter(_not_import_noise)


@contextlib.contextmanager
def quiet_native_imports() -> Iterator[None]:
    """Hold back what imports write straight to file descriptor 2, and show it only if they fail.

    Importing TensorFlow and TF-Agents prints a dozen start-up lines from C++ (oneDNN, CUDA probing,
    which TF_CPP_MIN_LOG_LEVEL does not silence) and Gym's deprecation notice; before every command's
    own output, they would bury its one-line result or error.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            sys.stderr.flush()
            held.seek(0)
            os.write(saved, held.read())
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def get_logger(name: str) -> logging.Logger:
    """A logger under ``recsys_rl`` that writes key=value lines to stderr (configured once)."""
    global _CONFIGURED
    root = logging.getLogger("recsys_rl")
    if not _CONFIGURED:
        handler = _CurrentStderrHandler()
        handler.setFormatter(KeyValueFormatter())
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        root.propagate = False
        _CONFIGURED = True
    return root.getChild(name)


def log_event(logger: logging.Logger, event: str, **kv: object) -> None:
    logger.info(event, extra={"kv": kv})


def progress_logger(name: str) -> Callable[[str, dict[str, Any]], None]:
    """A job's progress callback: each (event, fields) becomes one key=value line with a fresh run id."""
    logger = get_logger(name)
    run_id = new_run_id()
    return lambda event, fields: log_event(logger, event, run_id=run_id, **fields)
