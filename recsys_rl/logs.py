"""Structured logging: one ``key=value`` line per event, tagged with the run id, on stderr.

stdout stays for a command's result (what it produced and where), so scripts can parse it while people
watch progress on stderr.
"""

from __future__ import annotations

import logging
import sys
import time
import uuid

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


def _quote(value: object) -> str:
    text = str(value)
    return f'"{text}"' if (" " in text or "=" in text or not text) else text


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


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def get_logger(name: str) -> logging.Logger:
    """A logger under ``recsys_rl`` that writes key=value lines to stderr (configured once)."""
    global _CONFIGURED
    root = logging.getLogger("recsys_rl")
    if not _CONFIGURED:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(KeyValueFormatter())
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        root.propagate = False
        _CONFIGURED = True
    return root.getChild(name)


def log_event(logger: logging.Logger, event: str, **kv: object) -> None:
    logger.info(event, extra={"kv": kv})
