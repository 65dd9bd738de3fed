"""protobuf-confluent: Protobuf messages in the Confluent wire format, decoded into one reader message type.

Wire format (what confluent-kafka's ``ProtobufSerializer`` writes): magic byte 0, a 4-byte big-endian schema
id, the message-index array (zigzag varints: its length, then the path of the message type in the schema's
file; ``[0]``, the first top-level message, is written as a single 0 byte), then the message. The header
is read and written by confluent-kafka's own ``SchemaId``; the message by the Protobuf runtime (upb).

The reader schema comes from ``spec.schema`` (a ``.proto`` file or a descriptor set, see
``schemas.protobuf_schema``) or from the registry: ``spec.schema_id``, else the latest version of the subject
``spec.subject_strategy`` names. The reader type, one of its message types, is what every decoded batch
holds (one Arrow schema), chosen by ``ReaderType``:

- ``spec.message`` pins it;
- a schema with one top-level message type reads that one (Confluent's message index ``[0]``);
- otherwise each record's framing names its type, as it does for Confluent's deserializers, and the first
  record whose message-index array names a type the reader schema declares fixes the reader type for the
  format's life. Which type that is depends on which record is read first (per task, and again after a
  restart): on a topic that mixes types, ``message`` makes the choice stable.

A record of another type than the reader type is a per-record failure naming both ("record is message
acc.Inner (schema id 1, message index [0]); this source reads acc.Order (...)").

Records are parsed with the reader type after their writer schema (by id, from the registry) and index path
have been checked: the path must name a message type of the reader type's full name whose fields are
wire-compatible with the reader's (see ``incompatibility``), so a writer that evolved compatibly (fields
added or removed) reads into the reader schema the Protobuf way, unknown fields skipped and missing ones at
their default. Without a registry every record is read with the schema file (only ``spec.schema_id``, if
set, is accepted as its id), since writer schemas cannot be looked up.

Per-record failures (``DecodeFailure``, reason naming the problem): null payload, too short, wrong magic
byte, bad message-index array, unknown schema id, bad message index (the path and the type it was resolved
in), an id whose schema is not Protobuf, another message type than the reader type (or, before one is
chosen, a type the reader schema does not declare or cannot map to Arrow), an incompatible writer,
unparsable message bytes, a missing proto2 required field, a value Arrow cannot hold.
A registry that cannot be reached raises ``SchemaError``: an outage, not a bad record.

Encoding writes the reader type (so a schema with several message types needs ``spec.message``, unless
this format already chose one by decoding): rows become messages (``schemas.protobuf_arrow``), then the header with
the schema id: ``spec.schema_id``, or the id the registry gave the schema (from the registry by id or
subject), or the id of the schema file's registration under its subject (registered when
``spec.auto_register``, else looked up), imports registered as references the way ``ProtobufSerializer``
registers them.
"""

from __future__ import annotations

import functools
import io
import logging
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import pyarrow as pa
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient

# the _sync module: the package re-exports both the async and the sync resolver under this one name
from confluent_kafka.schema_registry._sync.protobuf import _resolve_named_schema
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.protobuf import _create_index_array, _is_builtin, _schema_to_str, _str_to_proto
from confluent_kafka.schema_registry.serde import SchemaId
from confluent_kafka.serialization import SerializationError
from google.protobuf.descriptor import Descriptor, FileDescriptor
from google.protobuf.message import DecodeError, Message

from schemas.arrow_batches import empty_batch
from schemas.base import Decoded, DecodeFailure, SchemaError
from schemas.protobuf_arrow import MessageMapping
from schemas.protobuf_schema import (
    BadMessageIndex,
    ProtobufSchema,
    add_file,
    compile_proto_texts,
    incompatibility,
    load_schema_file,
    schema_of,
    seeded_pool,
)
from schemas.registry import (
    RegistryUnavailable,
    UnknownSchemaId,
    connect,
    describe,
    header_problem,
    register_or_lookup,
    subject_name,
)

if TYPE_CHECKING:
    from schemas.factory import FormatSpec

log = logging.getLogger(__name__)
_T = TypeVar("_T")

NAME = "protobuf-confluent"
PROTOBUF = "PROTOBUF"
_NOT_FOUND = 404
_SERVER_ERROR = 500
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
_ROOT_FILE = "registered_schema.proto"


class WriterSchemas(Protocol):
    """Where the schemas of record ids come from."""

    description: str

    def fetch(self, schema_id: int) -> ProtobufSchema:
        """The schema registered under ``schema_id``; ``UnknownSchemaId`` if there is none."""


class RegistryProtobufSchemas:
    """Protobuf schemas from a Confluent Schema Registry, via confluent-kafka's client (cached per id).

    Schemas are asked for in their ``serialized`` form (a base64 FileDescriptorProto, what confluent-kafka's
    ``ProtobufDeserializer`` asks for too), so no compiler is needed; a registry that answers with ``.proto``
    text anyway (older ones, or a schema registered as text where the format is not honoured) has that text
    and its references compiled by protoc.
    """

    def __init__(self, url: str) -> None:
        self.client = connect(url)
        self.description = describe(self.client)
        self._schemas: dict[int, ProtobufSchema] = {}

    def fetch(self, schema_id: int) -> ProtobufSchema:
        cached = self._schemas.get(schema_id)
        if cached is None:
            registered = self._call(lambda: self.client.get_schema(schema_id, fmt="serialized"),
                                    f"schema id {schema_id}", missing=UnknownSchemaId(schema_id))
            cached = self._schemas[schema_id] = self._parse(registered, f"{self.description} id {schema_id}")
        return cached

    def latest(self, subject: str) -> tuple[int, ProtobufSchema]:
        """The id and schema of the subject's latest version (the reader schema when none is configured)."""
        missing = SchemaError(f"subject '{subject}' has no registered version in {self.description}")
        registered = self._call(lambda: self.client.get_latest_version(subject, fmt="serialized"),
                                f"the latest version of subject '{subject}'", missing=missing)
        schema_id = registered.schema_id
        assert schema_id is not None  # a registered version always has its id
        if schema_id not in self._schemas:
            where = f"{self.description} id {schema_id} (latest of subject '{subject}')"
            self._schemas[schema_id] = self._parse(registered.schema, where)
        return schema_id, self._schemas[schema_id]

    def _call(self, request: Callable[[], _T], what: str, *, missing: Exception) -> _T:
        """``request()``, its errors classified as ``schemas.registry`` does: 404 is ``missing``, 5xx and
        transport failures are ``RegistryUnavailable`` (an outage), anything else a refusal (``SchemaError``)."""
        try:
            return request()
        except SchemaRegistryError as exc:
            if exc.http_status_code == _NOT_FOUND:
                raise missing from exc
            if exc.http_status_code >= _SERVER_ERROR:
                raise RegistryUnavailable(f"{self.description} failed to return {what}: {exc}") from exc
            raise SchemaError(f"{self.description} refused to return {what}: {exc}") from exc
        except SchemaError:
            raise
        except Exception as exc:  # the client reports transport failures (refused, timeout) as assorted types
            raise RegistryUnavailable(f"{self.description} is unreachable for {what}: {type(exc).__name__}: "
                                      f"{exc}") from exc

    def _parse(self, registered: Schema, where: str) -> ProtobufSchema:
        if registered.schema_type != PROTOBUF:
            raise SchemaError(f"{where} is a {registered.schema_type} schema, not PROTOBUF")
        text = registered.schema_str or ""
        if _BASE64.fullmatch(text.strip()):
            return self._parse_serialized(registered, where)
        return self._compile_text(registered, where)

    def _parse_serialized(self, registered: Schema, where: str) -> ProtobufSchema:
        """The serialized schema and its references, resolved by confluent-kafka as ProtobufDeserializer does."""
        pool = seeded_pool()

        def resolve() -> None:
            try:
                _resolve_named_schema(registered, self.client, pool)
            except (TypeError, ValueError, KeyError, SerializationError) as exc:  # a reference that does not load
                raise SchemaError(f"{where}: its references do not load: {exc}") from exc

        missing = SchemaError(f"{where}: a schema it references is not in the registry")
        self._call(resolve, f"the references of {where}", missing=missing)
        try:
            root = _str_to_proto(_ROOT_FILE, registered.schema_str or "")
        except Exception as exc:  # base64 and descriptor parse errors of one broken schema come as several types
            raise SchemaError(f"{where} is not a serialized Protobuf file descriptor: {exc}") from exc
        add_file(pool, root, where=where)
        return ProtobufSchema(root, pool, where)

    def _compile_text(self, registered: Schema, where: str) -> ProtobufSchema:
        """A schema in ``.proto`` text: it and its references (fetched as text) compiled by protoc."""
        files = {_ROOT_FILE: registered.schema_str or ""}
        self._collect_references(registered, files, where)
        return schema_of(compile_proto_texts(files, _ROOT_FILE, where=where), _ROOT_FILE, where=where)

    def _collect_references(self, schema: Schema, files: dict[str, str], where: str) -> None:
        for ref in schema.references or []:
            if ref.name is None or ref.subject is None or ref.version is None:
                raise SchemaError(f"{where}: a reference lacks its name, subject or version: {ref}")
            if _is_builtin(ref.name) or ref.name in files:
                continue  # the well-known and Confluent types come with protoc and the pool
            subject, version = ref.subject, ref.version
            found = self._call(functools.partial(self.client.get_version, subject, version),
                               f"reference '{ref.name}' of {where}",
                               missing=SchemaError(f"{where}: reference '{ref.name}' ({subject} version {version}) "
                                                   "is not in the registry"))
            files[ref.name] = found.schema.schema_str or ""
            self._collect_references(found.schema, files, where)


class LocalSchemas:
    """No registry: every record is read with the schema file; only ``schema_id`` (if set) is a known id."""

    def __init__(self, schema: ProtobufSchema, schema_id: int | None) -> None:
        self.schema = schema
        self.schema_id = schema_id
        self.description = f"schema file {schema.where} (no registry; known id: {schema_id})" \
            if schema_id is not None else f"schema file {schema.where}"

    def fetch(self, schema_id: int) -> ProtobufSchema:
        if self.schema_id is not None and schema_id != self.schema_id:
            raise UnknownSchemaId(schema_id)
        return self.schema


def make_protobuf_format(spec: FormatSpec) -> ProtobufConfluentFormat:
    """The protobuf-confluent format ``spec`` describes (see the module doc for where its schema comes from)."""
    registry = RegistryProtobufSchemas(spec.registry_url) if spec.registry_url is not None else None
    schema_id = spec.schema_id
    if spec.schema is not None:
        schema = load_schema_file(spec.schema)
    elif registry is None:
        raise SchemaError("protobuf-confluent needs a schema: `schema` (a .proto file or descriptor set) or "
                          "`registry_url` (with `schema_id`, or the subject of `topic`)")
    elif schema_id is not None:
        schema = _configured_id(registry, schema_id)
    else:
        schema_id, schema = registry.latest(subject_name(spec.subject_strategy, spec.topic, spec.message))
    writers: WriterSchemas = registry if registry is not None else LocalSchemas(schema, schema_id)
    return ProtobufConfluentFormat(ReaderType(schema, spec.message), writers, schema_id=schema_id, spec=spec)


def _configured_id(registry: RegistryProtobufSchemas, schema_id: int) -> ProtobufSchema:
    try:
        return registry.fetch(schema_id)
    except UnknownSchemaId:
        raise SchemaError(f"protobuf-confluent schema_id {schema_id} is not in {registry.description}") from None


class ReaderType:
    """The message type a format's batches hold, and why it is that one (see the module doc for the rules).

    ``why`` ends every failure of a record of another type, so a dead letter says whether the type was set
    by ``message`` or chosen by the first record, and how to choose another.
    """

    def __init__(self, schema: ProtobufSchema, message: str | None) -> None:
        self.schema = schema
        self.mapping: MessageMapping | None = None
        if message is not None:
            self.why = "set by `message`"
        elif len(schema.top_level_names()) <= 1:
            self.why = "the schema's only top-level message type"
        else:
            self.why = "the type of the first record it read; set `message` to read another"
            return
        self.mapping = MessageMapping(schema.message(message), where=schema.where)

    def reading(self, writer: Descriptor, framing: str) -> MessageMapping | str:
        """The mapping records of ``writer`` (named by ``framing``) read into, or why they are not read.
        With no reader type yet, ``writer``'s type in the reader schema becomes it."""
        if self.mapping is None:
            return self._choose(writer, framing)
        reader = self.mapping.descriptor.full_name
        if writer.full_name != reader:
            return f"record is message {writer.full_name} ({framing}); this source reads {reader} ({self.why})"
        return self.mapping

    def for_encoding(self) -> MessageMapping:
        """The reader type; with none chosen yet the schema has several, and ``message(None)`` refuses that
        with the ``SchemaError`` that lists them and asks for ``message``."""
        if self.mapping is None:  # several top-level types, and no record chose one
            self.schema.message(None)  # raises
        assert self.mapping is not None
        return self.mapping

    def _choose(self, writer: Descriptor, framing: str) -> MessageMapping | str:
        declared = self.schema.declared(writer.full_name)
        if declared is None:
            return (f"record is message {writer.full_name} ({framing}), which the reader schema from "
                    f"{self.schema.where} does not declare")
        try:
            self.mapping = MessageMapping(declared, where=self.schema.where)
        except SchemaError as exc:
            return f"record is message {writer.full_name} ({framing}), which this source cannot read: {exc}"
        log.info("protobuf reader type chosen by the first record's message index",
                 extra={"message_type": writer.full_name, "framing": framing})
        return self.mapping


class ProtobufConfluentFormat:
    """Protobuf in the Confluent wire format, decoded into one reader message type (see module doc)."""

    name = NAME

    def __init__(self, reader: ReaderType, writers: WriterSchemas, *, schema_id: int | None,
                 spec: FormatSpec) -> None:
        self._reader = reader
        self._writers = writers
        self._spec = spec
        self._schema_id = schema_id
        self._readers: dict[tuple[int, tuple[int, ...]], MessageMapping] = {}  # (id, path) -> the reader type
        self._header: bytes | None = None

    @property
    def arrow_schema(self) -> pa.Schema | None:
        """The reader type's columns; None until a record chose it (see module doc)."""
        return self._reader.mapping.arrow_schema if self._reader.mapping is not None else None

    @property
    def message_class(self) -> type[Message]:
        """The generated class of the reader message type (to build or compare messages in tests and tools)."""
        return self._reader.for_encoding().message_class

    def decode(self, payloads: Sequence[bytes | None]) -> Decoded:
        messages: list[Message] = []
        indices: list[int] = []
        failures: list[DecodeFailure] = []
        unreadable: dict[tuple[int, tuple[int, ...]], str] = {}  # this call's reasons (an id may appear later)
        headers = _Headers()
        for index, payload in enumerate(payloads):
            problem = self._read_into(messages, payload, headers, unreadable)
            if problem is None:
                indices.append(index)
            else:
                failures.append(DecodeFailure(index, problem))
        return self._decoded(messages, indices, failures)

    def encode(self, batch: pa.RecordBatch) -> list[bytes]:
        writer = self._reader.for_encoding()
        header = self._header if self._header is not None else self._header_of(writer.descriptor)
        return [header + message.SerializeToString() for message in writer.to_messages(batch)]

    # -- decode ------------------------------------------------------------------------------------------------

    def _read_into(self, messages: list[Message], payload: bytes | None, headers: _Headers,
                   unreadable: dict[tuple[int, tuple[int, ...]], str]) -> str | None:
        """Append the payload's message and return None, or return why it cannot be decoded."""
        problem = header_problem(payload)
        if problem is not None:
            return problem
        assert payload is not None
        try:
            schema_id, path, start = headers.read(payload)
        except (EOFError, SerializationError) as exc:
            return f"invalid message-index array after the schema id: {exc}"
        key = (schema_id, path)
        reader = self._readers.get(key) or unreadable.get(key) or self._readability(key)
        if isinstance(reader, str):
            unreadable[key] = reader
            return reader
        try:
            message = reader.message_class.FromString(payload[start:])
        except (DecodeError, RuntimeError, ValueError) as exc:
            return (f"Protobuf message bytes ({len(payload) - start} after the header) do not parse as "
                    f"{reader.descriptor.full_name} (schema id {schema_id}): {exc}")
        if reader.has_required and not message.IsInitialized():  # upb's parser does not check them
            return (f"Protobuf message {reader.descriptor.full_name} (schema id {schema_id}) lacks required "
                    f"field(s): {', '.join(cast(Any, message).FindInitializationErrors())}")  # generated, not in stubs
        messages.append(message)
        return None

    def _readability(self, key: tuple[int, tuple[int, ...]]) -> MessageMapping | str:
        """The reader type when records of this schema id and message-index path read into it, else why not.

        Only successes are kept across calls: an unknown id may be registered by the next batch.
        """
        schema_id, path = key
        try:
            schema = self._writers.fetch(schema_id)
        except UnknownSchemaId:
            return f"unknown schema id {schema_id} (not found in {self._writers.description})"
        except RegistryUnavailable:
            raise  # an outage: every record would fail, so the job must stop instead
        except SchemaError as exc:  # a JSON or Avro schema's id, or a schema that does not load: these records
            return f"schema id {schema_id} is not a readable Protobuf schema: {exc}"
        try:
            writer = schema.message_at(path)
        except BadMessageIndex as exc:
            return f"bad message index {list(path)} for schema id {schema_id}: {exc}"
        reader = self._reader.reading(writer, f"schema id {schema_id}, message index {list(path)}")
        if isinstance(reader, str):
            return reader
        clash = incompatibility(writer, reader.descriptor)
        if clash is not None:
            return (f"records written with schema id {schema_id} cannot be read into the reader schema from "
                    f"{reader.where}: {clash}")
        self._readers[key] = reader
        return reader

    def _decoded(self, messages: list[Message], indices: list[int], failures: list[DecodeFailure]) -> Decoded:
        """The batch of ``messages``; messages whose values Arrow cannot hold are isolated into failures.
        Before a record chose the reader type nothing decoded, and the batch has no columns."""
        reader = self._reader.mapping
        if reader is None:
            return Decoded(empty_batch(pa.schema([])), indices, failures)
        try:
            return Decoded(reader.to_batch(messages), indices, failures)
        except (pa.ArrowInvalid, OverflowError):
            kept_messages, kept_indices = [], []
            for message, index in zip(messages, indices):
                try:
                    reader.to_batch([message])
                except (pa.ArrowInvalid, OverflowError) as exc:
                    failures.append(DecodeFailure(index, f"Protobuf message {reader.descriptor.full_name} "
                                                         f"holds a value its Arrow column cannot: {exc}"))
                    continue
                kept_messages.append(message)
                kept_indices.append(index)
            failures.sort(key=lambda failure: failure.index)
            return Decoded(reader.to_batch(kept_messages), kept_indices, failures)

    # -- encode ------------------------------------------------------------------------------------------------

    def _header_of(self, descriptor: Descriptor) -> bytes:
        """The header of ``descriptor``'s records, made on first encode: with ``schema_id``, else with the id
        of the schema file's registration (registered, or looked up)."""
        schema_id = self._schema_id if self._schema_id is not None else self._registered_id(descriptor)
        self._header = _header(schema_id, descriptor)
        return self._header

    def _registered_id(self, descriptor: Descriptor) -> int:
        if not isinstance(self._writers, RegistryProtobufSchemas):
            raise SchemaError("protobuf-confluent encode needs schema_id (the id written after the magic byte) "
                              "or registry_url (to register the schema or look it up)")
        subject = subject_name(self._spec.subject_strategy, self._spec.topic, descriptor.full_name)
        schema_id = register_file(self._writers.client, subject, descriptor.file, self._spec.auto_register)
        log.info("protobuf schema id for encoding", extra={"subject": subject, "schema_id": schema_id})
        return schema_id


class _Headers:
    """The headers of one decode call, read by confluent-kafka's ``SchemaId``, each distinct one once.

    The message-index array is self-delimiting (a length, then that many varints), so a payload that starts
    with exactly the bytes of the last header read has the same schema id and path: that read is reused.
    """

    def __init__(self) -> None:
        self._last: bytes | None = None
        self._read: tuple[int, tuple[int, ...], int] = (0, (), 0)

    def read(self, payload: bytes) -> tuple[int, tuple[int, ...], int]:
        """Schema id, message-index path and where the message starts (``payload`` passed ``header_problem``)."""
        if self._last is not None and payload.startswith(self._last):
            return self._read
        buffer = io.BytesIO(payload)
        header = SchemaId(PROTOBUF)
        header.from_bytes(buffer)
        assert header.id is not None and header.message_indexes is not None  # set for magic byte 0 and PROTOBUF
        self._read = (header.id, tuple(header.message_indexes), buffer.tell())
        self._last = payload[:buffer.tell()]
        return self._read


def _header(schema_id: int, descriptor: Descriptor) -> bytes:
    """Magic byte, schema id and the message's index path, written by confluent-kafka as its serializer does."""
    return SchemaId(PROTOBUF, schema_id, None, _create_index_array(descriptor)).id_to_bytes()


# -- registration -----------------------------------------------------------------------------------------------

def register_file(client: SchemaRegistryClient, subject: str, file: FileDescriptor, auto_register: bool) -> int:
    """The id of ``file`` under ``subject``, registered (``auto_register``) or looked up by ``schemas.registry``."""
    return register_or_lookup(client, subject, _registry_schema(client, file, auto_register), auto_register)


def _registry_schema(client: SchemaRegistryClient, file: FileDescriptor, auto_register: bool) -> Schema:
    """``file`` as ``ProtobufSerializer`` registers it: serialized, with its imports (other than the well-known
    and Confluent types) registered under their file names and listed as references (name, subject, version)."""
    references = []
    for dependency in file.dependencies:
        if _is_builtin(dependency.name):
            continue
        schema = _registry_schema(client, dependency, auto_register)
        register_or_lookup(client, dependency.name, schema, auto_register)
        references.append(SchemaReference(dependency.name, dependency.name, _version(client, dependency.name, schema)))
    return Schema(_schema_to_str(file), PROTOBUF, references)


def _version(client: SchemaRegistryClient, subject: str, schema: Schema) -> int:
    """The version of ``schema`` under ``subject`` (just registered or found: the look-up is cached)."""
    try:
        version = client.lookup_schema(subject, schema).version
    except SchemaRegistryError as exc:
        raise SchemaError(f"{describe(client)} has no version of reference '{subject}': {exc}") from exc
    except Exception as exc:  # transport failures (refused, timeout) come as assorted types
        raise RegistryUnavailable(f"{describe(client)} is unreachable to look up reference '{subject}': "
                                  f"{type(exc).__name__}: {exc}") from exc
    assert version is not None  # a found schema always has its version
    return version
