"""Which policy answers whom, and hot reload of the registry's routing without failing requests.

The server's side of routing: the registry's side (``recsys_rl.registry.routing``) writes
``routing.json`` and resolves it to versions; this module polls that and picks a policy per request.

A ``ServingSet`` is an immutable snapshot of one surface's loaded policies. Requests read the current
snapshot once and use it to the end, and a reload builds the next snapshot completely before swapping
the reference, so a request in flight during a reload finishes on the policies it started with.

Reload rules (DESIGN 9): stable and canary must be blessed (or, for a canary, hold an approved first
exposure within its share: ``recsys_rl.registry.exposure``) and load cleanly (files match their
sha256 list, the SavedModel loads); otherwise the whole new revision is refused, the previous snapshot
keeps serving and the refusal is remembered, so a corrupt artifact is not reloaded on every poll. A
shadow that cannot load is left out (it is never served). When nothing has ever loaded, the
surface's deterministic fallback policy answers, under the ``fallback`` arm.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from recsys_rl.errors import OperationalError
from recsys_rl.registry import Routing, VersionInfo, arm_for_user, read_routing, resolve_routing
from recsys_rl.serving.policies import Decider

#: Loads a policy directory of a registry version into a Decider; raises OperationalError if it cannot.
Loader = Callable[[Path, str], Decider]


@dataclass(frozen=True)
class ServingSet:
    """One surface's loaded policies; ``revision`` -1: nothing from the registry (fallback only).

    ``since_ms``: when it started serving (Unix ms), for the Status RPC.
    """

    fallback: Decider
    since_ms: int
    revision: int = -1
    stable: Decider | None = None
    canary: Decider | None = None
    canary_fraction: float = 0.0
    shadow: Decider | None = None

    def route(self, user_id: str) -> tuple[str, Decider]:
        """The arm and policy that serve ``user_id``: canary for its hashed share, else stable, else the
        fallback (a user_author canary may split traffic with the fallback: the ranking without a term)."""
        if self.canary is not None and arm_for_user(user_id, self.canary_fraction) == "canary":
            return "canary", self.canary
        if self.stable is None:
            return "fallback", self.fallback
        return "stable", self.stable


@dataclass
class ReloadStatus:
    revision_seen: int | None = None  # the routing revision last read (applied or refused)
    last_error: str | None = None  # why it was refused, or why its shadow was left out


class PolicyHolder:
    """The current ServingSet of one surface, refreshed from the registry's routing.json."""

    def __init__(
        self,
        registry: Path | None,
        surface: str,
        loader: Loader,
        fallback: Decider,
        on_reload: Callable[[str, str, str | None], None] = lambda surface, outcome, error: None,
    ) -> None:
        self._registry = registry
        self.surface = surface
        self._loader = loader
        self._on_reload = on_reload  # (surface, "applied" | "refused" | "failed", error)
        self._lock = threading.Lock()  # one refresh at a time (the watcher and the admin Reload)
        self.current = ServingSet(fallback, _now_ms())
        self.status = ReloadStatus()

    def refresh(self, *, force: bool = False) -> bool:
        """Apply the routing if its revision is new (or ``force``); True if the snapshot changed."""
        if self._registry is None:
            return False
        with self._lock:
            try:
                if (
                    not force
                    and read_routing(self._registry, self.surface).revision == self.status.revision_seen
                ):
                    return False
                routing = resolve_routing(self._registry, self.surface)
            except (OperationalError, OSError, ValueError) as err:
                return self._refused(None, f"cannot read the routing of {self.surface}: {err}", "failed")
            try:
                new, shadow_error = self._load(routing)
            except OperationalError as err:
                return self._refused(routing.revision, str(err), "refused")
            self.current = new
            self.status.revision_seen, self.status.last_error = routing.revision, shadow_error
            self._on_reload(self.surface, "applied", shadow_error)
            return True

    def _refused(self, revision: int | None, error: str, outcome: str) -> bool:
        if revision is None and error == self.status.last_error:
            return False  # the same unreadable routing as at the last poll: reported once, not every poll
        if revision is not None:
            self.status.revision_seen = revision
        self.status.last_error = error
        self._on_reload(self.surface, outcome, error)
        return False

    def _load(self, routing: Routing) -> tuple[ServingSet, str | None]:
        """The snapshot ``routing`` asks for (versions loaded already are reused), and a shadow's error."""
        old = self.current
        loaded = {d.version: d for d in (old.stable, old.canary, old.shadow) if d is not None}

        def load(info: VersionInfo | None, role: str) -> Decider | None:
            if info is None:
                return None
            if role != "shadow" and (why := info.why_not_servable(role, routing.canary_fraction)):
                raise OperationalError(f"{role} version {info.version} of {self.surface} cannot serve: {why}")
            if info.defects:
                raise OperationalError(
                    f"{role} version {info.version} of {self.surface}: {'; '.join(info.defects)}"
                )
            return loaded.get(info.version) or self._loader(info.policy_dir, info.version)

        stable = load(routing.stable, "stable")
        canary = load(routing.canary, "canary")
        shadow_error = None
        try:
            shadow = load(routing.shadow, "shadow")
        except OperationalError as err:
            shadow, shadow_error = None, f"shadow left out: {err}"
        new = ServingSet(
            old.fallback, _now_ms(), routing.revision, stable, canary, routing.canary_fraction, shadow
        )
        return new, shadow_error


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class RoutingWatcher:
    """Polls every holder's routing on a thread; a failed poll is reported by the holder and retried."""

    def __init__(self, holders: list[PolicyHolder], interval_s: float) -> None:
        self._holders = holders
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="routing-watcher", daemon=True)

    def start(self) -> None:
        with self._lock:
            if not self._stop.is_set():  # a server stopped during its first load never starts polling
                self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            for holder in self._holders:
                holder.refresh()

    def stop(self) -> None:
        with self._lock:
            self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10.0)
