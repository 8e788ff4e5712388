"""The test set-up cleans up after itself: a machine that runs the suite every day must not collect its
temporary directories."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_test_session_with_workers_leaves_no_directory_of_its_own_in_the_temporary_folder(tmp_path):
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    # a quick test, run as `make test` runs the suite: a controller and an xdist worker, each set up
    # by tests/conftest.py
    quick = "tests/unit/test_atomic_json.py::test_a_write_replaces_the_file_and_leaves_no_temporary"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "1", "-p", "no:cacheprovider", quick],
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(temporary)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    # pytest's own tmp_path folders live under pytest-of-<user>, which pytest prunes itself
    left = sorted(p.name for p in temporary.iterdir() if not p.name.startswith("pytest-of-"))
    assert left == []
