"""Model registry: versions, blessings, routing, audit, and what concurrent or interrupted writers leave."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import itertools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from registry_fakes import POLICY_FILES, digest_of, make_policy, make_report, make_run

from recsys_rl import registry
from recsys_rl.ope.blessing import Blessing, BlessingError, PolicyRef, write_blessing
from recsys_rl.registry import RegistryError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def reg(tmp_path: Path) -> Path:
    return tmp_path / "registry"


def add_version(reg: Path, tmp_path: Path, seed: int, *, report: bool = True, **blessing) -> str:
    """Register the policy of a fake run ``seed``, with a report whose blessing has ``blessing`` fields."""
    run = make_run(tmp_path / f"run{seed}", seed)
    report_dir = make_report(tmp_path / f"report{seed}", run / "policy", **blessing) if report else None
    return registry.register(reg, "feed", run=run, report=report_dir).version.version


def visible_tree(reg: Path) -> dict[str, bytes]:
    """Every file a reader can see: anything under a name starting with '.' is the writers' own."""
    return {
        str(path.relative_to(reg)): path.read_bytes()
        for path in sorted(reg.rglob("*"))
        if path.is_file() and not any(part.startswith(".") for part in path.relative_to(reg).parts)
    }


def staging_debris(reg: Path) -> list[Path]:
    return sorted((reg / "feed" / ".staging").glob("*")) if (reg / "feed" / ".staging").exists() else []


def wait_for(path: Path, process: subprocess.Popen, what: str) -> None:
    """Wait until a child process creates ``path``; fail with its output if it exits first."""
    deadline = time.monotonic() + 120
    while not path.exists():
        if process.poll() is not None:
            pytest.fail(f"{what} exited with {process.returncode} first: {process.communicate()}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"{what} did not get there")
        time.sleep(0.02)


def python(script: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# --- the round trip --------------------------------------------------------------------------------


def test_register_list_show_promote_rollback_round_trip(reg: Path, tmp_path: Path) -> None:
    v1, v2 = add_version(reg, tmp_path, 1), add_version(reg, tmp_path, 2)
    assert [info.version for info in registry.list_versions(reg, "feed")] == [v1, v2]
    info = registry.get_version(reg, "feed", v1)
    source = tmp_path / "run1" / "policy"
    assert info.blessed and info.policy_sha256 == digest_of(source)
    assert info.manifest["dataset_version"] == "ds1"
    assert info.manifest["source"]["run"] == str((tmp_path / "run1").resolve())
    assert {p.name: p.read_bytes() for p in info.policy_dir.rglob("*") if p.is_file()} == {
        p.name: p.read_bytes() for p in source.rglob("*") if p.is_file()
    }
    assert info.attachment("ope_report").read_bytes() == (tmp_path / "report1" / "report.json").read_bytes()

    registry.promote(reg, "feed", v1, "stable")
    after = registry.promote(reg, "feed", v2, "canary", canary_fraction=0.25).after
    assert (after.stable, after.canary, after.canary_fraction) == (v1, v2, 0.25)

    after = registry.promote(reg, "feed", v2, "stable").after
    assert (after.stable, after.canary, after.canary_fraction, after.stable_history) == (v2, None, 0.0, (v1,))

    after = registry.rollback(reg, "feed").after
    assert (after.stable, after.stable_history) == (v1, ())
    with pytest.raises(RegistryError, match=f"no earlier stable version than {v1}"):
        registry.rollback(reg, "feed")
    after = registry.rollback(reg, "feed", to=v2).after
    assert (after.stable, after.stable_history, after.revision) == (v2, (v1,), 5)
    assert registry.read_routing(reg, "feed") == after


def test_register_is_idempotent_and_refuses_conflicting_names(reg: Path, tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", 1)
    first = registry.register(reg, "feed", run=run)
    again = registry.register(reg, "feed", policy=run / "policy")
    assert first.created and not again.created and again.version.version == first.version.version
    assert len(registry.list_versions(reg, "feed")) == 1
    assert [r["action"] for r in registry.read_audit(reg)] == ["register"]

    other = make_policy(tmp_path / "other", 2)
    with pytest.raises(RegistryError, match=f"version {first.version.version} of feed already holds another"):
        registry.register(reg, "feed", policy=other, version=first.version.version)
    with pytest.raises(RegistryError, match=f"already registered in feed as {first.version.version}"):
        registry.register(reg, "feed", run=run, version="renamed")
    assert [info.version for info in registry.list_versions(reg, "feed")] == [first.version.version]


def test_default_version_is_the_policys_version_and_digest(reg: Path, tmp_path: Path) -> None:
    policy = make_policy(tmp_path / "p", 1, version="tscac ds/1:s0")
    version = registry.register(reg, "feed", policy=policy).version.version
    assert version == f"tscac-ds-1-s0-{digest_of(policy)[:12]}"


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "../up", "x" * 129, "sp ace"])
def test_bad_version_names_are_refused(reg: Path, tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="a version should be 1 to 128 letters"):
        registry.register(reg, "feed", run=make_run(tmp_path / "run", 1), version=name)


def _change_a_file(run: Path) -> None:
    (run / "policy" / "saved_model.pb").write_bytes(b"retrained")


def _add_a_file(run: Path) -> None:
    (run / "policy" / "extra.bin").write_bytes(b"?")


def _remove_policy_json(run: Path) -> None:
    (run / "policy" / "policy.json").unlink()


def _edit_run_manifest(run: Path) -> None:
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["policy"]["sha256"]["saved_model.pb"] = "0" * 64
    (run / "manifest.json").write_text(json.dumps(manifest))


def _not_a_run(run: Path) -> None:
    (run / "manifest.json").write_text(json.dumps({"kind": "transition_dataset"}))


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        pytest.param(_change_a_file, r"does not match its policy.json \(saved_model.pb differ", id="changed"),
        pytest.param(_add_a_file, r"does not match its policy.json \(extra.bin differ", id="extra-file"),
        pytest.param(_remove_policy_json, "has no policy.json: not an exported policy", id="no-policy-json"),
        pytest.param(_edit_run_manifest, "is not the policy run .* exported", id="not-the-runs-policy"),
        pytest.param(_not_a_run, "is not the manifest of a training run", id="not-a-run"),
    ],
)
def test_register_refuses_a_policy_it_cannot_trust_and_stores_nothing(
    reg: Path, tmp_path: Path, spoil, message: str
) -> None:
    run = make_run(tmp_path / "run", 1)
    spoil(run)
    with pytest.raises(RegistryError, match=message):
        registry.register(reg, "feed", run=run)
    assert not (reg / "feed" / "versions").exists() or not any((reg / "feed" / "versions").iterdir())
    assert staging_debris(reg) == []


def test_register_refuses_a_policy_of_another_surface(reg: Path, tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="is a feed policy, not one for live_allocation"):
        registry.register(reg, "live_allocation", policy=make_policy(tmp_path / "p", 1))


def test_the_stored_copy_has_the_source_policys_digest_and_files(reg: Path, tmp_path: Path) -> None:
    """The gate names the candidate by ``policy_digest`` of what it evaluated: the copy must match it."""
    from recsys_rl.registry.policy_files import mismatched_policy_files, policy_digest

    info = registry.get_version(reg, "feed", add_version(reg, tmp_path, 1))
    assert info.policy_sha256 == policy_digest(info.policy_dir) == policy_digest(tmp_path / "run1" / "policy")
    assert (
        mismatched_policy_files(info.policy_dir, json.loads((info.policy_dir / "policy.json").read_text()))
        == []
    )


# --- blessings -------------------------------------------------------------------------------------


def test_attach_refuses_a_blessing_for_other_weights(reg: Path, tmp_path: Path) -> None:
    version = add_version(reg, tmp_path, 1, report=False)
    other = make_policy(tmp_path / "other", 2)
    report = make_report(tmp_path / "report", other)
    with pytest.raises(
        RegistryError, match=r"blessing.json blesses candidate \(policy sha256 .*not this version"
    ):
        registry.attach_report(reg, "feed", version, report)
    assert registry.get_version(reg, "feed", version).why_not_blessed == "no OPE report and blessing attached"


def test_attach_refuses_an_invalid_blessing_naming_the_file(reg: Path, tmp_path: Path) -> None:
    version = add_version(reg, tmp_path, 1, report=False)
    report = make_report(tmp_path / "report", tmp_path / "run1" / "policy")
    record = json.loads((report / "blessing.json").read_text())
    del record["estimator"]
    (report / "blessing.json").write_text(json.dumps(record))
    with pytest.raises(
        BlessingError, match=rf"{report / 'blessing.json'} is not a valid blessing: .*missing \['estimator'\]"
    ):
        registry.attach_report(reg, "feed", version, report)


def test_attach_replaces_a_blessing_unless_the_version_serves(reg: Path, tmp_path: Path) -> None:
    version = add_version(reg, tmp_path, 1, passed=False, reasons=("ESS 12 vs required 1,000",))
    assert not registry.attach_report(reg, "feed", version, tmp_path / "report1")  # the same: no change
    passed = make_report(tmp_path / "rerun", tmp_path / "run1" / "policy", html=False)
    assert registry.attach_report(reg, "feed", version, passed)
    info = registry.get_version(reg, "feed", version)
    assert info.blessed and info.attachment("ope_report_html") is None
    assert not (info.directory / "ope" / "report.html").exists()

    registry.promote(reg, "feed", version, "stable")
    with pytest.raises(RegistryError, match="serves as stable: its blessing cannot be replaced"):
        registry.attach_report(reg, "feed", version, tmp_path / "report1")
    assert registry.get_version(reg, "feed", version).blessed


def _no_report(reg: Path, tmp_path: Path, version: str) -> None:
    pass


def _foreign_blessing(reg: Path, tmp_path: Path, version: str) -> None:
    """A blessing.json overwritten by hand with a verdict on other weights."""
    other = make_policy(tmp_path / "other", 9)
    record = Blessing(True, (), PolicyRef("other", digest_of(other)), None, "snips", "bca", {})
    write_blessing(reg / "feed" / "versions" / version / "blessing.json", record)


def _changed_policy(reg: Path, tmp_path: Path, version: str) -> None:
    path = reg / "feed" / "versions" / version / "policy" / "policy.json"
    path.write_text(path.read_text().replace("tscac", "edited"))


def _changed_weights(reg: Path, tmp_path: Path, version: str) -> None:
    """Two stored weight files overwritten after blessing; policy.json (and so the digest) untouched."""
    for name in POLICY_FILES[1:]:
        path = reg / "feed" / "versions" / version / "policy" / name
        path.write_bytes(path.read_bytes()[::-1])


def _changed_policy_and_foreign_blessing(reg: Path, tmp_path: Path, version: str) -> None:
    _changed_policy(reg, tmp_path, version)
    _foreign_blessing(reg, tmp_path, version)


@pytest.mark.parametrize(
    ("blessing", "spoil", "message", "shadow_ok"),
    [
        pytest.param({"report": False}, _no_report, "no OPE report and blessing attached", True, id="none"),
        pytest.param(
            {
                "passed": False,
                "reasons": ("watch_time: lower bound -1.20% < required +0.00%", "ESS 90 vs 1,000"),
            },
            _no_report,
            "the OPE gate refused it: watch_time: lower bound -1.20% < required .*; ESS 90 vs 1,000",
            True,
            id="failed",
        ),
        pytest.param(
            {},
            _foreign_blessing,
            ".*blessing.json blesses policy sha256 .*, not this version's",
            False,
            id="foreign",
        ),
        pytest.param({}, _changed_policy, ".*policy.json changed after registration", False, id="changed"),
        pytest.param(
            {},
            _changed_weights,
            # every changed file, sorted, joined by ", "
            f"its policy files changed after registration: {POLICY_FILES[2]}, {POLICY_FILES[1]}$",
            False,
            id="weights",
        ),
        pytest.param(
            {},
            _changed_policy_and_foreign_blessing,
            # every defect, joined by "; "
            r".*policy.json changed after registration \(sha256 \w+, not \w+\); "
            r".*blessing.json blesses policy sha256 \w+, not this version's \w+$",
            False,
            id="two-defects",
        ),
    ],
)
def test_promote_refuses_an_unblessed_version(
    reg: Path, tmp_path: Path, blessing: dict, spoil, message: str, shadow_ok: bool
) -> None:
    stable = add_version(reg, tmp_path, 1)
    registry.promote(reg, "feed", stable, "stable")
    version = add_version(reg, tmp_path, 2, **blessing)
    spoil(reg, tmp_path, version)
    routing = registry.read_routing(reg, "feed")
    for role, fraction in (("stable", None), ("canary", 0.1)):
        with pytest.raises(RegistryError, match=f"cannot make version {version} of feed {role}: {message}"):
            registry.promote(reg, "feed", version, role, canary_fraction=fraction)
    assert registry.read_routing(reg, "feed") == routing
    with pytest.raises(RegistryError, match=f"cannot make version {version} of feed stable: {message}"):
        registry.rollback(reg, "feed", to=version)
    if shadow_ok:  # shadow is never served: it may watch a candidate the gate has not blessed
        assert registry.promote(reg, "feed", version, "shadow").after.shadow == version
    else:
        with pytest.raises(RegistryError, match=f"cannot make version {version} of feed shadow: {message}"):
            registry.promote(reg, "feed", version, "shadow")
        assert registry.read_routing(reg, "feed") == routing


# --- routing rules ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [-0.1, 1.01, math.nan, math.inf, True, "0.5", None])
def test_canary_fraction_must_be_a_number_in_unit_interval(value) -> None:
    with pytest.raises(ValueError, match="canary_fraction should be a number in"):
        registry.check_fraction(value)
    with pytest.raises(ValueError, match="canary_fraction should be a number in"):
        registry.arm_for_user("user-1", value)


def test_canary_fraction_goes_with_canary_only(reg: Path, tmp_path: Path) -> None:
    stable, canary = add_version(reg, tmp_path, 1), add_version(reg, tmp_path, 2)
    with pytest.raises(
        RegistryError,
        match=r"^feed has no stable version for a canary to split traffic with; promote one to stable first$",
    ):
        registry.promote(reg, "feed", canary, "canary", canary_fraction=0.1)
    registry.promote(reg, "feed", stable, "stable")
    only_canary = r"^canary_fraction goes with a promotion to canary, and only with one$"
    with pytest.raises(ValueError, match=only_canary):
        registry.promote(reg, "feed", canary, "canary")
    with pytest.raises(ValueError, match=only_canary):
        registry.promote(reg, "feed", canary, "stable", canary_fraction=0.5)
    with pytest.raises(
        ValueError, match=r"^to should be one of \['stable', 'canary', 'shadow'\], but is 'primary'$"
    ):
        registry.promote(reg, "feed", canary, "primary")
    with pytest.raises(ValueError, match="canary_fraction should be a number in"):
        registry.promote(reg, "feed", canary, "canary", canary_fraction=1.5)
    for fraction in (0.0, 1.0, 0.3):
        assert (
            registry.promote(reg, "feed", canary, "canary", canary_fraction=fraction).after.canary_fraction
            == fraction
        )
    with pytest.raises(RegistryError, match=f"version {stable} of feed is stable; roll back before"):
        registry.promote(reg, "feed", stable, "canary", canary_fraction=0.1)


def test_a_version_holds_one_role(reg: Path, tmp_path: Path) -> None:
    stable, other = add_version(reg, tmp_path, 1), add_version(reg, tmp_path, 2)
    registry.promote(reg, "feed", stable, "stable")
    registry.promote(reg, "feed", other, "shadow")
    after = registry.promote(reg, "feed", other, "canary", canary_fraction=0.2).after
    assert (after.canary, after.shadow) == (other, None)
    after = registry.promote(reg, "feed", other, "shadow").after
    assert (after.canary, after.canary_fraction, after.shadow) == (None, 0.0, other)
    after = registry.promote(reg, "feed", other, "stable").after
    assert (after.stable, after.shadow, after.stable_history) == (other, None, (stable,))
    unchanged = registry.promote(reg, "feed", other, "stable")
    assert not unchanged.changed and unchanged.after == after


def test_a_new_stable_or_canary_leaves_the_other_roles_alone(reg: Path, tmp_path: Path) -> None:
    """Only the version that moves leaves its old role: another version's canary or shadow stays put."""
    v1, v2, v3, v4 = (add_version(reg, tmp_path, seed) for seed in (1, 2, 3, 4))
    registry.promote(reg, "feed", v1, "stable")
    registry.promote(reg, "feed", v3, "shadow")
    after = registry.promote(reg, "feed", v2, "canary", canary_fraction=0.3).after
    assert (after.stable, after.canary, after.canary_fraction, after.shadow) == (v1, v2, 0.3, v3)
    after = registry.promote(reg, "feed", v4, "stable").after
    assert (after.stable, after.canary, after.canary_fraction, after.shadow, after.stable_history) == (
        v4,
        v2,
        0.3,
        v3,
        (v1,),
    )
    after = registry.rollback(reg, "feed").after
    assert (after.stable, after.canary, after.canary_fraction, after.shadow, after.stable_history) == (
        v1,
        v2,
        0.3,
        v3,
        (),
    )


def test_a_change_reports_its_surface_version_routings_and_time(
    reg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from recsys_rl.registry import routing_file as routing_module

    v1, v2 = add_version(reg, tmp_path, 1), add_version(reg, tmp_path, 2)
    monkeypatch.setattr(routing_module, "utc_now", lambda: "2030-01-02T03:04:05Z")
    change = registry.promote(reg, "feed", v1, "stable")
    assert (change.surface, change.version, change.before, change.changed) == (
        "feed",
        v1,
        registry.RoutingState(),
        True,
    )
    assert change.after == registry.read_routing(reg, "feed")
    assert (change.after.revision, change.after.updated_at) == (1, "2030-01-02T03:04:05Z")

    monkeypatch.setattr(routing_module, "utc_now", lambda: "2030-06-07T08:09:10Z")
    first = change.after
    change = registry.promote(reg, "feed", v2, "shadow")
    assert (change.surface, change.version, change.before, change.changed) == ("feed", v2, first, True)
    assert (change.after.revision, change.after.updated_at) == (2, "2030-06-07T08:09:10Z")

    unchanged = registry.promote(reg, "feed", v2, "shadow")  # already shadow: nothing written
    assert (unchanged.surface, unchanged.version, unchanged.changed) == ("feed", v2, False)
    assert unchanged.before == unchanged.after == change.after == registry.read_routing(reg, "feed")


def test_rollback_walks_back_one_release_at_a_time(
    reg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("USER", "bob")
    v1, v2, v3 = (add_version(reg, tmp_path, seed) for seed in (1, 2, 3))
    with pytest.raises(RegistryError, match=r"^feed has no stable version to roll back$"):
        registry.rollback(reg, "feed")
    for version in (v1, v2, v3):
        registry.promote(reg, "feed", version, "stable")
    with pytest.raises(RegistryError, match=rf"^version {v3} of feed is already stable$"):
        registry.rollback(reg, "feed", to=v3)

    after = registry.rollback(reg, "feed", actor="ann").after
    assert (after.stable, after.stable_history) == (v2, (v1,))
    assert registry.read_audit(reg)[-1]["actor"] == "ann"
    after = registry.rollback(reg, "feed").after
    assert (after.stable, after.stable_history) == (v1, ())
    with pytest.raises(
        RegistryError,
        match=rf"^feed has no earlier stable version than {v1} to roll back to; name the version to roll "
        r"back to$",
    ):
        registry.rollback(reg, "feed")


def test_demote_clears_canary_and_shadow(reg: Path, tmp_path: Path) -> None:
    stable, canary = add_version(reg, tmp_path, 1), add_version(reg, tmp_path, 2)
    registry.promote(reg, "feed", stable, "stable")
    registry.promote(reg, "feed", canary, "canary", canary_fraction=0.4)
    change = registry.demote(reg, "feed", "canary")
    assert change.version == canary and (change.after.canary, change.after.canary_fraction) == (None, 0.0)
    with pytest.raises(RegistryError, match="feed has no shadow version"):
        registry.demote(reg, "feed", "shadow")
    with pytest.raises(ValueError, match="role should be canary or shadow"):
        registry.demote(reg, "feed", "stable")


def test_demoting_the_shadow_clears_only_the_shadow_and_is_audited(
    reg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("USER", "bob")
    stable, canary, shadow = (add_version(reg, tmp_path, seed) for seed in (1, 2, 3))
    registry.promote(reg, "feed", stable, "stable")
    registry.promote(reg, "feed", canary, "canary", canary_fraction=0.4)
    before = registry.promote(reg, "feed", shadow, "shadow").after
    change = registry.demote(reg, "feed", "shadow", actor="ann")
    assert change.version == shadow
    assert (change.after.stable, change.after.canary, change.after.canary_fraction, change.after.shadow) == (
        stable,
        canary,
        0.4,
        None,
    )
    record = registry.read_audit(reg, "feed")[-1]
    assert (record["action"], record["actor"], record["role"], record["version"]) == (
        "demote",
        "ann",
        "shadow",
        shadow,
    )
    assert (record["before"], record["after"]) == (before.to_dict(), change.after.to_dict())


def test_arm_for_user_is_a_stable_hash_of_the_id(tmp_path: Path) -> None:
    ids = [f"user-{i}" for i in range(20_000)]
    for fraction in (0.05, 0.3):
        share = sum(registry.arm_for_user(u, fraction) == "canary" for u in ids) / len(ids)
        assert abs(share - fraction) < 0.01  # 0.01 is over 4 binomial standard deviations here
    point = (int(hashlib.sha256(b"user-7").hexdigest()[:16], 16) >> 11) / 2**53  # its first 53 bits
    assert registry.arm_for_user("user-7", point) == "stable"  # the canary's share is [0, fraction)
    assert registry.arm_for_user("user-7", point + 1e-9) == "canary"
    assert registry.arm_for_user("user-7", point - 1e-9) == "stable"
    small = {u for u in ids if registry.arm_for_user(u, 0.05) == "canary"}
    large = {u for u in ids if registry.arm_for_user(u, 0.3) == "canary"}
    assert small < large  # raising the fraction only ever adds users to the canary
    assert {registry.arm_for_user(u, 0.0) for u in ids} == {"stable"}
    assert {registry.arm_for_user(u, 1.0) for u in ids} == {"canary"}
    with pytest.raises(TypeError, match="user_id should be a string, but is int"):
        registry.arm_for_user(7, 0.5)  # type: ignore[arg-type]

    script = (
        "from recsys_rl.registry import arm_for_user as a; print([a(f'user-{i}', 0.5) for i in range(200)])"
    )
    expected = str([registry.arm_for_user(f"user-{i}", 0.5) for i in range(200)])
    for seed in ("1", "2"):  # unlike hash(), the same in every process
        out = subprocess.run(
            [sys.executable, "-c", script],
            cwd=REPO,
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert out == expected


def test_resolve_routing_gives_each_roles_policy_and_blessing(reg: Path, tmp_path: Path) -> None:
    stable, canary = add_version(reg, tmp_path, 1), add_version(reg, tmp_path, 2)
    shadow = add_version(reg, tmp_path, 3, report=False)
    registry.promote(reg, "feed", stable, "stable")
    assert {registry.resolve_routing(reg, "feed").arm(f"u{i}") for i in range(100)} == {"stable"}
    registry.promote(reg, "feed", canary, "canary", canary_fraction=0.5)
    registry.promote(reg, "feed", shadow, "shadow")
    routing = registry.resolve_routing(reg, "feed")
    assert routing.surface == "feed" and routing.revision == 3 and routing.canary_fraction == 0.5
    assert routing.stable.policy_dir == reg / "feed" / "versions" / stable / "policy"
    assert (routing.stable.blessed, routing.canary.blessed, routing.shadow.blessed) == (True, True, False)
    assert all(routing.arm(f"u{i}") == registry.arm_for_user(f"u{i}", 0.5) for i in range(100))

    shutil.rmtree(reg / "feed" / "versions" / shadow)
    with pytest.raises(RegistryError, match=f"feed has no version '{shadow}'"):
        registry.resolve_routing(reg, "feed")


def test_without_a_canary_every_user_is_stable() -> None:
    """A fraction left without a canary (routing.json edited by hand, say) sends no user to a canary."""
    routing = registry.Routing("feed", 1, 0.5, None, None, None)
    assert {routing.arm(f"u{i}") for i in range(200)} == {"stable"}
    assert {registry.arm_for_user(f"u{i}", 0.5) for i in range(200)} == {"stable", "canary"}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param('{"stable": "v1", ', "is not valid JSON", id="half-written"),
        pytest.param("[]", "should be a JSON object with schema_version 1", id="not-an-object"),
        pytest.param(
            '{"schema_version": 1, "stable": null, "canary": null, "canary_fraction": 2, "shadow": null, '
            '"stable_history": [], "revision": 1, "updated_at": null}',
            "canary_fraction should be a number in",
            id="fraction",
        ),
        pytest.param('{"schema_version": 1, "stable": 3}', "its keys should be", id="keys"),
    ],
)
def test_a_corrupt_routing_file_is_reported_by_name(reg: Path, content: str, message: str) -> None:
    (reg / "feed").mkdir(parents=True)
    (reg / "feed" / "routing.json").write_text(content)
    with pytest.raises(RegistryError, match=f"{reg / 'feed' / 'routing.json'}.*{message}"):
        registry.read_routing(reg, "feed")


def test_reading_a_missing_registry_or_version_names_it(reg: Path, tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match=f"no registry at {reg}"):
        registry.list_versions(reg, "feed")
    version = add_version(reg, tmp_path, 1)
    with pytest.raises(RegistryError, match=f"feed has no version 'v9' in {reg} \\(known: {version}\\)"):
        registry.promote(reg, "feed", "v9", "stable")
    assert registry.list_versions(reg, "live_allocation") == []


# --- audit -----------------------------------------------------------------------------------------


def test_the_audit_log_records_every_write(
    reg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("USER", "bob")
    v1 = add_version(reg, tmp_path, 1)
    v2 = add_version(reg, tmp_path, 2, report=False)
    registry.register(reg, "feed", run=tmp_path / "run1")  # the same again: not a write
    registry.attach_report(
        reg, "feed", v2, make_report(tmp_path / "r2", tmp_path / "run2" / "policy"), actor="ann"
    )
    registry.promote(reg, "feed", v1, "stable", actor="ann")
    registry.promote(reg, "feed", v1, "stable", actor="ann")  # no change: not a write
    registry.promote(reg, "feed", v2, "canary", canary_fraction=0.1)
    registry.promote(reg, "feed", v2, "stable")
    registry.rollback(reg, "feed")
    registry.demote(reg, "feed", "canary") if registry.read_routing(reg, "feed").canary else None

    records = registry.read_audit(reg, "feed")
    assert [(r["action"], r["actor"], r["version"]) for r in records] == [
        ("register", "bob", v1),
        ("register", "bob", v2),
        ("attach", "ann", v2),
        ("promote", "ann", v1),
        ("promote", "bob", v2),
        ("promote", "bob", v2),
        ("rollback", "bob", v1),
    ]
    routing_writes = [r for r in records if "after" in r]
    assert [r["after"]["revision"] for r in routing_writes] == [1, 2, 3, 4]
    for earlier, later in itertools.pairwise(routing_writes):
        assert later["before"] == earlier["after"]  # each write starts from what the last one left
    assert routing_writes[-1]["after"] == registry.read_routing(reg, "feed").to_dict()
    assert records[4]["to"] == "canary" and records[4]["after"]["canary_fraction"] == 0.1


def test_a_torn_audit_line_does_not_hide_later_records(reg: Path, tmp_path: Path) -> None:
    version = add_version(reg, tmp_path, 1)
    with open(reg / "audit.jsonl", "ab") as log:
        log.write(b'{"action": "prom')  # a writer killed in the middle of its line
    registry.promote(reg, "feed", version, "stable")
    assert [r["action"] for r in registry.read_audit(reg)] == ["register", "promote"]


# --- concurrent and interrupted writers ------------------------------------------------------------

PROMOTE_WHEN_LOCKED = """
    import fcntl, pathlib, sys
    from recsys_rl import registry

    registry_dir, version, role, fraction, marker = sys.argv[1:]
    real_flock = fcntl.flock

    def flock(handle, operation):
        try:
            return real_flock(handle, operation)
        except BlockingIOError:
            pathlib.Path(marker).touch()  # tell the test this writer is waiting for the lock
            raise

    fcntl.flock = flock
    registry.promote(
        registry_dir, "feed", version, role, canary_fraction=float(fraction) if fraction else None
    )
"""


def test_concurrent_writers_serialise(reg: Path, tmp_path: Path) -> None:
    stable, canary, shadow = (add_version(reg, tmp_path, seed) for seed in (1, 2, 3))
    registry.promote(reg, "feed", stable, "stable")
    audited = len(registry.read_audit(reg))
    with open(reg / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # hold the writers' lock until both writers wait for it
        writers = [
            python(PROMOTE_WHEN_LOCKED, str(reg), canary, "canary", "0.3", str(tmp_path / "a-waits")),
            python(PROMOTE_WHEN_LOCKED, str(reg), shadow, "shadow", "", str(tmp_path / "b-waits")),
        ]
        for writer, marker in zip(writers, ("a-waits", "b-waits"), strict=True):
            wait_for(tmp_path / marker, writer, "a writer waiting for the lock")
        fcntl.flock(lock, fcntl.LOCK_UN)
    for writer in writers:
        _, err = writer.communicate(timeout=120)
        assert writer.returncode == 0, err
    routing = registry.read_routing(reg, "feed")
    assert (routing.stable, routing.canary, routing.canary_fraction, routing.shadow) == (
        stable,
        canary,
        0.3,
        shadow,
    )
    assert routing.revision == 3  # neither write was lost
    first, second = registry.read_audit(reg)[audited:]
    assert second["before"] == first["after"] and second["after"] == routing.to_dict()


def _registered_and_routed(reg: Path, tmp_path: Path) -> str:
    version = add_version(reg, tmp_path, 1)
    registry.promote(reg, "feed", version, "stable")
    return version


def test_a_copy_failing_midway_leaves_the_registry_unchanged(
    reg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _registered_and_routed(reg, tmp_path)
    before = visible_tree(reg)
    real_copytree, copied = shutil.copytree, []

    def copy_then_fail(src, dst, *args, **kwargs):
        if copied:
            raise OSError(errno.ENOSPC, "No space left on device")
        copied.append(src)
        return shutil.copy2(src, dst, *args, **kwargs)

    monkeypatch.setattr(
        shutil, "copytree", lambda src, dst, *_: real_copytree(src, dst, copy_function=copy_then_fail)
    )
    with pytest.raises(RegistryError, match=r"cannot store version .* of feed in .*No space left on device"):
        registry.register(reg, "feed", run=make_run(tmp_path / "run2", 2))
    assert copied  # it did fail partway, after a file had been copied
    assert visible_tree(reg) == before and staging_debris(reg) == []


def test_a_version_rename_failing_leaves_the_registry_unchanged(
    reg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _registered_and_routed(reg, tmp_path)
    before = visible_tree(reg)

    def refuse(src, dst):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "rename", refuse)
    with pytest.raises(RegistryError, match="Input/output error"):
        registry.register(reg, "feed", run=make_run(tmp_path / "run2", 2))
    assert visible_tree(reg) == before and staging_debris(reg) == []


def test_a_routing_write_failing_leaves_routing_unchanged(
    reg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _registered_and_routed(reg, tmp_path)
    canary = add_version(reg, tmp_path, 2)
    before = visible_tree(reg)
    real_replace = os.replace

    def fail_on_routing(src, dst):
        if Path(dst).name == "routing.json":
            raise OSError(errno.EIO, "Input/output error")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", fail_on_routing)
    with pytest.raises(RegistryError, match=r"cannot write .*routing.json: .*Input/output error"):
        registry.promote(reg, "feed", canary, "canary", canary_fraction=0.5)
    assert visible_tree(reg) == before  # routing.json as it was, and no audit line for the failed write
    monkeypatch.undo()
    assert registry.promote(reg, "feed", canary, "canary", canary_fraction=0.5).after.revision == 2


def test_an_attach_failing_midway_leaves_the_version_as_it_was(
    reg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    version = add_version(reg, tmp_path, 1, report=False)
    listed = [(v.version, v.why_not_blessed) for v in registry.list_versions(reg, "feed")]
    manifest = (reg / "feed" / "versions" / version / "manifest.json").read_bytes()
    real_replace = os.replace

    def fail_on_manifest(src, dst):
        if Path(dst).name == "manifest.json":
            raise OSError(errno.EIO, "Input/output error")
        real_replace(src, dst)

    report = make_report(tmp_path / "report", tmp_path / "run1" / "policy")
    monkeypatch.setattr(os, "replace", fail_on_manifest)
    with pytest.raises(RegistryError, match=f"cannot attach {report} to version {version} of feed"):
        registry.attach_report(reg, "feed", version, report)
    monkeypatch.undo()
    assert [(v.version, v.why_not_blessed) for v in registry.list_versions(reg, "feed")] == listed
    assert (reg / "feed" / "versions" / version / "manifest.json").read_bytes() == manifest
    assert registry.attach_report(reg, "feed", version, report)
    assert registry.get_version(reg, "feed", version).blessed


REGISTER_SLOWLY = """
    import pathlib, shutil, sys, time
    from recsys_rl import registry

    registry_dir, run, marker = sys.argv[1:]
    real_copytree = shutil.copytree

    def copy_then_stall(src, dst, **kwargs):
        shutil.copy2(src, dst)
        pathlib.Path(marker).touch()  # one file is in the staging copy: kill me now
        time.sleep(600)

    shutil.copytree = lambda src, dst, *_: real_copytree(src, dst, copy_function=copy_then_stall)
    registry.register(registry_dir, "feed", run=run)
"""


def test_a_register_killed_midway_leaves_the_registry_unchanged(reg: Path, tmp_path: Path) -> None:
    _registered_and_routed(reg, tmp_path)
    before = visible_tree(reg)
    run = make_run(tmp_path / "run2", 2)
    writer = python(REGISTER_SLOWLY, str(reg), str(run), str(tmp_path / "copying"))
    try:
        wait_for(tmp_path / "copying", writer, "the killed register")
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.communicate(timeout=60)
    assert writer.returncode == -signal.SIGKILL
    assert staging_debris(reg)  # it was killed with a half-made version in staging...
    assert visible_tree(reg) == before  # ...which no reader sees
    assert len(registry.list_versions(reg, "feed")) == 1

    version = registry.register(reg, "feed", run=run).version  # the next writer sweeps the debris
    assert version.policy_sha256 == digest_of(run / "policy") and staging_debris(reg) == []
