"""``recsys-rl evaluate`` on a trained policy and a pipeline-built dataset, then into the registry."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from recsys_rl.cli.main import main
from recsys_rl.ope.blessing import read_blessing
from recsys_rl.registry.policy_files import policy_digest
from recsys_rl.signals import FEED_SIGNALS

pytestmark = pytest.mark.integration

FAST = {"resamples": 30, "interval": "percentile"}
# a gate nothing can fail, and the strict default one
LENIENT = {
    "gate": {**FAST, "min_main_lift": -1.0, "default_tolerance": 10.0, "min_ess": 0, "max_weight_share": 1.0}
}
STRICT = {"gate": {**FAST, "min_main_lift": 0.05}}


@pytest.fixture(scope="module")
def bc_run(feed_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("eval-runs") / "bc"
    code = main(["train", "--algo", "bc", "--data", str(feed_dataset), "--out", str(run), "--steps", "40"])
    assert code == 0
    return run


def _config(tmp_path: Path, settings: dict) -> Path:
    path = tmp_path / "gate.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


def _evaluate(capsys, dataset: Path, run: Path, out: Path, config: Path, *flags: str) -> tuple[int, str, str]:
    code = main(
        [
            "evaluate",
            "--candidate",
            str(run),
            "--data",
            str(dataset),
            "--out",
            str(out),
            "--config",
            str(config),
            *flags,
        ]
    )
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _register_and_promote(capsys, registry: Path, run: Path, evaluation: Path) -> int:
    """Register the run with its evaluation attached; the exit code of promoting it to stable."""
    register = [
        "registry",
        "register",
        "--registry",
        str(registry),
        "--run",
        str(run),
        "--report",
        str(evaluation),
    ]
    assert main(register) == 0
    capsys.readouterr()
    assert main(["registry", "list", "--registry", str(registry)]) == 0
    version = next(line.split()[0] for line in capsys.readouterr().out.splitlines() if "bc-" in line)
    return main(["registry", "promote", version, "--to", "stable", "--registry", str(registry)])


def test_evaluate_writes_a_report_and_a_blessing_the_registry_accepts(
    feed_dataset: Path, bc_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    out = tmp_path / "eval"
    config = _config(tmp_path, LENIENT)
    code, stdout, _ = _evaluate(capsys, feed_dataset, bc_run, out, config, "--fail-if-not-blessed")
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    verdict = report["verdict"]
    # one set of support lines: the diagnostics warn where the gate gates
    diagnostics = report["lift"]["diagnostics"]["candidate"]
    assert (diagnostics["thresholds"]["min_ess"], diagnostics["thresholds"]["max_weight_share"]) == (0.0, 1.0)
    # the headline counts the warnings, and this gate says it is loose: every rule setting is
    by_level = diagnostics["warnings_by_level"]
    assert verdict["warnings"] == [f"candidate: {w}" for w in by_level["decision"] + by_level["groups"]]
    assert verdict["headline"] == (
        f"BLESSED with {len(verdict['warnings'])} warning{'s' if len(verdict['warnings']) > 1 else ''}"
        if verdict["warnings"]
        else "BLESSED"
    )
    assert len(verdict["loose_settings"]) == 1 + 6 + 2  # min_main_lift, six tolerances, min_ess, share
    lines = stdout.splitlines()
    assert lines[0].startswith(f"{verdict['headline']} by a LOOSE gate: ")
    assert lines[1] == "  loose gate: 9 settings looser than the recommended defaults"
    assert lines[2:11] == [f"    {setting}" for setting in verdict["loose_settings"]]
    blessing = read_blessing(out / "blessing.json")
    assert blessing.passed and blessing.reasons == ()
    assert blessing.candidate.policy_sha256 == policy_digest(bc_run / "policy")
    assert blessing.estimator == "snips" and blessing.interval_method == "percentile"
    assert blessing.data_manifest["version"] == feed_dataset.name
    lift = report["lift"]["estimators"]["snips"]["overall"]
    assert set(lift) == set(FEED_SIGNALS)
    for entry in lift.values():
        low, high = entry["relative"]["interval"]
        assert low <= entry["relative"]["value"] <= high
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3
    assert f"{verdict['headline']}</span>" in page and "Loose gate: 9 settings" in page
    assert not re.search(r'(src|href)="(http|//)', page), "the report must not fetch anything"

    assert _register_and_promote(capsys, tmp_path / "registry", bc_run, out) == 0


def test_a_failed_gate_lists_its_reasons_and_the_registry_refuses_promotion(
    feed_dataset: Path, bc_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    out = tmp_path / "eval"
    code, stdout, _ = _evaluate(capsys, feed_dataset, bc_run, out, _config(tmp_path, STRICT))
    assert code == 0 and stdout.startswith("NOT BLESSED: ")  # the recommended gate is not loose
    blessing = read_blessing(out / "blessing.json")
    assert not blessing.passed
    assert any(reason.startswith("watch_time: 95% lower bound") for reason in blessing.reasons)
    # for CI: the same verdict, and a distinct exit code
    again = tmp_path / "eval-ci"
    code, _, _ = _evaluate(
        capsys, feed_dataset, bc_run, again, _config(tmp_path, STRICT), "--fail-if-not-blessed"
    )
    assert code == 3 and not read_blessing(again / "blessing.json").passed

    assert _register_and_promote(capsys, tmp_path / "registry", bc_run, out) == 1
    assert "watch_time" in capsys.readouterr().err


def test_an_existing_output_and_a_bad_gate_config_are_one_line_errors(
    feed_dataset: Path, bc_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    out = tmp_path / "eval"
    out.mkdir()
    code, _, err = _evaluate(capsys, feed_dataset, bc_run, out, _config(tmp_path, LENIENT))
    assert code == 1 and "already exists" in err and err.count("\n") == 1
    code, _, err = _evaluate(
        capsys,
        feed_dataset,
        bc_run,
        tmp_path / "new",
        _config(tmp_path, {"gate": {"tolerances": {"watch_time": 0.1}}}),
    )
    assert code == 2 and "not constraint signals" in err and err.count("\n") == 1
    for estimator, message in (("magic", "estimator should be one of ['ips'"), ("dm", "'dm' cannot gate")):
        code, _, err = _evaluate(
            capsys,
            feed_dataset,
            bc_run,
            tmp_path / "new",
            _config(tmp_path, {"gate": {"estimator": estimator}}),
        )
        assert code == 2 and message in err and err.count("\n") == 1
        assert not (tmp_path / "new").exists()
