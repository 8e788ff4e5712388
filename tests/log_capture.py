"""A logger's structured events captured in order, for tests that check what was logged and how often."""

from __future__ import annotations

import logging


class Events(logging.Handler):
    """A logger's events (debug ones too) as (event, fields), in order; fields are the ``kv`` extras."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[tuple[str, dict]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((record.getMessage(), dict(getattr(record, "kv", {}))))

    def named(self, event: str) -> list[dict]:
        return [fields for name, fields in self.seen if name == event]
