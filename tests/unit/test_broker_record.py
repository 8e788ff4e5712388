"""The record ``recsys-rl broker start`` leaves (``recsys_rl.kafka.persistent``): bad records are named."""

from __future__ import annotations

import json

import pytest

from recsys_rl.kafka.persistent import RECORD, running_address, running_broker
from recsys_rl.kafka.setup_errors import BrokerConfigError


@pytest.mark.parametrize("text", ["{", '{"kind": "embedded"}', "[1, 2]"], ids=["json", "fields", "list"])
def test_a_broken_record_is_named_and_gives_no_default_address(tmp_path, monkeypatch, text):
    (tmp_path / RECORD).write_text(text)
    with pytest.raises(BrokerConfigError, match=f"{tmp_path / RECORD} is not a broker record .*; remove it"):
        running_broker(tmp_path)
    monkeypatch.setenv("RECSYS_RL_BROKER_DIR", str(tmp_path))
    assert running_address() is None  # every verb's --bootstrap-servers default: never an error


def test_a_record_of_a_process_that_is_gone_is_removed(tmp_path):
    record = {"kind": "embedded", "bootstrap_servers": "127.0.0.1:1", "pid": 2**22 + 7, "started_at": "t"}
    (tmp_path / RECORD).write_text(json.dumps({**record, "directory": str(tmp_path)}))
    assert running_broker(tmp_path) is None and not (tmp_path / RECORD).exists()
