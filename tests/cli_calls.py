"""Calling ``recsys-rl`` in-process from a test: exit code and what it printed, usage errors included."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from recsys_rl.cli.main import main


@dataclass(frozen=True)
class Invocation:
    code: int
    out: str
    err: str


def cli(capsys: pytest.CaptureFixture, *args: str | Path) -> Invocation:
    try:
        code = main([str(arg) for arg in args])
    except SystemExit as exit_:  # usage errors leave through argparse
        code = exit_.code
    captured = capsys.readouterr()
    return Invocation(code, captured.out, captured.err)
