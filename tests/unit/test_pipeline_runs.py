"""``recsys-rl pipeline list|status``: run records read back, and what the two commands print.

The records are written here in the layout ``training_pipeline`` writes (sorted keys, so the steps come
by name), for a finished blessed run, a failed one, an idle one and an unfinished one: no Kafka needed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_calls import cli

from recsys_rl.config import ConfigError
from recsys_rl.pipelines.pipeline_runs import RUN_RECORD, PipelineError, get_run, list_runs

VERSION = "tscac-ds-0003-s0-0123456789ab"
FINISHED, FAILED, IDLE, UNFINISHED = (
    f"2025030{day}T060000Z-{letter * 6}" for day, letter in zip("1234", "abcd", strict=True)
)


def _step(status: str, seconds: float, **outputs: Any) -> dict[str, Any]:
    return {"status": status, "seconds": seconds, "outputs": outputs}


STEPS = {
    "ingest": _step("done", 12.25, dataset="/data/ds-0003", version="ds-0003", records=1200, plan={}),
    "commit": _step("done", 0.5, group="trainer", partitions=3, dead_letters_published=0),
    "features": _step("not_needed", 0.0, reason="no features section in the config"),
    "train": _step("done", 80.0, run="/w/train/cd34", algo="tscac", policy_version="tscac-ds-0003-s0"),
    "evaluate": _step(
        "done",
        20.0,
        report="/w/evaluate/ab12",
        incumbent="behaviour",
        blessed=True,
        verdict="BLESSED",
        reasons=[],
    ),
    "register": _step("done", 0.25, version=VERSION, blessed=True),
    "promote": _step("done", 0.125, version=VERSION, role="stable", routing_revision=1),
}


def write_run(work: Path, run_id: str, status: str, steps: dict[str, Any], **extra: Any) -> Path:
    record = {
        "schema_version": 1,
        "kind": "pipeline_run",
        "run_id": run_id,
        "surface": "feed",
        "ingest_settings": "f" * 64,
        "started_at": f"2025-03-0{run_id[7]}T06:00:00Z",
        "status": status,
        "steps": steps,
        **extra,
    }
    path = work / "runs" / run_id / RUN_RECORD
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record, indent=2, sort_keys=True))
    return path


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """Four runs, a day apart: finished and promoted, failed in evaluate, idle, still unfinished."""
    work = tmp_path / "work"
    write_run(work, FINISHED, "complete", STEPS, finished_at="2025-03-01T06:02:00Z", error=None)
    up_to_train = {name: STEPS[name] for name in ("ingest", "commit", "features", "train")}
    write_run(work, FAILED, "failed", up_to_train, error="RuntimeError: node preempted", resumes=1)
    write_run(
        work, IDLE, "complete", {"ingest": _step("not_needed", 3.0, records=0, reason="no new records")}
    )
    write_run(work, UNFINISHED, "running", {"ingest": STEPS["ingest"]})
    return work


def test_runs_are_listed_newest_first_with_what_each_did(work: Path) -> None:
    runs = list_runs(work)
    assert [run.run_id for run in runs] == [UNFINISHED, IDLE, FAILED, FINISHED]
    assert [run.state for run in runs] == ["unfinished", "finished", "failed", "finished"]
    assert [run.stopped_in for run in runs] == ["commit", None, "evaluate", None]
    _, idle, failed, finished = runs
    assert [step.name for step in finished.steps] == list(STEPS)  # pipeline order, not the file's
    assert finished.seconds == 113.125
    assert (finished.algo, finished.dataset_version, finished.promoted) == (
        "tscac",
        "ds-0003",
        (VERSION, "stable"),
    )
    assert idle.idle and not finished.idle and idle.promoted is None and failed.promoted is None
    assert failed.error == "RuntimeError: node preempted" and failed.resumes == 1

    summary = finished.to_dict()
    assert "steps" not in summary
    assert summary["blessed"] is True and summary["verdict"] == "BLESSED"
    assert summary["promoted"] == {"version": VERSION, "role": "stable"}
    assert summary["registered_version"] == VERSION
    assert [step["name"] for step in finished.to_dict(with_steps=True)["steps"]] == list(STEPS)


def test_a_run_is_found_by_id_or_the_newest_and_an_unknown_id_names_the_runs(
    work: Path, tmp_path: Path
) -> None:
    assert get_run(work).run_id == UNFINISHED
    assert get_run(work, FAILED).run_id == FAILED
    with pytest.raises(
        ConfigError, match=f"no pipeline run 'nope' .*runs: {UNFINISHED}, {IDLE}, {FAILED}, {FINISHED}\\)"
    ):
        get_run(work, "nope")
    assert get_run(tmp_path / "never-run") is None and list_runs(tmp_path / "never-run") == []


def test_an_unreadable_record_is_named(work: Path) -> None:
    path = work / "runs" / FAILED / RUN_RECORD
    path.write_text(json.dumps({"run_id": FAILED}))
    with pytest.raises(PipelineError, match=f"{path} is not the record of a pipeline run"):
        list_runs(work)


def test_list_prints_a_line_per_run(work: Path, capsys: pytest.CaptureFixture) -> None:
    result = cli(capsys, "pipeline", "list", "--work-dir", work)
    assert result.code == 0, result
    header, *rows = result.out.splitlines()
    assert header.split() == [
        "RUN",
        "STARTED",
        "STATE",
        "STEPS",
        "SECONDS",
        "ALGO",
        "DATASET",
        "VERDICT",
        "PROMOTED",
    ]
    assert [row.split() for row in rows] == [
        [UNFINISHED, "2025-03-04T06:00:00Z", "unfinished", "1/7", "12.2", "-", "ds-0003", "-", "-"],
        [IDLE, "2025-03-03T06:00:00Z", "finished", "1/7", "3.0", "-", "-", "nothing", "new", "-"],
        [FAILED, "2025-03-02T06:00:00Z", "failed", "4/7", "92.8", "tscac", "ds-0003", "-", "-"],
        [
            FINISHED,
            "2025-03-01T06:00:00Z",
            "finished",
            "7/7",
            "113.1",
            "tscac",
            "ds-0003",
            "blessed",
            VERSION,
            "(stable)",
        ],
    ]

    result = cli(capsys, "pipeline", "list", "--work-dir", work, "--json")
    listed = json.loads(result.out)
    assert [run["run_id"] for run in listed] == [UNFINISHED, IDLE, FAILED, FINISHED]
    assert listed[3]["blessed"] is True and listed[3]["state"] == "finished"


def test_status_prints_each_step_of_a_run(work: Path, capsys: pytest.CaptureFixture) -> None:
    result = cli(capsys, "pipeline", "status", FINISHED, "--work-dir", work)
    assert result.code == 0, result
    assert result.out.splitlines() == [
        f"pipeline run {FINISHED}: finished (feed, algo tscac, dataset ds-0003)",
        "  started 2025-03-01T06:00:00Z, finished 2025-03-01T06:02:00Z, 113.1 s in its steps",
        "  ingest    done           12.2 s  version=ds-0003, records=1200",
        "  commit    done            0.5 s  group=trainer, partitions=3",
        "  features  not_needed      0.0 s  reason: no features section in the config",
        "  train     done           80.0 s  algo=tscac, policy_version=tscac-ds-0003-s0, run=/w/train/cd34",
        "  evaluate  done           20.0 s  verdict=BLESSED, incumbent=behaviour, report=/w/evaluate/ab12",
        f"  register  done            0.2 s  version={VERSION}, blessed=True",
        f"  promote   done            0.1 s  version={VERSION}, role=stable",
        f"run record: {work / 'runs' / FINISHED / RUN_RECORD}",
    ]

    result = cli(capsys, "pipeline", "status", "--work-dir", work)  # the newest
    assert result.out.splitlines()[0] == f"pipeline run {UNFINISHED}: unfinished (feed, dataset ds-0003)"
    assert result.out.splitlines()[-2] == "  unfinished in commit"
    result = cli(capsys, "pipeline", "status", FAILED, "--work-dir", work)
    assert "  failed in evaluate: RuntimeError: node preempted" in result.out.splitlines()

    shown = json.loads(cli(capsys, "pipeline", "status", FINISHED, "--work-dir", work, "--json").out)
    assert shown["run_id"] == FINISHED and [step["name"] for step in shown["steps"]] == list(STEPS)
    assert shown["steps"][0]["outputs"]["plan"] == {}  # --json keeps what the text leaves out


def test_the_work_dir_comes_from_the_pipeline_config(
    work: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    config = tmp_path / "pipeline.yaml"
    config.write_text(f"work_dir: {work}\nregistry: /elsewhere\ningest: {{group: g}}\n")
    result = cli(capsys, "pipeline", "list", "--config", config)
    assert result.code == 0 and result.out.splitlines()[1].startswith(UNFINISHED)


def test_no_runs_is_a_note_and_an_unknown_run_a_usage_error(
    work: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    empty = tmp_path / "empty"
    for action in ("list", "status"):
        result = cli(capsys, "pipeline", action, "--work-dir", empty)
        assert (result.code, result.out) == (0, f"no pipeline runs in {empty}\n")
    assert cli(capsys, "pipeline", "list", "--work-dir", empty, "--json").out == "[]\n"
    assert cli(capsys, "pipeline", "status", "--work-dir", empty, "--json").out == "null\n"

    result = cli(capsys, "pipeline", "status", "20990101T000000Z-ffffff", "--work-dir", work)
    assert result.code == 2 and result.out == ""
    assert result.err.count("\n") == 1 and result.err.startswith("recsys-rl pipeline: error: no pipeline run")
    assert FINISHED in result.err

    result = cli(capsys, "pipeline", "list")
    assert result.code == 2 and "work_dir is required" in result.err
