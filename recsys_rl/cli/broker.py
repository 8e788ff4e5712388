"""``recsys-rl broker start|stop|status``: a Kafka broker that stays up between commands
(``recsys_rl.kafka.persistent``, over the brokers of ``recsys_rl.kafka.broker``), which the other verbs
use when no --bootstrap-servers is given."""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass

from recsys_rl.cli.options import add_config_option
from recsys_rl.config import load_config
from recsys_rl.kafka.broker import BROKER_KINDS
from recsys_rl.kafka.persistent import BROKER_DIR_ENV, broker_dir, running_broker, start_broker, stop_broker

#: ``broker status`` when none runs: a script can test for a broker without parsing output.
EXIT_NOT_RUNNING = 3


def register(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser(
        "broker",
        help="start, stop or check a Kafka broker that stays up between commands",
        description="A broker in the background for the README's step-by-step path: simulate, "
        "build-transitions, serve and pipeline run use it when no --bootstrap-servers is given. "
        "The embedded broker (Tansu) keeps records in memory while it runs; Apache Kafka keeps them "
        "on disk in the broker directory, across restarts.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    where = argparse.ArgumentParser(add_help=False)
    add_config_option(where)
    where.add_argument(
        "--dir",
        metavar="DIR",
        help=f"broker directory: its record, log and data (env {BROKER_DIR_ENV}; default "
        "~/.local/state/recsys-rl/broker)",
    )
    a = actions.add_parser("start", parents=[where], help="start a broker in the background")
    a.add_argument(
        "--kind",
        choices=BROKER_KINDS,
        help="embedded: Tansu, pip-installed (default); local-kafka: Apache Kafka (make kafka-jars, Java)",
    )
    a.set_defaults(handler=_start)
    a = actions.add_parser("stop", parents=[where], help="stop the background broker")
    a.set_defaults(handler=_stop)
    a = actions.add_parser(
        "status", parents=[where], help=f"say whether a broker runs and where (exit {EXIT_NOT_RUNNING}: none)"
    )
    a.add_argument("--json", action="store_true", help="the broker's record as JSON")
    a.set_defaults(handler=_status)


@dataclass(frozen=True)
class BrokerSettings:
    """What a broker --config file may hold."""

    kind: str = "embedded"
    dir: str | None = None  # None: $RECSYS_RL_BROKER_DIR, else the user's state directory

    def __post_init__(self) -> None:
        if self.kind not in BROKER_KINDS:
            raise ValueError(f"kind should be one of {list(BROKER_KINDS)}, but is {self.kind!r}")


def _settings(args: argparse.Namespace) -> BrokerSettings:
    return load_config(BrokerSettings, args.config, {"kind": getattr(args, "kind", None), "dir": args.dir})


def _start(args: argparse.Namespace) -> int:
    settings = _settings(args)
    record = start_broker(settings.kind, broker_dir(settings.dir))
    print(f"{record.kind} broker running at {record.bootstrap_servers} (pid {record.pid})")
    found = (
        "by default"
        if broker_dir() == broker_dir(settings.dir)
        else f"with {BROKER_DIR_ENV}={record.directory}"
    )
    print(f"  log {record.log}; the other commands use it {found}; stop it with: recsys-rl broker stop")
    return 0


def _stop(args: argparse.Namespace) -> int:
    record = stop_broker(broker_dir(_settings(args).dir))
    print(
        "no broker was running"
        if record is None
        else f"stopped the {record.kind} broker at {record.bootstrap_servers}"
    )
    return 0


def _status(args: argparse.Namespace) -> int:
    record = running_broker(broker_dir(_settings(args).dir))
    if args.json:
        print(json.dumps(None if record is None else dataclasses.asdict(record)))
    elif record is None:
        print("no broker running (start one with: recsys-rl broker start)")
    else:
        where = f"{record.bootstrap_servers} (pid {record.pid}, since {record.started_at})"
        print(f"{record.kind} broker running at {where}")
    return EXIT_NOT_RUNNING if record is None else 0
