"""SASL/SCRAM-SHA-512 and ACLs for the local broker, and the AdminClient helpers that give a connector its
own least-privilege principal.

Why: in production a connector runs as a principal that may read its source topics, write its sink and
dead-letter topics, use its consumer group and its transactional id, and nothing more. A test against a broker
that enforces exactly that (``StandardAuthorizer`` with ``allow.everyone.if.no.acl.found=false``) finds a
missing ACL before a deployment does.

How the broker is set up: clients and brokers (replication, transaction markers) talk SASL_PLAINTEXT with
SCRAM-SHA-512 on the client listener, as the ``admin`` super user created at format time (StorageTool
``--add-scram``), so it exists before the first client connects. The KRaft controller listener uses SASL/PLAIN
with a generated ``controller`` user: SCRAM credentials live in the metadata log, which the controllers must
be able to reach each other to replay, so SCRAM cannot guard their own listener, and PLAINTEXT would make every
anonymous connection to it a super user. Both passwords are generated once per data dir and kept there in a
file of mode 0600.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

# confluent_kafka.admin re-exports these without declaring them; their defining modules do declare them.
from confluent_kafka.admin._acl import AclBinding, AclBindingFilter, AclOperation, AclPermissionType
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType
from confluent_kafka.admin._scram import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

from engine.testing.errors import KafkaTestError

AuthMode = Literal["none", "scram"]
SCRAM_MECHANISM = "SCRAM-SHA-512"
SCRAM_ITERATIONS = 8192
ADMIN_USER = "admin"
CONTROLLER_USER = "controller"
CREDENTIALS_FILE = "scram-credentials.json"
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
CLUSTER_RESOURCE = "kafka-cluster"


class PrincipalSetupFailed(KafkaTestError):
    """A SCRAM user or its ACLs could not be created, or the new credential did not work in time."""


@dataclass(frozen=True)
class ClientAuth:
    """One SCRAM principal, and the librdkafka settings a client authenticates as it with."""

    username: str
    password: str = field(repr=False)
    mechanism: str = SCRAM_MECHANISM

    @property
    def principal(self) -> str:
        """The name ACLs use for this user."""
        return f"User:{self.username}"

    @property
    def settings(self) -> dict[str, str]:
        """``security.protocol`` and ``sasl.*`` for librdkafka (confluent-kafka, kcat) or ``kafka.client``."""
        return {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": self.mechanism,
            "sasl.username": self.username,
            "sasl.password": self.password,
        }

    def config(self, bootstrap: str) -> dict[str, str]:
        """A complete client configuration: ``bootstrap.servers`` plus ``settings``."""
        return {"bootstrap.servers": bootstrap, **self.settings}


def new_password() -> str:
    """A random password of URL-safe characters, so it needs no quoting in JAAS or StorageTool arguments."""
    return secrets.token_urlsafe(24)


@dataclass(frozen=True)
class ScramSecrets:
    """The generated passwords of one SCRAM broker or cluster; every node of a cluster shares them."""

    admin: ClientAuth
    controller_password: str = field(repr=False)

    @classmethod
    def generate(cls) -> ScramSecrets:
        return cls(admin=ClientAuth(ADMIN_USER, new_password()), controller_password=new_password())

    def save(self, path: Path) -> None:
        """Write the file with mode 0600 from its creation on: it holds the super user's password."""
        payload = orjson.dumps({
            "mechanism": self.admin.mechanism, "username": self.admin.username, "password": self.admin.password,
            "controller_password": self.controller_password,
        }, option=orjson.OPT_INDENT_2)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(descriptor, 0o600)  # an existing file keeps its mode on O_CREAT; the umask may widen none
            os.write(descriptor, payload)
        finally:
            os.close(descriptor)

    @classmethod
    def load(cls, path: Path) -> ScramSecrets | None:
        """The recorded secrets, or None when the data dir runs without authentication."""
        try:
            recorded = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        admin = ClientAuth(recorded["username"], recorded["password"], recorded["mechanism"])
        return cls(admin=admin, controller_password=recorded["controller_password"])


def _jaas(module: str, **options: str) -> str:
    pairs = " ".join(f'{key}="{value}"' for key, value in options.items())
    return f"org.apache.kafka.common.security.{module} required {pairs};"


def scram_broker_settings(port: int, controller_port: int, scram: ScramSecrets) -> dict[str, str]:
    """server.properties entries that replace the PLAINTEXT listeners with authenticated ones and enforce ACLs."""
    admin = scram.admin
    return {
        "listeners": f"SASL_PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"SASL_PLAINTEXT://127.0.0.1:{port}",
        "listener.security.protocol.map": "SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT",
        "inter.broker.listener.name": "SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": admin.mechanism,
        "sasl.mechanism.inter.broker.protocol": admin.mechanism,
        f"listener.name.sasl_plaintext.{admin.mechanism.lower()}.sasl.jaas.config": _jaas(
            "scram.ScramLoginModule", username=admin.username, password=admin.password),
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": _jaas(
            "plain.PlainLoginModule", username=CONTROLLER_USER, password=scram.controller_password,
            **{f"user_{CONTROLLER_USER}": scram.controller_password}),
        "authorizer.class.name": AUTHORIZER,
        "allow.everyone.if.no.acl.found": "false",
        "super.users": f"{admin.principal};User:{CONTROLLER_USER}",
    }


def scram_format_args(scram: ScramSecrets) -> list[str]:
    """StorageTool arguments that create the admin's SCRAM credential in the bootstrap metadata."""
    admin = scram.admin
    return ["--add-scram", f"{admin.mechanism}=[name={admin.username},password={admin.password}]"]


def connector_acls(principal: str, *, read_topics: Iterable[str] = (), write_topics: Iterable[str] = (),
                   groups: Iterable[str] = (), transactional_ids: Iterable[str] = (),
                   idempotent_write: bool = False) -> list[AclBinding]:
    """ALLOW bindings for exactly what a connector does: READ+DESCRIBE its source topics, WRITE+DESCRIBE its
    sink and dead-letter topics, READ its group, WRITE+DESCRIBE its transactional id. Since Kafka 3.0 a producer
    with WRITE on a topic (or a transactional id) needs no IDEMPOTENT_WRITE on the cluster; ask for it only for
    an idempotent producer that has neither."""
    wanted: list[tuple[ResourceType, str, AclOperation]] = []
    for topic in read_topics:
        wanted += [(ResourceType.TOPIC, topic, AclOperation.READ), (ResourceType.TOPIC, topic, AclOperation.DESCRIBE)]
    for topic in write_topics:
        wanted += [(ResourceType.TOPIC, topic, AclOperation.WRITE), (ResourceType.TOPIC, topic, AclOperation.DESCRIBE)]
    wanted += [(ResourceType.GROUP, group, AclOperation.READ) for group in groups]
    for transactional_id in transactional_ids:
        wanted += [(ResourceType.TRANSACTIONAL_ID, transactional_id, AclOperation.WRITE),
                   (ResourceType.TRANSACTIONAL_ID, transactional_id, AclOperation.DESCRIBE)]
    if idempotent_write:
        wanted.append((ResourceType.BROKER, CLUSTER_RESOURCE, AclOperation.IDEMPOTENT_WRITE))
    unique = dict.fromkeys(wanted)  # a topic both read and written gets DESCRIBE once
    return [AclBinding(kind, name, ResourcePatternType.LITERAL, principal, "*", operation, AclPermissionType.ALLOW)
            for kind, name, operation in unique]


def _admin(admin_config: Mapping[str, Any]) -> AdminClient:
    return AdminClient({"log_level": 0, **admin_config})


def create_scram_user(admin_config: Mapping[str, Any], name: str, password: str | None = None, *,
                      timeout: float = 30.0) -> ClientAuth:
    """Create (or reset) a SCRAM-SHA-512 user, like ``kafka-configs --alter --add-config SCRAM-SHA-512=[...]``,
    and return once a client authenticates with it: the credential reaches brokers asynchronously."""
    user = ClientAuth(name, password or new_password())
    upsert = UserScramCredentialUpsertion(
        name, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS), user.password.encode())
    admin = _admin(admin_config)  # kept referenced: a collected client fails its futures with _DESTROY
    futures = admin.alter_user_scram_credentials([upsert], request_timeout=timeout)
    try:
        futures[name].result(timeout)
    except KafkaException as error:
        raise PrincipalSetupFailed(f"creating SCRAM user {name!r} failed: {error}") from error
    _wait_until_authenticates(str(admin_config["bootstrap.servers"]), user, timeout)
    return user


def _wait_until_authenticates(bootstrap: str, user: ClientAuth, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last_error = "no answer"
    while time.monotonic() < deadline:
        client = AdminClient({**user.config(bootstrap), "log_level": 0})
        try:
            client.list_topics(timeout=min(5.0, max(0.5, deadline - time.monotonic())))
            return
        except KafkaException as error:
            last_error = str(error)
        finally:
            del client
        time.sleep(0.2)
    raise PrincipalSetupFailed(f"SCRAM user {user.username!r} could not authenticate at {bootstrap} within "
                               f"{timeout:.0f}s: {last_error}")


def grant(admin_config: Mapping[str, Any], bindings: list[AclBinding], *, timeout: float = 30.0) -> None:
    """Create the ACL bindings and return once the bootstrap broker enforces them (ACLs propagate
    asynchronously from the controller, so a test right after ``create_acls`` could still be refused)."""
    if not bindings:
        return
    admin = _admin(admin_config)
    futures = admin.create_acls(bindings, request_timeout=timeout)
    try:
        for future in futures.values():
            future.result(timeout)
    except KafkaException as error:
        raise PrincipalSetupFailed(f"creating ACLs failed: {error}") from error
    _wait_until_acls_visible(admin, bindings, timeout)


def _principal_filter(principal: str) -> AclBindingFilter:
    """Every binding of ``principal``; None matches any resource name and host (the stubs type them as str)."""
    anything: Any = None
    return AclBindingFilter(ResourceType.ANY, anything, ResourcePatternType.ANY, principal, anything,
                            AclOperation.ANY, AclPermissionType.ANY)


def _wait_until_acls_visible(admin: AdminClient, bindings: list[AclBinding], timeout: float) -> None:
    principals = {binding.principal for binding in bindings}
    deadline = time.monotonic() + timeout
    missing = set(bindings)
    while time.monotonic() < deadline:
        for principal in principals:
            query = _principal_filter(principal)
            with contextlib.suppress(KafkaException):  # a broker still loading answers later
                missing -= set(admin.describe_acls(query, request_timeout=timeout).result(timeout))
        if not missing:
            return
        time.sleep(0.2)
    raise PrincipalSetupFailed(f"{len(missing)} ACLs were created but not visible within {timeout:.0f}s: "
                               f"{sorted(map(str, missing))}")


def create_principal(admin_config: Mapping[str, Any], name: str, *, password: str | None = None,
                     read_topics: Iterable[str] = (), write_topics: Iterable[str] = (),
                     groups: Iterable[str] = (), transactional_ids: Iterable[str] = (),
                     idempotent_write: bool = False, timeout: float = 30.0) -> ClientAuth:
    """A SCRAM user granted exactly what a connector needs (see ``connector_acls``); ``admin_config`` is a
    super user's client configuration, ``bootstrap.servers`` included."""
    user = create_scram_user(admin_config, name, password, timeout=timeout)
    grant(admin_config, connector_acls(
        user.principal, read_topics=read_topics, write_topics=write_topics, groups=groups,
        transactional_ids=transactional_ids, idempotent_write=idempotent_write), timeout=timeout)
    return user


@dataclass(frozen=True)
class ScramKafka:
    """A running SCRAM broker or cluster: where it listens and who its super user is."""

    bootstrap: str
    admin: ClientAuth
    data_dir: Path | None = None  # where a local broker keeps its files (credentials included)

    @property
    def admin_config(self) -> dict[str, str]:
        return self.admin.config(self.bootstrap)

    def config(self, user: ClientAuth) -> dict[str, str]:
        """Client configuration for ``user`` on this broker."""
        return user.config(self.bootstrap)

    def create_principal(self, name: str, *, password: str | None = None, read_topics: Iterable[str] = (),
                         write_topics: Iterable[str] = (), groups: Iterable[str] = (),
                         transactional_ids: Iterable[str] = (), idempotent_write: bool = False) -> ClientAuth:
        """``create_principal`` with this broker's admin."""
        return create_principal(self.admin_config, name, password=password, read_topics=read_topics,
                                write_topics=write_topics, groups=groups, transactional_ids=transactional_ids,
                                idempotent_write=idempotent_write)
