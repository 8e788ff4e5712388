"""The Beam environment flags `LocalFlink` and `process_environment` give (the runs: test_flink_runner)."""

import json
import os
from pathlib import Path

import pytest

from recsys_rl.pipelines.flink_service import (
    BEAM_BOOT_ENV,
    FlinkSetupError,
    LocalFlink,
    process_environment,
)


def _flags(args: list[str]) -> dict[str, str]:
    return dict(arg.removeprefix("--").split("=", 1) for arg in args)


@pytest.fixture
def boot(tmp_path: Path) -> Path:
    program = tmp_path / "boot"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    return program


def test_a_process_environment_runs_boot_with_the_workers_python_first_on_path(boot: Path, tmp_path: Path):
    env_dir = tmp_path / "worker-env"
    (env_dir / "bin").mkdir(parents=True)
    (env_dir / "pyvenv.cfg").write_text("home = /usr/bin\n")
    flags = _flags(process_environment(env_dir / "bin" / "python", tmp_path / "scratch", boot))
    assert flags["environment_type"] == "PROCESS"
    config = json.loads(flags["environment_config"])
    # boot itself, staging the job's files in the scratch directory rather than /tmp, which jobs share
    command = Path(config["command"])
    assert command.parent == tmp_path / "scratch" and os.access(command, os.X_OK)
    script = command.read_text()
    assert f'exec {boot} --semi_persist_dir={tmp_path / "scratch" / "worker-files"} "$@"' in script
    assert config["env"]["PATH"].split(os.pathsep)[0] == str(env_dir / "bin")
    assert config["env"]["VIRTUAL_ENV"] == str(env_dir)
    # without it boot installs into a new virtualenv that cannot see the environment's dependencies
    assert config["env"]["RUN_PYTHON_SDK_IN_DEFAULT_ENVIRONMENT"] == "1"


def test_a_missing_boot_program_says_how_to_build_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(BEAM_BOOT_ENV, str(tmp_path / "absent"))
    with pytest.raises(FlinkSetupError, match=r"make beam-boot"):
        process_environment(tmp_path / "bin" / "python", tmp_path / "scratch")


def test_process_workers_are_one_per_environment_and_external_ones_one_per_subtask(
    boot: Path, tmp_path: Path
):
    flink = LocalFlink()
    flink._job_port, flink._pool_port = 8099, 50000  # as if started: only the flags are under test
    external = _flags(flink.pipeline_args(parallelism=3))
    assert (external["environment_type"], external["environment_config"]) == ("EXTERNAL", "127.0.0.1:50000")
    assert external["sdk_worker_parallelism"] == external["parallelism"] == "3"
    # two boot programs installing the staged sdist into one environment at once break each other's install
    process = _flags(
        flink.pipeline_args(
            parallelism=3, environment=process_environment(tmp_path / "python", tmp_path / "scratch", boot)
        )
    )
    assert process["environment_type"] == "PROCESS"
    assert (process["parallelism"], process["sdk_worker_parallelism"]) == ("3", "1")
