"""Confluent wire format: magic byte 0, a 4-byte big-endian schema id, then a schemaless Avro body.

Writer schemas are looked up by id, either in a Schema Registry (``confluent_kafka.schema_registry``) or in
a directory of ``<id>.avsc`` files, and cached per id. Every decoded batch has ONE Arrow schema, that of
the *reader* schema: the spec's schema file if given, else the schema of the spec's ``schema_id``, else the
schema of the first id seen (so ``arrow_schema`` is None until the first decode). Records written with
other ids are read through Avro schema resolution (fastavro) into the reader schema; an id whose schema
cannot be resolved into it fails those records, not the batch. A batch whose values all carry the reader
schema's header is read whole from its Arrow binary column (``AvroCodec.read_columns``: in C for records of
primitive fields), and encoding writes the header and the records into one binary column the same way.

Encode writes the spec's ``schema_id``; without one, with a registry and a schema file, it writes the id of
that schema under the subject ``subject_strategy`` names (the record name is the Avro record's full name):
registered there with ``auto_register``, else looked up, and a ``SchemaError`` naming the subject when it is
not there (``schemas.registry``, shared with the other Confluent formats). That happens at the first
encode, so a source reading with the same spec never registers anything.

An unknown id is a DecodeFailure naming the id; a registry that cannot be reached (or a schema file that
cannot be parsed) raises ``SchemaError``: that is an outage or a configuration error, not a bad record,
and must not send every record to the dead-letter topic.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import fastavro
import pyarrow as pa

from schemas.arrow_batches import empty_batch
from schemas.avro_arrow import AvroSchema, load_avro_schema, parse_avro_schema, physical_avro_schema
from schemas.avro_format import AvroCodec, ParsedSchema, body_failure, varint_suspects
from schemas.base import Decoded, DecodeFailure, SchemaError
from schemas.registry import (
    HEADER_SIZE,
    MAGIC_BYTE,
    SubjectRegistration,
    UnknownSchemaId,
    connect,
    fetch_schema,
    framed,
    header_problem,
    schema_id_of,
    wire_header,
)

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient

__all__ = ["HEADER_SIZE", "MAGIC_BYTE", "ConfluentAvroFormat", "DirectorySchemaSource", "RegistrySchemaSource",
           "SchemaSource", "UnknownSchemaId", "avro_full_name"]

log = logging.getLogger(__name__)


class SchemaSource(Protocol):
    """Where writer schemas come from, by id; ``registry`` is the client when they come from a registry."""

    description: str
    registry: SchemaRegistryClient | None

    def fetch(self, schema_id: int) -> AvroSchema:
        """The Avro schema registered under ``schema_id``; ``UnknownSchemaId`` if there is none."""


class RegistrySchemaSource:
    """Schemas from a Confluent Schema Registry (``GET /schemas/ids/{id}``) via confluent-kafka's client."""

    def __init__(self, url: str) -> None:
        self.description = f"schema registry {url}"
        self.registry: SchemaRegistryClient | None = connect(url)

    def fetch(self, schema_id: int) -> AvroSchema:
        assert self.registry is not None
        registered = fetch_schema(self.registry, schema_id)
        if registered.schema_type not in (None, "AVRO"):
            raise SchemaError(f"{self.description}: schema id {schema_id} is {registered.schema_type}, not AVRO")
        where = f"{self.description} id {schema_id}"
        try:
            schema_text = cast(str, registered.schema_str)  # always set in a registry response
            return parse_avro_schema(json.loads(schema_text), where=where)
        except json.JSONDecodeError as exc:
            raise SchemaError(f"{where} is not valid JSON: {exc}") from exc


class DirectorySchemaSource:
    """Schemas from local files ``<directory>/<id>.avsc``."""

    def __init__(self, directory: Path) -> None:
        if not Path(directory).is_dir():
            raise SchemaError(f"avro-confluent schema_dir {directory} is not a directory")
        self.directory = Path(directory)
        self.description = f"schema directory {directory}"
        self.registry: SchemaRegistryClient | None = None

    def fetch(self, schema_id: int) -> AvroSchema:
        path = self.directory / f"{schema_id}.avsc"
        if not path.is_file():
            raise UnknownSchemaId(schema_id)
        return load_avro_schema(path)


@dataclass(frozen=True)
class _Writer:
    """How records of one schema id are read: ``parsed`` is None when the writer IS the reader schema."""

    parsed: ParsedSchema | None


def avro_full_name(schema: AvroSchema) -> str | None:
    """The full name of a named Avro type (``namespace.name``): its record name for subject strategies."""
    if not isinstance(schema, dict) or not isinstance(schema.get("name"), str):
        return None
    name: str = schema["name"]
    namespace = schema.get("namespace")
    return f"{namespace}.{name}" if namespace and "." not in name else name


class ConfluentAvroFormat:
    """Avro in the Confluent wire format, decoded into one reader schema (see module doc)."""

    name = "avro-confluent"

    def __init__(self, source: SchemaSource, *, reader: AvroCodec | None = None, schema_id: int | None = None,
                 registration: SubjectRegistration | None = None) -> None:
        self._source = source
        self._schemas: dict[int, AvroSchema] = {}
        self._writers: dict[int, _Writer] = {}
        self._encoder: tuple[bytes, AvroCodec] | None = None
        self._schema_file = reader  # what encode registers or looks up when there is no schema_id
        self._registration = registration or SubjectRegistration()
        if schema_id is not None:
            try:
                codec = AvroCodec(self._schema(schema_id), source=f"{source.description} id {schema_id}")
            except UnknownSchemaId:
                raise SchemaError(f"avro-confluent schema_id {schema_id} is not in {source.description}") from None
            self._encoder = (wire_header("AVRO", schema_id), codec)
            if reader is None:
                reader = codec
        self._reader = reader

    @property
    def arrow_schema(self) -> pa.Schema | None:
        return self._reader.arrow_schema if self._reader is not None else None

    def decode(self, payloads: Sequence[bytes | None]) -> Decoded:
        return self.decode_column(pa.array(payloads, pa.binary()))

    def decode_column(self, values: pa.BinaryArray) -> Decoded:
        writer_or_reason = functools.cache(self._writer_or_reason)  # an unknown id is looked up once per batch
        if (whole := self._read_columns(values, writer_or_reason)) is not None:
            return whole
        return self._decode_records(values.to_pylist(), writer_or_reason)

    def _decode_records(self, payloads: Sequence[bytes | None],
                        writer_or_reason: Callable[[int], _Writer | str]) -> Decoded:
        """Record by record in fastavro, through each payload's writer schema: each bad payload becomes a
        failure that names its problem."""
        records: list[dict[str, Any]] = []
        indices: list[int] = []
        failures: list[DecodeFailure] = []
        suspects = varint_suspects(payloads)
        for index, payload, schema_id, writer in framed(payloads, writer_or_reason):
            problem = writer if isinstance(writer, str) else self._read_into(
                records, payload, schema_id, writer, exact=index in suspects)
            if problem is None:
                indices.append(index)
            else:
                failures.append(DecodeFailure(index, problem))
        if self._reader is None:  # nothing decoded yet, so no reader schema has been chosen
            return Decoded(empty_batch(pa.schema([])), indices, failures)
        return self._reader.decoded(records, indices, failures)

    def encode(self, batch: pa.RecordBatch) -> list[bytes]:
        return cast(list[bytes], self._encoded(batch).to_pylist())

    def encode_column(self, batch: pa.RecordBatch) -> pa.ChunkedArray[Any]:
        return pa.chunked_array([self._encoded(batch)], pa.binary())

    def _encoded(self, batch: pa.RecordBatch) -> pa.BinaryArray:
        if self._encoder is None:
            self._encoder = self._registered_encoder()
        header, codec = self._encoder
        return codec.encode_values(batch, prefix=header)

    def _registered_encoder(self) -> tuple[bytes, AvroCodec]:
        """The schema file's id under the subject: registered or looked up (see module doc)."""
        client, codec = self._source.registry, self._schema_file
        if client is None or codec is None:
            raise SchemaError("avro-confluent encode needs schema_id (the id written after the magic byte), or "
                              "registry_url and a schema file to register or look up under the subject")
        from confluent_kafka.schema_registry import Schema

        record_name = avro_full_name(codec.avro_schema)
        schema = Schema(json.dumps(codec.avro_schema), schema_type="AVRO")
        schema_id = self._registration.schema_id(client, schema, record_name)
        log.info("avro-confluent encode schema id resolved",
                 extra={"schema_id": schema_id, "subject": self._registration.subject(record_name)})
        return wire_header("AVRO", schema_id), codec

    def _read_columns(self, values: pa.BinaryArray,
                      writer_or_reason: Callable[[int], _Writer | str]) -> Decoded | None:
        """The batch decoded column-wise when the first value's schema id is the reader schema (see
        ``AvroCodec.read_columns``, which checks that every value has that same header); else None."""
        first = values[0].as_py() if len(values) else None
        if first is None or header_problem(first) is not None:
            return None
        writer = writer_or_reason(schema_id_of(first))
        if isinstance(writer, str) or writer.parsed is not None:
            return None
        assert self._reader is not None  # chosen by _writer at the latest
        return self._reader.read_columns(values, prefix=first[:HEADER_SIZE])

    def _writer_or_reason(self, schema_id: int) -> _Writer | str:
        try:
            return self._writer(schema_id)
        except UnknownSchemaId:
            return f"unknown schema id {schema_id} (not found in {self._source.description})"

    def _read_into(self, records: list[dict[str, Any]], payload: bytes, schema_id: int, writer: _Writer, *,
                   exact: bool) -> str | None:
        """Append the payload's record and return None, or return why it could not be decoded."""
        assert self._reader is not None  # chosen by _writer at the latest
        try:
            records.append(self._reader.read_body(payload, HEADER_SIZE, writer.parsed, exact=exact))
        except fastavro.read.SchemaResolutionError as exc:
            return (f"records written with schema id {schema_id} cannot be read into the reader schema from "
                    f"{self._reader.source}: {exc}")
        except Exception as exc:  # noqa: BLE001 - any other fastavro error means this one payload is bad
            return body_failure(exc, len(payload), f"schema id {schema_id}")
        return None

    def _writer(self, schema_id: int) -> _Writer:
        cached = self._writers.get(schema_id)
        if cached is not None:
            return cached
        schema = self._schema(schema_id)
        if self._reader is None:
            self._reader = AvroCodec(schema, source=f"{self._source.description} id {schema_id}")
            log.info("reader schema chosen from first schema id", extra={"schema_id": schema_id})
        physical = physical_avro_schema(schema)
        same = physical == physical_avro_schema(self._reader.avro_schema)
        writer = _Writer(parsed=None if same else fastavro.parse_schema(physical))
        self._writers[schema_id] = writer
        return writer

    def _schema(self, schema_id: int) -> AvroSchema:
        schema = self._schemas.get(schema_id)
        if schema is None:
            schema = self._source.fetch(schema_id)
            self._schemas[schema_id] = schema
        return schema
