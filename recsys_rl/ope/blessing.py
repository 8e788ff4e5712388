"""The blessing record: the rollout gate's verdict on one exported policy, bound to its weights by digest.

The OPE gate writes ``blessing.json`` beside its report; the model registry (``recsys_rl.registry``)
reads it when the report is attached to a version and again on every promotion. Both go through this
module, so one piece of code writes and checks the schema::

    {"schema_version": 1,
     "passed": bool,
     "reasons": [str, ...],                      # why it failed; a failed blessing must give at least one
     "candidate": {"version": str, "policy_sha256": str},
     "incumbent": {"version": str, "policy_sha256": str} | null,
     "estimator": str, "interval_method": str,
     "data_manifest": {...},                     # the logged dataset the evaluation read
     "created_at": str}                          # ISO 8601, UTC

``policy_sha256`` is ``recsys_rl.training.agents.policy_io.policy_digest`` of the evaluated policy directory:
the sha256 of its ``policy.json``, which lists the sha256 of every file. The registry refuses a blessing whose
candidate digest is not that of the version's policy, so a verdict cannot be carried over to other weights
under a reused version name. Unknown keys are refused rather than ignored: a record that a promotion rests on
should not carry fields nobody checks.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recsys_rl.atomic_json import read_json_file, write_json_atomic
from recsys_rl.errors import OperationalError

BLESSING_SCHEMA_VERSION = 1
_SHA256 = re.compile(r"[0-9a-f]{64}")


class BlessingError(OperationalError):
    """A blessing file that is missing, unparsable, or not of the blessing schema."""


def utc_now() -> str:
    """The timestamp format of blessings, registry manifests and the audit log (seconds, UTC)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass(frozen=True)
class PolicyRef:
    """One policy as the gate saw it: a version name, and the digest that actually identifies it."""

    version: str
    policy_sha256: str

    def __post_init__(self) -> None:
        if not isinstance(self.version, str) or not self.version:
            raise ValueError(f"version should be a non-empty string, but is {self.version!r}")
        if not isinstance(self.policy_sha256, str) or not _SHA256.fullmatch(self.policy_sha256):
            raise ValueError(
                f"policy_sha256 should be 64 lowercase hex digits, but is {self.policy_sha256!r}"
            )

    def to_dict(self) -> dict[str, str]:
        return {"version": self.version, "policy_sha256": self.policy_sha256}


@dataclass(frozen=True)
class Blessing:
    passed: bool
    reasons: tuple[str, ...]
    candidate: PolicyRef
    incumbent: PolicyRef | None
    estimator: str
    interval_method: str
    data_manifest: Mapping[str, Any]
    created_at: str = field(default_factory=utc_now)

    def __post_init__(self) -> None:
        if not isinstance(self.passed, bool):
            raise TypeError(f"passed should be true or false, but is {self.passed!r}")
        if not isinstance(self.reasons, tuple | list) or not all(isinstance(r, str) for r in self.reasons):
            raise TypeError(f"reasons should be a list of strings, but is {self.reasons!r}")
        object.__setattr__(self, "reasons", tuple(self.reasons))
        if not self.passed and not self.reasons:
            raise ValueError("reasons should say why a failed blessing failed, but are empty")
        for name in ("candidate", "incumbent"):
            value = getattr(self, name)
            if not isinstance(value, PolicyRef) and not (name == "incumbent" and value is None):
                raise TypeError(f"{name} should be a PolicyRef, but is {value!r}")
        for name in ("estimator", "interval_method"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name} should be a non-empty string, but is {getattr(self, name)!r}")
        if not isinstance(self.data_manifest, Mapping):
            raise TypeError(f"data_manifest should be a mapping, but is {self.data_manifest!r}")
        try:
            dt.datetime.fromisoformat(self.created_at)
        except (TypeError, ValueError):
            raise ValueError(f"created_at should be an ISO 8601 time, but is {self.created_at!r}") from None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": BLESSING_SCHEMA_VERSION,
            "passed": self.passed,
            "reasons": list(self.reasons),
            "candidate": self.candidate.to_dict(),
            "incumbent": None if self.incumbent is None else self.incumbent.to_dict(),
            "estimator": self.estimator,
            "interval_method": self.interval_method,
            "data_manifest": dict(self.data_manifest),
            "created_at": self.created_at,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Blessing:
        """The blessing a parsed ``blessing.json`` holds; ValueError/TypeError name the offending key."""
        if not isinstance(data, dict):
            raise TypeError(f"a blessing should be a JSON object, but is {type(data).__name__}")
        expected = {"schema_version"} | {f.name for f in dataclasses.fields(cls)}
        if set(data) != expected:
            missing, unknown = sorted(expected - set(data)), sorted(set(data) - expected)
            raise ValueError(f"keys should be {sorted(expected)}; missing {missing}, unknown {unknown}")
        if data["schema_version"] != BLESSING_SCHEMA_VERSION:
            raise ValueError(
                f"schema_version should be {BLESSING_SCHEMA_VERSION}, but is {data['schema_version']!r}"
            )
        fields = {k: v for k, v in data.items() if k != "schema_version"}
        for name in ("candidate", "incumbent"):
            fields[name] = _policy_ref(name, data[name])
        return cls(**fields)


def _policy_ref(name: str, value: Any) -> PolicyRef | None:
    if value is None and name == "incumbent":
        return None
    if not isinstance(value, dict) or set(value) != {"version", "policy_sha256"}:
        raise ValueError(f"{name} should be {{version, policy_sha256}}, but is {value!r}")
    try:
        return PolicyRef(**value)
    except ValueError as err:
        raise ValueError(f"{name}.{err}") from None


def write_blessing(path: str | Path, blessing: Blessing) -> None:
    """Write ``blessing`` as ``path`` atomically: the registry never reads half a verdict."""
    write_json_atomic(path, blessing.to_dict())


def read_blessing(path: str | Path) -> Blessing:
    """The blessing at ``path``; BlessingError names the file and what is wrong with it."""
    data = read_json_file(path, BlessingError, "no blessing from the OPE gate")
    try:
        return Blessing.from_dict(data)
    except (TypeError, ValueError) as err:
        raise BlessingError(f"{path} is not a valid blessing: {err}") from None
