"""``recsys-rl train``: argument parsing and output of one training run (``recsys_rl.training.train``)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from recsys_rl.cli.options import (
    add_config_option,
    non_negative_int,
    positive_int,
    require_dataset,
)
from recsys_rl.config import ConfigError, load_config
from recsys_rl.logs import progress_logger, quiet_native_imports
from recsys_rl.training.agents.algorithms import ALL_ALGORITHMS, USER_AUTHOR, surface_of


def register(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser(
        "train",
        help="train a feed, live-allocation or user-author agent on a transition dataset into a run "
        "directory",
        description="Train a feed-ranking agent, a live-allocation agent (sl-mgac and its variants) or a "
        "user-author value (ua-mtcl, ua-independent; the dataset needs its user_author surface, from "
        "build-transitions --user-author-surface) offline on one transition dataset (the algorithm picks "
        "the surface; a version directory "
        "with manifest.json) and export its policy. The run directory holds the resolved config, the "
        "input manifest, metrics (JSON lines and TensorBoard), checkpoints, the exported policy and, "
        "last, manifest.json. Started again with the same config, a run resumes from its last checkpoint; "
        "a finished run is left as it is; a different config for the same directory is refused. Any "
        "TrainConfig key, including the nested 'agent' (feed), 'allocation' (live) and 'pair' (user-author) "
        "settings, can come from --config.",
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
    if (surface := surface_of(manifest["algo"])) != USER_AUTHOR:  # a pair value takes no logged decision
        _warn_if_thin_support(result.run_dir / manifest["policy"]["path"], config.data, surface)
    return 0


def _warn_if_thin_support(policy_dir: Path, data: str, surface: str) -> None:
    """Say, at the end of training, when the training data covers the new policy too thinly for the
    default gate (the README's first training run did: ESS 6 of 4,126 decisions), with the settings
    that pull it back; the gate would refuse it on this data for that reason alone."""
    from recsys_rl.ope.evaluate import support_on_data
    from recsys_rl.ope.gate import SUPPORT_HINTS, GateConfig

    support, gate = support_on_data(policy_dir, data, surface), GateConfig(surface=surface)
    print(
        f"  support on its training data: effective sample size {support['ess']:,.0f} of "
        f"{support['count']:,} decisions, largest weight share {support['max_weight_share']:.4f}"
    )
    if support["ess"] < gate.min_ess or support["max_weight_share"] > gate.max_weight_share:
        print(
            f"recsys-rl train: warning: the default gate needs an effective sample size of "
            f"{gate.min_ess:,.0f} and a largest weight share of at most {gate.max_weight_share:.4f}, so it "
            f"would refuse this policy on this data; {SUPPORT_HINTS[surface].removeprefix('hint: ')}",
            file=sys.stderr,
        )
