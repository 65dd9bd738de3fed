"""Building a ``Format`` from its configuration: the one entry point the rest of epochline uses."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import pyarrow as pa

from schemas.arrow_ipc import ArrowIpcFormat
from schemas.base import Format, SchemaError
from schemas.json_format import JsonFormat
from schemas.json_schema import json_schema_to_arrow, load_json_document
from schemas.raw import RawFormat

if TYPE_CHECKING:
    from schemas.confluent import SchemaSource

FormatName = Literal["json", "avro", "avro-confluent", "protobuf-confluent", "json-confluent", "raw", "arrow-ipc"]
SubjectStrategy = Literal["topic", "record", "topic-record"]
"""Confluent's subject name strategies: ``<topic>-value``, ``<record name>``, ``<topic>-<record name>``."""


@dataclass(frozen=True)
class FormatSpec:
    """How message values are encoded, and where their schema comes from.

    ``schema``: an ``.avsc`` (Avro) file, or for ``json`` also a JSON Schema ``.json`` file (optional: without
    it, types are inferred per batch). ``avro-confluent`` resolves writer schemas by id from
    ``registry_url`` (a Confluent Schema Registry) or ``schema_dir`` (``<id>.avsc`` files); ``schema`` is then
    the reader schema, and ``schema_id`` the id that encode writes (and the default reader schema). Without
    ``schema_id``, encode with a registry and a schema file registers or looks up that schema as below.

    ``protobuf-confluent`` and ``json-confluent`` take their schema from ``registry_url`` (by ``schema_id``,
    else the latest version of the subject) or from ``schema`` (a ``.proto`` file, a compiled descriptor set
    ``.desc``/``.pb``, or a JSON Schema ``.json``); ``message`` pins the Protobuf message type (without it, a
    file with several types is read as the type the first record's message-index array names, see
    ``schemas.protobuf_format``; encoding needs it). Encoding registers the schema under the subject
    ``subject_strategy`` names (from ``topic``) when ``auto_register`` is on, else looks it up and fails when
    it is not registered.
    """

    format: FormatName
    schema: Path | None = None
    registry_url: str | None = None
    schema_dir: Path | None = None
    schema_id: int | None = None
    message: str | None = None
    auto_register: bool = True
    subject_strategy: SubjectStrategy = "topic"
    topic: str | None = None


def make_format(spec: FormatSpec) -> Format:
    """The format ``spec`` describes; a bad configuration raises ``SchemaError`` naming the file or field.

    The Avro, Confluent and Protobuf modules are imported when a spec names their format: fastavro and the
    Avro modules cost a start that reads and writes JSON about 50 ms (``python -X importtime``)."""
    if spec.format == "raw":
        return RawFormat()
    if spec.format == "arrow-ipc":
        return ArrowIpcFormat()
    if spec.format == "json":
        if spec.schema is None:
            return JsonFormat(None)
        return JsonFormat(_json_format_schema(Path(spec.schema)), source=str(spec.schema))
    if spec.format == "avro":
        from schemas.avro_format import AvroCodec, AvroFormat

        if spec.schema is None:
            raise SchemaError("avro format needs a schema: the .avsc file the records were written with")
        return AvroFormat(AvroCodec.from_file(Path(spec.schema)))
    if spec.format == "avro-confluent":
        from schemas.avro_format import AvroCodec
        from schemas.confluent import ConfluentAvroFormat
        from schemas.registry import SubjectRegistration

        reader = AvroCodec.from_file(Path(spec.schema)) if spec.schema is not None else None
        return ConfluentAvroFormat(_schema_source(spec), reader=reader, schema_id=spec.schema_id,
                                   registration=SubjectRegistration.from_spec(spec))
    if spec.format == "protobuf-confluent":
        try:
            from schemas.protobuf_format import make_protobuf_format
        except ImportError as error:
            raise SchemaError(f"protobuf-confluent needs the protobuf libraries ({error}); install them with: "
                              "pip install 'epochline[protobuf]'") from error
        return make_protobuf_format(spec)
    if spec.format == "json-confluent":
        from schemas.json_confluent import make_json_confluent_format

        return make_json_confluent_format(spec)
    raise SchemaError(f"unknown format {spec.format!r}: expected json, avro, avro-confluent, protobuf-confluent, "
                      "json-confluent, raw or arrow-ipc")


def _json_format_schema(path: Path) -> pa.Schema:
    """A JSON Schema document, or an Avro record schema (``.avsc``, or JSON whose type is "record")."""
    document = load_json_document(path, "schema")
    is_avro = path.suffix == ".avsc" or (isinstance(document, dict) and document.get("type") == "record")
    if is_avro:
        from schemas.avro_arrow import avro_to_arrow_schema, parse_avro_schema

        return avro_to_arrow_schema(parse_avro_schema(document, where=str(path)), where=str(path))
    return json_schema_to_arrow(document, where=str(path))


def _schema_source(spec: FormatSpec) -> SchemaSource:
    from schemas.confluent import DirectorySchemaSource, RegistrySchemaSource

    if (spec.registry_url is None) == (spec.schema_dir is None):
        raise SchemaError("avro-confluent needs exactly one of registry_url and schema_dir to resolve schema ids")
    if spec.registry_url is not None:
        return RegistrySchemaSource(spec.registry_url)
    assert spec.schema_dir is not None
    return DirectorySchemaSource(Path(spec.schema_dir))
