"""stderr carries our key=value lines: third-party start-up noise is dropped, failures never are, colour
codes stay off anything but a terminal, long lines shrink, and a terminal gets a progress bar."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from recsys_rl.logs import (
    MAX_LINE,
    KeyValueFormatter,
    progress_logger,
    quiet_native_imports,
    quiet_third_party_output,
)

REPO = Path(__file__).resolve().parents[2]
LIBRARY_FILE = "/venv/lib/python3.11/site-packages/tf_agents/__init__.py"


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def quieted(monkeypatch):
    """The command line's set-up, undone after the test."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # as a command starts; pytest adds its own for the call
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    quiet_third_party_output()


def _fields(line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in shlex.split(line))


def test_known_third_party_noise_is_dropped_and_failures_of_the_same_loggers_are_not(quieted, capsys):
    selector = logging.getLogger("kafka.net.selector")
    slow = "Task <Task 1> ran for 0.308s (>0.100s threshold). It is blocking the event loop -- likely ..."
    selector.warning(slow)
    logging.warning("apitools not found, and bigquery client libraries are not available despite ...")
    selector.error(slow)  # raised to an error (raise_on_slow_task's kind), it is news
    selector.warning("Connection to node 1 failed")
    logging.warning("a warning of the root logger")
    lines = capsys.readouterr().err.splitlines()
    assert [(_fields(line)["logger"], _fields(line)["level"], _fields(line)["event"]) for line in lines] == [
        ("kafka.net.selector", "error", slow),
        ("kafka.net.selector", "warning", "Connection to node 1 failed"),
        ("root", "warning", "a warning of the root logger"),
    ]


def test_library_deprecations_are_dropped_and_other_warnings_are_key_value_lines(quieted, capsys):
    ours = str(REPO / "recsys_rl" / "logs.py")
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # as Feast's import makes it for DeprecationWarning
        warnings.warn_explicit(
            "distutils Version classes are deprecated", DeprecationWarning, LIBRARY_FILE, 58
        )
        warnings.warn_explicit("a library's own warning", UserWarning, LIBRARY_FILE, 60)
        warnings.warn_explicit("our deprecation", DeprecationWarning, ours, 1)
    lines = capsys.readouterr().err.splitlines()
    assert [(_fields(line)["event"], _fields(line)["category"]) for line in lines] == [
        ("a library's own warning", "UserWarning"),
        ("our deprecation", "DeprecationWarning"),
    ]
    assert all(_fields(line)["logger"] == "py.warnings" for line in lines)


def test_feasts_prints_reach_a_terminal_as_printed_and_anything_else_as_colourless_log_lines():
    from recsys_rl.feature_store.repo import progress_to_stderr

    coloured = "Materializing \x1b[1m\x1b[32m1\x1b[0m feature views"

    def feast_prints() -> None:  # as Feast prints its progress: a line, a blank one, a half one
        print(coloured + "\n")
        print("\x1b[1m\x1b[32muser_activity\x1b[0m", end=":")

    terminal, log = FakeTerminal(), io.StringIO()
    for stream in (terminal, log):
        with contextlib.redirect_stderr(stream), progress_to_stderr():
            feast_prints()
    assert terminal.getvalue() == coloured + "\n\n\x1b[1m\x1b[32muser_activity\x1b[0m:"
    lines = log.getvalue().splitlines()
    assert [(_fields(line)["logger"], _fields(line)["event"], _fields(line)["text"]) for line in lines] == [
        ("recsys_rl.feast", "printed", "Materializing 1 feature views"),
        ("recsys_rl.feast", "printed", "user_activity:"),
    ]
    assert "\x1b" not in log.getvalue()


def test_log_lines_never_carry_colour_codes():
    record = logging.LogRecord(
        "feast", logging.WARNING, __file__, 1, "view \x1b[1muser\x1b[0m: %s", ("x",), None
    )
    record.kv = {"name": "\x1b[32muser_activity\x1b[0m"}
    line = KeyValueFormatter().format(record)
    assert "\x1b" not in line and "\\u001b" not in line
    assert (_fields(line)["event"], _fields(line)["name"]) == ("view user: x", "user_activity")


def test_a_long_line_gives_its_longest_nested_values_as_sizes():
    ranges = [{"topic": "t.decisions", "partition": p, "start": 0, "end": 1000 + p} for p in range(8)]
    record = logging.LogRecord("recsys_rl.pipeline", logging.INFO, __file__, 1, "ingest_done", None, None)
    record.kv = {
        "records": 54381,
        "accounting": {"read": 54381, "dead_lettered": 0},
        "plan": {"ranges": ranges},
    }
    line = KeyValueFormatter().format(record)
    assert len(line) <= MAX_LINE
    fields = _fields(line)
    assert fields["plan.items"] == "1" and "plan" not in fields
    assert json.loads(fields["accounting"]) == {"read": 54381, "dead_lettered": 0}  # it fits: kept whole
    record.kv = {"plan": {"ranges": ranges[:1]}}
    assert json.loads(_fields(KeyValueFormatter().format(record))["plan"]) == {"ranges": ranges[:1]}
    record.kv = {"incumbent": "v" * MAX_LINE, "reasons": []}  # long anyway: a size would not shorten it
    assert _fields(KeyValueFormatter().format(record))["reasons"] == "[]"


def _train_like(progress) -> None:
    progress("started", {"algo": "bc", "step": 0, "of": 30, "rows": 8})
    for step in (10, 20, 30):
        progress("step", {"step": step, "of": 30, "loss": 1.5, "critic/click": 0.25})
    progress("exported", {"policy": "/tmp/run/policy"})


def test_progress_off_a_terminal_is_one_key_value_line_per_event():
    stream = io.StringIO()
    with contextlib.redirect_stderr(stream):
        _train_like(progress_logger("quiet_test"))
    lines = stream.getvalue().splitlines()
    assert [_fields(line)["event"] for line in lines] == ["started", "step", "step", "step", "exported"]
    assert [_fields(line)["step"] for line in lines[1:4]] == ["10", "20", "30"]
    assert "\r" not in stream.getvalue()


def test_progress_on_a_terminal_is_a_bar_instead_of_the_tick_lines():
    terminal = FakeTerminal()
    with contextlib.redirect_stderr(terminal):
        _train_like(progress_logger("quiet_test"))
    text = terminal.getvalue()
    assert "30/30" in text and "100%" in text and "loss=1.5" in text  # the bar, finished, with the loss
    assert "critic/click" not in text  # a figure more would squeeze the bar out of a terminal's width
    events = [
        _fields(line)["event"] for line in text.replace("\r", "\n").splitlines() if line.startswith("ts=")
    ]
    assert events == ["started", "exported"]


def test_native_error_lines_outlive_a_quiet_import_but_a_driverless_cuda_start_does_not(capfd):
    failure = b"E0000 00:00:1.5 7 loader.cc:1] could not load libtensorflow_framework.so.2\n"
    with quiet_native_imports():
        os.write(2, b"I0000 00:00:1.0 7 port.cc:153] oneDNN custom operations are on.\n")
        os.write(2, failure)
    assert capfd.readouterr().err == failure.decode()
    with quiet_native_imports():
        os.write(2, b"I0000 00:00:1.0 7 cudart_stub.cc:31] Could not find cuda drivers on your machine\n")
        os.write(2, b"E0000 00:00:1.2 7 cuda_platform.cc:52] failed call to cuInit: UNKNOWN ERROR (303)\n")
    assert capfd.readouterr().err == ""


def _stderr_of(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_CPP")}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


@pytest.mark.slow
def test_a_verb_that_imports_tensorflow_tf_agents_gym_beam_and_feast_says_only_its_error(tmp_path):
    # The pipeline verb imports Beam and Feast, then (outside its own quiet block) TensorFlow, TF-Agents
    # and Gym to check the train section; a bad step count then ends it.
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        f"work_dir: {tmp_path / 'work'}\nregistry: {tmp_path / 'registry'}\n"
        f"ingest: {{bootstrap_servers: '127.0.0.1:1', group: g, out: {tmp_path / 'datasets'}}}\n"
        "train: {steps: 0}\n"
    )
    result = _stderr_of("-m", "recsys_rl.cli.main", "pipeline", "run", "--config", str(config), cwd=tmp_path)
    assert (result.returncode, result.stderr) == (
        2,
        "recsys-rl pipeline: error: steps should be at least 1, but is 0\n",
    )


@pytest.mark.slow
def test_tensorflows_first_device_use_on_a_machine_without_cuda_says_nothing(tmp_path):
    script = (
        "from recsys_rl.logs import quiet_third_party_output\n"
        "quiet_third_party_output()\n"
        "import tensorflow as tf\n"
        "print(float(tf.constant(1.0) + 1))\n"
    )
    result = _stderr_of("-c", script, cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (0, "2.0\n", "")
