"""``recsys-rl registry`` called in-process: what each action prints, and one-line errors with exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_calls import Invocation, cli
from registry_fakes import digest_of, make_policy, make_report, make_run

from recsys_rl import registry


def one_line_error(result: Invocation, code: int, message: str) -> None:
    assert result.code == code, result
    assert message in result.err, result.err
    assert result.err.count("\n") == 1 and "Traceback" not in result.err
    assert result.err.startswith("recsys-rl registry")


@pytest.fixture
def reg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("RECSYS_RL_REGISTRY", raising=False)
    monkeypatch.setenv("USER", "carol")
    return tmp_path / "registry"


def test_register_attach_list_show_promote_rollback(
    reg: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    run1, run2 = make_run(tmp_path / "run1", 1), make_run(tmp_path / "run2", 2)
    v1 = f"tscac-ds1-s1-{digest_of(run1 / 'policy')[:12]}"
    v2 = f"tscac-ds1-s2-{digest_of(run2 / 'policy')[:12]}"
    reasons = ("watch_time: lower bound of the lift -1.20% < required +0.00%", "ESS 90 vs required 1,000")
    refused = make_report(tmp_path / "refused", run2 / "policy", passed=False, reasons=reasons)

    result = cli(capsys, "registry", "register", "--registry", reg, "--run", run1)
    assert result.code == 0, result
    assert result.out.splitlines() == [
        f"registered feed version {v1} from {run1}",
        f"  directory {reg / 'feed' / 'versions' / v1}",
        "  blessing  not blessed: no OPE report and blessing attached",
    ]
    result = cli(capsys, "registry", "register", "--registry", reg, "--policy", run1 / "policy")
    assert result.out.startswith(f"feed version {v1} already holds this policy; nothing copied")

    report = make_report(tmp_path / "report1", run1 / "policy")
    result = cli(capsys, "registry", "attach", v1, "--report", report, "--registry", reg, "--actor", "dave")
    assert result.code == 0 and result.out.startswith(f"attached {report} to feed version {v1}")
    assert "  blessing  passed (snips, bca intervals, gate run " in result.out
    assert (
        cli(capsys, "registry", "register", "--registry", reg, "--run", run2, "--report", refused).code == 0
    )

    result = cli(capsys, "registry", "list", "--registry", reg)
    lines = result.out.splitlines()
    assert lines[0] == f"feed in {reg}: stable -, canary -, shadow - (revision 0)"
    assert lines[1].split() == ["VERSION", "BLESSING", "ROLE", "REGISTERED", "DATASET"]
    assert [line.split()[:3] for line in lines[2:]] == [[v1, "blessed", "-"], [v2, "refused", "-"]]

    result = cli(capsys, "registry", "promote", v1, "--to", "stable", "--registry", reg)
    assert result.code == 0 and result.out.splitlines() == [
        "feed: routing revision 0 -> 1",
        f"  stable   - -> {v1}",
    ]
    result = cli(
        capsys, "registry", "promote", v2, "--to", "canary", "--canary-fraction", "0.2", "--registry", reg
    )
    one_line_error(
        result, 1, f"cannot make version {v2} of feed canary: the OPE gate refused it: {'; '.join(reasons)}"
    )
    result = cli(capsys, "registry", "promote", v2, "--to", "shadow", "--registry", reg)
    assert result.code == 0 and f"  shadow   - -> {v2}" in result.out

    result = cli(capsys, "registry", "show", v2, "--registry", reg)
    assert result.code == 0
    out = result.out.splitlines()
    assert out[0] == f"feed version {v2}" and out[1] == "  role        shadow"
    assert f"  policy      sha256 {digest_of(run2 / 'policy')} (policy version tscac-ds1-s2)" in out
    assert f"  source      run {run2.resolve()}" in out and "  dataset     ds1" in out
    assert any(line.startswith("  blessing    FAILED (snips, bca intervals") for line in out)
    assert [line for line in out if line.startswith("    - ")] == [f"    - {reason}" for reason in reasons]
    history = out[out.index("  history") + 1 :]
    assert [line.split(" ", 5)[-1] for line in history] == ["carol: registered", "carol: promoted to shadow"]

    one_line_error(
        cli(capsys, "registry", "rollback", "--registry", reg), 1, f"no earlier stable version than {v1}"
    )
    monkeypatch.setenv("RECSYS_RL_REGISTRY", str(reg))
    result = cli(capsys, "registry", "list")
    assert result.code == 0 and result.out.splitlines()[0] == (
        f"feed in {reg}: stable {v1}, canary -, shadow {v2} (revision 2)"
    )
    result = cli(capsys, "registry", "demote", "shadow")
    assert result.code == 0 and f"  shadow   {v2} -> -" in result.out
    actions = [(r["action"], r["actor"]) for r in registry.read_audit(reg)]
    assert actions == [
        ("register", "carol"),
        ("attach", "dave"),
        ("register", "carol"),
        ("promote", "carol"),
        ("promote", "carol"),
        ("demote", "carol"),
    ]


def test_canary_promotion_and_rollback(reg: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    versions = []
    for seed in (1, 2):
        run = make_run(tmp_path / f"run{seed}", seed)
        report = make_report(tmp_path / f"report{seed}", run / "policy")
        cli(capsys, "registry", "register", "--registry", reg, "--run", run, "--report", report)
        versions.append(f"tscac-ds1-s{seed}-{digest_of(run / 'policy')[:12]}")
    v1, v2 = versions
    cli(capsys, "registry", "promote", v1, "--to", "stable", "--registry", reg)
    result = cli(
        capsys, "registry", "promote", v2, "--to", "canary", "--canary-fraction", "0.05", "--registry", reg
    )
    assert result.out.splitlines()[1:] == [f"  canary   - -> {v2}", "  canary fraction 0 -> 0.05"]
    result = cli(capsys, "registry", "list", "--registry", reg)
    assert f"canary {v2} (5.0% of users)" in result.out
    result = cli(capsys, "registry", "promote", v2, "--to", "stable", "--registry", reg)
    assert result.out.splitlines()[1:] == [
        f"  stable   {v1} -> {v2}",
        f"  canary   {v2} -> -",
        "  canary fraction 0.05 -> 0",
    ]
    result = cli(capsys, "registry", "rollback", "--registry", reg)
    assert result.code == 0 and result.out.splitlines() == [
        "feed: routing revision 3 -> 4",
        f"  stable   {v2} -> {v1}",
    ]
    result = cli(capsys, "registry", "promote", v1, "--to", "stable", "--registry", reg)
    assert result.out.startswith(f"feed: nothing to change; stable {v1}")


def _lift(value: float, low: float, high: float) -> dict[str, Any]:
    return {"value": value, "interval": [low, high], "method": "bca", "dropped_resamples": 0}


def with_lifts(report_dir: Path, gating: dict[str, Any], other: dict[str, Any]) -> Path:
    """``report_dir``'s report.json given the lift block ``recsys-rl evaluate`` writes: relative lifts by
    the gating estimator (snips, as make_report's blessing names it) and by another one."""
    overall = {
        name: {
            signal: {"relative": lift, "difference": _lift(9.0, 8.0, 10.0)} for signal, lift in lifts.items()
        }
        for name, lifts in (("snips", gating), ("dr", other))
    }
    lift = {
        "signals": list(gating),
        "estimators": {name: {"overall": block, "groups": {}} for name, block in overall.items()},
    }
    (report_dir / "report.json").write_text(json.dumps({"estimator": "snips", "lift": lift}))
    return report_dir


def test_list_json_gives_each_version_its_role_and_blessing_with_its_lifts(
    reg: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    runs = [make_run(tmp_path / f"run{seed}", seed) for seed in (1, 2, 3)]
    v1, v2, v3 = (f"tscac-ds1-s{seed}-{digest_of(run / 'policy')[:12]}" for seed, run in enumerate(runs, 1))
    blessed = make_report(tmp_path / "blessed", runs[0] / "policy")
    gating = {"watch_time": _lift(0.012, 0.004, 0.021), "hate": _lift(-0.03, -0.08, 0.01)}
    other = {"watch_time": _lift(0.5, 0.4, 0.6), "hate": _lift(0.5, 0.4, 0.6)}
    with_lifts(blessed, gating, other)
    reasons = ("hate: upper bound of the lift +4.00% > allowed +2.00%",)
    refused = make_report(tmp_path / "refused", runs[1] / "policy", passed=False, reasons=reasons)
    for run, report in zip(runs, (blessed, refused, None), strict=True):
        extra = ["--report", report] if report else []
        assert cli(capsys, "registry", "register", "--registry", reg, "--run", run, *extra).code == 0
    cli(capsys, "registry", "promote", v1, "--to", "stable", "--registry", reg)
    cli(capsys, "registry", "promote", v2, "--to", "shadow", "--registry", reg)

    result = cli(capsys, "registry", "list", "--registry", reg, "--json")
    assert result.code == 0, result
    listed = json.loads(result.out)
    assert [(v["version"], v["role"], v["status"]) for v in listed] == [
        (v1, "stable", "blessed"),
        (v2, "shadow", "refused"),
        (v3, "none", "unblessed"),
    ]
    first = listed[0]
    assert first["policy_sha256"] == digest_of(runs[0] / "policy") and first["dataset_version"] == "ds1"
    assert first["registered_at"] and first["policy_version"] == "tscac-ds1-s1" and first["defects"] == []
    assert first["blessing"]["passed"] is True and first["blessing"]["reasons"] == []
    assert (first["blessing"]["estimator"], first["blessing"]["interval_method"]) == ("snips", "bca")
    assert first["blessing"]["relative_lifts"] == {
        signal: {"value": lift["value"], "interval": lift["interval"]} for signal, lift in gating.items()
    }
    assert listed[1]["blessing"]["passed"] is False and listed[1]["blessing"]["reasons"] == list(reasons)
    assert listed[1]["blessing"]["relative_lifts"] is None  # its report holds no lift block
    assert listed[2]["blessing"] is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["list"],
            "registry is required: --registry DIR, 'registry:' in --config, or env",
            id="no-registry",
        ),
        pytest.param(
            ["register", "--registry", "R", "--run", "a", "--policy", "b"],
            "argument --policy: not allowed with argument --run",
            id="run-and-policy",
        ),
        pytest.param(
            ["register", "--registry", "R"], "one of the arguments --run --policy is required", id="none"
        ),
        pytest.param(
            ["promote", "v1", "--to", "canary", "--registry", "R"],
            "--canary-fraction is needed with --to canary, and only with it",
            id="canary-without-fraction",
        ),
        pytest.param(
            ["promote", "v1", "--to", "stable", "--canary-fraction", "0.1", "--registry", "R"],
            "--canary-fraction is needed with --to canary, and only with it",
            id="fraction-without-canary",
        ),
        pytest.param(
            ["promote", "v1", "--to", "canary", "--canary-fraction", "1.5", "--registry", "R"],
            "argument --canary-fraction: canary_fraction should be a number in [0, 1], but is 1.5",
            id="fraction-above-1",
        ),
        pytest.param(
            ["promote", "v1", "--to", "canary", "--canary-fraction", "half", "--registry", "R"],
            "canary_fraction should be a number in [0, 1], but is 'half'",
            id="fraction-not-a-number",
        ),
        pytest.param(
            ["promote", "v1", "--to", "gold", "--registry", "R"], "argument --to: invalid choice", id="role"
        ),
        pytest.param(
            ["show", "../v1", "--registry", "R"], "a version should be 1 to 128 letters", id="version"
        ),
        pytest.param(
            ["list", "--registry", "R", "--surface", "search"], "argument --surface: invalid", id="surface"
        ),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(
    reg: Path, capsys: pytest.CaptureFixture, args: list[str], message: str
) -> None:
    one_line_error(cli(capsys, "registry", *[str(reg) if a == "R" else a for a in args]), 2, message)


def test_operational_errors_give_one_line_and_exit_1(
    reg: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    one_line_error(cli(capsys, "registry", "list", "--registry", reg), 1, f"no registry at {reg}")
    policy = make_policy(tmp_path / "policy", 1)
    (policy / "saved_model.pb").write_bytes(b"changed")
    result = cli(capsys, "registry", "register", "--registry", reg, "--policy", policy)
    one_line_error(result, 1, f"{policy} does not match its policy.json (saved_model.pb differ)")
    make_policy(policy, 1)
    version = f"tscac-ds1-s0-{digest_of(policy)[:12]}"
    assert cli(capsys, "registry", "register", "--registry", reg, "--policy", policy).code == 0
    result = cli(capsys, "registry", "show", "v9", "--registry", reg)
    one_line_error(result, 1, f"feed has no version 'v9' in {reg} (known: {version})")
    other = make_report(tmp_path / "other", make_policy(tmp_path / "other-policy", 2))
    result = cli(capsys, "registry", "attach", version, "--report", other, "--registry", reg)
    one_line_error(result, 1, "blesses candidate (policy sha256")
    result = cli(capsys, "registry", "promote", version, "--to", "stable", "--registry", reg)
    one_line_error(
        result, 1, f"cannot make version {version} of feed stable: no OPE report and blessing attached"
    )


def test_a_first_exposure_is_approved_shown_promoted_and_ended_by_a_refused_report(
    reg: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    policy = make_policy(tmp_path / "ua", 1, version="ua-mtcl-ds1-s1", surface="user_author")
    where = ["--registry", reg, "--surface", "user_author"]
    assert cli(capsys, "registry", "register", "--policy", policy, "--version", "ua1", *where).code == 0
    approve = ["registry", "approve-exposure", "ua1", *where, "--reason", "new follow critic"]

    too_many = cli(capsys, *approve, "--max-canary-fraction", "0.5")
    one_line_error(too_many, 2, "max_canary_fraction should be in")
    unexplained = cli(capsys, *approve, "--max-canary-fraction", "0.01", "--reason", " ")
    one_line_error(
        unexplained, 2, "--reason: reason should say why this version should be exposed, but is ' '"
    )
    result = cli(capsys, *approve, "--max-canary-fraction", "0.01")
    assert result.code == 0, result
    lines = result.out.splitlines()
    assert lines[0].startswith("approved first exposure for at most 1.0% of users, by carol at ")
    assert lines[0].endswith(": new follow critic")
    assert lines[1] == "  next: registry promote --surface user_author ua1 --to canary --canary-fraction 0.01"
    assert cli(capsys, *approve, "--max-canary-fraction", "0.01").out.startswith("already approved: ")

    promote = ["registry", "promote", "ua1", "--to", "canary", *where, "--canary-fraction"]
    one_line_error(cli(capsys, *promote, "0.02"), 1, "approved for at most 1.0% of users, not 2.0%")
    assert cli(capsys, *promote, "0.01").code == 0
    show = cli(capsys, "registry", "show", "ua1", *where).out
    assert "  role        canary" in show and "  exposure    first exposure for at most 1.0%" in show
    assert "first exposure approved for at most 1.0%: new follow critic" in show  # the history line
    (entry,) = json.loads(cli(capsys, "registry", "list", "--json", *where).out)
    assert entry["exposure"]["max_canary_fraction"] == 0.01 and entry["exposure"]["actor"] == "carol"
    assert entry["status"] == "first exposure <= 1.0%"
    row = cli(capsys, "registry", "list", *where).out.splitlines()[2]
    assert row.split()[:6] == ["ua1", "first", "exposure", "<=", "1.0%", "canary"]

    refused = make_report(tmp_path / "refused", policy, passed=False, reasons=("follow: lift below 0",))
    result = cli(capsys, "registry", "attach", "ua1", "--report", refused, *where)
    assert result.code == 0 and result.out.splitlines()[-1] == (
        "  canary    cleared: the gate refused the version's first exposure"
    )
    assert registry.read_routing(reg, "user_author").canary is None
