"""``recsys-rl simulate`` as users run it: a real process, the embedded broker, and bad input."""

import socket
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from recsys_rl.state import ACTIVITY_GROUPS

pytestmark = pytest.mark.integration


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "recsys_rl.cli.main", *args], capture_output=True, text=True, timeout=timeout
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_simulate_fills_the_embedded_broker_and_reports_counts(tmp_path):
    users = tmp_path / "users"
    result = _run(
        "simulate",
        "--users",
        "60",
        "--days",
        "1",
        "--seed",
        "5",
        "--partitions",
        "2",
        "--user-table",
        str(users),
    )
    assert result.returncode == 0, result.stderr
    # the world's user table: every account with its activity group, as of the first day's start
    table = pq.read_table(users).to_pydict()
    assert sorted(table["user_id"]) == sorted(f"u{i}" for i in range(60))
    assert set(table["activity_group"]) <= set(range(len(ACTIVITY_GROUPS)))
    lines = {line.split()[0]: line for line in result.stdout.splitlines() if line.startswith("  recsys.")}
    for topic in ("recsys.decisions", "recsys.feedback"):
        written = int(lines[topic].split()[1])
        assert written > 0
        assert lines[topic].endswith(f"topic end offset {written}")
    assert "broker_ready" in result.stderr and "day_written" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--users", "0"], "argument --users: should be at least 1, but is 0", id="zero-users"),
        pytest.param(
            ["--days", "two"], "argument --days: should be a whole number, but is 'two'", id="days-text"
        ),
        pytest.param(["--broker", "redpanda"], "argument --broker: invalid choice", id="unknown-broker"),
        pytest.param(["--bootstrap-servers", "localhost"], "invalid Kafka bootstrap address", id="no-port"),
        pytest.param(["--config", "/nonexistent.yaml"], "cannot read config file", id="missing-config"),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(args, message):
    result = _run("simulate", *args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_config_key_is_an_error(tmp_path):
    config = tmp_path / "sim.yaml"
    config.write_text("users: 10\nusres: 20\n")
    result = _run("simulate", "--config", str(config))
    assert result.returncode == 2
    assert "unknown config keys ['usres']" in result.stderr and result.stderr.count("\n") == 1


def test_unreachable_broker_gives_one_line_and_exit_1():
    address = f"127.0.0.1:{_free_port()}"
    result = _run("simulate", "--users", "5", "--bootstrap-servers", address)
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and address in lines[0], result.stderr
    assert "Traceback" not in result.stderr
