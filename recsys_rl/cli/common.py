"""Pieces every ``recsys-rl`` verb shares: the one-line-error parser and argument types."""

from __future__ import annotations

import argparse
import os
from typing import NoReturn

EXIT_USAGE = 2
EXIT_FAILURE = 1


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (with a pointer to --help) instead of the usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"should be a whole number, but is {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"should be at least 1, but is {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"should be a whole number, but is {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"should be at least 0, but is {value}")
    return value


def env_default(name: str) -> str | None:
    """Operators set connection settings once in the environment rather than on every call."""
    return os.environ.get(name) or None
