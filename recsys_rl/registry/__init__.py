"""The model registry: versioned policies per surface, the OPE evidence for each, and what is served.

Layout on a filesystem path (DESIGN 10)::

    REGISTRY/
      .lock                                 writers hold an exclusive flock on it, one at a time
      audit.jsonl                           one JSON line per write, all surfaces: time, actor, action, ...
      <surface>/                            feed or live_allocation
        routing.json                        stable, canary + canary_fraction, shadow, revision, ...
        versions/<version>/
          manifest.json                     version, surface, policy sha256, source run, dataset version
          policy/                           a verified copy of the exported policy
          ope/report.json, ope/report.html  the OPE report the gate judged, once attached
          blessing.json                     the gate's verdict (``recsys_rl.ope.blessing``), once attached
        .staging/                           writes in progress; never read, swept by the next writer

Readers take no lock and never see a partial write. A version directory is assembled under
``.staging/`` and renamed into ``versions/`` in one step, so it is listed whole or not at all, and its
policy never changes afterwards. ``routing.json``, manifests and attached files are written to a
temporary sibling and renamed over the old file. Writers serialise on ``.lock``. A writer killed midway
leaves debris only under ``.staging/`` (swept by the next writer) or in a temporary sibling: the
registry reads exactly as it did before. The server polls ``routing.json`` through
``resolve_routing`` and sees each revision whole.

Roles and blessings:

* stable and canary serve users, so they take only a *blessed* version: its blessing passed and names
  this version's weights (``candidate.policy_sha256`` is the digest of the stored ``policy.json``,
  which still has the digest recorded at registration).
* shadow is computed and logged but never served, so it also takes a version without a blessing or
  with a failed one: watching a candidate on live traffic is how evidence is gathered. It still refuses
  a version with defects (a blessing for other weights, a changed ``policy.json``), which mean tampering
  rather than missing evidence. ``resolve_routing`` reports ``blessed`` per role, so the server can
  hold to "serve only blessed versions" whatever the routing says.
* A version holds one role at a time: becoming stable takes it out of canary and shadow, becoming
  canary takes it out of shadow. A canary needs a stable version to split traffic with; users go to
  the canary by ``arm_for_user``, a hash of their id.
* ``routing.json`` keeps the earlier stable versions (``stable_history``): ``rollback`` returns to the
  last of them and drops it, so repeated rollbacks walk back through the releases.

An attached report and blessing can be replaced (the gate rerun on more data), except on a version that
serves as stable or canary: its evidence must not change under it. Identical repeats of ``register`` and
``attach_report`` change nothing and are not audited; every other write appends one audit line after it
commits (a writer killed between the two leaves the change unrecorded; the window is one rename long).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recsys_rl.atomic_json import read_json_file, write_json_atomic
from recsys_rl.errors import OperationalError
from recsys_rl.ope.blessing import Blessing, BlessingError, read_blessing, utc_now
from recsys_rl.registry.policy_files import POLICY_MANIFEST, mismatched_policy_files, policy_digest

SURFACES = ("feed", "live_allocation")
ROLES = ("stable", "canary", "shadow")
SERVING_ROLES = ("stable", "canary")
SCHEMA_VERSION = 1
VERSION_MANIFEST = "manifest.json"
ROUTING_FILE = "routing.json"
AUDIT_LOG = "audit.jsonl"
LOCK_FILE = ".lock"
STAGING = ".staging"
BLESSING_FILE = "blessing.json"
#: The manifest keys that point at attached files, and where the files go inside a version directory.
ATTACHMENTS = {
    "ope_report": "ope/report.json",
    "ope_report_html": "ope/report.html",
    "blessing": BLESSING_FILE,
}
#: A writer that cannot get the lock in this time fails with a message instead of hanging a job forever.
LOCK_TIMEOUT_S = 60.0
_VERSION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class RegistryError(OperationalError):
    """A registry operation that cannot be done as asked; the message names the surface, version or file."""


def check_surface(surface: str) -> str:
    if surface not in SURFACES:
        raise ValueError(f"surface should be one of {list(SURFACES)}, but is {surface!r}")
    return surface


def check_version_name(version: str) -> str:
    """Version names become directory names: letters, digits, '.', '_' and '-' only."""
    if not isinstance(version, str) or not _VERSION_NAME.fullmatch(version):
        raise ValueError(
            "a version should be 1 to 128 letters, digits, '.', '_' or '-', starting with a letter or digit, "
            f"but is {version!r}"
        )
    return version


def check_fraction(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise ValueError(f"canary_fraction should be a number in [0, 1], but is {value!r}")
    return float(value)


def arm_for_user(user_id: str, canary_fraction: float) -> str:
    """``"canary"`` for a ``canary_fraction`` share of user ids, ``"stable"`` for the rest.

    The arm comes from the sha256 of the id, its first 53 bits read as a number in [0, 1) (exactly, as a
    float): the same user lands on the same arm in every server process and after every restart (Python's
    ``hash()`` is salted per process), and raising the fraction only moves users from stable to canary,
    never back.
    """
    if not isinstance(user_id, str):
        raise TypeError(f"user_id should be a string, but is {type(user_id).__name__}")
    fraction = check_fraction(canary_fraction)
    point = (int.from_bytes(hashlib.sha256(user_id.encode()).digest()[:8], "big") >> 11) / 2.0**53
    return "canary" if point < fraction else "stable"


# --- reading ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RoutingState:
    """What ``routing.json`` says about one surface; ``revision`` counts its writes."""

    stable: str | None = None
    canary: str | None = None
    canary_fraction: float = 0.0
    shadow: str | None = None
    stable_history: tuple[str, ...] = ()  # earlier stable versions, oldest first: what rollback returns to
    revision: int = 0
    updated_at: str | None = None

    def role_of(self, version: str) -> str | None:
        return next((role for role in ROLES if getattr(self, role) == version), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            **dataclasses.asdict(self),
            "stable_history": list(self.stable_history),
        }

    @classmethod
    def from_dict(cls, data: Any, path: Path) -> RoutingState:
        def bad(what: str) -> RegistryError:
            return RegistryError(f"{path} is not a valid routing file: {what}")

        if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
            raise bad(f"it should be a JSON object with schema_version {SCHEMA_VERSION}")
        names = {f.name for f in dataclasses.fields(cls)}
        if set(data) != names | {"schema_version"}:
            raise bad(f"its keys should be {sorted(names)}, but are {sorted(set(data) - {'schema_version'})}")
        for role in ROLES:
            if data[role] is not None and not isinstance(data[role], str):
                raise bad(f"{role} should be a version name or null, but is {data[role]!r}")
        history = data["stable_history"]
        if not isinstance(history, list) or not all(isinstance(v, str) for v in history):
            raise bad(f"stable_history should be a list of version names, but is {history!r}")
        revision = data["revision"]
        if isinstance(revision, bool) or not isinstance(revision, int) or revision < 0:
            raise bad(f"revision should be a whole number >= 0, but is {revision!r}")
        try:
            check_fraction(data["canary_fraction"])
        except ValueError as err:
            raise bad(str(err)) from None
        fields = {k: v for k, v in data.items() if k != "schema_version"}
        fields.update(stable_history=tuple(history), canary_fraction=float(data["canary_fraction"]))
        return cls(**fields)


@dataclass(frozen=True)
class VersionInfo:
    """One registered version, with its blessing and what, if anything, is wrong with it."""

    surface: str
    version: str
    directory: Path
    manifest: dict[str, Any]
    blessing: Blessing | None
    defects: tuple[str, ...]  # unfit for any role: a changed policy.json, a bad or foreign blessing

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

    def attachment(self, key: str) -> Path | None:
        """The attached file ``key`` of ``ATTACHMENTS`` names, if this version has it."""
        return self.directory / self.manifest[key] if key in self.manifest else None


def _open_registry(registry: str | Path) -> Path:
    root = Path(registry)
    if not root.is_dir():
        raise RegistryError(f"no registry at {root} (registering a policy creates one)")
    return root


def _versions_dir(root: Path, surface: str) -> Path:
    return root / check_surface(surface) / "versions"


def _load_version(surface: str, directory: Path) -> VersionInfo:
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
    blessing = None
    # Only a blessing the manifest points at counts: an attach writes the manifest last, so a blessing
    # file without the pointer is one whose attach was cut short.
    if "blessing" in manifest:
        path = directory / manifest["blessing"]
        try:
            blessing = read_blessing(path)
        except BlessingError as err:
            defects.append(str(err))
        else:
            if blessing.candidate.policy_sha256 != digest:
                defects.append(
                    f"{path} blesses policy sha256 {blessing.candidate.policy_sha256[:12]}, not this "
                    f"version's {digest[:12]}"
                )
    return VersionInfo(surface, name, directory, manifest, blessing, tuple(defects))


def list_versions(registry: str | Path, surface: str) -> list[VersionInfo]:
    """Every version of ``surface``, oldest registration first."""
    versions_dir = _versions_dir(_open_registry(registry), surface)
    if not versions_dir.is_dir():
        return []
    infos = [_load_version(surface, d) for d in versions_dir.iterdir() if d.is_dir()]
    return sorted(infos, key=lambda info: (info.manifest["created_at"], info.version))


def get_version(registry: str | Path, surface: str, version: str) -> VersionInfo:
    versions_dir = _versions_dir(_open_registry(registry), surface)
    directory = versions_dir / check_version_name(version)
    if not directory.is_dir():
        known = sorted(d.name for d in versions_dir.iterdir()) if versions_dir.is_dir() else []
        raise RegistryError(
            f"{surface} has no version {version!r} in {registry} (known: {', '.join(known) or 'none'})"
        )
    return _load_version(surface, directory)


def read_routing(registry: str | Path, surface: str) -> RoutingState:
    """The routing of ``surface``; one that was never written routes nothing (revision 0)."""
    path = _open_registry(registry) / check_surface(surface) / ROUTING_FILE
    if not path.exists():
        return RoutingState()
    return RoutingState.from_dict(read_json_file(path, RegistryError, "no routing"), path)


@dataclass(frozen=True)
class Routing:
    """A surface's routing with each role's version resolved: what the server loads and serves."""

    surface: str
    revision: int
    canary_fraction: float
    stable: VersionInfo | None
    canary: VersionInfo | None
    shadow: VersionInfo | None

    def arm(self, user_id: str) -> str:
        """The arm that serves ``user_id``: canary for its share of users while there is a canary."""
        return "stable" if self.canary is None else arm_for_user(user_id, self.canary_fraction)


def resolve_routing(registry: str | Path, surface: str) -> Routing:
    """The routing of ``surface`` with the policy directory and blessing status of each role.

    Each ``VersionInfo`` says ``blessed``; the server should refuse to serve one that is not, whatever
    the routing says (shadow may hold an unblessed version, see the module docstring).
    """
    state = read_routing(registry, surface)

    def resolved(version: str | None) -> VersionInfo | None:
        return None if version is None else get_version(registry, surface, version)

    return Routing(
        surface,
        state.revision,
        state.canary_fraction,
        resolved(state.stable),
        resolved(state.canary),
        resolved(state.shadow),
    )


def read_audit(registry: str | Path, surface: str | None = None) -> list[dict[str, Any]]:
    """The audit records, oldest first (of ``surface`` only, if given).

    A line that does not parse is one a writer was killed in the middle of; it is skipped.
    """
    path = _open_registry(registry) / AUDIT_LOG
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return [r for r in records if surface is None or r.get("surface") == surface]


# --- writing ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """Hold the registry's write lock, after sweeping what writers killed earlier left in staging."""
    root.mkdir(parents=True, exist_ok=True)
    lock_path = root / LOCK_FILE
    with open(lock_path, "a") as handle:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise RegistryError(
                        f"{lock_path} is still held by another writer after {LOCK_TIMEOUT_S:g} s; try again "
                        "when it has finished"
                    ) from None
                time.sleep(0.05)
        try:
            for surface in SURFACES:
                shutil.rmtree(root / surface / STAGING, ignore_errors=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _new_staging(root: Path, surface: str) -> Path:
    staging = root / surface / STAGING / uuid.uuid4().hex
    staging.mkdir(parents=True)
    return staging


def _audit(root: Path, action: str, surface: str, actor: str | None, **fields: Any) -> None:
    record = {
        "time": utc_now(),
        "actor": actor or os.environ.get("USER") or "unknown",
        "action": action,
        "surface": surface,
        **fields,
    }
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    with open(root / AUDIT_LOG, "a+b") as log:
        size = log.seek(0, os.SEEK_END)
        if size:
            log.seek(size - 1)
            if log.read(1) != b"\n":  # a writer killed mid-line: start afresh so this record parses
                line = b"\n" + line
        log.write(line)


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
    with _locked(root):
        target = _versions_dir(root, surface) / name
        if target.exists():
            existing = _load_version(surface, target)
            if existing.policy_sha256 != source.digest:
                raise RegistryError(
                    f"version {name} of {surface} already holds another policy (sha256 "
                    f"{existing.policy_sha256[:12]}, {source.policy_dir} has {source.digest[:12]}); "
                    "choose another version name"
                )
            attached = report is not None and _attach(root, surface, name, Path(report), actor)
            return Registered(_load_version(surface, target), created=False, attached=attached)
        if target.parent.is_dir():
            for other in target.parent.iterdir():
                if _load_version(surface, other).policy_sha256 == source.digest:
                    raise RegistryError(
                        f"{source.policy_dir} is already registered in {surface} as {other.name}"
                    )
        _create_version(root, surface, name, source, None if report is None else Path(report))
        _audit(
            root,
            "register",
            surface,
            actor,
            version=name,
            policy_sha256=source.digest,
            source=str(source.policy_dir.resolve()),
            report=None if report is None else str(Path(report).resolve()),
        )
        return Registered(_load_version(surface, target), created=True, attached=report is not None)


def _create_version(root: Path, surface: str, name: str, source: _PolicySource, report: Path | None) -> None:
    """Assemble the version under staging, then rename it into place: it appears whole or not at all."""
    staging = _new_staging(root, surface)
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
        target = _versions_dir(root, surface) / name
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
    first attachment unseen, and a replaced blessing either old or new, never half written.
    """
    root = _open_registry(registry)
    with _locked(root):
        return _attach(root, check_surface(surface), version, Path(report), actor)


def _attach(root: Path, surface: str, version: str, report_dir: Path, actor: str | None) -> bool:
    info = get_version(root, surface, version)
    staging = _new_staging(root, surface)
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
    _audit(root, "attach", surface, actor, version=version, report=report, passed=blessing.passed)
    return True


@dataclass(frozen=True)
class RoutingChange:
    surface: str
    version: str | None  # the version whose role changed
    before: RoutingState
    after: RoutingState

    @property
    def changed(self) -> bool:
        return self.after.revision != self.before.revision


def _change_routing(
    registry: str | Path,
    surface: str,
    action: str,
    actor: str | None,
    edit: Callable[[Path, RoutingState], tuple[RoutingState, str]],
    **audit: Any,
) -> RoutingChange:
    """Apply ``edit`` to the routing under the lock; write and audit it unless it changed nothing.

    ``edit`` returns the new routing and the version whose role it changes.
    """
    root = _open_registry(registry)
    check_surface(surface)
    with _locked(root):
        before = read_routing(root, surface)
        after, version = edit(root, before)
        if after == before:
            return RoutingChange(surface, version, before, before)
        after = dataclasses.replace(after, revision=before.revision + 1, updated_at=utc_now())
        path = root / surface / ROUTING_FILE
        try:
            write_json_atomic(path, after.to_dict())
        except OSError as err:
            raise RegistryError(f"cannot write {path}: {err}") from err
        _audit(
            root,
            action,
            surface,
            actor,
            version=version,
            before=before.to_dict(),
            after=after.to_dict(),
            **audit,
        )
        return RoutingChange(surface, version, before, after)


def _require(info: VersionInfo, role: str) -> None:
    """Stable and canary need a blessed version; shadow only one without defects."""
    problem = info.why_not_blessed if role in SERVING_ROLES else "; ".join(info.defects) or None
    if problem:
        raise RegistryError(f"cannot make version {info.version} of {info.surface} {role}: {problem}")


def _with_stable(state: RoutingState, version: str, history: tuple[str, ...]) -> RoutingState:
    leaves_canary = state.canary == version
    return dataclasses.replace(
        state,
        stable=version,
        stable_history=history,
        canary=None if leaves_canary else state.canary,
        canary_fraction=0.0 if leaves_canary else state.canary_fraction,
        shadow=None if state.shadow == version else state.shadow,
    )


def promote(
    registry: str | Path,
    surface: str,
    version: str,
    to: str,
    *,
    canary_fraction: float | None = None,
    actor: str | None = None,
) -> RoutingChange:
    """Give ``version`` the role ``to`` (stable, canary with ``canary_fraction``, or shadow).

    Promoting to stable pushes the old stable onto the history ``rollback`` returns to.
    """
    if to not in ROLES:
        raise ValueError(f"to should be one of {list(ROLES)}, but is {to!r}")
    if (to == "canary") != (canary_fraction is not None):
        raise ValueError("canary_fraction goes with a promotion to canary, and only with one")
    fraction = None if canary_fraction is None else check_fraction(canary_fraction)

    def edit(root: Path, state: RoutingState) -> tuple[RoutingState, str]:
        info = get_version(root, surface, version)
        current = state.role_of(version)
        if current == to and (to != "canary" or state.canary_fraction == fraction):
            return state, version
        _require(info, to)
        if to == "stable":
            history = (*state.stable_history, state.stable) if state.stable else state.stable_history
            return _with_stable(state, version, history), version
        if current == "stable":
            raise RegistryError(f"version {version} of {surface} is stable; roll back before making it {to}")
        if to == "canary":
            if state.stable is None:
                raise RegistryError(
                    f"{surface} has no stable version for a canary to split traffic with; promote one to "
                    "stable first"
                )
            shadow = None if state.shadow == version else state.shadow
            return dataclasses.replace(
                state, canary=version, canary_fraction=fraction, shadow=shadow
            ), version
        if current == "canary":
            return dataclasses.replace(state, canary=None, canary_fraction=0.0, shadow=version), version
        return dataclasses.replace(state, shadow=version), version

    return _change_routing(registry, surface, "promote", actor, edit, to=to)


def rollback(
    registry: str | Path, surface: str, *, to: str | None = None, actor: str | None = None
) -> RoutingChange:
    """Make the previous stable version stable again (or ``to``, which must be blessed).

    Without ``to`` the history shrinks by one, so a second rollback goes one release further back; with
    ``to``, the current stable joins the history as on a promotion.
    """

    def edit(root: Path, state: RoutingState) -> tuple[RoutingState, str]:
        if state.stable is None:
            raise RegistryError(f"{surface} has no stable version to roll back")
        if to is None:
            if not state.stable_history:
                raise RegistryError(
                    f"{surface} has no earlier stable version than {state.stable} to roll back to; name the "
                    "version to roll back to"
                )
            target, history = state.stable_history[-1], state.stable_history[:-1]
        elif to == state.stable:
            raise RegistryError(f"version {to} of {surface} is already stable")
        else:
            target, history = to, (*state.stable_history, state.stable)
        _require(get_version(root, surface, target), "stable")
        return _with_stable(state, target, history), target

    return _change_routing(registry, surface, "rollback", actor, edit)


def demote(registry: str | Path, surface: str, role: str, *, actor: str | None = None) -> RoutingChange:
    """Clear the canary (its traffic returns to stable) or the shadow; the stable leaves by rollback."""
    if role not in ("canary", "shadow"):
        raise ValueError(f"role should be canary or shadow, but is {role!r}")

    def edit(root: Path, state: RoutingState) -> tuple[RoutingState, str]:
        version = getattr(state, role)
        if version is None:
            raise RegistryError(f"{surface} has no {role} version")
        cleared = {"canary": None, "canary_fraction": 0.0} if role == "canary" else {"shadow": None}
        return dataclasses.replace(state, **cleared), version

    return _change_routing(registry, surface, "demote", actor, edit, role=role)
