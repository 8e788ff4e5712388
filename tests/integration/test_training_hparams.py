"""A training run's TensorBoard directory feeds the HParams tab: its hyperparameters, and beside them the
scalars whose last values are the run's final metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tensorflow as tf
from tensorboard.backend.event_processing.event_accumulator import TENSORS, EventAccumulator
from tensorboard.plugins.hparams import metadata

from recsys_rl.training.agents.base import AgentConfig
from recsys_rl.training.train import TrainConfig, train

pytestmark = pytest.mark.integration

STEPS = 20


@pytest.fixture(scope="module")
def run(feed_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = TrainConfig(
        algo="bc",
        data=str(feed_dataset),
        out=str(tmp_path_factory.mktemp("hparams") / "bc"),
        steps=STEPS,
        batch_size=128,
        log_every=15,  # the last step is logged all the same: that is what makes the metrics final
        checkpoint_every=10,
        agent=AgentConfig(actor_hidden=(32,)),
    )
    return train(config).run_dir


def _events(run: Path) -> EventAccumulator:
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={TENSORS: 0})
    events.Reload()
    return events


def test_the_run_records_its_hyperparameters_for_the_hparams_tab(run: Path) -> None:
    [content] = _events(run).PluginTagToContent(metadata.PLUGIN_NAME).values()
    start = metadata.parse_session_start_info_plugin_data(content)
    values = {name: getattr(value, value.WhichOneof("kind")) for name, value in start.hparams.items()}
    dataset = json.loads((run / "input_manifest.json").read_text())["version"]
    assert values["algo"] == "bc" and values["steps"] == STEPS and values["batch_size"] == 128
    assert values["seed"] == 0 and values["dataset"] == dataset
    assert values["agent.actor_hidden"] == "[32]" and values["agent.discount"] == "null"
    assert "agent.bc_weight" in values and not any(name.startswith("allocation.") for name in values)
    assert not {"data", "out", "log_every"} & set(values)  # where and how often, not what it learns
    assert start.group_name.startswith(f"bc-{dataset}-s0-")


def test_its_last_scalars_are_the_final_metrics_the_tab_shows_beside_them(run: Path) -> None:
    events = _events(run)
    final = json.loads((run / "manifest.json").read_text())["final_metrics"]
    last = {tag: events.Tensors(tag)[-1] for tag in final}
    assert {event.step for event in last.values()} == {STEPS}
    assert {tag: float(tf.make_ndarray(event.tensor_proto)) for tag, event in last.items()} == pytest.approx(
        final
    )
