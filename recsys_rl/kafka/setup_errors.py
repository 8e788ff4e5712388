"""The errors this package raises for people rather than for programmers.

Every one of them derives from `KafkaSetupError`, so a command-line entry point can catch that single
class and print the message as one line instead of a traceback: the messages are written to be read
on their own (they name the address, topic or file involved and, where there is one, the fix).
"""

from __future__ import annotations

from recsys_rl.errors import OperationalError


class KafkaSetupError(OperationalError):
    """Base class: something about the Kafka set-up, not the code, needs the user's attention."""


class BrokerConfigError(KafkaSetupError, ValueError):
    """A broker was described wrongly (bad HOST:PORT list, unknown broker kind).

    It is also a `ValueError` because that is what a caller validating arguments expects to catch.
    """


class BrokerUnavailable(KafkaSetupError):
    """No broker answered a metadata request at the given address before the deadline."""


class TopicSetupError(KafkaSetupError):
    """A topic could not be created, or exists with a layout that differs from the one asked for."""


class DeliveryError(KafkaSetupError):
    """Records handed to the producer were not acknowledged by the broker."""


class ReadError(KafkaSetupError):
    """A bounded read could not finish (missing topic, no progress before the deadline)."""
