"""What a testing helper raises when it cannot do what it was asked."""

from __future__ import annotations


class KafkaTestError(RuntimeError):
    """A testing helper could not do what it was asked; the message names topic, broker or image."""


class ContainerStartFailed(KafkaTestError):
    """The Kafka container could not be created, or its broker did not accept transactions in time."""


class ProduceFailed(KafkaTestError):
    """Some rows were not acknowledged by the broker."""


class ReadFailed(KafkaTestError):
    """A topic could not be read to its end offsets in time, or a record did not decode."""


class WorkerProcessFailed(KafkaTestError):
    """A worker started for a test exited, did not answer its API in time, or did not stop; the message
    carries the tail of its log."""
