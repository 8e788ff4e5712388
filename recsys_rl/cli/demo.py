"""``recsys-rl demo``: the closed loop on the embedded default (``recsys_rl.loop.demo``)."""

from __future__ import annotations

import argparse

from recsys_rl.cli.options import add_bootstrap_option, add_config_option, non_negative_int, positive_int
from recsys_rl.config import load_config
from recsys_rl.logs import progress_logger, quiet_native_imports


def register(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser(
        "demo",
        help="the whole closed loop on this machine: simulate, train, gate, serve, learn again",
        description="Simulate a day of logged traffic into Kafka, run the training pipeline on it (ingest, "
        "Feast features, TSCAC training, the OPE gate, registry), start the gRPC server on the result, "
        "drive a second simulated day through the live endpoint over a socket, and run the pipeline "
        "again on the server's decision logs and the users' feedback. Without --bootstrap-servers it "
        "starts the pip-only embedded Kafka broker. Ends with a summary; everything goes under --out.",
    )
    add_config_option(p)
    p.add_argument(
        "--out",
        metavar="DIR",
        help="output directory (default demo-output; a previous demo there is replaced)",
    )
    p.add_argument("--users", type=positive_int, help="simulated users (default 1500)")
    p.add_argument("--seed", type=non_negative_int, help="seed of the world and its traffic (default 0)")
    p.add_argument("--train-steps", type=positive_int, help="training steps per pipeline run (default 800)")
    p.add_argument(
        "--served-days",
        type=positive_int,
        help="days the live server decides after day 0, each followed by a pipeline run (default 1)",
    )
    add_bootstrap_option(p, "Kafka cluster to use instead of the embedded broker")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    with quiet_native_imports():
        from recsys_rl.loop.demo import DemoConfig, run_demo

    keys = ("out", "users", "seed", "train_steps", "served_days", "bootstrap_servers")
    config = load_config(DemoConfig, args.config, {k: getattr(args, k) for k in keys})
    summary = run_demo(config, lambda line: print(line, flush=True), progress_logger("demo"))
    print(summary.text())
    return 0
