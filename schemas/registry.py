"""What the Confluent formats (avro-, json-, protobuf-confluent) share about a Schema Registry and its framing.

- **Framing.** Every value starts with magic byte 0 and the 4-byte big-endian id of the schema it was
  written with. ``header_problem`` says why a payload is not framed that way (a DecodeFailure reason, the
  same wording for every format); ``wire_header`` is confluent-kafka's own framing of an id (``SchemaId``),
  computed once per id and prefixed to every body, so our bytes are the library's bytes.
- **Subjects.** Encoding registers (or looks up) its schema under the subject Confluent's serializers would
  use, named by confluent-kafka's own strategy functions (``subject_name``): ``topic`` -> ``<topic>-value``,
  ``record`` -> the record name, ``topic-record`` -> ``<topic>-<record name>``. The record name is what
  the format calls it: the Avro record's full name, the JSON Schema's ``title``, the Protobuf message's
  full name.
- **Registry calls** go through confluent-kafka's ``SchemaRegistryClient``, which caches ids and schemas,
  so each schema reaches the registry once per client.

Errors say whose fault they are. A registry that cannot be reached, or answers 5xx, raises
``RegistryUnavailable``: an outage, which must stop the job rather than dead-letter every record. A schema
the registry refuses (invalid, incompatible) or does not have (a look-up with ``auto_register`` off)
raises ``SchemaError`` naming the subject: a configuration error. An id the registry does not know raises
``UnknownSchemaId``, which decoders turn into a DecodeFailure for the records that carry it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from schemas.base import NULL_PAYLOAD_REASON, SchemaError

if TYPE_CHECKING:  # the client pulls in an HTTP stack that formats without a registry never need
    from confluent_kafka.schema_registry import RegisteredSchema, Schema, SchemaRegistryClient

    from schemas.factory import FormatSpec, SubjectStrategy

MAGIC_BYTE = 0
HEADER_SIZE = 5
"""Magic byte + 4-byte schema id."""

_NOT_FOUND = 404
_SERVER_ERROR = 500


class UnknownSchemaId(LookupError):
    """The registry (or schema directory) has no schema under this id."""


class RegistryUnavailable(SchemaError):
    """The registry cannot be reached or failed to answer (5xx): an outage, not a bad record or schema."""


class SchemaNotRegistered(SchemaError):
    """``auto_register`` is off and the schema is not registered under the subject encoding needs."""


def connect(url: str) -> SchemaRegistryClient:
    """A client for the registry at ``url`` (comma-separated URLs fail over, as confluent-kafka does)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    try:
        return SchemaRegistryClient({"url": url})
    except ValueError as exc:
        raise SchemaError(f"invalid schema registry url {url!r}: {exc}") from exc


def describe(client: SchemaRegistryClient) -> str:
    """``schema registry <url>``: how error messages and failure reasons name a registry."""
    conf = client.config()  # type: ignore[no-untyped-call]  # confluent-kafka leaves config() unannotated
    return f"schema registry {conf['url']}"


# ------------------------------------------------------------------------------------------------- framing


def header_problem(payload: bytes | None) -> str | None:
    """Why ``payload`` is not in the Confluent wire format (a DecodeFailure reason), or None if it is."""
    if payload is None:
        return NULL_PAYLOAD_REASON
    if len(payload) < HEADER_SIZE:
        return (f"payload too short for Confluent wire format: {len(payload)} byte(s), need at least "
                f"{HEADER_SIZE} (magic byte + 4-byte schema id)")
    if payload[0] != MAGIC_BYTE:
        return f"wrong magic byte 0x{payload[0]:02x} (expected 0x00: not Confluent wire format)"
    return None


def schema_id_of(payload: bytes) -> int:
    """The schema id of a payload ``header_problem`` accepted."""
    return int.from_bytes(payload[1:HEADER_SIZE], "big")


Writer = TypeVar("Writer")


def framed(payloads: Sequence[bytes | None],
           writer_or_reason: Callable[[int], Writer | str]) -> Iterator[tuple[int, bytes, int, Writer | str]]:
    """Per payload, ``(index, payload, schema id, how to read it or why it cannot be read)``, asking
    ``writer_or_reason`` once per schema id of the call; payloads that are not framed come as
    ``(index, b"", -1, reason)``. The decode loop every Confluent format shares."""
    writers: dict[int, Writer | str] = {}
    for index, payload in enumerate(payloads):
        problem = header_problem(payload)
        if problem is not None or payload is None:
            yield index, b"", -1, problem or NULL_PAYLOAD_REASON
            continue
        schema_id = schema_id_of(payload)
        if schema_id not in writers:
            writers[schema_id] = writer_or_reason(schema_id)
        yield index, payload, schema_id, writers[schema_id]


def wire_header(schema_type: str, schema_id: int) -> bytes:
    """The bytes confluent-kafka's serializers put before a body written with ``schema_id``.

    For AVRO and JSON that is the 5-byte header; Protobuf bodies also need their message indexes after it,
    which the protobuf format appends itself.
    """
    from confluent_kafka.schema_registry.serde import SchemaId

    return SchemaId(schema_type, schema_id).id_to_bytes()


# ------------------------------------------------------------------------------------------------- subjects


def subject_name(strategy: SubjectStrategy, topic: str | None, record_name: str | None) -> str:
    """The subject confluent-kafka's serializers register a value schema under with this strategy.

    ``topic`` is needed by the ``topic`` and ``topic-record`` strategies, ``record_name`` by ``record`` and
    ``topic-record``; a missing one is a ``SchemaError`` naming what to configure.
    """
    from confluent_kafka.schema_registry import (
        record_subject_name_strategy,
        topic_record_subject_name_strategy,
        topic_subject_name_strategy,
    )
    from confluent_kafka.serialization import MessageField, SerializationContext

    strategies = {"topic": topic_subject_name_strategy, "record": record_subject_name_strategy,
                  "topic-record": topic_record_subject_name_strategy}
    if strategy not in strategies:
        raise SchemaError(f"unknown subject_strategy {strategy!r}: expected topic, record or topic-record")
    if topic is None and strategy != "record":
        raise SchemaError(f"subject_strategy {strategy!r} needs the topic to name the subject")
    if record_name is None and strategy != "topic":
        raise SchemaError(f"subject_strategy {strategy!r} needs a record name (Avro record name, JSON Schema "
                          "'title', Protobuf message name), and the schema has none")
    context = SerializationContext(topic or "", MessageField.VALUE)
    subject = strategies[strategy](context, record_name)
    assert subject is not None  # every input the strategy needs was checked above
    return subject


def register_or_lookup(client: SchemaRegistryClient, subject: str, schema: Schema, auto_register: bool) -> int:
    """The id of ``schema`` under ``subject``: registered there if ``auto_register``, else looked up.

    Registering a schema the subject already has returns its id without a new version (the registry's
    rule), so calling this once per format instance is idempotent.
    """
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    action = "register" if auto_register else "look up"
    try:
        if auto_register:
            return client.register_schema(subject, schema)
        registered = client.lookup_schema(subject, schema)
    except SchemaRegistryError as exc:
        if not auto_register and exc.http_status_code == _NOT_FOUND:
            raise SchemaNotRegistered(
                f"the {schema.schema_type} schema is not registered under subject '{subject}' in "
                f"{describe(client)} and auto_register is off: register it there, or turn auto_register on "
                f"({exc})") from exc
        raise _refused(client, f"{action} the schema under subject '{subject}'", exc) from exc
    except Exception as exc:  # the client reports transport failures (refused, timeout) as assorted types
        raise _unreachable(client, f"{action} the schema under subject '{subject}'", exc) from exc
    assert registered.schema_id is not None  # a successful look-up always carries the id
    return registered.schema_id


@dataclass(frozen=True)
class SubjectRegistration:
    """Where an encoder gets its schema id: the subject's naming inputs and the ``auto_register`` switch."""

    strategy: SubjectStrategy = "topic"
    topic: str | None = None
    auto_register: bool = True

    @classmethod
    def from_spec(cls, spec: FormatSpec) -> SubjectRegistration:
        return cls(spec.subject_strategy, spec.topic, spec.auto_register)

    def subject(self, record_name: str | None) -> str:
        return subject_name(self.strategy, self.topic, record_name)

    def schema_id(self, client: SchemaRegistryClient, schema: Schema, record_name: str | None) -> int:
        """Register or look up ``schema`` under this registration's subject (see ``register_or_lookup``)."""
        return register_or_lookup(client, self.subject(record_name), schema, self.auto_register)


# ------------------------------------------------------------------------------------------------- schemas


def fetch_schema(client: SchemaRegistryClient, schema_id: int) -> Schema:
    """The schema registered under ``schema_id`` (``GET /schemas/ids/{id}``); ``UnknownSchemaId`` if none."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        return client.get_schema(schema_id)
    except SchemaRegistryError as exc:
        if exc.http_status_code == _NOT_FOUND:
            raise UnknownSchemaId(schema_id) from exc
        raise _refused(client, f"return schema id {schema_id}", exc) from exc
    except Exception as exc:  # the client reports transport failures (refused, timeout) as assorted types
        raise _unreachable(client, f"schema id {schema_id}", exc) from exc


def latest_version(client: SchemaRegistryClient, subject: str) -> RegisteredSchema:
    """The latest version registered under ``subject``; ``SchemaError`` naming the subject if it has none."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        return client.get_latest_version(subject)
    except SchemaRegistryError as exc:
        if exc.http_status_code == _NOT_FOUND:
            raise SchemaError(f"subject '{subject}' has no registered version in {describe(client)} "
                              f"({exc})") from exc
        raise _refused(client, f"return the latest version of subject '{subject}'", exc) from exc
    except Exception as exc:  # the client reports transport failures (refused, timeout) as assorted types
        raise _unreachable(client, f"the latest version of subject '{subject}'", exc) from exc


def fetch_version(client: SchemaRegistryClient, subject: str, version: int) -> RegisteredSchema:
    """Version ``version`` of ``subject`` (soft-deleted ones too: references may still name them)."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        return client.get_version(subject, version, deleted=True)
    except SchemaRegistryError as exc:
        raise _refused(client, f"return version {version} of subject '{subject}'", exc) from exc
    except Exception as exc:  # the client reports transport failures (refused, timeout) as assorted types
        raise _unreachable(client, f"version {version} of subject '{subject}'", exc) from exc


def _refused(client: SchemaRegistryClient, action: str, exc: Exception) -> SchemaError:
    """A registry answer that is not a plain 'not found': an outage for 5xx, else a refusal of our request."""
    status = getattr(exc, "http_status_code", None)
    if isinstance(status, int) and status >= _SERVER_ERROR:
        return RegistryUnavailable(f"{describe(client)} failed to {action}: {exc}")
    return SchemaError(f"{describe(client)} refused to {action}: {exc}")


def _unreachable(client: SchemaRegistryClient, what: str, exc: Exception) -> RegistryUnavailable:
    return RegistryUnavailable(f"{describe(client)} is unreachable for {what}: {type(exc).__name__}: {exc}")
