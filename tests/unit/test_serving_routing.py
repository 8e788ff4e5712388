"""Routing and reload: arms by user hash, refusals keep the previous policies, fallback when nothing loads."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from registry_fakes import make_report, make_run

from recsys_rl import registry
from recsys_rl.errors import OperationalError
from recsys_rl.registry import arm_for_user
from recsys_rl.serving.policies import feed_fallback
from recsys_rl.serving.routing import PolicyHolder, RoutingWatcher


class FakeLoader:
    """Stands in for the SavedModel loader; records what it loaded and can refuse named versions."""

    def __init__(self) -> None:
        self.loaded: list[str] = []
        self.policy_dirs: list[Path] = []
        self.refuse: set[str] = set()

    def __call__(self, policy_dir: Path, version: str):
        self.loaded.append(version)
        self.policy_dirs.append(policy_dir)
        if version in self.refuse:
            raise OperationalError(f"{policy_dir} does not match its manifest")
        decider = feed_fallback()
        return type(decider)(decider.policy, version)


def add_version(root: Path, tmp_path: Path, name: str, seed: int, *, blessed: bool = True) -> str:
    run = make_run(tmp_path / f"run-{name}", seed)
    reasons = () if blessed else ("watch_time: lift below the minimum",)
    report = make_report(tmp_path / f"report-{name}", run / "policy", passed=blessed, reasons=reasons)
    registry.register(root, "feed", run=run, report=report, version=name)
    return name


@pytest.fixture
def setup(tmp_path: Path):
    root = tmp_path / "registry"
    for i, name in enumerate(("v1", "v2", "v3")):
        add_version(root, tmp_path, name, seed=i)
    loader = FakeLoader()
    events: list[tuple[str, str, str | None]] = []
    holder = PolicyHolder(root, "feed", loader, feed_fallback(), lambda *e: events.append(e))
    return root, holder, loader, events


def test_nothing_routed_is_served_by_the_fallback(setup):
    _, holder, _, _ = setup
    holder.refresh()
    assert holder.current.route("u1") == ("fallback", holder.current.fallback)
    assert PolicyHolder(None, "feed", FakeLoader(), feed_fallback()).refresh() is False


def test_stable_then_canary_split_by_the_user_hash(setup):
    root, holder, loader, events = setup
    registry.promote(root, "feed", "v1", "stable")
    assert holder.refresh() and holder.current.route("u1")[1].version == "v1"
    assert holder.refresh() is False  # same revision: nothing to do
    registry.promote(root, "feed", "v2", "canary", canary_fraction=0.3)
    assert holder.refresh()
    users = [f"user-{i}" for i in range(400)]
    arms = [holder.current.route(u) for u in users]
    assert [arm for arm, _ in arms] == [arm_for_user(u, 0.3) for u in users]
    assert {arm: d.version for arm, d in arms} == {"stable": "v1", "canary": "v2"}
    assert 0.2 < sum(arm == "canary" for arm, _ in arms) / len(users) < 0.4
    assert loader.loaded == ["v1", "v2"]  # v1 was reused, not loaded again
    assert [outcome for _, outcome, _ in events] == ["applied", "applied"]


def test_a_policy_that_fails_to_load_is_refused_and_the_previous_keeps_serving(setup):
    root, holder, loader, events = setup
    registry.promote(root, "feed", "v1", "stable")
    holder.refresh()
    loader.refuse.add("v2")
    registry.promote(root, "feed", "v2", "stable")
    assert holder.refresh() is False
    assert holder.current.stable.version == "v1" and holder.current.revision == 1
    assert "does not match its manifest" in holder.status.last_error
    assert events[-1][1] == "refused"
    assert holder.refresh() is False and loader.loaded.count("v2") == 1  # not retried every poll
    registry.promote(root, "feed", "v3", "stable")  # the next revision is applied
    assert holder.refresh() and holder.current.stable.version == "v3"


def test_a_changed_artifact_is_refused_by_its_digest(setup):
    root, holder, loader, _ = setup
    registry.promote(root, "feed", "v1", "stable")
    holder.refresh()
    registry.promote(root, "feed", "v2", "stable")
    policy_json = root / "feed" / "versions" / "v2" / "policy" / "policy.json"
    policy_json.write_text(policy_json.read_text() + " ")
    assert holder.refresh() is False and holder.current.stable.version == "v1"
    assert "changed after registration" in holder.status.last_error and "v2" not in loader.loaded


def test_an_unblessed_version_is_never_served_but_may_shadow(setup, tmp_path):
    root, holder, _, _ = setup
    add_version(root, tmp_path, "v4", seed=4, blessed=False)
    registry.promote(root, "feed", "v1", "stable")
    registry.promote(root, "feed", "v4", "shadow")
    assert holder.refresh() and holder.current.shadow.version == "v4"
    assert holder.current.route("u1")[0] == "stable"
    # a routing file edited by hand to serve it is refused
    routing_path = root / "feed" / "routing.json"
    routing = json.loads(routing_path.read_text())
    routing.update(stable="v4", shadow=None, revision=routing["revision"] + 1)
    routing_path.write_text(json.dumps(routing))
    assert holder.refresh() is False and holder.current.stable.version == "v1"
    assert "stable version v4 of feed cannot serve: the OPE gate refused it" in holder.status.last_error


def test_a_shadow_that_fails_to_load_is_left_out(setup):
    root, holder, loader, _ = setup
    loader.refuse.add("v2")
    registry.promote(root, "feed", "v1", "stable")
    registry.promote(root, "feed", "v2", "shadow")
    assert holder.refresh()
    assert holder.current.stable.version == "v1" and holder.current.shadow is None
    assert holder.status.last_error.startswith("shadow left out")


def test_an_unreadable_routing_file_keeps_the_current_set(setup):
    root, holder, _, events = setup
    registry.promote(root, "feed", "v1", "stable")
    holder.refresh()
    (root / "feed" / "routing.json").write_text("{not json")
    assert holder.refresh() is False and holder.current.stable.version == "v1"
    assert events[-1][1] == "failed"


def edit_routing(root: Path, **roles) -> None:
    """A routing.json edited by hand (what the registry's promote refuses to write), as a new revision."""
    path = root / "feed" / "routing.json"
    routing = json.loads(path.read_text())
    routing.update(roles, revision=routing["revision"] + 1)
    path.write_text(json.dumps(routing))


def test_the_fallback_answers_until_a_stable_is_routed_and_is_kept_across_reloads(setup):
    root, _, loader, _ = setup
    fallback = feed_fallback()
    holder = PolicyHolder(root, "feed", loader, fallback)
    assert holder.current.route("u1") == ("fallback", fallback) and holder.current.revision == -1
    registry.promote(root, "feed", "v2", "shadow")  # a shadow is never served: still the fallback
    assert holder.refresh() and holder.current.shadow.version == "v2"
    assert holder.current.route("u1")[0] == "fallback" and holder.current.route("u1")[1] is fallback
    registry.promote(root, "feed", "v1", "stable")
    assert holder.refresh() and holder.current.route("u1")[1].version == "v1"
    assert holder.current.fallback is fallback


def test_each_snapshot_says_since_when_it_serves_in_unix_ms(setup):
    root, _, loader, _ = setup
    before = time.time_ns() // 1_000_000
    holder = PolicyHolder(root, "feed", loader, feed_fallback())
    first = holder.current.since_ms
    registry.promote(root, "feed", "v1", "stable")
    holder.refresh()
    after = time.time_ns() // 1_000_000
    second = holder.current.since_ms
    assert isinstance(first, int) and isinstance(second, int)
    assert before <= first <= second <= after


def test_every_reload_outcome_is_reported_with_its_surface_and_error(setup):
    root, holder, loader, events = setup
    registry.promote(root, "feed", "v1", "stable")
    assert holder.refresh()
    assert events == [("feed", "applied", None)] and holder.status.last_error is None
    loader.refuse.add("v2")
    registry.promote(root, "feed", "v2", "stable")
    assert holder.refresh() is False
    assert events[-1] == ("feed", "refused", holder.status.last_error)
    assert "v2" in holder.status.last_error
    (root / "feed" / "routing.json").write_text("{not json")
    assert holder.refresh() is False
    assert events[-1] == ("feed", "failed", holder.status.last_error)
    assert holder.status.last_error.startswith("cannot read the routing of feed")


def test_an_unreadable_routing_is_reported_once_not_at_every_poll(setup):
    root, holder, _, events = setup
    registry.promote(root, "feed", "v1", "stable")
    holder.refresh()
    (root / "feed" / "routing.json").write_text("{not json")
    assert [holder.refresh() for _ in range(3)] == [False, False, False]
    assert [outcome for _, outcome, _ in events] == ["applied", "failed"]
    assert holder.current.stable.version == "v1"


@pytest.mark.parametrize("role", ["stable", "canary"])
def test_a_refusal_names_the_role_and_the_version_refused(setup, tmp_path, role):
    root, holder, _, events = setup
    add_version(root, tmp_path, "v4", seed=4, blessed=False)
    registry.promote(root, "feed", "v1", "stable")
    holder.refresh()
    edit_routing(root, **{role: "v4"}, **({"canary_fraction": 0.5} if role == "canary" else {}))
    assert holder.refresh() is False and holder.current.stable.version == "v1"
    refusal = f"{role} version v4 of feed cannot serve: the OPE gate refused"
    assert holder.status.last_error.startswith(refusal)
    assert events[-1] == ("feed", "refused", holder.status.last_error)


def test_a_damaged_shadow_is_left_out_with_each_of_its_defects_named(setup):
    root, holder, _, events = setup
    registry.promote(root, "feed", "v1", "stable")
    registry.promote(root, "feed", "v2", "shadow")
    # after its promotion, its policy.json changed and its blessing was overwritten: two defects
    info = registry.get_version(root, "feed", "v2")
    (info.policy_dir / "policy.json").write_text((info.policy_dir / "policy.json").read_text() + " ")
    (info.directory / info.manifest["blessing"]).write_text("{")
    defects = registry.get_version(root, "feed", "v2").defects
    assert len(defects) == 2
    assert holder.refresh() and holder.current.shadow is None and holder.current.stable.version == "v1"
    assert holder.status.last_error == f"shadow left out: shadow version v2 of feed: {'; '.join(defects)}"
    assert events[-1] == ("feed", "applied", holder.status.last_error)


def test_the_loader_is_given_the_policy_directory_of_the_routed_version(setup):
    root, holder, loader, _ = setup
    registry.promote(root, "feed", "v1", "stable")
    holder.refresh()
    assert loader.policy_dirs == [registry.get_version(root, "feed", "v1").policy_dir]


class PollCounter:
    """Stands in for a PolicyHolder: counts the watcher's polls."""

    def __init__(self) -> None:
        self.polls = 0
        self.polled_twice = threading.Event()

    def refresh(self) -> bool:
        self.polls += 1
        if self.polls >= 2:
            self.polled_twice.set()
        return False


def started_thread(action) -> list[threading.Thread]:
    """The threads that ``action`` started (and that still run)."""
    before = set(threading.enumerate())
    action()
    return [t for t in threading.enumerate() if t not in before]


def test_the_watcher_polls_every_holder_on_a_daemon_thread_until_stopped():
    holders = [PollCounter(), PollCounter()]
    watcher = RoutingWatcher(holders, interval_s=0.01)
    [thread] = started_thread(watcher.start)
    try:
        assert all(h.polled_twice.wait(timeout=5) for h in holders)
        assert thread.daemon  # a server that exits without stop() is not held up by it
        assert not thread.name.startswith("Thread-")  # named, for thread dumps
    finally:
        watcher.stop()
    assert not thread.is_alive()  # stop joins it
    polls = [h.polls for h in holders]
    time.sleep(0.05)
    assert [h.polls for h in holders] == polls


def test_the_watcher_waits_an_interval_between_polls_and_stops_without_waiting_it_out():
    holder = PollCounter()
    watcher = RoutingWatcher([holder], interval_s=60)
    [thread] = started_thread(watcher.start)
    time.sleep(0.05)  # the first load is the server's own; the watcher's first poll is an interval later
    watcher.stop()  # joins for at most 10 s: a thread still alive after it would be waiting out the 60 s
    assert not thread.is_alive()
    assert holder.polls == 0


def test_a_watcher_stopped_before_it_starts_never_polls():
    holder = PollCounter()
    watcher = RoutingWatcher([holder], interval_s=0.01)
    watcher.stop()
    assert started_thread(watcher.start) == []
    time.sleep(0.05)
    assert holder.polls == 0
