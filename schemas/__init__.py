"""Wire formats (JSON, Avro, Confluent Avro, Protobuf and JSON Schema, raw) and their mapping to and from Arrow."""

from schemas.base import Decoded, DecodeFailure, EncodeError, Format, SchemaError
from schemas.factory import FormatSpec, make_format

__all__ = ["DecodeFailure", "Decoded", "EncodeError", "Format", "FormatSpec", "SchemaError", "make_format"]
