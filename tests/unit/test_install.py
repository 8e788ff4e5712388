"""The installed environment is the verified one: Keras 2 under TF-Agents, stubs built, CLI on PATH."""

import os
import subprocess
import sys
from pathlib import Path


def _python(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


def test_importing_the_package_selects_legacy_keras_for_tf_agents():
    # TF_USE_LEGACY_KERAS is removed from the child's environment: the package itself must set it
    out = _python(
        "import recsys_rl, os; import tensorflow as tf; from tf_agents.networks import network; "
        "print(os.environ['TF_USE_LEGACY_KERAS'], tf.keras.layers.Dense.__module__.split('.')[0])"
    )
    # without the variable TensorFlow 2.21 resolves tf.keras to Keras 3 (module 'keras')
    assert out.splitlines()[-1] == "1 tf_keras"


def test_console_script_is_installed_next_to_the_interpreter():
    script = Path(sys.executable).parent / "recsys-rl"
    assert script.exists()
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "simulate" in result.stdout


def test_dependency_set_is_consistent():
    result = subprocess.run(
        [sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout
