"""Errors that point to the fix (issue 23, item 7): each found by following the README as a newcomer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from recsys_rl.cli.main import main
from recsys_rl.config import ConfigError, load_config
from recsys_rl.ope.evaluate import EvaluateConfig, scored_policy

ROOT = Path(__file__).resolve().parents[2]


def test_a_broken_config_file_is_reported_before_tensorflow_loads(tmp_path):
    """It took 6-13 s of TensorFlow start-up to learn of a YAML typo."""
    config = tmp_path / "train.yaml"
    config.write_text("algo: bc\nsteps: [\n")
    code = "import sys; from recsys_rl.cli.main import main; rc = main(sys.argv[1:]); "
    code += "print('tensorflow' in sys.modules); sys.exit(rc)"
    result = subprocess.run(
        [sys.executable, "-c", code, "train", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and result.stdout.strip() == "False", result.stderr
    assert result.stderr.count("\n") == 1 and "is not valid YAML" in result.stderr


def test_a_dataset_root_instead_of_a_version_names_the_versions_inside(tmp_path, capsys):
    (tmp_path / "transitions-0123" / "manifest.json").parent.mkdir()
    (tmp_path / "transitions-0123" / "manifest.json").write_text("{}")
    code = main(["train", "--algo", "bc", "--data", str(tmp_path), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and f"pass one of them, e.g. {tmp_path}/transitions-0123" in err, err


def test_an_allocation_policy_under_the_default_gate_names_the_setting(tmp_path):
    """An SL-MGAC run evaluated with the README's first command failed deep in the policy loader."""
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "policy.json").write_text(json.dumps({"kind": "allocation_policy", "schema_version": 1}))
    with pytest.raises(
        ConfigError, match=r"holds a live_allocation policy, but gate.surface is feed: set gate: "
    ):
        scored_policy(policy, "feed")


@pytest.mark.parametrize(
    ("name", "surface"),
    [("gate.yaml", "feed"), ("gate-live.yaml", "live_allocation"), ("gate-user-author.yaml", "user_author")],
)
def test_the_readmes_example_configs_exist_and_load(name, surface):
    path = ROOT / "examples" / name
    assert f"--config examples/{name}" in (ROOT / "README.md").read_text()
    config = load_config(EvaluateConfig, path, {"candidate": "c", "data": "d", "out": "o"})
    assert config.gate.surface == surface
    assert set(yaml.safe_load(path.read_text())["gate"]["tolerances"]) <= set(config.gate.constraint_signals)


def test_registry_settings_come_from_flags_then_the_config_then_the_environment(
    tmp_path, capsys, monkeypatch
):
    from_file, from_env = tmp_path / "from-file", tmp_path / "from-env"
    from_file.mkdir(), from_env.mkdir()
    config = tmp_path / "registry.yaml"
    config.write_text(yaml.safe_dump({"registry": str(from_file), "surface": "live_allocation"}))
    monkeypatch.setenv("RECSYS_RL_REGISTRY", str(from_env))

    assert main(["registry", "list", "--config", str(config)]) == 0
    assert capsys.readouterr().out.startswith(f"live_allocation in {from_file}:")
    assert main(["registry", "list", "--config", str(config), "--surface", "feed"]) == 0
    assert capsys.readouterr().out.startswith(f"feed in {from_file}:")
    assert main(["registry", "list"]) == 0
    assert capsys.readouterr().out.startswith(f"feed in {from_env}:")
    monkeypatch.delenv("RECSYS_RL_REGISTRY")
    assert main(["registry", "list"]) == 2
    assert "registry is required: --registry DIR, 'registry:' in --config, or env" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("ess", "share", "warned"),
    [(6.0, 0.2, True), (5000.0, 0.02, True), (5000.0, 0.001, False), (1000.0, 0.01, False)],
)
def test_training_warns_when_its_own_data_covers_the_policy_too_thinly_for_the_gate(
    monkeypatch, capsys, ess, share, warned
):
    """Issue 23: the README's training defaults made a policy the default gate refuses (ESS 6 of 4,126)."""
    from recsys_rl.cli import train as train_cmd
    from recsys_rl.ope import evaluate

    summary = {"ess": ess, "count": 4126, "max_weight_share": share}
    monkeypatch.setattr(evaluate, "support_on_data", lambda policy, data, surface: summary)
    train_cmd._warn_if_thin_support(Path("run/policy"), "data", "feed")
    captured = capsys.readouterr()
    assert f"effective sample size {ess:,.0f} of 4,126 decisions" in captured.out
    assert ("would refuse this policy on this data" in captured.err) is warned
    assert ("a larger agent.behaviour_lambda" in captured.err) is warned
