"""The test set-up cleans up after itself: a machine that runs the suite every day must not collect its
temporary directories, neither the set-up's own nor what the services a test starts leave behind."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# What Beam's job server and stager do on every pipeline: folders in the temporary folder, made in the
# test's process and in processes it starts, that nobody removes.
_LITTERING_TEST = textwrap.dedent(
    """
    import subprocess, sys, tempfile

    def test_a_service_leaves_temporary_folders(tmp_path):
        (tmp_path / "kept").write_text("for whoever debugs a failure")
        tempfile.mkdtemp(prefix="beam-temp")
        subprocess.run([sys.executable, "-c", "import tempfile; tempfile.mkdtemp()"], check=True)
    """
)


def test_a_test_session_with_workers_leaves_nothing_in_the_temporary_folder(tmp_path):
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    littering = tmp_path / "tests" / "test_littering.py"
    littering.parent.mkdir()
    littering.write_text(_LITTERING_TEST)
    environment = {**os.environ, "TMPDIR": str(temporary), "PYTHONPATH": str(REPO / "tests")}
    environment.pop("PYTEST_DEBUG_TEMPROOT", None)  # this session's conftest set it to the real one
    # run as `make test` runs the suite: a controller and an xdist worker, each set up by tests/conftest.py
    pytest_args = [
        "-q",
        "-n",
        "1",
        "-p",
        "no:cacheprovider",
        "-p",
        "conftest",
        "--rootdir",
        str(littering.parent),
    ]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *pytest_args, str(littering)],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    # pytest's own tmp_path folders live under pytest-of-<user>, which pytest prunes itself
    left = sorted(p.name for p in temporary.iterdir())
    assert [name for name in left if not name.startswith("pytest-of-")] == []
    assert list(temporary.glob("pytest-of-*/pytest-*/popen-gw0/*/kept")), "pytest's own folders moved"
