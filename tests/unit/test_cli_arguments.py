"""Bad arguments to the pipeline verbs end in one line and exit 2, before anything connects anywhere."""

import subprocess
import sys

import pytest


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "recsys_rl.cli.main", *args], capture_output=True, text=True, timeout=120
    )


BUILD = ["build-transitions", "--bootstrap-servers", "127.0.0.1:9", "--out", "/tmp/unused"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(BUILD, "group is required", id="no-group"),
        pytest.param(
            [*BUILD, "--group", "g", "--start", "latest"], "argument --start: invalid choice", id="start"
        ),
        pytest.param(
            [*BUILD, "--group", "g", "--num-shards", "0"], "--num-shards: should be at least 1", id="shards"
        ),
        pytest.param(
            [*BUILD, "--group", "g", "--join-window-s", "-5"], "join_window_s should be positive", id="window"
        ),
        pytest.param(
            [*BUILD, "--group", "g", "--out", "gs://bucket/datasets"],
            "gs://bucket/datasets: Beam has no filesystem for gs:// here; install",
            id="uri-without-its-filesystem",
        ),
        pytest.param(
            [*BUILD, "--group", "g", "--direct_running_mode=multi_threading"],
            "multi_threading loses elements",
            id="threaded-beam",
        ),
        pytest.param(
            ["simulate", "--runner=DirectRunner"],
            "unrecognized arguments: --runner=DirectRunner",
            id="beam-flag-elsewhere",
        ),
    ],
)
def test_bad_pipeline_arguments_give_one_line_and_exit_2(args, message):
    result = _run(*args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["train", "--algo", "ppo"], "argument --algo: invalid choice: 'ppo'", id="algo"),
        pytest.param(
            ["train", "--steps", "0"], "argument --steps: should be at least 1, but is 0", id="steps"
        ),
        pytest.param(["train", "--algo", "bc", "--out", "/tmp/unused"], "data is required", id="no-data"),
        pytest.param(["sim-eval", "--users", "0"], "argument --users: should be at least 1", id="users"),
        pytest.param(["sim-eval", "--episode-seed", "-1"], "should be at least 0, but is -1", id="seed"),
        pytest.param(["sim-eval", "--users", "5"], "policy is required", id="no-policy"),
        pytest.param(
            ["train", "--workers", "10.0.0.1:2222,10.0.0.2"],
            "argument --workers: should be HOST:PORT[,HOST:PORT...], but is '10.0.0.1:2222,10.0.0.2'",
            id="worker-address",
        ),
        pytest.param(
            ["train", "--data", "d", "--out", "o", "--workers", "a:1,b:2", "--worker-index", "2"],
            "--worker-index 2 is not one of the 2 --workers",
            id="worker-index",
        ),
        pytest.param(
            ["train", "--data", "/no/such/dataset", "--out", "o"],
            "data '/no/such/dataset': no such directory",
            id="data",
        ),
        pytest.param(
            ["evaluate", "--candidate", "r", "--data", "/no/such/dataset", "--out", "o"],
            "data '/no/such/dataset': no such directory",
            id="evaluate-data",
        ),
    ],
)
def test_bad_training_and_evaluation_arguments_give_one_line_and_exit_2(args, message):
    result = _run(*args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("estimator", "message"),
    [
        pytest.param(
            "fqe", "estimator 'fqe' cannot gate: its bootstrap interval holds the fitted FQE", id="fqe"
        ),
        pytest.param(
            "dm", "estimator 'dm' cannot gate: its bootstrap interval holds the fitted reward", id="dm"
        ),
        pytest.param("magic", "estimator should be one of ['ips', 'clipped_ips'", id="unknown"),
    ],
)
def test_a_gate_estimator_is_refused_when_the_config_is_loaded(tmp_path, estimator, message):
    """Issue 19: an unknown estimator failed with a KeyError only after the whole evaluation. The
    candidate and data here do not exist: the config is refused before anything is read."""
    config = tmp_path / "gate.yaml"
    config.write_text(f"gate:\n  estimator: {estimator}\n")
    missing = str(tmp_path / "missing")
    result = _run(
        "evaluate", "--candidate", missing, "--data", missing, "--out", missing, "--config", str(config)
    )
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
