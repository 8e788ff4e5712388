"""``recsys-rl simulate``: write simulated days of decisions and feedback to Kafka.

Its command-line side is ``recsys_rl.cli.simulate``; this module does the work.

Until real traffic exists this is the project's data source: the pipelines, training and OPE read what
it writes exactly as they would read production topics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from recsys_rl import contracts
from recsys_rl.kafka.broker import BROKER_KINDS
from recsys_rl.kafka.producer import EventProducer
from recsys_rl.kafka.reader import high_watermarks
from recsys_rl.kafka.topics import TopicSpec, ensure_topics
from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.events import EventIds, decision_records, feedback_events, write_user_table
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.simulator import DayLog, Simulator


@dataclass(frozen=True)
class SimulateConfig:
    """Simulated traffic into Kafka, written by the behaviour policies (DESIGN 11)."""

    users: int = 1_000  # users in the world; traffic grows linearly with it
    days: int = 1  # days to simulate; later days depend on earlier satisfaction through returns
    seed: int = 0  # fixes world and traffic: the same seed writes the same records, byte for byte
    bootstrap_servers: str | None = None  # HOST:PORT[,...] of a Kafka cluster; None starts `broker`
    broker: str = "embedded"  # broker to start when no servers are given: embedded (Tansu) | local-kafka
    decisions_topic: str = "recsys.decisions"
    feedback_topic: str = "recsys.feedback"
    partitions: int = 4  # partitions of each topic it creates; records are keyed by user id
    # where to write the platform's user table of the simulated world (each account's activity group),
    # which the feature store needs beside the pipeline's aggregates; None: not written
    user_table: str | None = None

    def __post_init__(self) -> None:
        for name in ("users", "days", "partitions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} should be at least 1, but is {getattr(self, name)}")
        if self.seed < 0:
            raise ValueError(f"seed should be non-negative, but is {self.seed}")
        if self.broker not in BROKER_KINDS:
            raise ValueError(f"broker should be one of {list(BROKER_KINDS)}, but is {self.broker!r}")
        if self.decisions_topic == self.feedback_topic:
            raise ValueError(
                f"decisions_topic and feedback_topic should differ, but both are {self.decisions_topic!r}"
            )


@dataclass
class SimulationReport:
    days: int = 0
    sessions: int = 0
    requests: int = 0
    written: dict[str, int] = field(default_factory=dict)  # records this run produced, per topic
    end_offsets: dict[str, int] = field(default_factory=dict)  # sum of partition high watermarks, per topic


def simulated_days(config: SimulateConfig) -> tuple[Simulator, Callable[[], DayLog]]:
    """The simulator of a run and a function that advances it by one day with the behaviour policies."""
    sim = Simulator(SimConfig(n_users=config.users), config.seed)
    feed_policy, allocation_policy = behaviour_feed_policy(), behaviour_allocation_policy()
    return sim, lambda: sim.run_day(feed_policy, allocation_policy)


def day_messages(
    config: SimulateConfig, sim: Simulator, log: DayLog
) -> Iterator[tuple[str, bytes, bytes, int]]:
    """(topic, key, value, timestamp ms) of every record a simulated day produces, in production order."""
    ids = EventIds.for_seed(config.seed)
    versions = (behaviour_feed_policy().version, behaviour_allocation_policy().version)
    outputs = (
        (config.decisions_topic, decision_records(log, sim.world, ids, versions)),
        (config.feedback_topic, feedback_events(log, sim.world, ids)),
    )
    for topic, messages in outputs:
        for message in messages:
            yield topic, message.user_id.encode(), contracts.encode(message), message.event_time_ms


def run_simulation(
    config: SimulateConfig,
    bootstrap_servers: str,
    on_day: Callable[[DayLog, SimulationReport], None] | None = None,
    simulation: tuple[Simulator, Callable[[], DayLog]] | None = None,
) -> SimulationReport:
    """Simulate ``config.days`` days and produce them to the two topics at ``bootstrap_servers``.

    ``simulation``: the simulator to advance (from ``simulated_days``), for a caller that goes on with
    the same world and users afterwards; by default a fresh one.
    """
    # Simulated events carry simulated (past) timestamps, which time-based retention would delete at
    # its first check; topics this command creates keep their records until someone deletes them.
    keep = (("retention.ms", "-1"),)
    ensure_topics(
        bootstrap_servers,
        [
            TopicSpec(topic, config.partitions, configs=keep)
            for topic in (config.decisions_topic, config.feedback_topic)
        ],
    )
    sim, next_day = simulation if simulation is not None else simulated_days(config)
    if config.user_table is not None:  # as of the first day's start: the accounts exist before they act
        write_user_table(
            sim.world, EventIds.for_seed(config.seed), config.user_table, sim.config.start_time_ms
        )
    report = SimulationReport(written={config.decisions_topic: 0, config.feedback_topic: 0})
    with EventProducer(bootstrap_servers) as producer:
        for _ in range(config.days):
            log = next_day()
            for topic, key, value, timestamp_ms in day_messages(config, sim, log):
                producer.send(topic, key, value, timestamp_ms)
                report.written[topic] += 1
            producer.flush()
            report.days += 1
            report.sessions += log.sessions
            report.requests += int(log.feed.request.size)
            if on_day is not None:
                on_day(log, report)
    for topic in (config.decisions_topic, config.feedback_topic):
        report.end_offsets[topic] = sum(high_watermarks(bootstrap_servers, topic).values())
    return report
