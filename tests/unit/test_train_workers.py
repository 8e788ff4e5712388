"""Which training worker a process is, from TF_CONFIG (the runs: test_training's two-worker test)."""

import json
import re

import pytest

from recsys_rl.config import ConfigError
from recsys_rl.training.train import TF_CONFIG, Workers, tf_config_for


def test_no_tf_config_is_one_worker_the_chief(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(TF_CONFIG, raising=False)
    assert Workers.from_environment() == Workers(count=1, index=0)
    assert Workers.from_environment().is_chief


def test_the_workers_flag_composes_the_tf_config_tensorflow_reads(monkeypatch: pytest.MonkeyPatch):
    addresses = ["10.0.0.1:2222", "10.0.0.2:2222", "10.0.0.3:2222"]
    monkeypatch.setenv(TF_CONFIG, tf_config_for(addresses, 2))
    assert json.loads(tf_config_for(addresses, 2)) == {
        "cluster": {"worker": addresses},
        "task": {"type": "worker", "index": 2},
    }
    workers = Workers.from_environment()
    assert (workers.count, workers.index, workers.is_chief) == (3, 2, False)


@pytest.mark.parametrize(
    ("tf_config", "message"),
    [
        pytest.param("{not json", "TF_CONFIG should be JSON like", id="not-json"),
        pytest.param('["a:1"]', "TF_CONFIG should be JSON like", id="not-an-object"),
        pytest.param(
            tf_config_for(["a:1", "b:2"], 2), "TF_CONFIG task index 2 is not one of its 2 workers", id="index"
        ),
        pytest.param(
            json.dumps(
                {"cluster": {"worker": ["a:1"], "ps": ["b:2"]}, "task": {"type": "worker", "index": 0}}
            ),
            "should name workers only (MultiWorkerMirroredStrategy, worker 0 the chief), but names ['ps']",
            id="parameter-server",
        ),
        pytest.param(
            json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "evaluator", "index": 0}}),
            "but names ['evaluator']",
            id="evaluator",
        ),
    ],
)
def test_a_tf_config_this_training_cannot_run_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, tf_config: str, message: str
):
    monkeypatch.setenv(TF_CONFIG, tf_config)
    with pytest.raises(ConfigError, match=re.escape(message)):
        Workers.from_environment()
