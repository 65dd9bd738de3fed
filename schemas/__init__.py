"""Wire formats (JSON, Avro, Confluent Avro, raw) and their mapping to and from Apache Arrow."""

from schemas.base import Decoded, DecodeFailure, EncodeError, Format, SchemaError
from schemas.factory import FormatSpec, make_format

__all__ = ["DecodeFailure", "Decoded", "EncodeError", "Format", "FormatSpec", "SchemaError", "make_format"]
