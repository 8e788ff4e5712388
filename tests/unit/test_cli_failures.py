"""Failures of the environment (Kafka lost, a full disk) end a command with one line and exit 1."""

from __future__ import annotations

import errno

import kafka.errors
import pytest

from recsys_rl.cli import main as cli_main
from recsys_rl.cli import simulate as simulate_cmd


def _fail_with(monkeypatch, error: BaseException) -> None:
    def handler(args):
        raise error

    monkeypatch.setattr(simulate_cmd, "run", handler)


@pytest.mark.parametrize(
    ("error", "words"),
    [
        pytest.param(
            kafka.errors.KafkaConnectionError("Connection at 127.0.0.1:9092 closed"),
            "Kafka: KafkaConnectionError: Connection at 127.0.0.1:9092 closed",
            id="broker-lost",
        ),
        pytest.param(
            kafka.errors.KafkaTimeoutError("Failed to update metadata after 60.0 secs."),
            "Kafka: KafkaTimeoutError: Failed to update metadata after 60.0 secs.",
            id="metadata-timeout",
        ),
        pytest.param(
            OSError(errno.ENOSPC, "No space left on device", "/data/out/part-0.parquet"),
            "storage: No space left on device: '/data/out/part-0.parquet'",
            id="disk-full",
        ),
        pytest.param(
            OSError(errno.EDQUOT, "Disk quota exceeded"), "storage: Disk quota exceeded", id="quota"
        ),
    ],
)
def test_an_environment_failure_is_one_line_and_exit_1(monkeypatch, capsys, error, words):
    _fail_with(monkeypatch, error)
    assert cli_main.main(["simulate", "--users", "5"]) == 1
    err = capsys.readouterr().err
    assert err == f"recsys-rl simulate: error: {words}\n"


def test_a_bug_still_shows_its_traceback(monkeypatch):
    """Anything else is our bug, and its traceback is what a bug report needs."""
    _fail_with(monkeypatch, FileNotFoundError(errno.ENOENT, "No such file", "x"))
    with pytest.raises(FileNotFoundError):
        cli_main.main(["simulate", "--users", "5"])
    _fail_with(monkeypatch, KeyError("state"))
    with pytest.raises(KeyError):
        cli_main.main(["simulate", "--users", "5"])
