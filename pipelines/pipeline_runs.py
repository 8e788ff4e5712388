"""The training pipeline's run records, read back for ``recsys-rl pipeline list|status``.

``training_pipeline`` rewrites WORK/runs/<run id>/run.json after every step. Its directories are named
by digests, which say nothing to a person scanning a list; the record, though, holds what does: the
algorithm trained, the dataset version ingested, the gate's verdict and the version promoted. This module
turns records into small objects that answer those questions, and leaves the wording to the command line.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recsys_rl.atomic_json import read_json_file
from recsys_rl.config import ConfigError
from recsys_rl.errors import OperationalError

#: The training pipeline's steps in order (``training_pipeline``), and the record each run keeps of them.
STEPS = ("ingest", "commit", "features", "train", "evaluate", "register", "promote")
RUN_RECORD = "run.json"


class PipelineError(OperationalError):
    """The pipeline cannot start or go on; the message says what to do."""


#: A record's status as a person reads it. "running" is all a record can say both of a run still going
#: and of one whose process died without a word (SIGKILL, a lost node): either way, it is unfinished.
STATES = {"complete": "finished", "failed": "failed", "running": "unfinished"}
#: How many run ids an unknown-run error names: a six-hourly schedule makes over a thousand a year.
_IDS_NAMED = 5


@dataclass(frozen=True)
class StepRun:
    name: str
    status: str  # done, skipped (its outputs for the same inputs existed), not_needed
    seconds: float
    outputs: dict[str, Any]


@dataclass(frozen=True)
class PipelineRun:
    """One run record, with the answers a listing needs computed from it."""

    run_id: str
    record: Path
    surface: str
    status: str  # the record's own: running, failed, complete
    started_at: str
    finished_at: str | None
    error: str | None
    resumes: int
    steps: tuple[StepRun, ...]  # in the pipeline's order

    @property
    def state(self) -> str:
        return STATES.get(self.status, self.status)

    @property
    def seconds(self) -> float:
        """Time spent in the steps: a resumed run's wall clock would also count the hours between its
        crash and the scheduler's retry."""
        return round(sum(step.seconds for step in self.steps), 3)

    @property
    def stopped_in(self) -> str | None:
        """The step a failed or unfinished run has not got through; None once the run is finished."""
        if self.status == "complete":
            return None
        done = {step.name for step in self.steps}
        return next((name for name in STEPS if name not in done), None)

    @property
    def idle(self) -> bool:
        """Kafka had nothing new, so the run ended after ingest."""
        ingest = self.step("ingest")
        return ingest is not None and ingest.status == "not_needed"

    def step(self, name: str) -> StepRun | None:
        return next((step for step in self.steps if step.name == name), None)

    def output(self, step: str, key: str) -> Any:
        """One output of a step; None while the step has not run or did not produce it."""
        found = self.step(step)
        return None if found is None else found.outputs.get(key)

    @property
    def algo(self) -> str | None:
        return self.output("train", "algo")

    @property
    def dataset_version(self) -> str | None:
        return self.output("ingest", "version")

    @property
    def promoted(self) -> tuple[str, str] | None:
        """The version the run promoted and the role it got; None when it promoted nothing."""
        version, role = self.output("promote", "version"), self.output("promote", "role")
        return None if role is None else (version, role)

    def to_dict(self, with_steps: bool = False) -> dict[str, Any]:
        """The run for ``--json``: its summary, and with ``with_steps`` every step's full outputs."""
        promoted = self.promoted
        summary = {
            "run_id": self.run_id,
            "record": str(self.record),
            "surface": self.surface,
            "state": self.state,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "seconds": self.seconds,
            "steps_done": [step.name for step in self.steps],
            "stopped_in": self.stopped_in,
            "error": self.error,
            "resumes": self.resumes,
            "algo": self.algo,
            "dataset_version": self.dataset_version,
            "policy_version": self.output("train", "policy_version"),
            "blessed": self.output("evaluate", "blessed"),
            "verdict": self.output("evaluate", "verdict"),
            "registered_version": self.output("register", "version"),
            "promoted": None if promoted is None else {"version": promoted[0], "role": promoted[1]},
        }
        if with_steps:
            summary["steps"] = [dataclasses.asdict(step) for step in self.steps]
        return summary


def list_runs(work_dir: str | Path) -> list[PipelineRun]:
    """Every run recorded under ``work_dir``, newest first; none if the directory does not exist yet."""
    records = (Path(work_dir) / "runs").glob(f"*/{RUN_RECORD}")
    return sorted((read_run(path) for path in records), key=lambda r: (r.started_at, r.run_id), reverse=True)


def get_run(work_dir: str | Path, run_id: str | None = None) -> PipelineRun | None:
    """The run ``run_id`` (default: the newest; None when there is no run at all).

    An id that matches no run is a usage error naming the newest ids there are, as ``pipeline list``
    shows them.
    """
    runs = list_runs(work_dir)
    if run_id is None:
        return runs[0] if runs else None
    for run in runs:
        if run.run_id == run_id:
            return run
    named = ", ".join(run.run_id for run in runs[:_IDS_NAMED]) or "none"
    older = f" and {len(runs) - _IDS_NAMED} older" if len(runs) > _IDS_NAMED else ""
    raise ConfigError(f"no pipeline run {run_id!r} in {Path(work_dir) / 'runs'} (runs: {named}{older})")


def read_run(path: Path) -> PipelineRun:
    """The run whose record is at ``path``; PipelineError names a record that cannot be read."""
    record = read_json_file(path, PipelineError, "the record of a pipeline run")
    try:
        order = {name: i for i, name in enumerate(STEPS)}
        steps = tuple(
            StepRun(name, step["status"], float(step["seconds"]), dict(step["outputs"]))
            # the record is written with sorted keys; a step this version does not know goes last
            for name, step in sorted(record["steps"].items(), key=lambda item: order.get(item[0], len(order)))
        )
        return PipelineRun(
            run_id=record["run_id"],
            record=path,
            surface=record["surface"],
            status=record["status"],
            started_at=record["started_at"],
            finished_at=record.get("finished_at"),
            error=record.get("error"),
            resumes=record.get("resumes", 0),
            steps=steps,
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        raise PipelineError(f"{path} is not the record of a pipeline run") from None
