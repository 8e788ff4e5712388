"""The pipeline config fails at load, naming the key, before any step runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from recsys_rl.cli.main import main
from recsys_rl.config import ConfigError
from recsys_rl.pipelines.training_pipeline import load_pipeline_config

INGEST = {"bootstrap_servers": "127.0.0.1:9092", "group": "g", "out": "datasets"}
BASE = {"work_dir": "work", "registry": "registry", "ingest": INGEST}


def _write(tmp_path: Path, settings: dict) -> str:
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(settings))
    return str(path)


def test_a_complete_config_loads_with_every_section_typed(tmp_path: Path) -> None:
    settings = {
        **BASE,
        "features": {"repo": "features", "profile": "redis", "redis": "127.0.0.1:6379"},
        "train": {"algo": "bc", "steps": 10, "agent": {"actor_hidden": [16]}},
        "gate": {"min_main_lift": 0.01, "tolerances": {"hate": 0.1}},
        "promotion": {"canary_fraction": 0.25},
        "beam_args": ["--direct_num_workers=2"],
    }
    config = load_pipeline_config(_write(tmp_path, settings))
    assert config.ingest.group == "g" and config.features.profile == "redis"
    assert config.gate.tolerances == {"hate": 0.1} and config.promotion.canary_fraction == 0.25
    trained = config.train_config("d", "r")
    assert (trained.algo, trained.steps, trained.agent.actor_hidden, trained.data) == ("bc", 10, (16,), "d")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"ingest": None}, "ingest is required"),
        ({"train": {"data": "elsewhere"}}, "train.data is set by the pipeline"),
        ({"train": {"stepz": 10}}, "unknown config keys \\['stepz'\\]"),
        ({"train": {"algo": "dqn"}}, "algo should be one of"),
        ({"features": {"offline": "x"}}, "features.offline is set by the pipeline"),
        ({"promotion": {"canary_fraction": 1.5}}, "canary_fraction|fraction"),
        ({"ingest": {**INGEST, "start": "latest"}}, "ingest: start should be one of"),
        ({"ingest": {**INGEST, "out": "s3://b/datasets"}}, "ingest.out should be a local or mounted dir"),
        ({"gate": {"resamples": 3}}, "resamples should be at least 10"),
        ({"train": {"algo": "sl-mgac"}}, "decides for live_allocation, but gate.surface is feed"),
    ],
)
def test_a_bad_section_is_named(tmp_path: Path, change: dict, message: str) -> None:
    settings = {**BASE, **change}
    if settings["ingest"] is None:
        del settings["ingest"]
    with pytest.raises(ConfigError, match=message):
        load_pipeline_config(_write(tmp_path, settings))


def test_an_allocation_pipeline_trains_and_gates_live_allocation(tmp_path: Path) -> None:
    settings = {**BASE, "train": {"algo": "sl-mgac"}, "gate": {"surface": "live_allocation"}}
    config = load_pipeline_config(_write(tmp_path, settings))
    assert config.surface == "live_allocation" and config.train_config("d", "r").algo == "sl-mgac"


def test_the_command_reports_a_bad_config_in_one_line(tmp_path: Path, capsys) -> None:
    code = main(["pipeline", "run", "--config", _write(tmp_path, {**BASE, "train": {"out": "x"}})])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "train.out is set by the pipeline" in err
