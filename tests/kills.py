"""Crashes for fault-injection tests: a step of build-transitions that dies partway."""

from __future__ import annotations

from recsys_rl.kafka.producer import EventProducer


class Killed(RuntimeError):
    """What a killed run leaves: raised where the process would have died."""


def die_while_publishing(monkeypatch, dead_letter_topic: str, after: int) -> None:
    """The next build dies once ``after`` dead letters went out (the ones before are delivered: the
    producer flushes on the way out, as acknowledged sends survive a kill)."""
    real = EventProducer.send
    sent = []

    def send(self, topic, key, value, timestamp_ms=None):
        if topic == dead_letter_topic and len(sent) == after:
            raise Killed("killed while publishing dead letters")
        if topic == dead_letter_topic:
            sent.append(key)
        real(self, topic, key, value, timestamp_ms)

    monkeypatch.setattr(EventProducer, "send", send)
