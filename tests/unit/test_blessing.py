"""The blessing record the OPE gate writes and the registry checks: one schema, refused loudly when off."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recsys_rl.ope.blessing import Blessing, BlessingError, PolicyRef, read_blessing, write_blessing

SHA = "ab" * 32


def blessing(**changes) -> Blessing:
    fields = {
        "passed": False,
        "reasons": ("ESS 90 vs required 1,000",),
        "candidate": PolicyRef("tscac-ds1-s0", SHA),
        "incumbent": PolicyRef("bc-ds1-s0", "cd" * 32),
        "estimator": "snips",
        "interval_method": "bca",
        "data_manifest": {"version": "logs-7", "rows": 120_000},
        "created_at": "2026-11-30T07:00:00Z",
    }
    return Blessing(**{**fields, **changes})


def test_write_then_read_gives_the_same_blessing(tmp_path: Path) -> None:
    path = tmp_path / "blessing.json"
    for record in (blessing(), blessing(passed=True, reasons=(), incumbent=None)):
        write_blessing(path, record)
        assert read_blessing(path) == record
    assert json.loads(path.read_text()) == {
        "schema_version": 1,
        "passed": True,
        "reasons": [],
        "candidate": {"version": "tscac-ds1-s0", "policy_sha256": SHA},
        "incumbent": None,
        "estimator": "snips",
        "interval_method": "bca",
        "data_manifest": {"version": "logs-7", "rows": 120_000},
        "created_at": "2026-11-30T07:00:00Z",
    }


def _set(key: str, value):
    return lambda record: record.update({key: value})


def _drop(key: str):
    return lambda record: record.pop(key)


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        pytest.param(_drop("estimator"), r"missing \['estimator'\], unknown \[\]", id="missing-key"),
        pytest.param(_set("score", 1.0), r"missing \[\], unknown \['score'\]", id="unknown-key"),
        pytest.param(_set("schema_version", 2), "schema_version should be 1, but is 2", id="schema"),
        pytest.param(_set("passed", "yes"), "passed should be true or false, but is 'yes'", id="passed"),
        pytest.param(_set("reasons", "ESS"), "reasons should be a list of strings", id="reasons"),
        pytest.param(_set("reasons", []), "should say why a failed blessing failed", id="no-reasons"),
        pytest.param(
            _set("candidate", {"version": "v", "policy_sha256": "AB" * 32}),
            "candidate.policy_sha256 should be 64 lowercase hex digits",
            id="sha",
        ),
        pytest.param(
            _set("incumbent", {"version": "v"}), "incumbent should be {version, policy_sha256}", id="ref"
        ),
        pytest.param(_set("interval_method", ""), "interval_method should be a non-empty string", id="empty"),
        pytest.param(_set("data_manifest", []), "data_manifest should be a mapping", id="manifest"),
        pytest.param(_set("created_at", "yesterday"), "created_at should be an ISO 8601 time", id="time"),
    ],
)
def test_read_refuses_a_record_off_the_schema_naming_file_and_key(
    tmp_path: Path, spoil, message: str
) -> None:
    path = tmp_path / "blessing.json"
    write_blessing(path, blessing())
    record = json.loads(path.read_text())
    spoil(record)
    path.write_text(json.dumps(record))
    with pytest.raises(BlessingError, match=f"{path} is not a valid blessing: .*{message}"):
        read_blessing(path)


def test_read_names_a_missing_or_unparsable_file(tmp_path: Path) -> None:
    with pytest.raises(BlessingError, match=f"{tmp_path} has no blessing.json"):
        read_blessing(tmp_path / "blessing.json")
    (tmp_path / "blessing.json").write_text('{"passed": tr')
    with pytest.raises(BlessingError, match=r"blessing\.json is not valid JSON"):
        read_blessing(tmp_path / "blessing.json")


def test_the_gate_cannot_build_an_invalid_blessing() -> None:
    with pytest.raises(TypeError, match="passed should be true or false, but is 1"):
        blessing(passed=1)
    with pytest.raises(ValueError, match="should say why a failed blessing failed"):
        blessing(reasons=())
    with pytest.raises(ValueError, match="policy_sha256 should be 64 lowercase hex digits, but is 'abc'"):
        PolicyRef("v", "abc")
