"""Bad arguments to the pipeline verbs end in one line and exit 2, before anything connects anywhere."""

import subprocess
import sys

import pytest


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "recsys_rl.cli.main", *args], capture_output=True, text=True, timeout=120
    )


BUILD = ["build-transitions", "--bootstrap-servers", "127.0.0.1:9", "--out", "/tmp/unused"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(BUILD, "group is required", id="no-group"),
        pytest.param(
            [*BUILD, "--group", "g", "--start", "latest"], "argument --start: invalid choice", id="start"
        ),
        pytest.param(
            [*BUILD, "--group", "g", "--num-shards", "0"], "--num-shards: should be at least 1", id="shards"
        ),
        pytest.param(
            [*BUILD, "--group", "g", "--join-window-s", "-5"], "join_window_s should be positive", id="window"
        ),
        pytest.param(
            ["simulate", "--runner=DirectRunner"],
            "unrecognized arguments: --runner=DirectRunner",
            id="beam-flag-elsewhere",
        ),
    ],
)
def test_bad_pipeline_arguments_give_one_line_and_exit_2(args, message):
    result = _run(*args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
