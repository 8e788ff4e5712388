"""Pieces every ``recsys-rl`` verb shares: the one-line-error parser and argument types."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import NoReturn

from recsys_rl.config import ConfigError
from recsys_rl.dataset_contract import MANIFEST
from recsys_rl.kafka.persistent import running_address

EXIT_USAGE = 2
EXIT_FAILURE = 1


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (with a pointer to --help) instead of the usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def int_at_least(minimum: int):
    """An argparse type for whole numbers >= ``minimum`` whose errors name the bad value."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"should be a whole number, but is {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"should be at least {minimum}, but is {value}")
        return value

    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


BOOTSTRAP_ENV = "RECSYS_RL_BOOTSTRAP_SERVERS"


def add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="YAML", help="YAML file with any of the options below; flags win")


def require_dataset(directory: str) -> None:
    """A ``data`` path that is no dataset is a usage error (exit 2), named before anything is read:
    usually a typo, or the dataset root given instead of one of its versions."""
    path = Path(directory)
    if not path.is_dir():
        raise ConfigError(f"data {directory!r}: no such directory")
    if not (path / MANIFEST).is_file():
        versions = sorted(p.parent.name for p in path.glob(f"*/{MANIFEST}"))
        hint = f"; it holds datasets, pass one of them, e.g. {directory}/{versions[-1]}" if versions else ""
        raise ConfigError(f"data {directory!r} has no {MANIFEST}: not a transition dataset{hint}")


def add_bootstrap_option(parser: argparse.ArgumentParser, what: str) -> None:
    """--bootstrap-servers with the fallbacks every Kafka verb shares: the environment, then the broker
    ``recsys-rl broker start`` left running."""
    parser.add_argument(
        "--bootstrap-servers",
        metavar="HOST:PORT",
        default=env_default(BOOTSTRAP_ENV) or running_address(),
        help=f"{what} (env {BOOTSTRAP_ENV}, else the broker of 'recsys-rl broker start' when one runs)",
    )


def env_default(name: str) -> str | None:
    """Operators set connection settings once in the environment rather than on every call."""
    return os.environ.get(name) or None


def table_lines(rows: list[tuple[str, ...]]) -> list[str]:
    """``rows`` (a header first) as lines of left-aligned columns, for listings people scan by eye."""
    widths = [max(len(cell) for cell in column) for column in zip(*rows, strict=True)]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
