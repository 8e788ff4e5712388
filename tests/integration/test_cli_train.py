"""``recsys-rl train`` and ``recsys-rl sim-eval`` on a dataset built the production way, called in-process."""

import contextlib
import io
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from recsys_rl import signals
from recsys_rl.cli.main import main
from recsys_rl.config import load_config
from recsys_rl.sim.sim_eval import AUXILIARY_SIGNALS

pytestmark = pytest.mark.integration

STEPS = 60
SETTINGS = {"log_every": 20, "checkpoint_every": 20, "agent": {"actor_hidden": [32]}}


@dataclass(frozen=True)
class Invocation:
    code: int
    out: str
    err: str


def _cli(capsys: pytest.CaptureFixture, *args: str) -> Invocation:
    code = main(list(args))
    captured = capsys.readouterr()
    return Invocation(code, captured.out, captured.err)


def _train_args(dataset: Path, run: Path, config: Path) -> list[str]:
    return ["train", "--algo", "bc", "--data", str(dataset), "--out", str(run), "--config", str(config)]


@pytest.fixture(scope="module")
def settings_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("train-config") / "train.yaml"
    path.write_text(yaml.safe_dump(SETTINGS))
    return path


@pytest.fixture(scope="module")
def bc_run(feed_dataset: Path, settings_file: Path, tmp_path_factory: pytest.TempPathFactory):
    """One finished run, with what its command printed (capsys is per test, so captured by hand)."""
    run = tmp_path_factory.mktemp("runs") / "bc"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(
            [*_train_args(feed_dataset, run, settings_file), "--steps", str(STEPS), "--batch-size", "256"]
        )
    return run, Invocation(code, out.getvalue(), err.getvalue())


def test_train_help_lists_the_algorithms():
    result = subprocess.run(
        [sys.executable, "-m", "recsys_rl.cli.main", "train", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert (
        "{tscac,tscac-dpg,bc,rcpo,rcpo-mc,ac-main,sl-mgac,sl-mgac-nosl,ac-single-group,ua-mtcl,ua-independent}"
        in result.stdout
    )


def test_train_reports_the_run_and_logs_progress(bc_run):
    run, result = bc_run
    assert result.code == 0, result.err
    assert f"run {run}: bc, {STEPS} steps (trained from scratch)" in result.out
    assert f"policy  {run / 'policy'} (version bc-" in result.out
    assert "final metrics: actor/main=" in result.out and "transitions_per_s=" in result.out
    support = re.search(
        r"support on its training data: effective sample size ([\d,]+) of ([\d,]+) decisions", result.out
    )
    assert support is not None, result.out
    ess, decisions = (int(g.replace(",", "")) for g in support.groups())
    assert 0 < ess <= decisions
    events = [line for line in result.err.splitlines() if "logger=recsys_rl.train" in line]
    assert any("event=started" in line and "step=0" in line for line in events), result.err
    assert [line.split("step=")[1].split()[0] for line in events if "event=step " in line] == [
        "20",
        "40",
        "60",
    ]
    assert any("event=exported" in line for line in events)


def test_run_directory_holds_config_inputs_metrics_checkpoints_and_policy(bc_run, feed_dataset):
    run, _ = bc_run
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["algo"] == "bc" and config["steps"] == STEPS and config["agent"]["actor_hidden"] == [32]
    assert json.loads((run / "input_manifest.json").read_text()) == json.loads(
        (feed_dataset / "manifest.json").read_text()
    )
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [20, 40, 60]
    assert all(m["loss"] == m["loss"] and m["transitions_per_s"] > 0 for m in metrics)
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert (run / "checkpoints" / "checkpoint").is_file() and (
        run / "checkpoints" / "ckpt-60.index"
    ).is_file()
    policy = json.loads((run / "policy" / "policy.json").read_text())
    manifest = json.loads((run / "manifest.json").read_text())
    assert policy["algo"] == "bc" and policy["train_step"] == STEPS
    assert manifest["steps"] == STEPS and manifest["policy"]["sha256"] == policy["sha256"]
    assert manifest["final_metrics"] == {k: v for k, v in metrics[-1].items() if k != "step"}


def test_a_user_author_value_trains_on_the_pair_surface_and_records_only_its_own_section(
    feed_dataset, tmp_path, capsys
):
    config = tmp_path / "pair.yaml"
    config.write_text(yaml.safe_dump({"log_every": 10, "pair": {"hidden": [16], "learning_rate": 0.002}}))
    run = tmp_path / "ua"
    args = ["train", "--algo", "ua-independent", "--data", str(feed_dataset), "--out", str(run)]
    result = _cli(capsys, *args, "--config", str(config), "--steps", "20", "--batch-size", "64")

    assert result.code == 0, result.err
    assert f"run {run}: ua-independent, 20 steps (trained from scratch)" in result.out
    assert "final metrics: loss=" in result.out and "td_follow=" in result.out
    assert "support on its training data" not in result.out  # a pair value takes no logged decision
    recorded = yaml.safe_load((run / "config.yaml").read_text())
    assert recorded["pair"]["hidden"] == [16] and recorded["pair"]["learning_rate"] == 0.002
    assert "agent" not in recorded and "allocation" not in recorded
    policy = json.loads((run / "policy" / "policy.json").read_text())
    assert policy["kind"] == "pair_value" and policy["surface"] == "user_author"
    assert policy["version"].startswith("ua-independent-") and policy["train_step"] == 20
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["surface"] == "user_author"


def test_the_same_command_again_reports_the_run_complete(bc_run, feed_dataset, settings_file, capsys):
    run, _ = bc_run
    before = (run / "manifest.json").read_text()
    result = _cli(
        capsys, *_train_args(feed_dataset, run, settings_file), "--steps", str(STEPS), "--batch-size", "256"
    )
    assert result.code == 0, result.err
    assert f"run {run}: bc, {STEPS} steps (already complete, nothing to do)" in result.out
    assert (run / "manifest.json").read_text() == before


def test_another_config_for_the_same_run_is_one_line_and_exit_1(bc_run, feed_dataset, settings_file, capsys):
    run, _ = bc_run
    result = _cli(
        capsys, *_train_args(feed_dataset, run, settings_file), "--steps", "61", "--batch-size", "256"
    )
    assert result.code == 1
    assert result.err.count("\n") == 1 and "different config (differs in ['steps'])" in result.err


def test_an_interrupted_run_resumes_from_its_last_checkpoint(feed_dataset, settings_file, tmp_path, capsys):
    from recsys_rl.training.train import TrainConfig, train

    run = tmp_path / "resumed"
    args = [*_train_args(feed_dataset, run, settings_file), "--steps", "40", "--batch-size", "128"]
    overrides = {"algo": "bc", "data": str(feed_dataset), "out": str(run), "steps": 40, "batch_size": 128}
    config = load_config(TrainConfig, settings_file, overrides)  # what the command builds from args

    def interrupt_at_step_40(event: str, fields: dict) -> None:
        if event == "step" and fields["step"] == 40:  # before the step-40 checkpoint: the last one is 20
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(config, interrupt_at_step_40)
    result = _cli(capsys, *args)
    assert result.code == 0, result.err
    assert "40 steps (resumed from step 20)" in result.out
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [20, 40]


def test_a_missing_dataset_is_one_line_and_exit_2(settings_file, tmp_path, capsys):
    """A usage error, as the README says (issue 23: it exited 1)."""
    result = _cli(capsys, *_train_args(tmp_path / "no-such-dataset", tmp_path / "run", settings_file))
    assert result.code == 2
    assert result.err.count("\n") == 1 and "no-such-dataset': no such directory" in result.err


def test_an_unknown_nested_config_key_is_named_and_exit_2(feed_dataset, tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text("agent:\n  actor_hiden: [32]\n")
    result = _cli(capsys, *_train_args(feed_dataset, tmp_path / "run", config))
    assert result.code == 2
    assert result.err.count("\n") == 1 and "unknown config keys ['agent.actor_hiden']" in result.err
    assert not (tmp_path / "run").exists()


def test_sim_eval_compares_every_feed_signal_and_writes_json(bc_run, tmp_path, capsys):
    run, _ = bc_run
    out = tmp_path / "eval.json"
    result = _cli(
        capsys, "sim-eval", "--policy", str(run), "--users", "300", "--days", "1", "--out", str(out)
    )
    assert result.code == 0, result.err
    report = json.loads(out.read_text())
    assert sorted(report["signals"]) == sorted(signals.FEED_SIGNALS)
    for values in report["signals"].values():
        assert values["behaviour"]["stderr"] >= 0 and values["policy"]["stderr"] >= 0
    watch_time = report["signals"]["watch_time"]
    assert watch_time["behaviour"]["mean"] > 0 and watch_time["policy"]["stderr"] > 0
    lift = watch_time["policy"]["mean"] / watch_time["behaviour"]["mean"] - 1
    assert watch_time["lift"] == pytest.approx(lift)
    assert sorted(report["constraints"]) == sorted(AUXILIARY_SIGNALS)
    assert report["constraints"]["hate"]["bound"] == "at most"
    assert report["return_rate"] == {"behaviour": None, "policy": None}  # one day: no later day to return
    assert report["policy"]["directory"] == str((run / "policy").resolve())
    for name in signals.FEED_SIGNALS:
        assert any(line.split()[:1] == [name] for line in result.out.splitlines()), result.out
    assert f"wrote {out}" in result.out

    # the policy directory itself is accepted, and the same seeds give the same figures
    again = _cli(capsys, "sim-eval", "--policy", str(run / "policy"), "--users", "300", "--days", "1")
    assert again.code == 0, again.err
    assert again.out == result.out.replace(f"wrote {out}\n", "")


def test_sim_eval_of_a_directory_without_a_policy_is_one_line_and_exit_1(tmp_path, capsys):
    result = _cli(capsys, "sim-eval", "--policy", str(tmp_path))
    assert result.code == 1
    assert result.err.count("\n") == 1 and "neither a policy directory" in result.err
