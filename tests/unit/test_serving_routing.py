"""Routing and reload: arms by user hash, refusals keep the previous policies, fallback when nothing loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from registry_fakes import make_report, make_run

from recsys_rl import registry
from recsys_rl.errors import OperationalError
from recsys_rl.registry import arm_for_user
from recsys_rl.serving.policies import feed_fallback
from recsys_rl.serving.routing import PolicyHolder


class FakeLoader:
    """Stands in for the SavedModel loader; records what it loaded and can refuse named versions."""

    def __init__(self) -> None:
        self.loaded: list[str] = []
        self.refuse: set[str] = set()

    def __call__(self, policy_dir: Path, version: str):
        self.loaded.append(version)
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
    assert "not blessed" in holder.status.last_error


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
