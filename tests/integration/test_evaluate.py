"""``recsys-rl evaluate`` on a trained policy and a pipeline-built dataset, then into the registry."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import FEED_DATASET_SEED, FEED_DATASET_USERS
from open_gate import OPEN_GATE

from recsys_rl.cli.main import main
from recsys_rl.ope.blessing import read_blessing
from recsys_rl.registry.policy_files import policy_digest
from recsys_rl.signals import FEED_SIGNALS

pytestmark = pytest.mark.integration

FAST = {"resamples": 30, "interval": "percentile"}
# a gate nothing can fail, and the strict default one
LENIENT = {"gate": {**FAST, **OPEN_GATE}}
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
    # lift per group, estimator agreement, risk, actions, importance weights, ESS
    assert page.count("data:image/png;base64,") == 6
    assert f"{verdict['headline']}</span>" in page and "Loose gate: 9 settings" in page
    assert not re.search(r'(src|href)="(http|//)', page), "the report must not fetch anything"

    assert _register_and_promote(capsys, tmp_path / "registry", bc_run, out) == 0

    # the same figures in TensorBoard: the candidate's identity as hparams, the lifts as its metrics
    hparams, scalars = _tensorboard(out / "tensorboard")
    assert (
        hparams["candidate"] == report["inputs"]["candidate"]["version"] and hparams["estimator"] == "snips"
    )
    for signal, entry in lift.items():
        assert scalars[f"lift/{signal}"] == pytest.approx(entry["relative"]["value"], rel=1e-6)
        assert scalars[f"lift/{signal}/low"] == pytest.approx(entry["relative"]["interval"][0], rel=1e-6)
    assert scalars["gate/blessed"] == 1.0


def _tensorboard(directory: Path) -> tuple[dict, dict[str, float]]:
    """The hparams and the scalars (by tag) written to ``directory``'s event files."""
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = event_accumulator.EventAccumulator(str(directory), size_guidance={"tensors": 0})
    events.Reload()
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    hparams = {name: value.string_value for name, value in start.hparams.items()}
    tags = [tag for tag in events.Tags()["tensors"] if not tag.startswith("_hparams_")]
    scalars = {tag: float(tf_value(events.Tensors(tag)[0])) for tag in tags}
    return hparams, scalars


def tf_value(event) -> float:
    import tensorflow as tf

    return tf.make_ndarray(event.tensor_proto).item()


def test_a_failed_gate_lists_its_reasons_and_the_registry_refuses_promotion(
    feed_dataset: Path, bc_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    out = tmp_path / "eval"
    code, stdout, _ = _evaluate(capsys, feed_dataset, bc_run, out, _config(tmp_path, STRICT))
    assert code == 0 and stdout.startswith("NOT BLESSED: ")  # the recommended gate is not loose
    blessing = read_blessing(out / "blessing.json")
    assert not blessing.passed
    assert any(reason.startswith("watch_time: 95% lower bound") for reason in blessing.reasons)
    # for CI: the same verdict, and a distinct exit code; sessions resampled alone, as configured
    again = tmp_path / "eval-ci"
    by_session = {"gate": {**STRICT["gate"], "bootstrap_unit": "session"}}
    code, _, _ = _evaluate(
        capsys, feed_dataset, bc_run, again, _config(tmp_path, by_session), "--fail-if-not-blessed"
    )
    assert code == 3 and not read_blessing(again / "blessing.json").passed
    units = [json.loads((d / "report.json").read_text())["lift"]["interval"]["unit"] for d in (out, again)]
    assert units == ["user", "session"]

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
    # a simulated world is named whole: a seed without its users is refused before anything is read
    code, _, err = _evaluate(
        capsys, feed_dataset, bc_run, tmp_path / "new", _config(tmp_path, LENIENT), "--simulator-seed", "3"
    )
    assert code == 2 and "simulator users should be at least 1, but is 0" in err and err.count("\n") == 1
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


@pytest.fixture(scope="module")
def evaluated(
    feed_dataset: Path, bc_run: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict, str]:
    """One lenient evaluation of the BC run with the world of the simulated logs declared."""
    tmp = tmp_path_factory.mktemp("eval-truth")
    out = tmp / "eval"
    code = main(
        [
            "evaluate",
            "--candidate",
            str(bc_run),
            "--data",
            str(feed_dataset),
            "--out",
            str(out),
            "--config",
            str(_config(tmp, LENIENT)),
            "--simulator-users",
            str(FEED_DATASET_USERS),
            "--simulator-seed",
            str(FEED_DATASET_SEED),
        ]
    )
    assert code == 0
    return out, json.loads((out / "report.json").read_text()), (out / "report.html").read_text()


def test_the_report_holds_absolute_values_actions_and_risk_from_report_json(evaluated):
    """Issue 19 item 8: absolute values in the signal's units, the reward model's fit, the risk of the
    return distribution, and the candidate's actions against the logged ones, all in report.json."""
    out, report, page = evaluated
    lift = report["lift"]
    block = lift["estimators"]["snips"]["overall"]["watch_time"]
    assert block["candidate"]["value"] > 1.0  # seconds of watch time per decision, not a ratio
    low, high = block["candidate"]["interval"]
    assert low <= block["candidate"]["value"] <= high
    actions = report["actions"]
    assert (actions["kind"], actions["series"], actions["seed"]) == ("continuous", ["logged", "candidate"], 0)
    assert actions["names"] == list(FEED_SIGNALS) and sorted(actions["dimensions"]) == sorted(FEED_SIGNALS)
    for dimension in actions["dimensions"].values():
        for series in actions["series"]:
            counted = sum(dimension["counts"][series]) + dimension["outside"][series]
            assert counted == actions["states"] == lift["rows"]
            quantiles = dimension["quantiles"][series]
            assert quantiles == sorted(quantiles)
    # the page is rendered from report.json alone: the same page again from the file
    from recsys_rl.ope.report import render

    again = render(json.loads((out / "report.json").read_text()))
    assert again.replace(report["created_at"], "") == page.replace(report["created_at"], "")
    watch = lift["estimators"]["snips"]["overall"]["watch_time"]
    assert "seconds per decision" in page and f"{watch['candidate']['value']:,.4g}" in page
    assert "<th>R²</th>" in page and "CVaR 10%" in page and "Actions: candidate against logged" in page
    assert (
        page.count("dm (model error not included)") == 1 and page.count("fqe (model error not included)") == 1
    )


def test_simulated_logs_get_the_simulators_truth_beside_each_estimate(evaluated):
    """Issue 19 item 8: the dataset does not record its simulated world, so evaluate is told it; the
    behaviour policy in that world must reproduce the logged value, and the truth is shown."""
    _, report, page = evaluated
    truth = report["ground_truth"]
    assert truth["world"]["users"] == FEED_DATASET_USERS and truth["world"]["seed"] == FEED_DATASET_SEED
    check = truth["world_check"]
    assert check["passed"], check
    per_decision = truth["scales"]["per_decision"]["watch_time"]
    # against the behaviour policy, the baseline's truth is the behaviour's own: the world check's
    assert per_decision["baseline"]["value"] == pytest.approx(check["behaviour_truth"]["value"])
    # OPE and the truth agree on what the BC candidate is worth, within a few of their errors
    estimate = report["lift"]["estimators"]["dr"]["overall"]["watch_time"]["candidate"]
    spread = (estimate["interval"][1] - estimate["interval"][0]) / 3.92
    error = np.hypot(spread, per_decision["candidate"]["stderr"])
    assert abs(estimate["value"] - per_decision["candidate"]["value"]) < 4 * error
    assert "Simulator ground truth" in page and "World check passed" in page
    assert "candidate, simulator truth" in page and "simulator truth" in page


def test_several_candidates_are_ranked_each_with_an_attachable_evaluation(
    feed_dataset: Path, bc_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    """Issue 19 item 8: `evaluate --candidate A --candidate B`. The second run has the first's version
    name (same algorithm, dataset and seed), so the directories tell them apart by digest."""
    other = tmp_path / "bc-short"
    assert (
        main(["train", "--algo", "bc", "--data", str(feed_dataset), "--out", str(other), "--steps", "5"]) == 0
    )
    capsys.readouterr()
    out = tmp_path / "ranked"
    config = _config(tmp_path, STRICT)
    code, stdout, _ = _evaluate(
        capsys, feed_dataset, bc_run, out, config, "--candidate", str(other), "--fail-if-not-blessed"
    )
    assert code == 3  # the strict gate blesses neither
    ranking = json.loads((out / "ranking.json").read_text())
    entries = ranking["candidates"]
    assert [e["rank"] for e in entries] == [1, 2]
    bounds = [e["lower_bound"] for e in entries]
    assert bounds == sorted(bounds, reverse=True)
    digests = {policy_digest(bc_run / "policy"), policy_digest(other / "policy")}
    assert {e["policy_sha256"] for e in entries} == digests
    assert sorted(p.name for p in (out / "candidates").iterdir()) == sorted(
        f"{e['version']}-{e['policy_sha256'][:12]}" for e in entries
    )
    lines = stdout.splitlines()
    assert (
        len(lines) == 3
        and lines[0].startswith("1. NOT BLESSED: ")
        and lines[1].startswith("2. NOT BLESSED: ")
    )
    reports = []
    for entry in entries:
        directory = out / entry["directory"]
        assert sorted(p.name for p in directory.iterdir()) == [
            "blessing.json",
            "report.html",
            "report.json",
            "tensorboard",
        ]
        report = json.loads((directory / "report.json").read_text())
        assert report["lift"]["interval"]["seed"] == 0 and report["verdict"]["headline"] == entry["headline"]
        assert (
            report["lift"]["estimators"]["snips"]["overall"]["watch_time"]["relative"]["interval"][0]
            == (entry["lower_bound"])
        )
        reports.append(report)
    assert not any(name.startswith(".") for name in (p.name for p in tmp_path.iterdir()))  # no staging left
    page = (out / "ranking.html").read_text()
    assert all(f'href="{e["directory"]}/report.html"' in page for e in entries)
    # each candidate's directory is what the registry attaches, as a single evaluation's OUT: bc_run's
    # own, whichever rank the data gave it
    (own,) = [e for e in entries if e["policy_sha256"] == policy_digest(bc_run / "policy")]
    assert _register_and_promote(capsys, tmp_path / "registry", bc_run, out / own["directory"]) in (0, 1)
    code, _, err = _evaluate(
        capsys, feed_dataset, bc_run, tmp_path / "twice", config, "--candidate", str(bc_run)
    )
    assert code == 2 and "given more than once" in err
