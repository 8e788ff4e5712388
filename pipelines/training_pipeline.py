"""``recsys-rl pipeline run``: ingest, commit, features, train, evaluate, register, promote (DESIGN 1, 5).

Scheduled jobs die half way (a preempted node, a broker outage, a full disk) and the scheduler's answer
is to run the same command again. So every step is a function of recorded inputs, and its outputs live
in a directory named by a digest of those inputs:

    WORK/runs/<run id>/run.json    the run: its steps' inputs, outputs, timings and status
    WORK/steps/<step>/<key>/       a step's outputs; <key> is the sha256 of the step's inputs

A step whose outputs for the same inputs already exist is skipped. Ingest is the one step whose inputs
(the consumer group's offsets) move on once it succeeds, so the run record keeps its result: the next
invocation after a crash resumes the unfinished run with the dataset that run ingested, and the later
steps find their own finished outputs. Offsets are committed by the step after ingest, once the run
record holds the dataset: a crash before the commit re-reads the same records into the same dataset
version, and one after it resumes with that dataset and never reads them twice.

One run at a time per registry: the run holds an exclusive lock on REGISTRY/.pipeline.lock. Two runs
promoting into one registry would each evaluate against an incumbent the other is about to replace.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recsys_rl import registry
from recsys_rl.atomic_json import read_json_file, write_json_atomic
from recsys_rl.config import load_config
from recsys_rl.feature_store import MaterializeConfig
from recsys_rl.ope.blessing import utc_now
from recsys_rl.ope.gate import GateConfig
from recsys_rl.pipelines.build_transitions import (
    BuildTransitionsConfig,
    build_transitions,
    publish_dead_letters,
)
from recsys_rl.pipelines.kafka_source import ReplayPlan, commit_offsets
from recsys_rl.pipelines.pipeline_runs import RUN_RECORD, STEPS, PipelineError
from recsys_rl.storage import is_uri
from recsys_rl.training.agents.algorithms import surface_of

Progress = Callable[[str, dict[str, Any]], None]
STEP_RECORD = "step.json"
LOCK_FILE = ".pipeline.lock"
RUN_SCHEMA_VERSION = 1
_PIPELINE_SET = ("data", "out")  # train keys the pipeline fills in itself
_EMPTY_WINDOW_FIX = "set features.start_date/end_date to cover it (or leave them out), or features.reset"


class PipelineLockedError(PipelineError):
    """Another pipeline run holds the registry."""


@dataclass(frozen=True)
class PromotionConfig:
    enabled: bool = True  # off: register (with the blessing) but leave routing to a person
    canary_fraction: float = 0.1  # share of users a blessed candidate serves as canary
    # A canary needs a stable version to split traffic with; on a surface that has none, the first
    # blessed version becomes stable instead (off: it waits for a person to promote it).
    bootstrap_stable: bool = True

    def __post_init__(self) -> None:
        registry.check_fraction(self.canary_fraction)


@dataclass(frozen=True)
class PipelineConfig:
    """One scheduled training pipeline: where it reads, what it trains, how it gates and promotes."""

    work_dir: str = ""  # run records and every step's outputs
    registry: str = ""  # model registry the run evaluates against, registers into and promotes in
    ingest: BuildTransitionsConfig | None = None  # Kafka -> transitions (required)
    features: MaterializeConfig | None = None  # Feast materialisation of the ingested aggregates; None: skip
    train: dict[str, Any] = field(default_factory=dict)  # any TrainConfig key but data and out
    gate: GateConfig = field(default_factory=GateConfig)  # its surface is the surface the run trains for
    evaluate_seed: int = 0  # bootstrap and reward-model seed of the OPE step
    promotion: PromotionConfig = field(default_factory=PromotionConfig)
    beam_args: tuple[str, ...] = ()  # Beam pipeline options of the ingest step, e.g. --runner=FlinkRunner

    def __post_init__(self) -> None:
        for name in ("work_dir", "registry", "ingest"):
            if not getattr(self, name):
                raise ValueError(f"{name} is required")
        if is_uri(self.ingest.out):
            raise ValueError(
                f"ingest.out should be a local or mounted directory, but is the URI {self.ingest.out!r}: "
                "the steps after ingest (Feast, training, evaluation) read the dataset with local file "
                "operations; build-transitions alone writes datasets to object stores"
            )
        if self.features is not None and self.features.offline is not None:
            raise ValueError(
                "features.offline is set by the pipeline: each dataset carries its own aggregates"
            )
        taken = sorted(set(self.train) & set(_PIPELINE_SET))
        if taken:
            raise ValueError(f"train.{taken[0]} is set by the pipeline; leave it out")
        trained = self.train_config(
            "<dataset>", "<run>"
        )  # a bad train section fails at start, not after ingest
        if surface_of(trained.algo) != self.surface:
            raise ValueError(
                f"train.algo {trained.algo} decides for {surface_of(trained.algo)}, but gate.surface is "
                f"{self.surface}; one pipeline config trains one surface"
            )

    def train_config(self, dataset: str, out: str):
        from recsys_rl.training.train import TrainConfig  # TensorFlow: only when the run gets this far

        return load_config(TrainConfig, None, {**self.train, "data": dataset, "out": out})

    @property
    def surface(self) -> str:
        return self.gate.surface


@dataclass
class PipelineResult:
    run_dir: Path
    record: dict[str, Any]
    resumed: bool

    @property
    def steps(self) -> dict[str, dict[str, Any]]:
        return self.record["steps"]

    def text(self) -> str:
        """What the run did, step by step, and where its outputs went."""
        record = self.record
        lines = [
            f"pipeline run {record['run_id']} ({'resumed' if self.resumed else 'new'}): {record['status']}"
        ]
        for name in (n for n in STEPS if n in self.steps):
            step = self.steps[name]
            outputs = step["outputs"]
            shown = ", ".join(
                f"{k}={v}"
                for k, v in outputs.items()
                # the evaluate step's verdict line stands for its blessed flag and settings list
                if k not in ("reasons", "final_metrics", "accounting", "plan", "loose_settings")
                and not (k == "blessed" and "verdict" in outputs)
            )
            lines.append(f"  {name:<9} {step['status']:<10} {step['seconds']:>8.1f} s  {shown}")
            lines.extend(f"            reason: {reason}" for reason in outputs.get("reasons", []))
        lines.append(f"run record: {self.run_dir / RUN_RECORD}")
        return "\n".join(lines)


def load_pipeline_config(path: str | None, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    return load_config(PipelineConfig, path, overrides)


def run_pipeline(config: PipelineConfig, progress: Progress = lambda event, fields: None) -> PipelineResult:
    """Run (or resume) the pipeline once; returns the finished run record."""
    work = Path(config.work_dir)
    with _registry_lock(Path(config.registry)) as claim:
        run_dir, record, resumed = _open_run(work, config)
        claim(record["run_id"])
        progress("run_started" if not resumed else "run_resumed", {"run": record["run_id"]})
        steps = _Steps(config, work, record, run_dir, progress)
        try:
            for name in STEPS:
                if steps.run(name)["status"] == "not_needed" and name == "ingest":
                    break  # no new records: nothing to train on
        except BaseException as err:
            record.update(status="failed", error=f"{type(err).__name__}: {err}", finished_at=utc_now())
            write_json_atomic(run_dir / RUN_RECORD, record)
            raise
        record.update(status="complete", error=None, finished_at=utc_now())
        write_json_atomic(run_dir / RUN_RECORD, record)
        progress("run_complete", {"run": record["run_id"], "run_record": str(run_dir / RUN_RECORD)})
        return PipelineResult(run_dir, record, resumed)


@contextlib.contextmanager
def _registry_lock(root: Path) -> Iterator[Callable[[str], None]]:
    """Hold REGISTRY/.pipeline.lock; the holder's pid and run id go in the file for whoever is refused."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK_FILE
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "an unknown process"
            raise PipelineLockedError(
                f"another pipeline run holds {path} ({holder}); one run at a time per registry"
            ) from None

        def claim(run_id: str) -> None:
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()}, run {run_id}, since {utc_now()}")
            handle.flush()

        try:
            yield claim
        finally:
            handle.seek(0)
            handle.truncate()
            fcntl.flock(handle, fcntl.LOCK_UN)


def _digest(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _ingest_settings(config: PipelineConfig) -> dict[str, Any]:
    return {"ingest": dataclasses.asdict(config.ingest), "beam_args": list(config.beam_args)}


def _open_run(work: Path, config: PipelineConfig) -> tuple[Path, dict[str, Any], bool]:
    """The unfinished run to resume, or a new one."""
    runs = work / "runs"
    settings = _digest(_ingest_settings(config))
    for run_dir in sorted(runs.glob("*/")):
        record = read_json_file(run_dir / RUN_RECORD, PipelineError, "the record of a pipeline run")
        if record["status"] == "complete":
            continue
        if record["ingest_settings"] != settings:
            raise PipelineError(
                f"run {record['run_id']} did not finish and ingested with other settings; run it again "
                f"with its own config to finish it, or delete {run_dir} to abandon it"
            )
        record["resumes"] = record.get("resumes", 0) + 1
        return run_dir, record, True
    run_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:6]
    run_dir = runs / run_id
    run_dir.mkdir(parents=True)
    record = {
        "schema_version": RUN_SCHEMA_VERSION,
        "kind": "pipeline_run",
        "run_id": run_id,
        "surface": config.surface,
        "ingest_settings": settings,
        "started_at": utc_now(),
        "status": "running",
        "steps": {},
    }
    write_json_atomic(run_dir / RUN_RECORD, record)
    return run_dir, record, False


class _Steps:
    """Each step: skip when done, else run; the run record is rewritten after every step."""

    def __init__(
        self, config: PipelineConfig, work: Path, record: dict[str, Any], run_dir: Path, progress: Progress
    ) -> None:
        self.config, self.work, self.record, self.run_dir, self.progress = (
            config,
            work,
            record,
            run_dir,
            progress,
        )

    def run(self, name: str) -> dict[str, Any]:
        """Run step ``name`` unless this run already finished it; its outcome either way."""
        outcome = self.record["steps"].get(name)
        if outcome is not None:
            self.progress(f"{name}_finished_earlier", {"status": outcome["status"]})
            return outcome
        started = time.perf_counter()
        self.progress(f"{name}_started", {})
        outcome = getattr(self, f"_{name}")()
        outcome["seconds"] = round(time.perf_counter() - started, 3)
        self.record["steps"][name] = outcome
        write_json_atomic(self.run_dir / RUN_RECORD, self.record)
        self.progress(f"{name}_{outcome['status']}", outcome["outputs"])
        return outcome

    def output(self, step: str) -> dict[str, Any]:
        return self.record["steps"][step]["outputs"]

    def _step_dir(self, step: str, inputs: dict[str, Any]) -> Path:
        return self.work / "steps" / step / _digest(inputs)[:16]

    # --- the steps ------------------------------------------------------------------------------

    def _ingest(self) -> dict[str, Any]:
        # Offsets are committed by the next step, once this one's result is in the run record: a crash
        # between the two then resumes with this dataset instead of reading past it.
        ingest = dataclasses.replace(self.config.ingest, commit=False)
        result = build_transitions(ingest, self.config.beam_args, self.progress)
        if result.dataset_dir is None:
            return {"status": "not_needed", "outputs": {"records": 0, "reason": "no new records"}}
        manifest = result.manifest
        return {
            "status": "skipped" if result.reused else "done",
            "outputs": {
                "dataset": str(result.dataset_dir.resolve()),
                "version": manifest["version"],
                "records": result.plan.total_records,
                "accounting": manifest["accounting"],
                "plan": result.plan.to_dict(),
            },
        }

    def _commit(self) -> dict[str, Any]:
        ingested = self.output("ingest")
        plan = ReplayPlan.from_dict(ingested["plan"])
        if not self.config.ingest.commit:
            return {"status": "not_needed", "outputs": {"reason": "ingest.commit is off"}}
        # dead letters first, then offsets, as build-transitions does; both are safe to repeat on resume
        published = publish_dead_letters(Path(ingested["dataset"]), self.config.ingest)
        commit_offsets(plan)  # the same end offsets again on a resumed run: harmless
        outputs = {"group": plan.group, "partitions": len(plan.ranges), "dead_letters_published": published}
        return {"status": "done", "outputs": outputs}

    def _features(self) -> dict[str, Any]:
        if self.config.features is None:
            return {"status": "not_needed", "outputs": {"reason": "no features section in the config"}}
        from recsys_rl.feature_store import materialize_repo  # Feast: seconds to import

        dataset = self.output("ingest")
        settings = dataclasses.replace(
            self.config.features, offline=str(Path(dataset["dataset"]) / "features")
        )
        inputs = {"dataset": dataset["version"], "features": dataclasses.asdict(settings)}
        step_dir = self._step_dir("features", inputs)
        if (step_dir / STEP_RECORD).exists():
            outputs = read_json_file(step_dir / STEP_RECORD, PipelineError, "a finished materialisation")
            return {"status": "skipped", "inputs": inputs, "outputs": outputs}
        report = materialize_repo(settings)
        if empty := report.empty_windows(_EMPTY_WINDOW_FIX):
            # unlike the command, a scheduled run has nobody reading warnings, and its model would be
            # served on features that never reached the online store
            raise PipelineError("; ".join(empty))
        outputs = {
            "online_store": report.online_store,
            "views": {view.name: view.entities for view in report.views},
        }
        step_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(step_dir / STEP_RECORD, outputs)
        return {"status": "done", "inputs": inputs, "outputs": outputs}

    def _train(self) -> dict[str, Any]:
        from recsys_rl.training.train import train

        dataset = self.output("ingest")
        inputs = {"dataset": dataset["version"], "train": self.config.train}
        run_dir = self._step_dir("train", inputs)
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        config = self.config.train_config(dataset["dataset"], str(run_dir))
        result = train(config, self.progress)
        manifest = result.manifest
        outputs = {
            "run": str(run_dir.resolve()),
            "algo": manifest["algo"],
            "policy_version": manifest["policy"]["version"],
            "final_metrics": manifest["final_metrics"],
        }
        return {
            "status": "skipped" if result.already_complete else "done",
            "inputs": inputs,
            "outputs": outputs,
        }

    def _evaluate(self) -> dict[str, Any]:
        from recsys_rl.ope.evaluate import BLESSING_JSON, REPORT_JSON, EvaluateConfig, run_evaluation
        from recsys_rl.ope.report import verdict_line
        from recsys_rl.registry.policy_files import policy_digest
        from recsys_rl.sim.sim_eval import policy_directory

        dataset, trained = self.output("ingest"), self.output("train")
        incumbent = _incumbent(Path(self.config.registry), self.config.surface)
        inputs = {
            "dataset": dataset["version"],
            "candidate_sha256": policy_digest(policy_directory(trained["run"])),
            "incumbent": None
            if incumbent is None
            else {"version": incumbent.version, "sha256": incumbent.policy_sha256},
            "gate": dataclasses.asdict(self.config.gate),
            "seed": self.config.evaluate_seed,
        }
        out = self._step_dir("evaluate", inputs)
        skipped = (out / BLESSING_JSON).exists()
        if not skipped:
            out.parent.mkdir(parents=True, exist_ok=True)
            evaluate = EvaluateConfig(
                candidate=trained["run"],
                incumbent="behavior" if incumbent is None else str(incumbent.policy_dir),
                data=dataset["dataset"],
                out=str(out),
                seed=self.config.evaluate_seed,
                gate=self.config.gate,
            )
            run_evaluation(evaluate, self.progress)
        blessing = read_json_file(out / BLESSING_JSON, PipelineError, "the gate's blessing")
        verdict = read_json_file(out / REPORT_JSON, PipelineError, "the gate's report")["verdict"]
        outputs = {
            "report": str(out.resolve()),
            "incumbent": "behaviour" if incumbent is None else incumbent.version,
            "blessed": blessing["passed"],
            # what to print: the headline counts the warnings and a loose gate says so, where "blessed"
            # alone would read the same for a clean blessing and one with warnings by a lax gate
            "verdict": verdict_line(verdict),
            "loose_settings": verdict["loose_settings"],
            "reasons": blessing["reasons"],
        }
        return {"status": "skipped" if skipped else "done", "inputs": inputs, "outputs": outputs}

    def _register(self) -> dict[str, Any]:
        evaluation = self.output("evaluate")
        registered = registry.register(
            self.config.registry,
            self.config.surface,
            run=self.output("train")["run"],
            report=evaluation["report"],
            actor=f"pipeline:{self.record['run_id']}",
        )
        outputs = {"version": registered.version.version, "blessed": registered.version.blessed}
        return {"status": "done" if registered.created else "skipped", "outputs": outputs}

    def _promote(self) -> dict[str, Any]:
        version = self.output("register")["version"]
        promotion = self.config.promotion
        if not self.output("register")["blessed"]:
            return {"status": "not_needed", "outputs": {"version": version, "reason": "not blessed"}}
        if not promotion.enabled:
            return {"status": "not_needed", "outputs": {"version": version, "reason": "promotion disabled"}}
        routing = registry.read_routing(self.config.registry, self.config.surface)
        if routing.stable is None and not promotion.bootstrap_stable:
            reason = "no stable version to canary against, and bootstrap_stable is off"
            return {"status": "not_needed", "outputs": {"version": version, "reason": reason}}
        role = "canary" if routing.stable is not None else "stable"
        change = registry.promote(
            self.config.registry,
            self.config.surface,
            version,
            role,
            canary_fraction=promotion.canary_fraction if role == "canary" else None,
            actor=f"pipeline:{self.record['run_id']}",
        )
        outputs = {"version": version, "role": role, "routing_revision": change.after.revision}
        return {"status": "done" if change.changed else "skipped", "outputs": outputs}


def _incumbent(root: Path, surface: str) -> registry.VersionInfo | None:
    """The stable version a candidate must beat; None (the logging policy) while the surface has none."""
    if not root.is_dir():
        return None
    stable = registry.resolve_routing(root, surface).stable
    return stable if stable is not None and stable.blessed else None
