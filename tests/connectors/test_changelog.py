"""Changelog topics against the real broker: the last committed state record of a partition is what restores
it, whatever aborted epochs and transaction markers follow it; ensure_topic creates changelog topics as
compacted topics and refuses one that does not fit."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
)
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._resource import ResourceType

from connectors.admin import (
    KafkaUnreachable,
    TopicMismatch,
    TopicNotAuthorized,
    create_topic,
    ensure_topic,
    partition_offsets,
    partitions_of,
)
from connectors.changelog import (
    CHECKPOINT_HEADER,
    INSTANCE_HEADER,
    STATE_KEY,
    ChangelogError,
    ChangelogReader,
    ChangelogRecordInvalid,
    ChangelogTimeout,
    changelog_topic,
    repartition_topic,
    state_record,
)
from engine.ports import free_port
from engine.testing.auth import ScramKafka, grant
from engine.testing.topics import create_unique_topic

TIMEOUT = 30.0
LARGE_STATE = 1024 * 1024


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def changelog(bootstrap: str, partitions: int = 1, **config: str) -> str:
    topic = changelog_topic(unique("changelog-test"), "window")
    ensure_topic(bootstrap, topic, partitions, compacted=True, timeout=TIMEOUT, config=config or None)
    return topic


class StateWriter:
    """The engine's side, as a test plays it: each epoch one state record per changed partition, in one
    transaction, committed or aborted."""

    def __init__(self, bootstrap: str, topic: str, **config: str | int) -> None:
        self.topic = topic
        self.failures: list[str] = []
        self.producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("changelog-test"),
                                  "log_level": 0, **config})
        self.producer.init_transactions(TIMEOUT)

    def _delivered(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.failures.append(f"partition {message.partition()}: {error}")

    def epoch(self, states: dict[int, bytes | None], checkpoint_id: int, instance: str = "instance-a", *,
              commit: bool = True, extra: int = 0) -> None:
        """One transaction: the state of each partition (None: a tombstone) and ``extra`` more records each."""
        self.producer.begin_transaction()
        for partition, state in states.items():
            for _ in range(extra):
                self.producer.produce(self.topic, b"aborted-padding", STATE_KEY, partition)
            if state is None:
                self.producer.produce(self.topic, None, STATE_KEY, partition, on_delivery=self._delivered)
            else:
                key, value, headers = state_record(state, checkpoint_id, instance)
                self.producer.produce(self.topic, value, key, partition, headers=headers,
                                      on_delivery=self._delivered)
        assert self.producer.flush(TIMEOUT) == 0
        (self.producer.commit_transaction if commit else self.producer.abort_transaction)(TIMEOUT)
        assert not self.failures


@pytest.fixture
def reader(kafka_bootstrap: str) -> Iterator[ChangelogReader]:
    with ChangelogReader(kafka_bootstrap, {}, timeout=TIMEOUT) as changelog_reader:
        yield changelog_reader


def test_topic_names_follow_connector_and_operator() -> None:
    assert changelog_topic("orders-eu", "per-minute") == "orders-eu-per-minute-changelog"
    assert repartition_topic("orders-eu") == "orders-eu-repartition"
    with pytest.raises(ValueError, match="operator"):
        changelog_topic("orders", "")


def test_a_state_record_has_the_state_key_and_names_checkpoint_and_instance() -> None:
    record = state_record(b"snapshot", 42, "worker-1")
    assert record == (STATE_KEY, b"snapshot", [(CHECKPOINT_HEADER, b"42"), (INSTANCE_HEADER, b"worker-1")])
    with pytest.raises(ValueError, match="checkpoint id"):
        state_record(b"snapshot", -1, "worker-1")


def test_latest_is_the_last_committed_record_not_a_later_aborted_one_and_markers_end_the_partition(
        kafka_bootstrap: str, reader: ChangelogReader) -> None:
    topic = changelog(kafka_bootstrap)
    writer = StateWriter(kafka_bootstrap, topic)
    writer.epoch({0: b"state-1"}, 1)
    writer.epoch({0: b"state-2"}, 2)
    writer.epoch({0: b"state-3-aborted"}, 3, commit=False)

    read = reader.read(topic, 0)

    assert read.entry is not None
    assert (read.entry.value, read.entry.checkpoint_id, read.entry.offset) == (b"state-2", 2, 2)
    # offsets: 0 state-1, 1 commit marker, 2 state-2, 3 commit marker, 4 aborted, 5 abort marker
    assert (read.log_start, read.end) == (0, 6)
    assert read.records_read == 1 and read.passes > 1


def test_a_partition_that_ends_in_its_commit_marker_restores_its_last_record(
        kafka_bootstrap: str, reader: ChangelogReader) -> None:
    topic = changelog(kafka_bootstrap)
    StateWriter(kafka_bootstrap, topic).epoch({0: b"only"}, 7)

    read = reader.read(topic, 0)

    assert read.entry is not None and (read.entry.value, read.entry.offset) == (b"only", 0)
    assert read.end == 2, "the record's commit marker occupies offset 1: the end is not last offset + 1"
    assert read.passes == 1 and read.records_read == 1


def test_more_aborted_records_than_the_initial_lookback_are_skipped_by_doubling_it(
        kafka_bootstrap: str, reader: ChangelogReader) -> None:
    topic = changelog(kafka_bootstrap)
    writer = StateWriter(kafka_bootstrap, topic)
    writer.epoch({0: b"committed"}, 1)
    for checkpoint_id in (2, 3, 4):
        writer.epoch({0: b"aborted"}, checkpoint_id, commit=False, extra=20)

    read = reader.read(topic, 0)

    assert read.entry is not None and (read.entry.value, read.entry.checkpoint_id) == (b"committed", 1)
    assert read.end == 2 + 3 * 22
    assert read.passes > 3, "initial lookback 2 cannot reach offset 0 of 68 without doubling"


def test_an_empty_partition_has_no_state(kafka_bootstrap: str, reader: ChangelogReader) -> None:
    topic = changelog(kafka_bootstrap)

    read = reader.read(topic, 0)

    assert read.entry is None and read.passes == 0


def test_a_partition_of_only_aborted_records_has_no_state(kafka_bootstrap: str, reader: ChangelogReader) -> None:
    topic = changelog(kafka_bootstrap)
    writer = StateWriter(kafka_bootstrap, topic)
    writer.epoch({0: b"x"}, 1, commit=False, extra=4)
    writer.epoch({0: b"y"}, 2, commit=False, extra=2)

    read = reader.read(topic, 0)

    assert read.entry is None
    assert read.end == 10 and read.records_read == 0


def test_a_tombstone_as_last_committed_record_means_no_state_even_with_older_records(
        kafka_bootstrap: str, reader: ChangelogReader) -> None:
    topic = changelog(kafka_bootstrap)
    writer = StateWriter(kafka_bootstrap, topic)
    writer.epoch({0: b"old"}, 1)
    writer.epoch({0: None}, 2)

    assert reader.latest(topic, 0) is None


def test_checkpoint_id_and_instance_round_trip_through_the_headers(
        kafka_bootstrap: str, reader: ChangelogReader) -> None:
    topic = changelog(kafka_bootstrap)
    StateWriter(kafka_bootstrap, topic).epoch({0: b"\x00binary\xff"}, 123456789012, instance="wörker-7/b")

    entry = reader.latest(topic, 0)

    assert entry is not None
    assert (entry.value, entry.checkpoint_id, entry.instance) == (b"\x00binary\xff", 123456789012, "wörker-7/b")


def test_a_last_record_without_the_headers_is_refused_naming_where_it_is(
        kafka_bootstrap: str, reader: ChangelogReader) -> None:
    topic = changelog(kafka_bootstrap)
    writer = StateWriter(kafka_bootstrap, topic)
    writer.producer.begin_transaction()
    writer.producer.produce(topic, b"not a state record", STATE_KEY, 0)  # no headers
    writer.producer.commit_transaction(TIMEOUT)

    with pytest.raises(ChangelogRecordInvalid, match=rf"{topic}.*partition 0.*offset 0"):
        reader.latest(topic, 0)


def test_latest_of_partition_1_is_not_affected_by_records_of_partition_0(
        kafka_bootstrap: str, reader: ChangelogReader) -> None:
    topic = changelog(kafka_bootstrap, partitions=2)
    writer = StateWriter(kafka_bootstrap, topic)
    writer.epoch({0: b"p0-state-1", 1: b"p1-state-1"}, 1)
    writer.epoch({0: b"p0-state-2"}, 2)  # partition 1 unchanged: no record there
    writer.epoch({0: b"p0-state-3"}, 3, commit=False)

    p0, p1 = reader.latest(topic, 0), reader.latest(topic, 1)

    assert p0 is not None and (p0.value, p0.checkpoint_id) == (b"p0-state-2", 2)
    assert p1 is not None and (p1.value, p1.checkpoint_id, p1.offset) == (b"p1-state-1", 1, 0)


def test_one_reader_restores_many_partitions_one_after_the_other(
        kafka_bootstrap: str, reader: ChangelogReader) -> None:
    topic = changelog(kafka_bootstrap, partitions=3)
    writer = StateWriter(kafka_bootstrap, topic)
    writer.epoch({partition: f"p{partition}".encode() for partition in range(3)}, 1)
    writer.epoch({2: b"p2-aborted"}, 2, commit=False, extra=10)

    values = [entry.value if (entry := reader.latest(topic, partition)) else None
              for partition in (2, 0, 1, 2)]

    assert values == [b"p2", b"p0", b"p1", b"p2"]


def test_a_commit_whose_markers_are_not_written_yet_is_waited_for_not_missed(
        kafka_bootstrap: str, reader: ChangelogReader) -> None:
    topic = changelog(kafka_bootstrap)
    writer = StateWriter(kafka_bootstrap, topic)
    writer.epoch({0: b"state-1"}, 1)
    writer.producer.begin_transaction()
    key, value, headers = state_record(b"state-2", 2, "instance-a")
    writer.producer.produce(topic, value, key, 0, headers=headers)
    assert writer.producer.flush(TIMEOUT) == 0
    committer = threading.Timer(1.0, writer.producer.commit_transaction, args=(TIMEOUT,))
    committer.start()
    try:
        read = reader.read(topic, 0)
    finally:
        committer.join(TIMEOUT)

    assert read.entry is not None and read.entry.checkpoint_id == 2
    assert read.waited >= 0.5


def test_a_transaction_left_open_ends_the_read_at_the_timeout_naming_both_offsets(kafka_bootstrap: str) -> None:
    topic = changelog(kafka_bootstrap)
    writer = StateWriter(kafka_bootstrap, topic)
    writer.epoch({0: b"state-1"}, 1)
    with ChangelogReader(kafka_bootstrap, {}, timeout=2.0) as impatient:
        # Connected first (both of its consumers), so that the 2 s go to the open transaction, not to a cold
        # start on a loaded machine, which alone may take them and end the read at "offsets not available".
        assert impatient.read(topic, 0).waited == 0.0
        writer.producer.begin_transaction()
        writer.producer.produce(topic, b"open", STATE_KEY, 0)
        assert writer.producer.flush(TIMEOUT) == 0
        started = time.monotonic()
        try:
            expected = rf"{topic}' partition 0 .*transaction is still open.*offset 2, high watermark 3"
            with pytest.raises(ChangelogTimeout, match=expected):
                impatient.latest(topic, 0)
        finally:
            writer.producer.abort_transaction(TIMEOUT)
        assert time.monotonic() - started < 10


def test_a_1_mib_state_is_restored_by_reading_only_the_last_one(
        kafka_bootstrap: str, reader: ChangelogReader, capsys: pytest.CaptureFixture[str]) -> None:
    topic = changelog(kafka_bootstrap, **{"max.message.bytes": str(4 * LARGE_STATE)})
    writer = StateWriter(kafka_bootstrap, topic, **{"message.max.bytes": 4 * LARGE_STATE})
    states = [bytes([n]) * LARGE_STATE for n in range(5)]
    for checkpoint_id, state in enumerate(states, start=1):
        writer.epoch({0: state}, checkpoint_id)

    read = reader.read(topic, 0)

    assert read.entry is not None and read.entry.value == states[-1] and read.entry.checkpoint_id == 5
    assert read.records_read == 1 and LARGE_STATE <= read.bytes_read < LARGE_STATE + 100
    assert read.seconds < 10 and read.passes == 1
    with capsys.disabled():
        print(f"\nrestore of a 1 MiB state record: {read.seconds * 1000:.1f} ms, {read.bytes_read} bytes, "
              f"{read.passes} pass(es)")


def test_a_missing_changelog_topic_is_an_error_at_once_not_a_timeout(
        kafka_bootstrap: str, reader: ChangelogReader) -> None:
    topic = unique("changelog-missing")
    started = time.monotonic()

    with pytest.raises(ChangelogError, match=rf"{topic}.*partition 0.*{kafka_bootstrap}") as raised:
        reader.latest(topic, 0)

    assert not isinstance(raised.value, ChangelogTimeout)
    assert time.monotonic() - started < TIMEOUT


def test_an_unreachable_broker_times_out_naming_topic_partition_and_bootstrap() -> None:
    bootstrap = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    with ChangelogReader(bootstrap, {}, timeout=2.0) as unreachable, \
            pytest.raises(ChangelogTimeout, match=rf"'some-changelog' partition 3 on Kafka at {bootstrap}"):
        unreachable.latest("some-changelog", 3)
    assert time.monotonic() - started < 10


def _cleanup_policy(bootstrap: str, topic: str) -> str | None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    [future] = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
    return future.result(TIMEOUT)["cleanup.policy"].value


def test_ensure_topic_creates_a_compacted_topic_with_the_partitions_asked_for_and_is_idempotent(
        kafka_bootstrap: str) -> None:
    topic = changelog_topic(unique("ensure"), "window")

    assert ensure_topic(kafka_bootstrap, topic, 3, {}, compacted=True, timeout=TIMEOUT) is True
    assert ensure_topic(kafka_bootstrap, topic, 3, {}, compacted=True, timeout=TIMEOUT) is False

    assert partitions_of(kafka_bootstrap, topic, TIMEOUT) == [0, 1, 2]
    assert _cleanup_policy(kafka_bootstrap, topic) == "compact"


def test_ensure_topic_creates_a_delete_policy_topic_when_not_compacted(kafka_bootstrap: str) -> None:
    topic = repartition_topic(unique("ensure"))

    assert ensure_topic(kafka_bootstrap, topic, 2, {}, compacted=False, timeout=TIMEOUT) is True

    assert _cleanup_policy(kafka_bootstrap, topic) == "delete"
    assert partition_offsets(kafka_bootstrap, topic, TIMEOUT) == {0: (0, 0), 1: (0, 0)}


def test_ensure_topic_refuses_an_existing_topic_with_another_partition_count_naming_both(
        kafka_bootstrap: str) -> None:
    topic = changelog_topic(unique("ensure"), "window")
    ensure_topic(kafka_bootstrap, topic, 2, {}, compacted=True, timeout=TIMEOUT)

    with pytest.raises(TopicMismatch, match=rf"{topic}.* has 2 partitions, 4 are required"):
        ensure_topic(kafka_bootstrap, topic, 4, {}, compacted=True, timeout=TIMEOUT)


def test_ensure_topic_refuses_an_existing_topic_whose_cleanup_policy_would_lose_state(kafka_bootstrap: str) -> None:
    topic = create_unique_topic(kafka_bootstrap, "ensure-delete-policy", partitions=2)

    with pytest.raises(TopicMismatch, match=rf"{topic}.*cleanup.policy=delete, compact is required"):
        ensure_topic(kafka_bootstrap, topic, 2, {}, compacted=True, timeout=TIMEOUT)


def test_ensure_topic_refuses_compaction_for_a_topic_that_must_keep_every_row(kafka_bootstrap: str) -> None:
    topic = unique("ensure-compacted")
    create_topic(kafka_bootstrap, topic, 1, {"cleanup.policy": "compact"})

    with pytest.raises(TopicMismatch, match=rf"{topic}.*cleanup.policy=compact, delete is required"):
        ensure_topic(kafka_bootstrap, topic, 1, {}, compacted=False, timeout=TIMEOUT)



def test_ensure_topic_on_an_unreachable_broker_fails_within_its_timeout_naming_the_address() -> None:
    bootstrap = f"127.0.0.1:{free_port()}"
    started = time.monotonic()

    with pytest.raises(KafkaUnreachable, match=rf"'some-changelog'.*Kafka at {bootstrap}"):
        ensure_topic(bootstrap, "some-changelog", 1, {}, compacted=True, timeout=2.0)

    assert time.monotonic() - started < 10

@pytest.mark.auth
def test_ensure_topic_without_create_permission_names_the_topic_and_how_to_create_it(
        kafka_scram: ScramKafka) -> None:
    topic = changelog_topic(unique("auth"), "window")
    user = kafka_scram.create_principal(unique("no-create"), read_topics=[topic])

    with pytest.raises(TopicNotAuthorized, match=rf"may not create topic '{topic}'.*3 partitions, "
                                                 r"cleanup.policy=compact"):
        ensure_topic(kafka_scram.bootstrap, topic, 3, user.settings, compacted=True, timeout=TIMEOUT)


@pytest.mark.auth
def test_a_principal_that_may_create_but_not_describe_a_topic_is_told_so_at_once_before_and_after_it_exists(
        kafka_scram: ScramKafka) -> None:
    topic = changelog_topic(unique("auth"), "window")
    user = kafka_scram.create_principal(unique("create-only"))
    grant(kafka_scram.admin_config, [AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, user.principal,
                                                "*", AclOperation.CREATE, AclPermissionType.ALLOW)])

    for attempt in ("creates it", "finds it made"):
        started = time.monotonic()
        with pytest.raises(TopicNotAuthorized, match=rf"may not describe topic '{topic}'.*whether it has "
                                                     r"2 partitions, cleanup.policy=compact.*grant DESCRIBE"):
            ensure_topic(kafka_scram.bootstrap, topic, 2, user.settings, compacted=True, timeout=TIMEOUT)
        waited = time.monotonic() - started
        assert waited < TIMEOUT / 3, f"the call that {attempt} waited {waited:.1f}s, as for a topic not yet made"
    assert partitions_of(kafka_scram.bootstrap, topic, client_config=kafka_scram.admin_config) == [0, 1]


@pytest.mark.auth
def test_a_principal_that_may_only_read_an_existing_changelog_ensures_and_restores_it_without_a_group_acl(
        kafka_scram: ScramKafka) -> None:
    topic = changelog_topic(unique("auth"), "window")
    admin = kafka_scram.admin.settings
    ensure_topic(kafka_scram.bootstrap, topic, 1, admin, compacted=True, timeout=TIMEOUT)
    StateWriter(kafka_scram.bootstrap, topic, **admin).epoch({0: b"state"}, 3)
    user = kafka_scram.create_principal(unique("reader"), read_topics=[topic])

    assert ensure_topic(kafka_scram.bootstrap, topic, 1, user.settings, compacted=True, timeout=TIMEOUT) is False
    with ChangelogReader(kafka_scram.bootstrap, user.settings, timeout=TIMEOUT) as reader:
        entry = reader.latest(topic, 0)
    assert entry is not None and (entry.value, entry.checkpoint_id) == (b"state", 3)


@pytest.mark.auth
def test_a_principal_that_may_not_read_the_changelog_gets_an_error_at_once(kafka_scram: ScramKafka) -> None:
    topic = changelog_topic(unique("auth"), "window")
    ensure_topic(kafka_scram.bootstrap, topic, 1, kafka_scram.admin.settings, compacted=True, timeout=TIMEOUT)
    user = kafka_scram.create_principal(unique("stranger"))
    started = time.monotonic()

    with ChangelogReader(kafka_scram.bootstrap, user.settings, timeout=TIMEOUT) as reader, \
            pytest.raises(ChangelogError, match=rf"{topic}' partition 0 .*may not describe it") as raised:
        reader.latest(topic, 0)

    assert not isinstance(raised.value, ChangelogTimeout) and time.monotonic() - started < TIMEOUT
