"""Waiting in tests for something another thread or process does: poll, never sleep a fixed time."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest


def wait_for(condition: Callable[[], object], what: str, attempts: int = 400) -> None:
    """Poll ``condition`` every 50 ms; fail naming ``what`` after ``attempts`` tries (20 s by default)."""
    pause = threading.Event()
    for _ in range(attempts):
        if condition():
            return
        pause.wait(0.05)
    pytest.fail(f"gave up waiting for {what}")
