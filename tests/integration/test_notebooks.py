"""The notebooks run top to bottom on the embedded default, as a user would run them."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.integration

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def test_the_ope_report_notebook_runs_and_reaches_a_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RECSYS_RL_NOTEBOOK_WORK", str(tmp_path))
    monkeypatch.setenv("RECSYS_RL_NOTEBOOK_USERS", "600")
    notebook = nbformat.read(NOTEBOOKS / "ope_report.ipynb", as_version=4)
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    printed = "".join(
        output.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
    )
    assert "BLESSED" in printed  # NOT BLESSED contains it too: either verdict, but one was reached
    assert (tmp_path / "evaluation" / "blessing.json").is_file()
    assert (tmp_path / "evaluation" / "report.html").read_text().count("data:image/png;base64,") == 3
