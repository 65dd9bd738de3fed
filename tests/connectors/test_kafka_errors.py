"""connectors.kafka_errors: a librdkafka error as one sentence naming the topic, the broker and what to do."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from connectors.kafka_errors import kafka_error_text

BOOTSTRAP = "127.0.0.1:9092"


@pytest.mark.parametrize(("error", "topic", "sentence"), [
    (KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), "orders",
     "topic 'orders' does not exist on 127.0.0.1:9092: create it (kafka-topics.sh --create, or epochline run "
     "--create-topics), or correct the topic name"),
    (KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), "orders",
     "topic 'orders': Kafka at 127.0.0.1:9092 refused the request, not authorized (TOPIC_AUTHORIZATION_FAILED): "
     "grant the principal the ACL it needs"),
    (KafkaError(KafkaError._TRANSPORT, "Connect to ipv4#127.0.0.1:9092 failed: Connection refused"), None,
     "cannot reach Kafka at 127.0.0.1:9092: connection refused (Connect to ipv4#127.0.0.1:9092 failed: "
     "Connection refused)"),
    (KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION, "Broker: Not leader for partition"), "orders",
     "topic 'orders': Kafka at 127.0.0.1:9092 answered NOT_LEADER_FOR_PARTITION: Broker: Not leader for partition"),
])
def test_an_error_reads_as_a_sentence_naming_topic_broker_and_what_to_do(
        error: KafkaError, topic: str | None, sentence: str) -> None:
    assert kafka_error_text(error, BOOTSTRAP, topic) == sentence


def test_an_exception_is_read_for_the_error_it_carries_never_printed_as_its_repr() -> None:
    wrapped = KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))

    text = kafka_error_text(wrapped, BOOTSTRAP, "orders")

    assert text.startswith("topic 'orders' does not exist on 127.0.0.1:9092")
    assert "KafkaError{" not in text and "KafkaError{" in str(wrapped)


def test_without_a_broker_or_topic_the_sentence_leaves_them_out_and_other_exceptions_keep_their_message() -> None:
    assert kafka_error_text(KafkaError(KafkaError.REQUEST_TIMED_OUT, "Broker: Request timed out")) == \
        "Kafka answered REQUEST_TIMED_OUT: Broker: Request timed out"
    assert kafka_error_text(BufferError("Local: Queue full")) == "Local: Queue full"
