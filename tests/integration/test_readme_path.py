"""The README's step-by-step path, walked command by command as a newcomer would (issue 23).

The commands are read from the README itself, so the walk and the text cannot drift apart. What a
newcomer reads off one command's output and types into the next (the dataset version) is taken the same
way here; only the sizes shrink, so the walk fits in a test.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from recsys_rl.cli.main import main

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
MARKER = "# the path step by step"
#: The README's sizes, made small: a few hundred users, a few dozen training steps.
SMALLER = {
    "--users 1000": "--users 200",
    "--out runs/tscac-1": "--out runs/tscac-1 --steps 40 --batch-size 128",
}


def readme_path() -> list[str]:
    """The commands of the README block that starts with ``MARKER``, comments dropped."""
    text = (REPO / "README.md").read_text()
    block = text[text.index(MARKER) :].split("```", 1)[0]
    commands = [line.split("  #")[0].strip() for line in block.splitlines()[1:] if line.strip()]
    assert all(c.startswith(".venv/bin/recsys-rl ") for c in commands), commands
    return [c.removeprefix(".venv/bin/recsys-rl ") for c in commands]


def test_the_readme_path_runs_in_order_without_a_guess(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").symlink_to(REPO / "examples")  # the README's commands run from the checkout
    monkeypatch.delenv("RECSYS_RL_BOOTSTRAP_SERVERS", raising=False)
    commands = readme_path()
    assert [c.split()[0] for c in commands] == [
        "broker", "simulate", "build-transitions", "features", "train", "evaluate", "registry", "registry",
        "broker", "broker",
    ]  # fmt: skip
    seen: dict[str, str] = {}
    try:
        for command in commands:
            for big, small in SMALLER.items():
                command = command.replace(big, small)
            if "<version>" in command:  # build-transitions printed "dataset .../transitions/<version>"
                command = command.replace("<version>", seen["version"])
            code = main(shlex.split(command))
            out = capsys.readouterr().out
            assert code == 0, f"{command} exited {code}:\n{out}"
            if command.startswith("build-transitions"):
                seen["version"] = re.search(r"^dataset \S*/data/transitions/(\S+)", out, re.M).group(1)
    finally:
        main(["broker", "stop"])
    assert (tmp_path / "runs" / "tscac-1" / "manifest.json").is_file()
    assert (tmp_path / "evaluations" / "tscac-1" / "blessing.json").is_file()
    assert list((tmp_path / "registry" / "feed" / "versions").iterdir())
