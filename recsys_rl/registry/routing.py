"""Which version serves whom: promote, roll back and demote, and the routing the server resolves.

The registry's side of routing: it writes ``routing.json`` and resolves it to versions. The server's side
(``recsys_rl.serving.routing``) polls what ``resolve_routing`` returns and picks a policy per request
with the same ``arm_for_user``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recsys_rl.registry.audit import locked
from recsys_rl.registry.layout import (
    FIRST_EXPOSURE_SURFACES,
    ROLES,
    RegistryError,
    check_fraction,
    check_surface,
    open_registry,
)
from recsys_rl.registry.routing_file import RoutingState, read_routing, write_routing
from recsys_rl.registry.versions import VersionInfo, get_version


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

    The server should refuse a version whose ``why_not_servable`` for its role is not None, whatever
    the routing says (shadow may hold an unblessed version, see the package docstring).
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
    root = open_registry(registry)
    check_surface(surface)
    with locked(root):
        before = read_routing(root, surface)
        after, version = edit(root, before)
        if after == before:
            return RoutingChange(surface, version, before, before)
        after = write_routing(root, surface, before, after, action, actor, version=version, **audit)
        return RoutingChange(surface, version, before, after)


def _require(info: VersionInfo, role: str, canary_fraction: float) -> None:
    """Stable and canary need a blessed version (a canary, or an approved first exposure within its
    share); shadow only one without defects; each its files intact."""
    problem = info.why_not_servable(role, canary_fraction)
    if problem is None and (changed := info.changed_policy_files()):
        problem = f"its policy files changed after registration: {', '.join(changed[:5])}"
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
        _require(info, to, fraction or 0.0)
        if to == "stable":
            history = (*state.stable_history, state.stable) if state.stable else state.stable_history
            return _with_stable(state, version, history), version
        if current == "stable":
            raise RegistryError(f"version {version} of {surface} is stable; roll back before making it {to}")
        if to == "canary":
            if state.stable is None and surface not in FIRST_EXPOSURE_SURFACES:
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
        _require(get_version(root, surface, target), "stable", 0.0)
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
