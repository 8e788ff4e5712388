"""build-transitions on Apache Flink writes the dataset the in-process runner writes, byte for byte.

Flink here is Beam 2.62.0's Flink 1.19 job server with the pinned 2.77 Python SDK submitting to it
(`recsys_rl.pipelines.flink_service` says why), a PortableRunner job at parallelism 2 whose SDK workers
come from an EXTERNAL worker pool, or are Beam's boot program in a PROCESS environment that installs the
project from ``--setup_file`` into a Python environment without it: the set-ups a cluster deployment
has, on one machine.
"""

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import test_build_transitions
import venvs

from recsys_rl.kafka.broker import log_excerpt
from recsys_rl.pipelines.flink_service import (
    FlinkSetupError,
    check_worker_python,
    process_environment,
    worker_environment,
)

pytestmark = pytest.mark.integration

# the same simulated day as the other build-transitions tests: that module's fixture, reused
simulated_topics = test_build_transitions.simulated_topics

REPO = Path(__file__).resolve().parents[2]
# A Flink run takes 30-60 s on two busy cores; a job whose workers never come up would otherwise hang
# for many minutes before Beam gives up.
RUN_TIMEOUT_S = 300
# manifest.json records when it was written; everything else in it must match
MANIFEST_FIELDS_THAT_DIFFER = ("created_at",)


def _build_transitions(broker, sim_config, out: Path, group: str, flink=None, runner_args=()) -> Path:
    """Run the CLI as a user would, on the in-process runner or on ``flink`` (a `LocalFlink`, with
    ``runner_args`` its `pipeline_args`), and return the one dataset directory it published under ``out``."""
    argv = [
        sys.executable,
        "-m",
        "recsys_rl.cli.main",
        "build-transitions",
        "--bootstrap-servers",
        broker.bootstrap_servers,
        "--group",
        group,  # the manifest records the group: both runs replay the same offsets under the same one
        "--out",
        str(out),
        "--decisions-topic",
        sim_config.decisions_topic,
        "--feedback-topic",
        sim_config.feedback_topic,
        "--start",
        "earliest",
        "--no-commit",
        "--num-shards",
        "2",
        "--max-records-per-chunk",
        "700",  # several chunks, so that both Flink subtasks read
        "--carry-open-sessions",
        *runner_args,
    ]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"build-transitions {_where(flink)} ran over {RUN_TIMEOUT_S} s", pytrace=False)
    assert result.returncode == 0, f"build-transitions {_where(flink)} failed: {result.stderr[-3000:]}"
    [dataset] = [p for p in out.iterdir() if not p.name.startswith(".")]
    return dataset


def _where(flink) -> str:
    return f"on Flink (job server log: {log_excerpt(flink.job_server_log)})" if flink else "in process"


def _files(dataset: Path) -> dict[str, bytes]:
    return {
        p.relative_to(dataset).as_posix(): p.read_bytes() for p in sorted(dataset.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def in_process(apache_kafka, simulated_topics, tmp_path_factory) -> tuple[str, Path]:
    """The group both runs replay under (the manifest records it) and the in-process runner's dataset."""
    sim_config, _, _ = simulated_topics
    group = f"flink-{uuid.uuid4().hex[:8]}"
    out = tmp_path_factory.mktemp("in-process")
    return group, _build_transitions(apache_kafka, sim_config, out, group)


def test_flink_with_an_external_worker_pool_writes_the_in_process_runners_bytes(
    apache_kafka, simulated_topics, flink_cluster, in_process, tmp_path
):
    sim_config, _, _ = simulated_topics
    group, expected = in_process
    finished_before = _flink_jobs_finished(flink_cluster)
    runner_args = flink_cluster.pipeline_args(parallelism=2)
    on_flink = _build_transitions(apache_kafka, sim_config, tmp_path, group, flink_cluster, runner_args)
    # the job did run on Flink, not on a default runner
    assert _flink_jobs_finished(flink_cluster) == finished_before + 1
    _assert_same_dataset(expected, on_flink)


def test_workers_without_the_project_install_it_from_setup_file(
    apache_kafka, simulated_topics, flink_cluster, in_process, tmp_path
):
    # what a cluster's workers have before the job ships the project: Beam and the dependencies only
    python = venvs.without_the_project(tmp_path / "worker-env")
    assert _imports_recsys_rl(python) is None
    sim_config, _, _ = simulated_topics
    group, expected = in_process
    finished_before = _flink_jobs_finished(flink_cluster)
    runner_args = [
        *flink_cluster.pipeline_args(
            parallelism=2, environment=process_environment(python, tmp_path / "boot")
        ),
        f"--setup_file={REPO / 'setup.py'}",
    ]
    out = tmp_path / "out"
    on_flink = _build_transitions(apache_kafka, sim_config, out, group, flink_cluster, runner_args)
    assert _flink_jobs_finished(flink_cluster) == finished_before + 1
    _assert_same_dataset(expected, on_flink)
    # the workers ran the sdist that --setup_file built and the boot program installed, not the checkout
    installed = _imports_recsys_rl(python)
    assert installed is not None and installed.is_relative_to(tmp_path / "worker-env")
    # the job's staged files went to this job's scratch space, not to /tmp/staged that all jobs share
    assert (tmp_path / "boot" / "worker-files" / "staged" / "workflow.tar.gz").is_file()


def _imports_recsys_rl(python: Path) -> Path | None:
    """Where ``python`` imports the project from (run outside the checkout), or None if it cannot."""
    code = "import importlib.util; spec = importlib.util.find_spec('recsys_rl'); print(spec and spec.origin)"
    result = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert result.returncode == 0, result.stderr[-2000:]
    origin = result.stdout.strip()
    return None if origin == "None" else Path(origin)


def _assert_same_dataset(in_process: Path, on_flink: Path) -> None:
    assert on_flink.name == in_process.name  # the version: a digest of the offsets and settings
    expected, got = _files(in_process), _files(on_flink)
    assert sorted(got) == sorted(expected)
    assert any(name.startswith("features/") for name in got) and "carried.jsonl" in got
    differing = [name for name in expected if name != "manifest.json" and got[name] != expected[name]]
    assert differing == []
    manifest, flink_manifest = json.loads(expected["manifest.json"]), json.loads(got["manifest.json"])
    for field in MANIFEST_FIELDS_THAT_DIFFER:
        manifest.pop(field)
        flink_manifest.pop(field)
    assert flink_manifest == manifest
    assert manifest["accounting"]["balanced"] and manifest["surfaces"]["feed"]["rows"] > 0


def _flink_jobs_finished(flink_cluster) -> int:
    return len(
        re.findall(r"FlinkPipelineRunner - Execution finished", flink_cluster.job_server_log.read_text())
    )


def test_a_worker_pool_that_would_start_the_system_python_is_refused_at_once(tmp_path):
    # the system interpreter first on the pool's PATH: its workers would die on `import apache_beam` while
    # the job waited minutes for them, so the check must fail instead, in one line
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(Path(sys._base_executable).resolve())
    with pytest.raises(FlinkSetupError, match=r"cannot run the pipeline's workers: .*apache_beam") as refused:
        check_worker_python(worker_environment(bin_dir / "python"), tmp_path, timeout_s=60)
    assert "\n" not in str(refused.value)
