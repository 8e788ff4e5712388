"""Tiny stand-ins for exported policies, training runs and OPE report directories, for registry tests.

A fake policy is a few random files and a ``policy.json`` listing their sha256, exactly the contract the
registry checks, so the tests need no TensorFlow model.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from recsys_rl.ope.blessing import Blessing, PolicyRef, write_blessing

POLICY_FILES = ("saved_model.pb", "variables/variables.index", "variables/variables.data-00000-of-00001")


def digest_of(policy_dir: Path) -> str:
    return hashlib.sha256((policy_dir / "policy.json").read_bytes()).hexdigest()


def make_policy(directory: Path, seed: int, *, version: str = "tscac-ds1-s0", surface: str = "feed") -> Path:
    rng = random.Random(seed)
    listed = {}
    for name in POLICY_FILES:
        data = rng.randbytes(64 + rng.randrange(512))
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
        listed[name] = hashlib.sha256(data).hexdigest()
    manifest = {
        "schema_version": 1,
        "kind": "feed_policy",
        "surface": surface,
        "version": version,
        "sha256": listed,
    }
    (directory / "policy.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return directory


def make_run(directory: Path, seed: int, *, dataset_version: str = "ds1") -> Path:
    """A finished training run: manifest.json naming its policy/ the way ``recsys_rl.training.train`` does."""
    policy = make_policy(directory / "policy", seed, version=f"tscac-{dataset_version}-s{seed}")
    listed = json.loads((policy / "policy.json").read_text())["sha256"]
    manifest = {
        "schema_version": 1,
        "kind": "training_run",
        "algo": "tscac",
        "dataset": {"path": "/data/ds", "version": dataset_version},
        "policy": {"path": "policy", "version": f"tscac-{dataset_version}-s{seed}", "sha256": listed},
    }
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


def make_report(
    directory: Path,
    policy_dir: Path,
    *,
    passed: bool = True,
    reasons: tuple[str, ...] = (),
    sha256: str | None = None,
    html: bool = True,
) -> Path:
    """An OPE gate output directory: report.json, blessing.json for ``policy_dir`` and maybe report.html."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "report.json").write_text(json.dumps({"estimator": "snips", "passed": passed}))
    if html:
        (directory / "report.html").write_text("<html><body>report</body></html>")
    blessing = Blessing(
        passed=passed,
        reasons=reasons,
        candidate=PolicyRef("candidate", sha256 or digest_of(policy_dir)),
        incumbent=None,
        estimator="snips",
        interval_method="bca",
        data_manifest={"version": "logs-1"},
    )
    write_blessing(directory / "blessing.json", blessing)
    return directory
