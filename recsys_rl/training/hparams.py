"""A training run's hyperparameters for TensorBoard's HParams tab, where runs compare side by side.

Each run records its hyperparameters once, in its own TensorBoard directory. The tab shows beside them the
last value of every scalar the run logged there, and a run always logs its last step, so those are its
final metrics: nothing else needs writing. No experiment-wide ``hp.hparams_config`` is written, on purpose:
TensorBoard applies the first one it finds to every run under its logdir, and feed and allocation runs
have different hyperparameters and losses.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

import tensorflow as tf
from tensorboard.plugins.hparams import api as hp

if TYPE_CHECKING:
    from recsys_rl.training.train import TrainConfig

#: TrainConfig keys that say where a run reads and writes, or how often it records: not what it learns.
_NOT_HYPERPARAMETERS = ("data", "out", "devices", "checkpoint_every", "log_every")

Scalar = bool | int | float | str


def hyperparameters(config: TrainConfig, dataset_version: str) -> dict[str, Scalar]:
    """The run's hyperparameters as TensorBoard takes them, one scalar each: the algorithm's own agent
    section flattened to ``agent.actor_hidden`` and the like, lists and None as JSON text. The dataset
    version is one too: the same settings on new data make a different run."""
    settings = {k: v for k, v in config.to_dict().items() if k not in _NOT_HYPERPARAMETERS}
    return {"dataset": dataset_version, **_flatten(settings)}


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Scalar]:
    flat: dict[str, Scalar] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value if isinstance(value, Scalar) else json.dumps(value)
    return flat


def trial_id(hparams: dict[str, Scalar]) -> str:
    """The run's name in the HParams tab. TensorBoard groups runs by it, so it is unique per set of
    hyperparameters (their digest: repeats of one config fall in one group), and readable before that."""
    digest = hashlib.sha256(json.dumps(hparams, sort_keys=True).encode()).hexdigest()[:8]
    return f"{hparams['algo']}-{hparams['dataset']}-s{hparams['seed']}-{digest}"


def write_hparams(writer: tf.summary.SummaryWriter, config: TrainConfig, dataset_version: str) -> None:
    """Record the run's hyperparameters in ``writer``'s directory, beside the scalars it logs."""
    hparams = hyperparameters(config, dataset_version)
    with writer.as_default():
        hp.hparams(hparams, trial_id=trial_id(hparams))
