"""What a team adopting the package checks first: the version it runs, the license, what the sdist ships."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import recsys_rl

REPO = Path(__file__).resolve().parents[2]
#: sha256 of https://www.apache.org/licenses/LICENSE-2.0.txt: the text unmodified, appendix included.
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO, timeout=120)


def test_version_flag_prints_the_package_version_and_exits_zero():
    result = _python("-m", "recsys_rl.cli.main", "--version")
    assert (result.returncode, result.stdout) == (0, f"recsys-rl {recsys_rl.__version__}\n"), result.stderr


def test_version_flag_imports_neither_tensorflow_nor_beam():
    # in a fresh interpreter: this test process may have imported both already
    result = _python(
        "-c",
        "import sys\n"
        "from recsys_rl.cli.main import main\n"
        "try:\n"
        "    main(['--version'])\n"
        "except SystemExit as stop:\n"
        "    print(stop.code, sorted({'tensorflow', 'apache_beam'} & set(sys.modules)))\n",
    )
    assert result.stdout.splitlines()[-1] == "0 []", result.stderr


def test_setup_py_takes_its_version_from_the_package():
    result = _python("setup.py", "--version")
    assert result.stdout.splitlines()[-1] == recsys_rl.__version__, result.stderr


def test_license_is_the_apache_2_text_unmodified():
    text = (REPO / "LICENSE").read_text()
    assert text.split()[:5] == ["Apache", "License", "Version", "2.0,", "January"]
    assert hashlib.sha256(text.encode()).hexdigest() == APACHE_2_SHA256


def test_setup_py_declares_the_license_for_wheels():
    result = _python("setup.py", "--license")
    assert result.stdout.splitlines()[-1] == "Apache-2.0", result.stderr


def test_sdist_manifest_includes_license_and_changelog():
    included = {
        name
        for line in (REPO / "MANIFEST.in").read_text().splitlines()
        if line.startswith("include ")
        for name in line.split()[1:]
    }
    assert {"LICENSE", "CHANGELOG.md"} <= included
