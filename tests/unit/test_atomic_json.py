"""Whole-file JSON writes: the old file survives a payload that cannot be written."""

import json

import pytest

from recsys_rl.atomic_json import write_json_atomic


def test_a_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "result.json"
    write_json_atomic(path, {"b": 1, "a": [1.5, None]})
    write_json_atomic(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_nan_is_refused_and_the_previous_file_kept(tmp_path):
    path = tmp_path / "result.json"
    write_json_atomic(path, {"a": 1})
    with pytest.raises(ValueError, match="not JSON compliant"):
        write_json_atomic(path, {"a": float("nan")})
    assert json.loads(path.read_text()) == {"a": 1}
