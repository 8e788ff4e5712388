"""An evaluation in TensorBoard: each candidate one run in the HParams tab, with what it is (version,
dataset, incumbent, surface, estimator) as hyperparameters and the gate's figures as its metrics.

``tensorboard --logdir evaluations/`` then lines up every candidate evaluated under it, sortable by the
lift of any signal, beside the training runs' own hyperparameters (``recsys_rl.training.hparams``). The
figures are the gating estimator's relative lifts over the baseline with their interval bounds, and the
verdict; report.json keeps everything else.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import tensorflow as tf
from tensorboard.plugins.hparams import api as hp

TENSORBOARD_DIR = "tensorboard"


def figures(report: dict[str, Any]) -> dict[str, float]:
    """The metrics of a report: ``lift/<signal>`` with ``.../low`` and ``.../high``, and ``gate/blessed``;
    a figure the evaluation could not compute (no interval for a rare signal) is left out, not zero."""
    estimator = report["gate"]["estimator"]
    overall = report["lift"]["estimators"][estimator]["overall"]
    values = {"gate/blessed": 1.0 if report["verdict"]["passed"] else 0.0}
    for signal in report["lift"]["signals"]:
        relative = overall[signal]["relative"]
        low, high = relative["interval"] or (None, None)
        for name, value in ((signal, relative["value"]), (f"{signal}/low", low), (f"{signal}/high", high)):
            if value is not None and math.isfinite(value):
                values[f"lift/{name}"] = float(value)
    return values


def write_evaluation(directory: Path, report: dict[str, Any]) -> None:
    """``directory/tensorboard``: the candidate's hyperparameters and figures (step 0: one evaluation)."""
    candidate, incumbent = report["inputs"]["candidate"], report["inputs"]["incumbent"]
    hparams = {
        "candidate": candidate["version"],
        "incumbent": "behavior" if incumbent is None else incumbent["version"],
        "dataset": report["inputs"]["dataset"]["version"],
        "surface": report["gate"]["surface"],
        "estimator": report["gate"]["estimator"],
    }
    writer = tf.summary.create_file_writer(str(directory / TENSORBOARD_DIR))
    with writer.as_default():
        hp.hparams(hparams, trial_id=f"{candidate['version']}-{candidate['policy_sha256'][:8]}")
        for name, value in figures(report).items():
            tf.summary.scalar(name, value, step=0)
    writer.close()
