"""``routing.json`` of one surface: which version holds each role, as one validated record.

Kept apart from ``routing`` (which decides the changes and resolves it to versions) because registering
and attaching evidence also read it, to refuse changes under a version that serves, and attaching a
refused blessing to a first-exposure canary also writes it (``write_routing``, one write for both).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recsys_rl.atomic_json import read_json_file, write_json_atomic
from recsys_rl.ope.blessing import utc_now
from recsys_rl.registry.audit import append_audit
from recsys_rl.registry.layout import (
    ROLES,
    ROUTING_FILE,
    SCHEMA_VERSION,
    RegistryError,
    check_fraction,
    check_surface,
    open_registry,
)


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


def read_routing(registry: str | Path, surface: str) -> RoutingState:
    """The routing of ``surface``; one that was never written routes nothing (revision 0)."""
    path = open_registry(registry) / check_surface(surface) / ROUTING_FILE
    if not path.exists():
        return RoutingState()
    return RoutingState.from_dict(read_json_file(path, RegistryError, "no routing"), path)


def write_routing(
    root: Path,
    surface: str,
    before: RoutingState,
    after: RoutingState,
    action: str,
    actor: str | None,
    **audit: Any,
) -> RoutingState:
    """Write ``after`` over ``before`` as the next revision and audit it; the caller holds the lock."""
    after = dataclasses.replace(after, revision=before.revision + 1, updated_at=utc_now())
    path = root / surface / ROUTING_FILE
    try:
        write_json_atomic(path, after.to_dict())
    except OSError as err:
        raise RegistryError(f"cannot write {path}: {err}") from err
    append_audit(root, action, surface, actor, before=before.to_dict(), after=after.to_dict(), **audit)
    return after
