"""The built wheel, installed in a fresh virtualenv, away from the checkout.

What a team adopting the package gets: only the ``recsys_rl`` import name in their environment (our
``pipelines/``, ``serving/`` and ``features/`` folders live inside it), and a console script whose demo runs
from any directory, with the Feast repo and the protobuf stubs inside the wheel.

The fresh virtualenv takes the project's dependencies from this one's site-packages (``venvs``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import venvs
import yaml
from open_gate import OPEN_GATE

from recsys_rl.kafka import Broker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
#: What the checkout holds that is not source: never copied into the wheel's build tree.
NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    "node_modules",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".hypothesis",
    ".test-services",
    "demo-output",
    "data",
    "*_pb2.py",
    "*_pb2.pyi",
    "*_pb2_grpc.py",
)


def _run(argv: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{argv[:3]} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the source tree (the build writes stubs and build/ where it runs)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    shutil.copytree(REPO, source, ignore=NOT_SOURCE)
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
    _run([*argv, "--wheel-dir", str(work / "dist"), str(source)], cwd=work, timeout=600)
    (built,) = (work / "dist").glob("recsys_rl-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the wheel installed; returns its bin directory."""
    root = tmp_path_factory.mktemp("venv")
    python = venvs.without_the_project(root)
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index"]
    _run([*install, str(wheel)], cwd=root, timeout=300)
    return root / "bin"


def test_the_wheel_holds_only_our_name_with_the_feature_repo_and_stubs(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"recsys_rl", wheel.name.split("-py3")[0] + ".dist-info"}
    needed = {
        "recsys_rl/feature_repo/feature_definitions.py",
        "recsys_rl/feature_repo/feature_store.yaml",
        "recsys_rl/feature_repo/feature_store.redis.yaml",
        "recsys_rl/pipelines/transitions.py",
        "recsys_rl/serving/server.py",
        "recsys_rl/proto/serving_pb2.py",
        "recsys_rl/proto/events_pb2_grpc.py",
    }
    assert needed - set(names) == set()


def test_an_unrelated_project_cannot_import_our_folders(installed: Path, tmp_path: Path) -> None:
    code = (
        "import importlib.util, recsys_rl; print(recsys_rl.__file__); "
        "print(*[importlib.util.find_spec(name) for name in ('serving', 'pipelines', 'features')])"
    )
    out = _run([str(installed / "python"), "-c", code], cwd=tmp_path, timeout=120).stdout.splitlines()
    assert Path(out[0]).is_relative_to(installed.parent)
    assert out[1] == "None None None"


def test_the_installed_demo_runs_outside_the_checkout(
    installed: Path, apache_kafka: Broker, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # small, with a gate that blesses anything: what is under test is the installed package, not the gate
    config = {
        "users": 150,
        "train_steps": 20,
        "deadline_s": 30.0,
        "gate": {"resamples": 20, **OPEN_GATE},
    }
    (elsewhere / "demo.yaml").write_text(yaml.safe_dump(config))
    argv = [str(installed / "recsys-rl"), "demo", "--config", "demo.yaml", "--out", "out"]
    result = _run([*argv, "--bootstrap-servers", apache_kafka.bootstrap_servers], cwd=elsewhere, timeout=1200)
    assert "demo finished" in result.stdout
    registry = elsewhere / "out" / "registry"
    for surface in ("feed", "live_allocation"):  # one version per pipeline run, on both surfaces
        assert len(list((registry / surface / "versions").iterdir())) == 2, surface
    assert (
        "pipeline run 2, live allocation" in result.stdout
        and (elsewhere / "out" / "pipeline-live.yaml").is_file()
    )
    # Feast kept its registry and online store in the demo's output, not inside the installed package
    (repo,) = installed.parent.glob("lib/python*/site-packages/recsys_rl/feature_repo")
    assert (elsewhere / "out" / "feast").is_dir() and not (repo / "data").exists()
