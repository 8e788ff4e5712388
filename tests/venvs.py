"""Fresh virtualenvs that see this one's dependencies but not the project: what a user's machine or a
remote worker has before the project is installed on it.

Installing TensorFlow and Beam into each new environment would take minutes and the network, so the
environment takes them from this interpreter's site-packages through a path file. The project's own
editable install does not come through: a path-file line adds a directory to ``sys.path`` without
running the path files inside it, and the editable install is one of those.
"""

from __future__ import annotations

import subprocess
import sysconfig
import venv
from pathlib import Path

DEPENDENCIES_PTH = "project_dependencies.pth"


def without_the_project(root: Path) -> Path:
    """A new virtualenv at ``root`` (no pip of its own: this one's comes through the path file) that
    imports every dependency and not ``recsys_rl``; returns its ``python``."""
    venv.create(root, with_pip=False)
    python = root / "bin" / "python"
    see_dependencies(python)
    return python


def see_dependencies(python: Path) -> None:
    """Give the virtualenv of ``python`` this interpreter's site-packages, through a path file."""
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    (Path(purelib) / DEPENDENCIES_PTH).write_text(sysconfig.get_paths()["purelib"] + "\n")
