"""The local broker with SASL/SCRAM-SHA-512 and enforced ACLs, and the helpers that create least-privilege
principals.

Tests marked ``auth`` start JVMs (``pytest -m auth``); the unmarked ones check settings, ACL bindings and
files without starting anything."""

from __future__ import annotations

import shlex
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from engine.cli import main
from engine.ports import free_port
from engine.testing.auth import (
    CREDENTIALS_FILE,
    ClientAuth,
    ScramKafka,
    ScramSecrets,
    connector_acls,
    create_principal,
    scram_broker_settings,
)
from engine.testing.cluster import LocalCluster
from engine.testing.local_broker import LayoutMismatch, resolve_scram

TIMEOUT = 30.0


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _create_topics(admin_config: dict[str, str], *topics: str, replicas: int = 1) -> None:
    admin = AdminClient(admin_config)
    futures = admin.create_topics([NewTopic(topic, 1, replicas) for topic in topics], operation_timeout=TIMEOUT)
    for future in futures.values():
        future.result(TIMEOUT)


def _produce(config: dict[str, str], topic_values: list[tuple[str, bytes]]) -> dict[str, KafkaError | None]:
    """Produce each value and return each topic's delivery outcome (None: delivered)."""
    outcomes: dict[str, KafkaError | None] = {}
    producer = Producer({**config, "log_level": 0})
    for topic, value in topic_values:
        producer.produce(topic, value, on_delivery=lambda error, message, topic=topic: outcomes.update({topic: error}))
    producer.flush(TIMEOUT)
    return outcomes


def _read_committed(config: dict[str, str], topic: str, expected: int, group: str | None = None) -> list[bytes]:
    consumer = Consumer({**config, "group.id": group or _name("reader"), "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed", "enable.auto.commit": False, "log_level": 0})
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while len(values) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                values.append(message.value())
    finally:
        consumer.close()
    return values


@pytest.mark.auth
def test_the_admin_can_create_topics_and_a_principal_without_acls_cannot(kafka_scram: ScramKafka) -> None:
    topic = _name("admin-made")
    _create_topics(kafka_scram.admin_config, topic)
    assert topic in AdminClient(kafka_scram.admin_config).list_topics(timeout=TIMEOUT).topics

    nobody = kafka_scram.create_principal(_name("nobody"))
    refused = _name("refused")
    client = AdminClient(kafka_scram.config(nobody))
    futures = client.create_topics([NewTopic(refused, 1, 1)])
    with pytest.raises(KafkaException) as raised:
        futures[refused].result(TIMEOUT)
    assert raised.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


@pytest.mark.auth
def test_a_principal_granted_one_topic_produces_to_it_and_is_refused_on_another(kafka_scram: ScramKafka) -> None:
    granted, other = _name("granted"), _name("other")
    _create_topics(kafka_scram.admin_config, granted, other)
    writer = kafka_scram.create_principal(_name("writer"), write_topics=[granted])

    outcomes = _produce(kafka_scram.config(writer), [(granted, b"allowed"), (other, b"refused")])

    assert outcomes[granted] is None
    refusal = outcomes[other]
    assert refusal is not None and refusal.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert _read_committed(kafka_scram.admin_config, granted, 1) == [b"allowed"]


def _consume(consumer: Consumer, count: int) -> list[Message]:
    messages: list[Message] = []
    deadline = time.monotonic() + 60
    while len(messages) < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None:
            assert message.error() is None, message.error()
            messages.append(message)
    return messages


@pytest.mark.auth
def test_a_connector_principal_moves_records_exactly_once_with_only_its_own_acls(kafka_scram: ScramKafka) -> None:
    source, sink, dead_letter = _name("source"), _name("sink"), _name("dlq")
    group, transactional_id = _name("connector"), _name("connector-tx")
    _create_topics(kafka_scram.admin_config, source, sink, dead_letter)
    _produce(kafka_scram.admin_config, [(source, f"record-{i}".encode()) for i in range(3)])
    connector = kafka_scram.create_principal(_name("connector"), read_topics=[source],
                                             write_topics=[sink, dead_letter], groups=[group],
                                             transactional_ids=[transactional_id])
    config = kafka_scram.config(connector)
    consumer = Consumer({**config, "group.id": group, "auto.offset.reset": "earliest", "log_level": 0,
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    producer = Producer({**config, "transactional.id": transactional_id, "log_level": 0})
    try:
        consumer.subscribe([source])
        producer.init_transactions(TIMEOUT)
        records = _consume(consumer, 3)
        producer.begin_transaction()
        for record in records:
            producer.produce(sink, record.value())
        producer.send_offsets_to_transaction([TopicPartition(source, 0, records[-1].offset() + 1)],
                                             consumer.consumer_group_metadata(), TIMEOUT)
        producer.commit_transaction(TIMEOUT)
    finally:
        consumer.close()

    assert _read_committed(kafka_scram.admin_config, sink, 3) == [b"record-0", b"record-1", b"record-2"]
    committed = Consumer({**config, "group.id": group, "log_level": 0}).committed([TopicPartition(source, 0)],
                                                                                  TIMEOUT)
    assert committed[0].offset == 3


@pytest.mark.auth
def test_a_wrong_password_fails_with_an_authentication_error(kafka_scram: ScramKafka) -> None:
    user = kafka_scram.create_principal(_name("user"))
    errors: list[KafkaError] = []
    client = AdminClient({**kafka_scram.config(ClientAuth(user.username, "not-the-password")),
                          "error_cb": errors.append, "log_level": 0})

    with pytest.raises(KafkaException):
        client.list_topics(timeout=5)
    client.poll(1)  # delivers the error callbacks

    assert errors and errors[0].code() == KafkaError._AUTHENTICATION, errors
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in errors[0].str()


@pytest.mark.auth
def test_the_admin_password_is_kept_in_the_data_dir_readable_by_its_owner_only(kafka_scram: ScramKafka) -> None:
    assert kafka_scram.data_dir is not None
    credentials = kafka_scram.data_dir / CREDENTIALS_FILE
    assert stat.S_IMODE(credentials.stat().st_mode) == 0o600
    assert stat.S_IMODE((kafka_scram.data_dir / "server.properties").stat().st_mode) == 0o600
    assert ScramSecrets.load(credentials) == ScramSecrets.load(credentials)
    recorded = ScramSecrets.load(credentials)
    assert recorded is not None and recorded.admin == kafka_scram.admin


def _settings_from(lines: list[str]) -> dict[str, str]:
    return dict(line.strip().split("=", 1) for line in lines if "=" in line and " " not in line.strip())


@pytest.mark.auth
def test_the_cli_starts_a_scram_broker_and_prints_how_to_connect_and_add_a_user(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data_dir = str(tmp_path / "scram")
    try:
        assert main(["broker", "start", "--auth", "scram", "--data-dir", data_dir, "--port", str(free_port())]) == 0
        out = capsys.readouterr().out.splitlines()
        bootstrap = out[0]
        admin = ScramSecrets.load(Path(data_dir) / CREDENTIALS_FILE)
        assert admin is not None
        assert _settings_from(out) == admin.admin.config(bootstrap)
        assert any(line.strip().startswith("epochline broker add-user alice") for line in out)
        assert main(["broker", "status", "--data-dir", data_dir]) == 0
        assert capsys.readouterr().out.strip().endswith("auth=SCRAM-SHA-512")

        topic = _name("cli")
        _create_topics(admin.admin.config(bootstrap), topic)
        assert main(["broker", "add-user", "alice", "--write-topic", topic, "--data-dir", data_dir]) == 0
        alice = _settings_from(capsys.readouterr().out.splitlines())
        assert alice["sasl.username"] == "alice" and alice["bootstrap.servers"] == bootstrap
        assert _produce(alice, [(topic, b"from-alice")]) == {topic: None}

        one_liner = next(line for line in out if line.strip().startswith("python -c"))
        command = shlex.split(one_liner)
        done = subprocess.run([sys.executable, *command[1:]], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr  # resets alice's password to alice-secret
        assert _produce({**alice, "sasl.password": "alice-secret"}, [(topic, b"again")]) == {topic: None}
    finally:
        main(["broker", "stop", "--data-dir", data_dir])


@pytest.mark.cluster
@pytest.mark.auth
def test_a_scram_cluster_replicates_and_authorizes_a_transactional_principal(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "scram-cluster")
    try:
        cluster.start(nodes=3, auth="scram")
        admin = cluster.client_config()
        assert admin["sasl.username"] == "admin"
        topic, transactional_id = _name("replicated"), _name("tx")
        _create_topics(admin, topic, replicas=3)
        user = create_principal(admin, _name("writer"), write_topics=[topic], transactional_ids=[transactional_id])
        producer = Producer({**user.config(cluster.bootstrap), "transactional.id": transactional_id,
                             "log_level": 0})
        producer.init_transactions(TIMEOUT)
        producer.begin_transaction()
        producer.produce(topic, b"replicated")
        producer.commit_transaction(TIMEOUT)

        assert sorted(cluster.in_sync_replicas(topic)) == [1, 2, 3]
        assert _read_committed(admin, topic, 1) == [b"replicated"]
    finally:
        cluster.stop()
    assert not any(status.running for status in cluster.status())


def test_connector_acls_grant_exactly_what_a_connector_needs() -> None:
    bindings = connector_acls("User:c", read_topics=["in"], write_topics=["out", "dlq"], groups=["g"],
                              transactional_ids=["tx"])

    granted = {(b.restype.name, b.name, b.operation.name, b.permission_type.name, b.host) for b in bindings}
    assert granted == {
        ("TOPIC", "in", "READ", "ALLOW", "*"), ("TOPIC", "in", "DESCRIBE", "ALLOW", "*"),
        ("TOPIC", "out", "WRITE", "ALLOW", "*"), ("TOPIC", "out", "DESCRIBE", "ALLOW", "*"),
        ("TOPIC", "dlq", "WRITE", "ALLOW", "*"), ("TOPIC", "dlq", "DESCRIBE", "ALLOW", "*"),
        ("GROUP", "g", "READ", "ALLOW", "*"),
        ("TRANSACTIONAL_ID", "tx", "WRITE", "ALLOW", "*"), ("TRANSACTIONAL_ID", "tx", "DESCRIBE", "ALLOW", "*"),
    }
    assert len(bindings) == len(granted)
    assert {b.principal for b in bindings} == {"User:c"}
    assert {b.resource_pattern_type.name for b in bindings} == {"LITERAL"}


def test_idempotent_write_on_the_cluster_is_granted_only_when_asked() -> None:
    assert connector_acls("User:c", write_topics=["out"]) == connector_acls("User:c", write_topics=["out"])
    asked = connector_acls("User:c", idempotent_write=True)
    assert [(b.restype.name, b.name, b.operation.name) for b in asked] == [
        ("BROKER", "kafka-cluster", "IDEMPOTENT_WRITE")]


def test_the_broker_enforces_acls_and_has_no_anonymous_super_user() -> None:
    settings = scram_broker_settings(9092, 9093, ScramSecrets(ClientAuth("admin", "pw"), "controller-pw"))

    assert settings["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert settings["allow.everyone.if.no.acl.found"] == "false"
    assert settings["super.users"] == "User:admin;User:controller"
    assert "PLAINTEXT:PLAINTEXT" not in settings["listener.security.protocol.map"]
    assert settings["listeners"] == "SASL_PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert settings["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"


def test_scram_secrets_are_written_owner_only_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / CREDENTIALS_FILE
    path.write_text("{}")
    path.chmod(0o644)  # an existing, wider file is narrowed too
    secrets = ScramSecrets.generate()

    secrets.save(path)

    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ScramSecrets.load(path) == secrets
    assert ScramSecrets.load(tmp_path / "absent.json") is None
    assert secrets.admin.password not in repr(secrets)


def test_authentication_cannot_be_switched_on_formatted_storage(tmp_path: Path) -> None:
    with pytest.raises(LayoutMismatch, match="formatted without authentication"):
        resolve_scram(tmp_path, "scram", formatted=True)
    ScramSecrets.generate().save(tmp_path / CREDENTIALS_FILE)
    with pytest.raises(LayoutMismatch, match="formatted with SCRAM"):
        resolve_scram(tmp_path, "none", formatted=True)
    assert resolve_scram(tmp_path, None, formatted=True) == ScramSecrets.load(tmp_path / CREDENTIALS_FILE)


def test_adding_a_user_to_a_broker_without_authentication_says_so(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["broker", "add-user", "bob", "--data-dir", str(tmp_path)]) == 2
    assert "runs without authentication" in capsys.readouterr().err


def test_a_test_using_a_costly_fixture_without_its_marker_errors(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(
        "def test_unmarked(kafka_scram):\n    raise AssertionError('must not run')\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "test_inner.py", "-p", "no:cacheprovider", "-q"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)

    assert done.returncode == 1, done.stdout + done.stderr
    assert "uses kafka_scram but is not marked @pytest.mark.auth" in done.stdout
    assert "1 error" in done.stdout
