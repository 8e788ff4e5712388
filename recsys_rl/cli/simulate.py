"""``recsys-rl simulate``: argument parsing and output of the simulate verb.

The work is done by ``recsys_rl.sim.simulate``.
"""

from __future__ import annotations

import argparse
import time

from recsys_rl.cli.options import add_bootstrap_option, add_config_option, non_negative_int, positive_int
from recsys_rl.config import load_config
from recsys_rl.kafka import open_broker
from recsys_rl.logs import get_logger, log_event, new_run_id
from recsys_rl.sim.simulate import BROKER_KINDS, SimulateConfig, SimulationReport, run_simulation


def register(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser(
        "simulate",
        help="write simulated user traffic (decisions and feedback) to Kafka",
        description="Simulate users of the short-video app under the behaviour policies and write their "
        "decision records and feedback events to Kafka. Without --bootstrap-servers it starts the "
        "embedded broker, which keeps the records in memory until the command ends.",
    )
    add_config_option(p)
    p.add_argument("--users", type=positive_int, help="users in the simulated world (default 1000)")
    p.add_argument("--days", type=positive_int, help="days to simulate (default 1)")
    p.add_argument("--seed", type=non_negative_int, help="seed of world and traffic (default 0)")
    add_bootstrap_option(p, "Kafka cluster to write to; default: start a broker")
    p.add_argument("--broker", choices=BROKER_KINDS, help="broker to start without --bootstrap-servers")
    p.add_argument("--partitions", type=positive_int, help="partitions per created topic (default 4)")
    p.add_argument("--decisions-topic", help="topic for decision records (default recsys.decisions)")
    p.add_argument("--feedback-topic", help="topic for feedback events (default recsys.feedback)")
    p.add_argument(
        "--user-table",
        metavar="DIR",
        help="also write the simulated platform's user table there (each account's activity group), "
        "for `recsys-rl features materialize --user-table`",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    overrides = {
        k: getattr(args, k)
        for k in (
            "users",
            "days",
            "seed",
            "bootstrap_servers",
            "broker",
            "partitions",
            "decisions_topic",
            "feedback_topic",
            "user_table",
        )
    }
    config = load_config(SimulateConfig, args.config, overrides)
    logger = get_logger("simulate")
    run_id = new_run_id()
    started = time.perf_counter()

    def on_day(log, report: SimulationReport) -> None:
        log_event(
            logger,
            "day_written",
            run_id=run_id,
            day=log.day + 1,
            of=config.days,
            sessions=log.sessions,
            requests=log.feed.request.size,
            records=sum(report.written.values()),
        )

    with open_broker(config.bootstrap_servers, config.broker) as broker:
        log_event(
            logger,
            "broker_ready",
            run_id=run_id,
            bootstrap_servers=broker.bootstrap_servers,
            kind=config.broker if config.bootstrap_servers is None else "external",
        )
        report = run_simulation(config, broker.bootstrap_servers, on_day)
        print(
            f"simulated {report.days} day(s): {config.users} users, {report.sessions} sessions, "
            f"{report.requests} feed requests in {time.perf_counter() - started:.1f} s"
        )
        print(f"wrote to Kafka at {broker.bootstrap_servers}:")
        for topic, written in report.written.items():
            print(f"  {topic:<24} {written:>9} records written, topic end offset {report.end_offsets[topic]}")
        if config.bootstrap_servers is None:
            print("the started broker keeps records in memory only; it stops now with this command")
    return 0
