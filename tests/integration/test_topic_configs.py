"""Topics the simulator creates keep their records: retention by time would delete simulated-past events."""

import uuid

import pytest
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType

from recsys_rl.sim.simulate import SimulateConfig, run_simulation

pytestmark = pytest.mark.integration


def test_simulate_creates_topics_without_time_retention(apache_kafka):
    suffix = uuid.uuid4().hex[:8]
    config = SimulateConfig(users=3, decisions_topic=f"dec-{suffix}", feedback_topic=f"fb-{suffix}")
    run_simulation(config, apache_kafka.bootstrap_servers)
    admin = KafkaAdminClient(bootstrap_servers=apache_kafka.bootstrap_servers)
    try:
        resources = [
            ConfigResource(ConfigResourceType.TOPIC, t)
            for t in (config.decisions_topic, config.feedback_topic)
        ]
        responses = admin.describe_configs(resources)
    finally:
        admin.close()
    topics = next(iter(responses.values()))  # {resource type: {topic: {key: {config data}}}}
    for topic in (config.decisions_topic, config.feedback_topic):
        entry = topics[topic]["retention.ms"]
        assert (entry["value"], entry["config_source"]) == ("-1", "DYNAMIC_TOPIC_CONFIG"), topic
