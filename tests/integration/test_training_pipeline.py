"""``recsys-rl pipeline run`` on real Apache Kafka: a crash mid-run resumes, a second run is refused."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from open_gate import OPEN_GATE

from recsys_rl.cli.main import main
from recsys_rl.kafka.producer import EventProducer
from recsys_rl.kafka.reader import read_range
from recsys_rl.ope import evaluate as evaluation
from recsys_rl.ope.gate import GateConfig
from recsys_rl.pipelines import training_pipeline
from recsys_rl.pipelines.build_transitions import BuildTransitionsConfig
from recsys_rl.pipelines.training_pipeline import PipelineConfig, PipelineLockedError, run_pipeline
from recsys_rl.sim.simulate import SimulateConfig, run_simulation

pytestmark = pytest.mark.integration


@pytest.fixture
def config(apache_kafka, tmp_path: Path) -> PipelineConfig:
    suffix = uuid.uuid4().hex[:8]
    # enough users that every signal occurs several times (follow, hate: one in 60-80 user-days): a signal
    # a bootstrap resample never drew has no lift there, and the gate (rightly) blesses nothing it cannot
    # judge, open as it is here
    sim = SimulateConfig(
        users=500, seed=11, decisions_topic=f"pl-dec-{suffix}", feedback_topic=f"pl-fb-{suffix}"
    )
    run_simulation(sim, apache_kafka.bootstrap_servers)
    return PipelineConfig(
        work_dir=str(tmp_path / "work"),
        registry=str(tmp_path / "registry"),
        ingest=BuildTransitionsConfig(
            bootstrap_servers=apache_kafka.bootstrap_servers,
            group=f"pl-{suffix}",
            out=str(tmp_path / "datasets"),
            decisions_topic=sim.decisions_topic,
            feedback_topic=sim.feedback_topic,
            dead_letter_topic="",
        ),
        train={"steps": 20, "batch_size": 64, "checkpoint_every": 10, "log_every": 10},
        gate=GateConfig(resamples=10, **OPEN_GATE),
    )


def test_a_killed_run_resumes_where_it_stopped(config, monkeypatch) -> None:
    def killed(*args, **kwargs):
        raise RuntimeError("node preempted")

    # Killed after ingest wrote its dataset, before the offsets were committed.
    monkeypatch.setattr(training_pipeline, "commit_offsets", killed)
    with pytest.raises(RuntimeError, match="preempted"):
        run_pipeline(config)
    [run_dir] = (Path(config.work_dir) / "runs").iterdir()
    first = json.loads((run_dir / "run.json").read_text())
    assert first["status"] == "failed" and set(first["steps"]) == {"ingest"}

    # Killed again in the evaluation: the resumed run used the same dataset and committed its offsets.
    monkeypatch.undo()
    real_evaluation = evaluation.run_evaluation
    monkeypatch.setattr(evaluation, "run_evaluation", killed)
    with pytest.raises(RuntimeError, match="preempted"):
        run_pipeline(config)
    crashed = json.loads((run_dir / "run.json").read_text())
    assert crashed["run_id"] == first["run_id"] and crashed["resumes"] == 1
    assert crashed["status"] == "failed" and "node preempted" in crashed["error"]
    assert set(crashed["steps"]) == {"ingest", "commit", "features", "train"}
    assert crashed["steps"]["ingest"] == first["steps"]["ingest"]

    monkeypatch.setattr(evaluation, "run_evaluation", real_evaluation)
    resumed = run_pipeline(config)
    assert resumed.resumed and resumed.record["run_id"] == crashed["run_id"]
    assert resumed.record["status"] == "complete"
    steps = resumed.steps
    assert steps["ingest"] == crashed["steps"]["ingest"]  # taken from the record, not read again
    assert steps["train"] == crashed["steps"]["train"]
    assert steps["evaluate"]["status"] == "done" and steps["register"]["status"] == "done"
    assert steps["promote"]["outputs"]["role"] == "stable"  # blessed, and the surface had no stable yet

    # The training step, asked again for the same inputs, finds its finished run instead of training.
    record = json.loads((resumed.run_dir / "run.json").read_text())
    del record["steps"]["train"]
    (resumed.run_dir / "run.json").write_text(json.dumps({**record, "status": "failed"}))
    again = run_pipeline(config)
    assert again.resumed and again.steps["train"]["status"] == "skipped"
    assert again.steps["train"]["outputs"] == steps["train"]["outputs"]

    # Nothing new in Kafka: the next run ends after ingest.
    idle = run_pipeline(config)
    assert not idle.resumed and list(idle.steps) == ["ingest"]
    assert idle.steps["ingest"]["status"] == "not_needed"


def test_one_run_at_a_time_per_registry(config) -> None:
    with training_pipeline._registry_lock(Path(config.registry)) as claim:
        claim("run-holding-the-lock")
        with pytest.raises(PipelineLockedError, match="run-holding-the-lock"):
            run_pipeline(config)


def test_the_command_prints_each_step_and_where_the_record_is(config, tmp_path, capsys) -> None:
    """...and publishes the dead letters once, in its commit step (its ingest builds without committing)."""
    path = tmp_path / "pipeline.yaml"
    ingest = {k: v for k, v in vars(config.ingest).items()} | {
        "dead_letter_topic": f"dlq-{uuid.uuid4().hex[:8]}"
    }
    good = next(read_range(config.ingest.bootstrap_servers, config.ingest.feedback_topic))
    with EventProducer(config.ingest.bootstrap_servers) as producer:
        producer.send(config.ingest.feedback_topic, good.key, b"\x00not an event", good.timestamp_ms)
    path.write_text(
        json.dumps({"ingest": ingest, "train": config.train, "gate": vars(config.gate) | {"tolerances": {}}})
    )
    code = main(
        [
            "pipeline",
            "run",
            "--config",
            str(path),
            "--work-dir",
            config.work_dir,
            "--registry",
            config.registry,
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    for step in ("ingest", "commit", "features", "train", "evaluate", "register", "promote"):
        assert f"  {step}" in out
    assert "run record: " in out and "complete" in out.splitlines()[0]
    [letter] = list(read_range(config.ingest.bootstrap_servers, ingest["dead_letter_topic"]))
    assert b"malformed_bytes" in letter.value
