"""What identifies an exported policy on disk, checked by hashing alone, without loading TensorFlow.

The registry stores and verifies policies and the gate names them by digest; neither needs the model
itself, so these facts live apart from ``recsys_rl.training.agents.policy_io`` (which exports and loads).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

POLICY_MANIFEST = "policy.json"


def policy_digest(directory: str | Path) -> str:
    """One sha256 for a whole exported policy: that of its ``policy.json``, which lists every file's sha256.

    Blessings and the registry name a policy by it, so a blessing cannot be reused for other weights.
    """
    return hashlib.sha256((Path(directory) / POLICY_MANIFEST).read_bytes()).hexdigest()


def file_digests(directory: Path) -> dict[str, str]:
    digests = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != POLICY_MANIFEST):
        digests[str(path.relative_to(directory))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def mismatched_policy_files(directory: str | Path, manifest: dict[str, Any]) -> list[str]:
    """Files where ``directory`` and the sha256 list of ``manifest`` disagree: changed, missing or unlisted.

    Empty when the directory is exactly what was exported. Checking needs only hashing, not loading the
    SavedModel: the model registry verifies every copy it stores this way.
    """
    actual = file_digests(Path(directory))
    listed = manifest.get("sha256", {})
    return sorted({name for name, _ in set(actual.items()) ^ set(listed.items())})
