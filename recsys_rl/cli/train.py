"""``recsys-rl train``: argument parsing and output of one training run (``recsys_rl.training.train``)."""

from __future__ import annotations

import argparse
import os

from recsys_rl.cli.options import (
    add_config_option,
    non_negative_int,
    positive_int,
    require_dataset,
)
from recsys_rl.config import ConfigError, load_config
from recsys_rl.logs import progress_logger, quiet_native_imports
from recsys_rl.training.agents.algorithms import ALL_ALGORITHMS


def register(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser(
        "train",
        help="train a feed or live-allocation agent on a transition dataset into a run directory",
        description="Train a feed-ranking agent or a live-allocation agent (sl-mgac and its variants; the "
        "algorithm picks the dataset's surface) offline on one transition dataset (a version directory "
        "with manifest.json) and export its policy. The run directory holds the resolved config, the "
        "input manifest, metrics (JSON lines and TensorBoard), checkpoints, the exported policy and, "
        "last, manifest.json. Started again with the same config, a run resumes from its last checkpoint; "
        "a finished run is left as it is; a different config for the same directory is refused. Any "
        "TrainConfig key, including the nested 'agent' (feed) and 'allocation' (live) settings, can come "
        "from --config.",
    )
    add_config_option(p)
    p.add_argument("--algo", choices=list(ALL_ALGORITHMS), help="algorithm (default tscac)")
    p.add_argument("--data", metavar="DATASET", help="transition dataset version directory")
    p.add_argument("--out", metavar="RUN", help="run directory")
    p.add_argument("--steps", type=positive_int, help="training steps (default 3000)")
    p.add_argument("--batch-size", type=positive_int, help="transitions per step (default 512)")
    p.add_argument("--seed", type=non_negative_int, help="seed of initialisation and data order (default 0)")
    p.add_argument(
        "--workers",
        type=_addresses,
        metavar="HOST:PORT,...",
        help="train on several machines (MultiWorkerMirroredStrategy): every worker's address, in the same "
        "order on each; start this command on each with its --worker-index and the same other arguments, "
        "--out on storage they share (default: TF_CONFIG, else one worker)",
    )
    p.add_argument(
        "--worker-index",
        type=non_negative_int,
        default=0,
        help="this worker's place in --workers (0: the chief)",
    )
    p.set_defaults(handler=run)


def _addresses(value: str) -> list[str]:
    addresses = [a.strip() for a in value.split(",") if a.strip()]
    if not addresses or not all(a.rpartition(":")[2].isdigit() for a in addresses):
        raise argparse.ArgumentTypeError(f"should be HOST:PORT[,HOST:PORT...], but is {value!r}")
    return addresses


def run(args: argparse.Namespace) -> int:
    if args.workers and args.worker_index >= len(args.workers):
        raise ConfigError(
            f"--worker-index {args.worker_index} is not one of the {len(args.workers)} --workers"
        )
    with quiet_native_imports():  # TensorFlow only for this verb
        from recsys_rl.training.train import TF_CONFIG, TrainConfig, tf_config_for, train

    if args.workers:
        os.environ[TF_CONFIG] = tf_config_for(args.workers, args.worker_index)
    overrides = {k: getattr(args, k) for k in ("algo", "data", "out", "steps", "batch_size", "seed")}
    config = load_config(TrainConfig, args.config, overrides)
    require_dataset(config.data)
    result = train(config, progress_logger("train"))
    manifest = result.manifest
    if result.already_complete:
        status = "already complete, nothing to do"
    elif result.resumed_from_step:
        status = f"resumed from step {result.resumed_from_step}"
    else:
        status = "trained from scratch"
    print(f"run {result.run_dir}: {manifest['algo']}, {manifest['steps']} steps ({status})")
    print(
        f"  policy  {result.run_dir / manifest['policy']['path']} (version {manifest['policy']['version']})"
    )
    print(f"  dataset {manifest['dataset']['path']} (version {manifest['dataset']['version']})")
    metrics = " ".join(f"{name}={value:.6g}" for name, value in sorted(manifest["final_metrics"].items()))
    print(f"  final metrics: {metrics or 'none logged'}")
    return 0
