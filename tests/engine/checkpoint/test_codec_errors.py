"""No traceback for a record problem: every error class the codecs (``schemas/``) define ends as a dead letter
with its reason (one record) or as the connector's one-line error with exit code 2 (a config problem).

Runs on the broker-free driver, which runs the real pipeline and encodes with the sinks' own ``encode_rows``.
"""

from __future__ import annotations

import importlib
import io
import json
import pkgutil
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import fastavro
import orjson
import pyarrow as pa
import pytest

import schemas
from connectors.dead_letter import PoisonRecord
from engine.cli import known_failures
from engine.testing import TransformTestDriver
from engine.testing.connectors import write_config
from schemas import EncodeError, FormatSpec, SchemaError, make_format
from schemas.base import Format

POISON = "poison"


def headers(record: Any) -> dict[str, str]:
    return {name: value.decode() for name, value in record.headers}


def connector(tmp_path: Path, sink: dict[str, Any], on_error: str = "dead-letter", **more: Any) -> Path:
    source_schema = tmp_path / "in.schema.json"
    source_schema.write_text(json.dumps({"type": "object", "required": ["id", "n"], "properties": {
        "id": {"type": "integer"}, "n": {"type": "integer"}}}))
    return write_config(tmp_path, {"name": "codec-errors", "source": {
        "topic": "in", "format": "json", "schema": str(source_schema), "on_error": on_error},
        "sink": {"topic": "out", **sink}, "dead_letter": {"topic": "dlq"}, **more})


def small_int_sink(tmp_path: Path) -> dict[str, Any]:
    """An Avro sink whose ``n`` is an Avro int: an int64 beyond 32 bits does not fit it."""
    path = tmp_path / "out.avsc"
    path.write_text(json.dumps({"type": "record", "name": "Out", "fields": [
        {"name": "id", "type": "long"}, {"name": "n", "type": "int"}]}))
    return {"format": "avro", "schema": str(path)}


# -- a row that does not fit the sink's schema --------------------------------------------------------------------

def test_a_row_that_does_not_fit_the_sink_schema_is_dead_lettered_as_the_record_it_came_from(tmp_path: Path) -> None:
    with TransformTestDriver(connector(tmp_path, small_int_sink(tmp_path))) as driver:
        driver.send([{"id": 1, "n": 1}, {"id": 2, "n": 2**40}, {"id": 3, "n": 3}], key=b"k")

        assert [row["id"] for row in driver.output_rows()] == [1, 3]
        [letter] = driver.dead_letters()
        assert (letter.key, orjson.loads(letter.value or b"")) == (b"k", {"id": 2, "n": 2**40})
        found = headers(letter)
        assert (found["epochline.stage"], found["epochline.topic"], found["epochline.offset"]) == ("encode", "in", "1")
        assert "column 'n'" in found["epochline.reason"] and "int32" in found["epochline.reason"]


def test_a_transformed_row_that_does_not_fit_is_dead_lettered_as_json_naming_the_sink_topic(tmp_path: Path) -> None:
    config = connector(tmp_path, small_int_sink(tmp_path), transform=[{"sql": "SELECT id, n * 2 AS n FROM input"}])
    with TransformTestDriver(config) as driver:
        driver.send([{"id": 1, "n": 1}, {"id": 2, "n": 2**31}])

        assert driver.output_rows() == [{"id": 1, "n": 2}]
        [letter] = driver.dead_letters()
        assert orjson.loads(letter.value or b"") == {"id": 2, "n": 2**32}
        found = headers(letter)
        assert (found["epochline.stage"], found["epochline.topic"], found["epochline.offset"]) == (
            "encode", "out", "-1")


def test_with_on_error_halt_a_row_that_does_not_fit_halts_naming_its_record(tmp_path: Path) -> None:
    with TransformTestDriver(connector(tmp_path, small_int_sink(tmp_path), on_error="halt")) as driver:
        driver.send([{"id": 1, "n": 1}])
        assert len(driver.output()) == 1
        driver.send([{"id": 2, "n": 2**40}])
        with pytest.raises(PoisonRecord, match=r"topic 'in' partition 0 offset 1: encode: .*column 'n'"):
            driver.output()


def test_output_the_sink_format_cannot_write_at_all_is_refused_at_start(tmp_path: Path) -> None:
    config = connector(tmp_path, {"format": "raw"})
    with pytest.raises(SchemaError, match="sink format raw cannot write the output to topic 'out': column value"):
        TransformTestDriver(config)


# -- every error class of the codecs ------------------------------------------------------------------------------

def codec_error_classes() -> list[type[Exception]]:
    """Every exception class a module of ``schemas`` defines."""
    found = []
    for module_info in pkgutil.iter_modules(schemas.__path__):
        module = importlib.import_module(f"schemas.{module_info.name}")
        found += [value for value in vars(module).values() if isinstance(value, type)
                  and issubclass(value, Exception) and value.__module__ == module.__name__]
    return sorted(found, key=lambda kind: kind.__qualname__)


def avro_payload(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def record_schema(field_type: Any) -> dict[str, Any]:
    return {"type": "record", "name": "R", "fields": [{"name": "f", "type": field_type}]}


def avro_format(tmp_path: Path, field_type: Any) -> Format:
    path = tmp_path / "r.avsc"
    path.write_text(json.dumps(record_schema(field_type)))
    return make_format(FormatSpec("avro", schema=path))


def unknown_schema_id(tmp_path: Path) -> tuple[Format, bytes]:
    (tmp_path / "1.avsc").write_text(json.dumps(record_schema("long")))
    return make_format(FormatSpec("avro-confluent", schema_dir=tmp_path)), b"\x00" + struct.pack(">I", 99) + b"\x02"


def bad_message_index(tmp_path: Path) -> tuple[Format, bytes]:
    proto = Path(__file__).parents[2] / "schemas" / "protos" / "all_types.proto"
    fmt = make_format(FormatSpec("protobuf-confluent", schema=proto, message="epochline.test.Everything", schema_id=1))
    return fmt, b"\x00" + struct.pack(">I", 1) + b"\x02\x14"  # one index, 10: the file has two messages


def time_out_of_range(tmp_path: Path) -> tuple[Format, bytes]:
    return (avro_format(tmp_path, {"type": "int", "logicalType": "time-millis"}),
            avro_payload(record_schema("int"), {"f": 90_000_000}))


def decimal_overflow(tmp_path: Path) -> tuple[Format, bytes]:
    return (avro_format(tmp_path, {"type": "bytes", "logicalType": "decimal", "precision": 2, "scale": 0}),
            avro_payload(record_schema("bytes"), {"f": (1000).to_bytes(2, "big")}))


def bytes_after_the_record(tmp_path: Path) -> tuple[Format, bytes]:
    return avro_format(tmp_path, "long"), avro_payload(record_schema("long"), {"f": 7}) + b"\x00"


def two_objects_in_one_payload(tmp_path: Path) -> tuple[Format, bytes]:
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"id": {"type": "integer"}}}))
    return make_format(FormatSpec("json", schema=schema)), b'{"id": 1}{"id": 2}'


DECODE_ONLY = {
    "UnknownSchemaId": unknown_schema_id,
    "BadMessageIndex": bad_message_index,
    "ValueOutOfRange": time_out_of_range,
    "DecimalOverflow": decimal_overflow,
    "_RowCountMismatch": two_objects_in_one_payload,
    "_TrailingBytes": bytes_after_the_record,
    "_Malformed": bytes_after_the_record,
}
"""The classes a codec raises and catches itself while decoding, each with a payload that raises it (the
Avro column reader's ``_Malformed`` where the C reader is not used): the payload becomes a ``DecodeFailure``,
which the source dead-letters (tests/engine/testing/test_driver.py)."""


class RaisingFormat:
    """A sink format whose encode raises ``error`` for a batch holding a poison row (the fake of a codec)."""

    def __init__(self, inner: Format, error: Exception) -> None:
        self.name = inner.name
        self._inner = inner
        self._error = error

    @property
    def arrow_schema(self) -> pa.Schema | None:
        return self._inner.arrow_schema

    def decode(self, payloads: Sequence[bytes | None]) -> Any:
        return self._inner.decode(payloads)

    def encode(self, batch: pa.RecordBatch) -> Sequence[bytes | None]:
        if POISON in batch.column("note").to_pylist():
            raise self._error
        return self._inner.encode(batch)


@pytest.fixture
def poison_connector(tmp_path: Path) -> Path:
    return write_config(tmp_path, {"name": "codec-errors", "source": {"topic": "in", "format": "json"},
                                   "sink": {"topic": "out", "format": "json"}, "dead_letter": {"topic": "dlq"}})


@pytest.fixture
def sink_raising(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Exception]]:
    """Makes the connector's sink format raise the error put in the list it yields."""
    raised: list[Exception] = []
    import engine.checkpoint.pipeline
    import engine.testing.driver

    def raising_format(config: Any) -> Format:
        return RaisingFormat(make_format(FormatSpec("json")), raised[0])

    monkeypatch.setattr(engine.testing.driver, "sink_format", raising_format)
    monkeypatch.setattr(engine.checkpoint.pipeline, "sink_format", raising_format)
    yield raised


def instance_of(kind: type[Exception]) -> Exception:
    return kind(f"{kind.__name__} raised by the codec")


@pytest.mark.parametrize("kind", codec_error_classes(), ids=lambda kind: kind.__qualname__)
def test_every_codec_error_is_a_dead_letter_or_a_one_line_error(
        kind: type[Exception], poison_connector: Path, sink_raising: list[Exception], tmp_path: Path) -> None:
    if kind.__name__ in DECODE_ONLY:
        fmt, payload = DECODE_ONLY[kind.__name__](tmp_path)
        decoded = fmt.decode([payload])
        assert decoded.batch.num_rows == 0 and len(decoded.failures) == 1
        return
    assert issubclass(kind, EncodeError | SchemaError), f"{kind} is neither a record's nor a config's problem"
    sink_raising.append(instance_of(kind))
    with TransformTestDriver(poison_connector) as driver:
        driver.send([{"id": 1, "note": "fine"}])
        assert len(driver.output()) == 1
        driver.send([{"id": 2, "note": POISON}])
        if issubclass(kind, EncodeError):
            [letter] = driver.dead_letters()
            assert headers(letter)["epochline.reason"] == f"{kind.__name__} raised by the codec"
            assert len(driver.output()) == 1
            return
        with pytest.raises(kind) as raised:
            driver.output()
    assert isinstance(raised.value, known_failures())  # the command line's one line and exit code 2
    assert "\n" not in str(raised.value)
