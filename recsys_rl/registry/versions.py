"""Policy versions: register an exported policy, attach its OPE evidence or a first-exposure approval,
list and read them back.

A version directory is assembled under ``.staging/`` and renamed into ``versions/`` in one step, so it is
listed whole or not at all, and its policy never changes afterwards.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from recsys_rl.atomic_json import read_json_file, write_json_atomic
from recsys_rl.ope.blessing import Blessing, BlessingError, read_blessing, utc_now
from recsys_rl.registry.audit import append_audit, locked, new_staging
from recsys_rl.registry.exposure import ExposureApproval, read_exposure
from recsys_rl.registry.layout import (
    ATTACHMENTS,
    BLESSING_FILE,
    EXPOSURE_FILE,
    FIRST_EXPOSURE_SURFACES,
    SCHEMA_VERSION,
    SERVING_ROLES,
    VERSION_MANIFEST,
    RegistryError,
    check_surface,
    check_version_name,
    open_registry,
    versions_path,
)
from recsys_rl.registry.policy_files import POLICY_MANIFEST, mismatched_policy_files, policy_digest
from recsys_rl.registry.routing_file import read_routing, write_routing

T = TypeVar("T")


@dataclass(frozen=True)
class VersionInfo:
    """One registered version, with its blessing and what, if anything, is wrong with it."""

    surface: str
    version: str
    directory: Path
    manifest: dict[str, Any]
    blessing: Blessing | None
    defects: tuple[str, ...]  # unfit for any role: a changed policy.json, a bad or foreign blessing
    exposure: ExposureApproval | None = None  # a first exposure approved before the gate could judge it

    @property
    def policy_dir(self) -> Path:
        return self.directory / self.manifest["policy"]["path"]

    @property
    def policy_sha256(self) -> str:
        return self.manifest["policy"]["sha256"]

    @property
    def blessed(self) -> bool:
        return self.why_not_blessed is None

    @property
    def why_not_blessed(self) -> str | None:
        if self.defects:
            return "; ".join(self.defects)
        if self.blessing is None:
            return "no OPE report and blessing attached"
        if not self.blessing.passed:
            return "the OPE gate refused it: " + "; ".join(self.blessing.reasons)
        return None

    def why_not_servable(self, role: str, canary_fraction: float = 0.0) -> str | None:
        """Why this version cannot take ``role`` (None: it can), by the registry's and the server's rule.

        Stable and canary need a blessing; a canary of a version the gate has not judged yet may stand on
        its first-exposure approval instead, within the share of users it approves. Shadow, never served,
        needs only a version without defects.
        """
        if role not in SERVING_ROLES:
            return "; ".join(self.defects) or None
        why = self.why_not_blessed
        if why is None or role != "canary" or self.defects or self.blessing is not None:
            return why
        if self.exposure is None:
            return why + (
                " (a version the gate cannot judge yet can serve a capped canary once its first exposure "
                "is approved: registry approve-exposure)"
                if self.surface in FIRST_EXPOSURE_SURFACES
                else ""
            )
        if canary_fraction > self.exposure.max_canary_fraction:
            return (
                f"its first exposure is approved for at most {self.exposure.max_canary_fraction:.1%} of "
                f"users, not {canary_fraction:.1%}"
            )
        return None

    def changed_policy_files(self) -> list[str]:
        """Stored policy files that differ from the sha256 list of its ``policy.json``: hashes every file.

        ``defects`` checks only ``policy.json`` itself (cheap enough for every listing); a role change
        checks the files too, so weights overwritten after blessing are refused before they serve.
        """
        listed = read_json_file(self.policy_dir / POLICY_MANIFEST, RegistryError, "not an exported policy")
        return mismatched_policy_files(self.policy_dir, listed)

    def attachment(self, key: str) -> Path | None:
        """The attached file ``key`` of ``ATTACHMENTS`` names, if this version has it."""
        return self.directory / self.manifest[key] if key in self.manifest else None


def load_version(surface: str, directory: Path) -> VersionInfo:
    path = directory / VERSION_MANIFEST
    manifest = read_json_file(path, RegistryError, "not a registry version")
    try:
        name, created_at, digest = manifest["version"], manifest["created_at"], manifest["policy"]["sha256"]
        policy_json = directory / manifest["policy"]["path"] / POLICY_MANIFEST
    except (KeyError, TypeError):
        raise RegistryError(f"{path} is not the manifest of a registry version") from None
    if not all(isinstance(value, str) for value in (name, created_at, digest)):
        raise RegistryError(f"{path} is not the manifest of a registry version")
    defects = []
    try:
        actual = policy_digest(policy_json.parent)
    except FileNotFoundError:
        defects.append(f"{policy_json} is missing")
    else:
        if actual != digest:
            defects.append(
                f"{policy_json} changed after registration (sha256 {actual[:12]}, not {digest[:12]})"
            )
    blessing = _attached(directory, manifest, "blessing", _read_blessing, "blesses", digest, defects)
    exposure = _attached(directory, manifest, "exposure", _read_exposure, "approves", digest, defects)
    return VersionInfo(surface, name, directory, manifest, blessing, tuple(defects), exposure)


def _attached(
    directory: Path,
    manifest: dict[str, Any],
    key: str,
    read: Callable[[Path], tuple[T, str]],
    verb: str,
    digest: str,
    defects: list[str],
) -> T | None:
    """The record attached under ``key`` (a blessing, an exposure approval), or None; one that cannot be
    read or that names other weights than ``digest`` adds to ``defects``.

    Only a record the manifest points at counts: a write puts the file first and the manifest last, so a
    file without the pointer is one whose write was cut short.
    """
    if key not in manifest:
        return None
    path = directory / manifest[key]
    try:
        record, weights = read(path)
    except (BlessingError, RegistryError) as err:
        defects.append(str(err))
        return None
    if weights != digest:
        defects.append(f"{path} {verb} policy sha256 {weights[:12]}, not this version's {digest[:12]}")
    return record


def _read_blessing(path: Path) -> tuple[Blessing, str]:
    blessing = read_blessing(path)
    return blessing, blessing.candidate.policy_sha256


def _read_exposure(path: Path) -> tuple[ExposureApproval, str]:
    exposure = read_exposure(path)
    return exposure, exposure.policy_sha256


def list_versions(registry: str | Path, surface: str) -> list[VersionInfo]:
    """Every version of ``surface``, oldest registration first."""
    versions_dir = versions_path(open_registry(registry), surface)
    if not versions_dir.is_dir():
        return []
    infos = [load_version(surface, d) for d in versions_dir.iterdir() if d.is_dir()]
    return sorted(infos, key=lambda info: (info.manifest["created_at"], info.version))


def get_version(registry: str | Path, surface: str, version: str) -> VersionInfo:
    versions_dir = versions_path(open_registry(registry), surface)
    directory = versions_dir / check_version_name(version)
    if not directory.is_dir():
        known = sorted(d.name for d in versions_dir.iterdir()) if versions_dir.is_dir() else []
        raise RegistryError(
            f"{surface} has no version {version!r} in {registry} (known: {', '.join(known) or 'none'})"
        )
    return load_version(surface, directory)


@dataclass(frozen=True)
class _PolicySource:
    policy_dir: Path
    run_dir: Path | None
    dataset_version: str | None
    policy_json: dict[str, Any]
    digest: str


def _read_source(run: str | Path | None, policy: str | Path | None) -> _PolicySource:
    if (run is None) == (policy is None):
        raise ValueError("give exactly one of run (a training run directory) and policy (a policy directory)")
    run_dir = dataset_version = listed_files = None
    if run is not None:
        run_dir = Path(run)
        manifest_path = run_dir / "manifest.json"
        manifest = read_json_file(manifest_path, RegistryError, "not a finished training run")
        entry = manifest.get("policy") if isinstance(manifest, dict) else None
        if not isinstance(entry, dict) or manifest.get("kind") != "training_run" or "path" not in entry:
            raise RegistryError(f"{manifest_path} is not the manifest of a training run with a policy")
        policy_dir = run_dir / entry["path"]
        dataset_version = (manifest.get("dataset") or {}).get("version")
        listed_files = entry.get("sha256")
    else:
        policy_dir = Path(policy)
    path = policy_dir / POLICY_MANIFEST
    policy_json = read_json_file(path, RegistryError, "not an exported policy")
    if not isinstance(policy_json, dict) or not isinstance(policy_json.get("sha256"), dict):
        raise RegistryError(f"{path} lists no sha256 of the policy's files: not an exported policy")
    if listed_files is not None and listed_files != policy_json["sha256"]:
        raise RegistryError(
            f"{policy_dir} is not the policy run {run_dir} exported: its files differ from the run's manifest"
        )
    return _PolicySource(policy_dir, run_dir, dataset_version, policy_json, policy_digest(policy_dir))


def _default_version(source: _PolicySource) -> str:
    """The policy's own version (algorithm, dataset, seed) and a short digest: readable and unique."""
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", str(source.policy_json.get("version") or "policy"))
    return f"{base.strip('._-')[:100] or 'policy'}-{source.digest[:12]}"


@dataclass(frozen=True)
class Registered:
    version: VersionInfo
    created: bool  # False: the same policy was already registered under this version
    attached: bool  # this call attached (or replaced) an OPE report and blessing


def register(
    registry: str | Path,
    surface: str,
    *,
    run: str | Path | None = None,
    policy: str | Path | None = None,
    version: str | None = None,
    report: str | Path | None = None,
    actor: str | None = None,
) -> Registered:
    """Copy a training run's policy (or a policy directory) into the registry as a new version.

    The copy is checked file by file against the sha256 list of its ``policy.json``. The version name
    defaults to ``_default_version``. Registering the same policy again under its version changes
    nothing; a different policy under a taken name, or the same policy under a second name, is refused.
    ``report``: a directory with ``report.json``, ``blessing.json`` and optionally ``report.html``, attached
    as by ``attach_report``.
    """
    check_surface(surface)
    source = _read_source(run, policy)
    declared = source.policy_json.get("surface")
    if declared not in (None, surface):
        raise RegistryError(f"{source.policy_dir} is a {declared} policy, not one for {surface}")
    name = check_version_name(version) if version is not None else _default_version(source)
    root = Path(registry)
    with locked(root):
        target = versions_path(root, surface) / name
        if target.exists():
            existing = load_version(surface, target)
            if existing.policy_sha256 != source.digest:
                raise RegistryError(
                    f"version {name} of {surface} already holds another policy (sha256 "
                    f"{existing.policy_sha256[:12]}, {source.policy_dir} has {source.digest[:12]}); "
                    "choose another version name"
                )
            attached = report is not None and _attach(root, surface, name, Path(report), actor)
            return Registered(load_version(surface, target), created=False, attached=attached)
        if target.parent.is_dir():
            for other in target.parent.iterdir():
                if load_version(surface, other).policy_sha256 == source.digest:
                    raise RegistryError(
                        f"{source.policy_dir} is already registered in {surface} as {other.name}"
                    )
        _create_version(root, surface, name, source, None if report is None else Path(report))
        append_audit(
            root,
            "register",
            surface,
            actor,
            version=name,
            policy_sha256=source.digest,
            source=str(source.policy_dir.resolve()),
            report=None if report is None else str(Path(report).resolve()),
        )
        return Registered(load_version(surface, target), created=True, attached=report is not None)


def _create_version(root: Path, surface: str, name: str, source: _PolicySource, report: Path | None) -> None:
    """Assemble the version under staging, then rename it into place: it appears whole or not at all."""
    staging = new_staging(root, surface)
    try:
        _copy_policy(source, staging / "policy")
        manifest = {
            "schema_version": SCHEMA_VERSION,
            "kind": "registry_version",
            "version": name,
            "surface": surface,
            "policy": {
                "path": "policy",
                "sha256": source.digest,
                "version": source.policy_json.get("version"),
            },
            "source": {
                "policy": str(source.policy_dir.resolve()),
                "run": None if source.run_dir is None else str(source.run_dir.resolve()),
            },
            "dataset_version": source.dataset_version,
            "created_at": utc_now(),
        }
        if report is not None:
            manifest.update(_stage_report(report, staging, source.digest)[0])
        write_json_atomic(staging / VERSION_MANIFEST, manifest)
        target = versions_path(root, surface) / name
        target.parent.mkdir(exist_ok=True)
        os.rename(staging, target)
    except OSError as err:
        raise RegistryError(f"cannot store version {name} of {surface} in {root}: {err}") from err
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _copy_policy(source: _PolicySource, target: Path) -> None:
    shutil.copytree(source.policy_dir, target)
    if policy_digest(target) != source.digest:
        raise RegistryError(
            f"{source.policy_dir / POLICY_MANIFEST} changed while it was copied; register it again"
        )

    changed = mismatched_policy_files(target, source.policy_json)
    if changed:
        raise RegistryError(
            f"{source.policy_dir} does not match its {POLICY_MANIFEST} ({', '.join(changed[:5])} differ); "
            "it is corrupt or was changed after export"
        )


def _stage_report(report_dir: Path, into: Path, digest: str) -> tuple[dict[str, str], Blessing]:
    """Check an OPE report directory and copy it into ``into``; returns its manifest entries and blessing.

    The blessing must name the policy with ``digest``: a verdict on other weights is refused. (The stored
    copy is checked again on every read, so a blessing rewritten between the check and the copy shows.)
    """
    blessing = read_blessing(report_dir / BLESSING_FILE)
    candidate = blessing.candidate
    if candidate.policy_sha256 != digest:
        raise RegistryError(
            f"{report_dir / BLESSING_FILE} blesses {candidate.version} (policy sha256 "
            f"{candidate.policy_sha256[:12]}), not this version's policy (sha256 {digest[:12]}); a blessing "
            "holds only for the weights the gate evaluated"
        )
    report = read_json_file(report_dir / "report.json", RegistryError, "not an OPE report directory")
    if not isinstance(report, dict):
        raise RegistryError(
            f"{report_dir / 'report.json'} should hold a JSON object, but holds {report!r:.40}"
        )
    sources = {"blessing": BLESSING_FILE, "ope_report": "report.json", "ope_report_html": "report.html"}
    entries = {}
    for key, name in sources.items():
        if (report_dir / name).is_file():
            (into / ATTACHMENTS[key]).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(report_dir / name, into / ATTACHMENTS[key])
            entries[key] = ATTACHMENTS[key]
    return entries, blessing


def attach_report(
    registry: str | Path, surface: str, version: str, report: str | Path, *, actor: str | None = None
) -> bool:
    """Attach an OPE report and blessing (a directory as ``register`` takes) to ``version``.

    Returns False when the same report and blessing are attached already. The files go in one by one,
    the blessing last of them, and then the manifest that points at them: an attach cut short leaves a
    first attachment unseen, and a replaced blessing either old or new, never half written. A refused
    blessing attached to a version that serves as canary on its first exposure (the only way a version
    without a blessing serves) also clears the canary, audited as a demotion: the gate has spoken.
    """
    root = open_registry(registry)
    with locked(root):
        return _attach(root, check_surface(surface), version, Path(report), actor)


def _attach(root: Path, surface: str, version: str, report_dir: Path, actor: str | None) -> bool:
    info = get_version(root, surface, version)
    staging = new_staging(root, surface)
    try:
        entries, blessing = _stage_report(report_dir, staging, info.policy_sha256)
        current = {k: p.read_bytes() for k in ATTACHMENTS if (p := info.attachment(k)) and p.is_file()}
        if current == {k: (staging / rel).read_bytes() for k, rel in entries.items()}:
            return False
        role = read_routing(root, surface).role_of(version)
        if info.blessing is not None and role in SERVING_ROLES:
            raise RegistryError(
                f"version {version} of {surface} serves as {role}: its blessing cannot be replaced while it "
                "serves; roll it back or demote it first"
            )
        for rel in sorted(entries.values(), key=lambda rel: rel == BLESSING_FILE):
            (info.directory / rel).parent.mkdir(exist_ok=True)
            os.replace(staging / rel, info.directory / rel)
        manifest = {k: v for k, v in info.manifest.items() if k not in ATTACHMENTS} | entries
        write_json_atomic(info.directory / VERSION_MANIFEST, manifest)
        if "ope_report_html" not in entries:  # a replaced report that came without one
            (info.directory / ATTACHMENTS["ope_report_html"]).unlink(missing_ok=True)
    except OSError as err:
        raise RegistryError(f"cannot attach {report_dir} to version {version} of {surface}: {err}") from err
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    report = str(report_dir.resolve())
    append_audit(root, "attach", surface, actor, version=version, report=report, passed=blessing.passed)
    if role == "canary" and not blessing.passed:  # a first exposure the gate has now refused stops serving
        routing = read_routing(root, surface)
        cleared = dataclasses.replace(routing, canary=None, canary_fraction=0.0)
        write_routing(root, surface, routing, cleared, "demote", actor, version=version, role="canary")
    return True


def approve_exposure(
    registry: str | Path,
    surface: str,
    version: str,
    *,
    max_canary_fraction: float,
    reason: str,
    actor: str | None = None,
) -> bool:
    """Approve the first exposure of ``version``, which the gate has not judged (``registry.exposure``).

    Only on ``FIRST_EXPOSURE_SURFACES``, only for a version without a report (once the gate has spoken,
    its verdict decides), with a reason, for at most ``max_canary_fraction`` of users. Returns False when
    the same approval is there already. Lowering the cap below the share the version serves as canary is
    refused: lower the canary's share first.
    """
    check_surface(surface)
    if surface not in FIRST_EXPOSURE_SURFACES:
        raise RegistryError(
            f"a first exposure is for surfaces the gate cannot judge before they serve "
            f"({', '.join(FIRST_EXPOSURE_SURFACES)}); {surface} versions are judged on the logs there are"
        )
    root = open_registry(registry)
    with locked(root):
        info = get_version(root, surface, version)
        approval = ExposureApproval(
            policy_sha256=info.policy_sha256,
            max_canary_fraction=max_canary_fraction,
            reason=reason,
            actor=actor or os.environ.get("USER") or "unknown",
            approved_at=utc_now(),
        )
        problem = "; ".join(info.defects) or None
        if problem is None and info.blessing is not None:
            verdict = "blessed it: promote it" if info.blessing.passed else "refused it"
            problem = f"the OPE gate has judged it already and {verdict}"
        if problem is None and (changed := info.changed_policy_files()):
            problem = f"its policy files changed after registration: {', '.join(changed[:5])}"
        routing = read_routing(root, surface)
        if problem is None and routing.canary == version and routing.canary_fraction > max_canary_fraction:
            problem = (
                f"it serves {routing.canary_fraction:.1%} of users as canary, more than "
                f"{max_canary_fraction:.1%}; lower the canary's share first"
            )
        if problem:
            raise RegistryError(
                f"cannot approve the first exposure of version {version} of {surface}: {problem}"
            )
        old = info.exposure
        if old is not None and (old.max_canary_fraction, old.reason) == (max_canary_fraction, reason):
            return False
        try:
            write_json_atomic(info.directory / EXPOSURE_FILE, approval.to_dict())
            write_json_atomic(info.directory / VERSION_MANIFEST, {**info.manifest, "exposure": EXPOSURE_FILE})
        except OSError as err:
            raise RegistryError(f"cannot approve the first exposure of version {version}: {err}") from err
        append_audit(
            root,
            "approve_exposure",
            surface,
            actor,
            version=version,
            max_canary_fraction=max_canary_fraction,
            reason=reason,
        )
        return True
