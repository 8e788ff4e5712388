"""Kafka plumbing: brokers to run or reach, topic set-up, batched producing, bounded reading."""

from recsys_rl.kafka.broker import (
    BROKER_KINDS,
    Broker,
    EmbeddedBroker,
    ExternalBroker,
    LocalKafkaBroker,
    open_broker,
)
from recsys_rl.kafka.connection import parse_bootstrap_servers, wait_until_reachable
from recsys_rl.kafka.setup_errors import (
    BrokerConfigError,
    BrokerUnavailable,
    DeliveryError,
    KafkaSetupError,
    ReadError,
    TopicSetupError,
)

__all__ = [
    "BROKER_KINDS",
    "Broker",
    "BrokerConfigError",
    "BrokerUnavailable",
    "DeliveryError",
    "EmbeddedBroker",
    "ExternalBroker",
    "KafkaSetupError",
    "LocalKafkaBroker",
    "ReadError",
    "TopicSetupError",
    "open_broker",
    "parse_bootstrap_servers",
    "wait_until_reachable",
]
