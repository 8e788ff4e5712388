"""Log lines go to the stderr of the moment; import chatter on fd 2 is held back unless the import fails."""

import contextlib
import io
import json
import logging
import os
import shlex

import pytest

from recsys_rl.logs import KeyValueFormatter, get_logger, log_event, quiet_native_imports


def test_log_lines_follow_a_swapped_stderr():
    logger = get_logger("test_logs")
    first, second = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(first):
        log_event(logger, "one", run_id="r1", n=1)
    first.close()  # what a finished capture does; a handler holding it would now fail
    with contextlib.redirect_stderr(second):
        log_event(logger, "two", run_id="r2", note="a b")
    line = second.getvalue()
    assert line.endswith('event=two run_id=r2 note="a b"\n') and line.count("\n") == 1


def test_native_import_output_is_held_back_unless_the_import_fails(capfd):
    with quiet_native_imports():
        os.write(2, b"start-up chatter\n")
    assert capfd.readouterr().err == ""
    with pytest.raises(ImportError), quiet_native_imports():
        os.write(2, b"why it failed\n")
        raise ImportError("no such library")
    assert capfd.readouterr().err == "why it failed\n"
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"


def test_nested_values_are_json_and_every_line_splits_back_into_its_fields():
    record = logging.LogRecord("recsys_rl.x", logging.INFO, __file__, 1, "done", None, None)
    record.kv = {
        "reasons": ["like: bound -3% is beyond", 'say "no"'],
        "metrics": {"loss": 0.5},
        "path": "/tmp/a b",
        "empty": "",
        "plain": 3,
    }
    fields = dict(part.split("=", 1) for part in shlex.split(KeyValueFormatter().format(record)))
    assert json.loads(fields["reasons"]) == ["like: bound -3% is beyond", 'say "no"']
    assert json.loads(fields["metrics"]) == {"loss": 0.5}
    assert (fields["path"], fields["empty"], fields["plain"], fields["event"]) == (
        "/tmp/a b",
        "",
        "3",
        "done",
    )
