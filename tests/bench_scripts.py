"""The benchmark scripts as modules, for unit tests of their pure parts.

They are scripts, not a package: each imports its shared helpers as ``common`` and ``trained`` from
``bench/``, so that folder is on the path while one loads.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench_script(name: str) -> ModuleType:
    """``bench/<name>.py`` imported as the module ``bench_<name>`` (its ``main`` not run)."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # a dataclass of the script looks its module up there
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module
