"""Shared plumbing of the benchmarks: repeated timing, result records and atomic JSON output.

Every result carries the commit, seeds and config it was measured with, and each figure comes with its
spread over repeats beside a baseline timed in the same process: these machines are shared and noisy,
so absolute times drift between runs while the ratio to the baseline holds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recsys_rl.processes import exit_on_sigterm


def bench_parser(doc: str, name: str) -> argparse.ArgumentParser:
    """The options every benchmark takes: --quick (CI sizes) or --full (default), --out, --seed.

    Every benchmark builds this first, so it is also where SIGTERM is made to unwind the run like Ctrl-C
    (``exit_on_sigterm``): a benchmark stopped with ``kill`` or ``timeout`` stops its embedded broker and
    worker pools too."""
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_const", dest="mode", const="quick", help="small, for CI")
    mode.add_argument("--full", action="store_const", dest="mode", const="full", help="default")
    parser.add_argument("--out", default=f"bench/results/{name}.json", help="where the JSON result goes")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(mode="full")
    return parser


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def repeat_rate(work: Callable[[], int], repeats: int) -> dict[str, Any]:
    """Run ``work`` (which returns how many units it did) ``repeats`` times; rates in units per second."""
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        units = work()
        rates.append(units / (time.perf_counter() - start))
    return {
        "value": statistics.median(rates),
        "min": min(rates),
        "max": max(rates),
        "runs": rates,
    }


def rounded(value: Any, digits: int) -> Any:
    """``value`` with every float in it rounded, for the Markdown the benchmarks write."""
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, list):
        return [rounded(v, digits) for v in value]
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    return value


def write_result(path: str | Path, result: dict[str, Any]) -> None:
    """Write JSON atomically: a reader never sees half a result file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "commit": git_commit(),  # unless the result says which commit it started from (long runs)
        **result,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as tmp:
        json.dump(result, tmp, indent=2, sort_keys=True)
        tmp.write("\n")
    os.replace(tmp.name, path)
