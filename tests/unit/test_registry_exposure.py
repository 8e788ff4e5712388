"""A user-author term's first exposure: an audited, capped canary before the gate can judge it.

The gate judges a term only on logs of that same term, so without this path no new term could ever
serve. What is pinned: where the approval is accepted and where refused, that it stands in for a
blessing only for a canary within its share and only until a report is attached, that a refused report
ends the exposure, and that the server applies the same rule as the registry.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from registry_fakes import make_policy, make_report

from recsys_rl import registry
from recsys_rl.registry import RegistryError, approve_exposure
from recsys_rl.registry.layout import MAX_FIRST_EXPOSURE_FRACTION
from recsys_rl.serving.policies import NoUserAuthorTerm
from recsys_rl.serving.routing import PolicyHolder

WHY = "a new follow critic; the gate needs logs of its term"


def _version(root: Path, tmp_path: Path, name: str, seed: int, surface: str = "user_author") -> Path:
    policy = make_policy(tmp_path / f"policy-{name}", seed, version=f"ua-{name}", surface=surface)
    registry.register(root, surface, policy=policy, version=name)
    return policy


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "registry"
    _version(root, tmp_path, "ua1", seed=1)
    return root


def _audit_actions(root: Path) -> list[str]:
    return [record["action"] for record in registry.read_audit(root, "user_author")]


def test_an_approved_first_exposure_serves_as_canary_within_its_share_and_beside_the_fallback(root):
    assert approve_exposure(root, "user_author", "ua1", max_canary_fraction=0.02, reason=WHY, actor="ana")
    change = registry.promote(root, "user_author", "ua1", "canary", canary_fraction=0.02)
    assert (change.after.stable, change.after.canary, change.after.canary_fraction) == (None, "ua1", 0.02)
    info = registry.get_version(root, "user_author", "ua1")
    exposure = info.exposure
    assert (exposure.actor, exposure.reason, exposure.max_canary_fraction) == ("ana", WHY, 0.02)
    assert info.exposure.policy_sha256 == info.policy_sha256
    record = registry.read_audit(root, "user_author")[-2]
    assert (record["action"], record["version"], record["reason"]) == ("approve_exposure", "ua1", WHY)

    with pytest.raises(RegistryError, match=r"approved for at most 2\.0% of users, not 3\.0%"):
        registry.promote(root, "user_author", "ua1", "canary", canary_fraction=0.03)
    with pytest.raises(RegistryError, match=r"cannot make version ua1 of user_author stable: no OPE report"):
        registry.promote(root, "user_author", "ua1", "stable")


def test_without_an_approval_an_unjudged_term_is_refused_with_the_way_in_named(root):
    with pytest.raises(RegistryError, match=r"no OPE report .* registry approve-exposure"):
        registry.promote(root, "user_author", "ua1", "canary", canary_fraction=0.01)


def test_the_approval_is_refused_where_the_gate_can_judge_or_has_judged(root, tmp_path):
    policy = _version(root, tmp_path, "f1", seed=2, surface="feed")
    with pytest.raises(RegistryError, match="feed versions are judged on the logs there are"):
        approve_exposure(root, "feed", "f1", max_canary_fraction=0.01, reason=WHY)
    for passed, verdict in ((False, "refused it"), (True, "blessed it: promote it")):
        policy = _version(root, tmp_path, f"judged-{passed}", seed=3 + passed)
        reasons = () if passed else ("follow: lift below the minimum",)
        report = make_report(tmp_path / f"report-{passed}", policy, passed=passed, reasons=reasons)
        registry.attach_report(root, "user_author", f"judged-{passed}", report)
        with pytest.raises(RegistryError, match=rf"the OPE gate has judged it already and {verdict}"):
            approve_exposure(root, "user_author", f"judged-{passed}", max_canary_fraction=0.01, reason=WHY)
    assert "approve_exposure" not in _audit_actions(root)


@pytest.mark.parametrize("share", [0.0, -0.01, MAX_FIRST_EXPOSURE_FRACTION + 0.01, float("nan"), True])
def test_the_share_is_capped(root, share):
    with pytest.raises(ValueError, match="max_canary_fraction should be in"):
        approve_exposure(root, "user_author", "ua1", max_canary_fraction=share, reason=WHY)


def test_an_empty_reason_is_refused(root):
    with pytest.raises(ValueError, match="reason should say why this version should be exposed"):
        approve_exposure(root, "user_author", "ua1", max_canary_fraction=0.01, reason="  ")


def test_weights_changed_after_registration_are_not_approved(root):
    info = registry.get_version(root, "user_author", "ua1")
    (info.policy_dir / "saved_model.pb").write_bytes(b"other weights")
    with pytest.raises(RegistryError, match=r"policy files changed after registration: saved_model\.pb"):
        approve_exposure(root, "user_author", "ua1", max_canary_fraction=0.01, reason=WHY)


def test_an_approval_naming_other_weights_is_a_defect(root):
    approve_exposure(root, "user_author", "ua1", max_canary_fraction=0.01, reason=WHY)
    info = registry.get_version(root, "user_author", "ua1")
    stored = json.loads((info.directory / "exposure.json").read_text())
    (info.directory / "exposure.json").write_text(json.dumps({**stored, "policy_sha256": "0" * 64}))
    info = registry.get_version(root, "user_author", "ua1")
    assert any("approves policy sha256 000000000000" in d for d in info.defects)
    with pytest.raises(RegistryError, match="approves policy sha256"):
        registry.promote(root, "user_author", "ua1", "canary", canary_fraction=0.01)


@pytest.mark.parametrize(
    ("damage", "defect"),
    [
        pytest.param(lambda stored: "{not json", "exposure.json is not valid JSON", id="not-json"),
        pytest.param(None, "has no exposure.json: no exposure approval", id="missing"),
        pytest.param(
            lambda stored: json.dumps({k: v for k, v in stored.items() if k != "reason"}),
            "is not an exposure approval: it should hold exactly ['actor', 'approved_at', "
            "'max_canary_fraction', 'policy_sha256', 'reason']",
            id="missing-key",
        ),
        pytest.param(lambda stored: json.dumps([stored]), "is not an exposure approval", id="not-an-object"),
        pytest.param(
            lambda stored: json.dumps({**stored, "max_canary_fraction": 0.5}),
            "is not a valid exposure approval: max_canary_fraction should be in (0, 0.05]",
            id="share-beyond-the-cap",
        ),
        pytest.param(
            lambda stored: json.dumps({**stored, "actor": ""}),
            "is not a valid exposure approval: actor should be a non-empty string",
            id="no-actor",
        ),
    ],
)
def test_a_damaged_approval_is_a_defect_that_serves_nowhere(root, damage, defect):
    approve_exposure(root, "user_author", "ua1", max_canary_fraction=0.01, reason=WHY)
    path = registry.get_version(root, "user_author", "ua1").directory / "exposure.json"
    if damage is None:
        path.unlink()
    else:
        path.write_text(damage(json.loads(path.read_text())))
    info = registry.get_version(root, "user_author", "ua1")
    assert info.exposure is None and len(info.defects) == 1 and defect in info.defects[0]
    assert str(path if damage else path.parent) in info.defects[0]
    with pytest.raises(RegistryError, match="cannot make version ua1 of user_author canary"):
        registry.promote(root, "user_author", "ua1", "canary", canary_fraction=0.01)


def test_the_same_approval_again_changes_nothing_and_a_lower_cap_waits_for_a_lower_share(root):
    approve_exposure(root, "user_author", "ua1", max_canary_fraction=0.03, reason=WHY)
    assert approve_exposure(root, "user_author", "ua1", max_canary_fraction=0.03, reason=WHY) is False
    assert _audit_actions(root).count("approve_exposure") == 1
    registry.promote(root, "user_author", "ua1", "canary", canary_fraction=0.03)
    with pytest.raises(RegistryError, match=r"serves 3\.0% of users as canary, more than 1\.0%"):
        approve_exposure(root, "user_author", "ua1", max_canary_fraction=0.01, reason=WHY)
    registry.promote(root, "user_author", "ua1", "canary", canary_fraction=0.01)
    assert approve_exposure(root, "user_author", "ua1", max_canary_fraction=0.01, reason=WHY)


def test_a_refused_report_ends_the_exposure_and_a_passing_one_leads_to_stable(root, tmp_path):
    policy = registry.get_version(root, "user_author", "ua1").policy_dir
    approve_exposure(root, "user_author", "ua1", max_canary_fraction=0.01, reason=WHY)
    registry.promote(root, "user_author", "ua1", "canary", canary_fraction=0.01)
    refused = make_report(tmp_path / "refused", policy, passed=False, reasons=("follow: lift below 0",))
    assert registry.attach_report(root, "user_author", "ua1", refused)
    routing = registry.read_routing(root, "user_author")
    assert (routing.canary, routing.canary_fraction, routing.revision) == (None, 0.0, 2)
    assert _audit_actions(root)[-2:] == ["attach", "demote"]
    with pytest.raises(RegistryError, match="the OPE gate refused it"):  # the approval no longer counts
        registry.promote(root, "user_author", "ua1", "canary", canary_fraction=0.01)

    policy2 = _version(root, tmp_path, "ua2", seed=5)
    approve_exposure(root, "user_author", "ua2", max_canary_fraction=0.01, reason=WHY)
    registry.promote(root, "user_author", "ua2", "canary", canary_fraction=0.01)
    registry.attach_report(root, "user_author", "ua2", make_report(tmp_path / "passed", policy2))
    assert registry.read_routing(root, "user_author").canary == "ua2"
    assert registry.promote(root, "user_author", "ua2", "stable").after.stable == "ua2"


class _TermLoader:
    def __call__(self, policy_dir: Path, version: str) -> NoUserAuthorTerm:
        return NoUserAuthorTerm(version=version)


def test_the_server_serves_the_exposure_to_its_share_only_and_refuses_a_share_beyond_it(root):
    approve_exposure(root, "user_author", "ua1", max_canary_fraction=0.05, reason=WHY)
    registry.promote(root, "user_author", "ua1", "canary", canary_fraction=0.05)
    holder = PolicyHolder(root, "user_author", _TermLoader(), NoUserAuthorTerm())
    assert holder.refresh() and holder.status.last_error is None
    arms = [holder.current.route(f"u{i}")[0] for i in range(2000)]
    expected = [
        "canary" if registry.arm_for_user(f"u{i}", 0.05) == "canary" else "fallback" for i in range(2000)
    ]
    assert arms == expected and 40 < arms.count("canary") < 160
    versions = {holder.current.route(f"u{i}")[1].version for i in range(2000)}
    assert versions == {"ua1", "fallback-no-user-author-term"}

    path = root / "user_author" / "routing.json"  # a share beyond the approval, written by hand
    edited = json.loads(path.read_text())
    path.write_text(json.dumps({**edited, "canary_fraction": 0.5, "revision": edited["revision"] + 1}))
    assert holder.refresh() is False
    assert holder.status.last_error == (
        "canary version ua1 of user_author cannot serve: its first exposure is approved for at most 5.0% "
        "of users, not 50.0%"
    )
    assert holder.current.canary_fraction == 0.05
