"""The notebooks run top to bottom on the embedded default, as a user would run them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from recsys_rl import signals
from recsys_rl.ope.blessing import read_blessing

pytestmark = pytest.mark.integration

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def _printed(notebook: nbformat.NotebookNode) -> str:
    return "".join(
        output.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
    )


def _figures(notebook: nbformat.NotebookNode) -> int:
    return sum(
        "image/png" in output.get("data", {})
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
    )


def _reached_a_verdict(work: Path, notebook: nbformat.NotebookNode) -> None:
    """The notebooks' logs are small (a few hundred users), so the gate refuses their candidate: the sparse
    signals' intervals are far wider than the 2% tolerance. Measured: follow's lower bound at -80% and
    -46%, share's at -47% and -61%; nothing borderline. The blessing file is read, not the printed
    headline, whose wording may grow (warnings)."""
    blessing = read_blessing(work / "evaluation" / "blessing.json")
    assert not blessing.passed, "a candidate trained and evaluated on a few hundred users was blessed"
    refused_on = {reason.split(":")[0] for reason in blessing.reasons}
    assert {"follow", "share"} <= refused_on, blessing.reasons
    assert "NOT BLESSED" in _printed(notebook)  # the notebook shows the verdict the blessing records


def _check_ope_report(work: Path, notebook: nbformat.NotebookNode) -> None:
    _reached_a_verdict(work, notebook)
    # lift per group, estimator agreement, risk, actions, importance weights, ESS per group
    assert (work / "evaluation" / "report.html").read_text().count("data:image/png;base64,") == 6


def _check_training_walkthrough(work: Path, notebook: nbformat.NotebookNode) -> None:
    for algo in ("tscac", "bc"):
        manifest = json.loads((work / "runs" / algo / "manifest.json").read_text())
        assert manifest["algo"] == algo
        assert (work / "runs" / algo / "policy" / "policy.json").is_file()
    metrics = (work / "runs" / "tscac" / "metrics.jsonl").read_text().splitlines()
    logged = [json.loads(line) for line in metrics]
    plotted = {f"critic/{s}" for s in signals.FEED_SIGNALS} | {"actor/main"}
    assert plotted <= set().union(*logged)  # every curve the notebook plots was logged
    assert _figures(notebook) == 3  # rewards, behaviour actions and propensities, training losses
    _reached_a_verdict(work, notebook)
    assert (work / "train.yaml").is_file()  # the CLI config it wrote (and checked) for `recsys-rl train`


# notebook, simulated users (small: CI runs them), what a finished run must have left behind
RUNS: list = [
    pytest.param("ope_report.ipynb", 600, _check_ope_report, id="ope_report"),
    pytest.param("training_walkthrough.ipynb", 400, _check_training_walkthrough, id="training_walkthrough"),
]


@pytest.mark.parametrize(("name", "users", "check"), RUNS)
def test_the_notebook_runs_top_to_bottom(
    name: str,
    users: int,
    check: Callable[[Path, nbformat.NotebookNode], None],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setenv("RECSYS_RL_NOTEBOOK_WORK", str(tmp_path))
    monkeypatch.setenv("RECSYS_RL_NOTEBOOK_USERS", str(users))
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    check(tmp_path, notebook)


@pytest.mark.parametrize("name", [p.values[0] for p in RUNS])
def test_the_notebook_is_stored_without_outputs(name: str):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)
