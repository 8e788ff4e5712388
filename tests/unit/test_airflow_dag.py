"""The Airflow example stays a valid DAG file that runs the pipeline command (Airflow is not installed)."""

from __future__ import annotations

import ast
from pathlib import Path

DAG_FILE = Path(__file__).resolve().parents[2] / "pipelines" / "airflow_dag.py"


def test_the_dag_example_parses_and_runs_the_pipeline_command() -> None:
    tree = ast.parse(DAG_FILE.read_text())
    imports = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert {"airflow", "airflow.operators.bash"} <= imports
    commands = [
        kw.value
        for call in ast.walk(tree)
        if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "BashOperator"
        for kw in call.keywords
        if kw.arg == "bash_command"
    ]
    assert len(commands) == 1
    assert "recsys-rl pipeline run --config" in ast.unparse(commands[0])
