"""Specification of protobuf-confluent: Protobuf in the Confluent wire format, against confluent-kafka's own
ProtobufSerializer and ProtobufDeserializer, the fake Schema Registry (tests/helpers/schema_registry.py) and
the real broker. The schemas are in tests/schemas/protos/.

The message classes the tests build expected values with are compiled here, independently of the format
(protoc from grpcio-tools into a descriptor pool of their own), as a producer's generated code would be.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import random
import subprocess
import sys
import tempfile
from collections.abc import Hashable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import orjson
import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from connectors.admin import create_topic
from connectors.batch import SourceBatch
from connectors.metadata import METADATA_COLUMNS
from engine.testing import read_values, run_pipeline
from engine.testing.accounting import assert_exactly_once, ids_in
from engine.testing.connectors import produce_keyed, read_batches, write_config
from schemas import EncodeError, FormatSpec, SchemaError, make_format
from schemas.protobuf_format import ProtobufConfluentFormat
from schemas.registry import RegistryUnavailable, SchemaNotRegistered
from tests.helpers import REPO_ROOT

if TYPE_CHECKING:  # imported by pytest as the plugin below; importing it here first would skip assert rewriting
    from tests.helpers.schema_registry import FakeSchemaRegistry

pytest_plugins = ["tests.helpers.schema_registry"]

PROTOS = Path(__file__).parent / "protos"
ALL_TYPES = PROTOS / "all_types.proto"
EVERYTHING = "epochline.test.Everything"
ORDER = "epochline.test.Order"
SERDE_CONF = {"use.deprecated.format": False}
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
TS = pa.timestamp("us", tz="UTC")


def nn(name: str, arrow_type: pa.DataType) -> pa.Field[pa.DataType]:
    return pa.field(name, arrow_type, nullable=False)


def list_of(arrow_type: pa.DataType) -> pa.DataType:
    return pa.list_(nn("item", arrow_type))


def map_of(key: pa.DataType, value: pa.DataType) -> pa.DataType:
    # pyarrow-stubs: map_ also takes a Field as the item type (it carries the values' nullability)
    map_type: pa.DataType = pa.map_(key, nn("value", value))  # type: ignore[call-overload]
    return map_type


ADDRESS = pa.struct([nn("street", pa.string()), pa.field("zip", pa.uint32())])
VISIT = pa.struct([pa.field("at", TS), nn("page", pa.string())])
EVERYTHING_SCHEMA = pa.schema([
    nn("i32", pa.int32()), nn("s32", pa.int32()), nn("sf32", pa.int32()),
    nn("i64", pa.int64()), nn("s64", pa.int64()), nn("sf64", pa.int64()),
    nn("u32", pa.uint32()), nn("f32", pa.uint32()), nn("u64", pa.uint64()), nn("f64", pa.uint64()),
    nn("fl", pa.float32()), nn("db", pa.float64()), nn("flag", pa.bool_()), nn("text", pa.string()),
    nn("blob", pa.binary()), nn("color", pa.string()),
    pa.field("maybe_text", pa.string()), pa.field("maybe_count", pa.int64()), pa.field("maybe_color", pa.string()),
    pa.field("address", ADDRESS),
    nn("tags", list_of(pa.string())), nn("deltas", list_of(pa.int64())), nn("visits", list_of(VISIT)),
    nn("palette", list_of(pa.string())),
    nn("counts", map_of(pa.string(), pa.int64())), nn("addresses", map_of(pa.int32(), ADDRESS)),
    nn("ratios", map_of(pa.bool_(), pa.float64())),
    pa.field("created", TS), nn("history", list_of(TS)),
    pa.field("w_double", pa.float64()), pa.field("w_float", pa.float32()), pa.field("w_int64", pa.int64()),
    pa.field("w_uint64", pa.uint64()), pa.field("w_int32", pa.int32()), pa.field("w_uint32", pa.uint32()),
    pa.field("w_bool", pa.bool_()), pa.field("w_string", pa.string()), pa.field("w_bytes", pa.binary()),
    pa.field("card", pa.string()), pa.field("account", pa.int64()), pa.field("billing", ADDRESS),
])
"""The mapping of all_types.proto's Everything, written out type by type (schemas/protobuf_arrow.py)."""

WRAPPED = ("w_double", "w_float", "w_int64", "w_uint64", "w_int32", "w_uint32", "w_bool", "w_string", "w_bytes")
MAPS = ("counts", "addresses", "ratios")
FLOATS32 = [0.0, -0.0, 1.5, -2.25, 3.0e38, 1.0e-38, float("inf")]  # exactly representable as float32


# -- message classes, compiled independently of the format -------------------------------------------------------

@functools.cache
def compiled(proto: str) -> dict[str, type[Message]]:
    """Every top-level message class of ``protos/<proto>``, by full name, in a descriptor pool of their own."""
    files = descriptor_set(PROTOS / proto)
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    root = files.file[-1]
    return {f"{root.package}.{m.name}": message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"{root.package}.{m.name}")) for m in root.message_type}


def descriptor_set(proto: Path) -> descriptor_pb2.FileDescriptorSet:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.desc"
        subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{proto.parent}",
                        f"-I{resources.files('grpc_tools') / '_proto'}", "--include_imports",
                        f"--descriptor_set_out={out}", str(proto)], check=True)
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def everything_class() -> type[Message]:
    return compiled("all_types.proto")[EVERYTHING]


# -- rows and the messages they stand for --------------------------------------------------------------------------

def everything_rows(count: int, seed: int = 3) -> list[dict[str, Any]]:
    """``count`` rows of Everything as Arrow holds them; every nullable field is null in some, extremes in
    some, map entries ordered by key (as decode orders them). ``sf64`` is the row number (a sort key)."""
    rng = random.Random(seed)
    return [_everything_row(n, rng) for n in range(count)]


def _timestamp(rng: random.Random) -> dt.datetime:
    """Anywhere in the range a Timestamp allows (years 1 to 9999), to the microsecond."""
    low, high = -62_135_596_800 * 10**6, 253_402_300_799 * 10**6
    return EPOCH + dt.timedelta(microseconds=rng.choice([low, high, 0, -1, rng.randrange(low, high)]))


def _everything_row(n: int, rng: random.Random) -> dict[str, Any]:
    colors = ["COLOR_UNSPECIFIED", "RED", "GREEN", "BLUE"]
    address = {"street": f"{n} Main St", "zip": None if n % 3 else rng.randrange(2**32)}
    payment = n % 4
    return {
        "i32": rng.choice([-2**31, 2**31 - 1, 0, rng.randrange(-2**31, 2**31)]),
        "s32": rng.randrange(-2**31, 2**31), "sf32": rng.randrange(-2**31, 2**31),
        "i64": rng.choice([-2**63, 2**63 - 1, rng.randrange(-2**63, 2**63)]),
        "s64": rng.randrange(-2**63, 2**63), "sf64": n,
        "u32": rng.choice([0, 2**32 - 1, rng.randrange(2**32)]), "f32": rng.randrange(2**32),
        "u64": rng.choice([0, 2**64 - 1, rng.randrange(2**64)]), "f64": rng.randrange(2**64),
        "fl": rng.choice(FLOATS32), "db": rng.choice([rng.uniform(-1e300, 1e300), 0.1, -0.0, float("-inf")]),
        "flag": n % 2 == 0, "text": rng.choice(["", "plain", "ünïcødé ✓ 😀", f"row-{n}", "a\nb\x00c"]),
        "blob": rng.randbytes(rng.randrange(0, 12)), "color": colors[n % 4],
        "maybe_text": None if n % 3 == 0 else rng.choice(["", f"maybe-{n}"]),
        "maybe_count": None if n % 4 == 0 else rng.choice([0, -n, 2**62]),
        "maybe_color": None if n % 5 == 0 else colors[(n // 5) % 4],
        "address": None if n % 6 == 0 else address,
        "tags": [f"t{k}" for k in range(n % 4)],
        "deltas": [rng.choice([-2**63, 2**63 - 1, -k]) for k in range(n % 3)],
        "visits": [{"at": None if k % 2 else _timestamp(rng), "page": f"/p{k}"} for k in range(n % 3)],
        "palette": [colors[(n + k) % 4] for k in range(n % 5)],
        "counts": [(f"k{k:02d}", rng.randrange(-2**63, 2**63)) for k in range(n % 4)],
        "addresses": sorted({rng.randrange(-2**31, 2**31): address for _ in range(n % 3)}.items()),
        "ratios": [(False, 0.5), (True, -1.25)][: n % 3],
        "created": None if n % 7 == 0 else _timestamp(rng),
        "history": [_timestamp(rng) for _ in range(n % 3)],
        "w_double": None if n % 2 else rng.choice([0.0, 2.5]), "w_float": None if n % 3 else rng.choice(FLOATS32),
        "w_int64": None if n % 4 else rng.choice([0, -2**63]), "w_uint64": None if n % 5 else 2**64 - 1,
        "w_int32": None if n % 2 == 0 else -n, "w_uint32": None if n % 3 == 1 else n,
        "w_bool": None if n % 3 == 2 else n % 2 == 1, "w_string": None if n % 5 == 1 else rng.choice(["", "w"]),
        "w_bytes": None if n % 2 else b"\x00\xff",
        "card": f"4111-{n}" if payment == 1 else None, "account": -n if payment == 2 else None,
        "billing": address if payment == 3 else None,
    }


def timestamp_of(value: dt.datetime) -> dict[str, int]:
    seconds, micros = divmod((value - EPOCH) // dt.timedelta(microseconds=1), 10**6)
    return {"seconds": seconds, "nanos": micros * 1000}


def message_of(cls: type[Message], row: dict[str, Any]) -> Message:
    """The message ``row`` stands for, built with the generated constructor as a producer would."""
    fields: dict[str, Any] = {}
    for name, value in row.items():
        if value is None:
            continue
        if name in WRAPPED:
            fields[name] = {"value": value}
        elif name == "created":
            fields[name] = timestamp_of(value)
        elif name == "history":
            fields[name] = [timestamp_of(v) for v in value]
        elif name == "visits":
            fields[name] = [{"at": timestamp_of(v["at"]) if v["at"] else None, "page": v["page"]} for v in value]
        elif name in MAPS:
            fields[name] = dict(value)
        else:
            fields[name] = value
    return cls(**fields)


DEFAULTS: dict[str, Any] = {
    "i32": 0, "s32": 0, "sf32": 0, "i64": 0, "s64": 0, "sf64": 0, "u32": 0, "f32": 0, "u64": 0, "f64": 0, "fl": 0.0,
    "db": 0.0, "flag": False, "text": "", "blob": b"", "color": "COLOR_UNSPECIFIED", "tags": [], "deltas": [],
    "visits": [], "palette": [], "counts": [], "addresses": [], "ratios": [], "history": []}
"""The row of an Everything with no field set: the non-nullable columns at Protobuf's defaults."""


def everything_batch(*rows: dict[str, Any]) -> pa.RecordBatch:
    """A batch of Everything rows: ``DEFAULTS`` plus each row's fields (the others null)."""
    return pa.RecordBatch.from_pylist([{**DEFAULTS, **row} for row in rows], schema=EVERYTHING_SCHEMA)


def everything_format(**spec: Any) -> ProtobufConfluentFormat:
    fmt = make_format(FormatSpec("protobuf-confluent", message=EVERYTHING, **spec))
    assert isinstance(fmt, ProtobufConfluentFormat)
    return fmt


def local_format(proto: str = "all_types.proto", schema_id: int | None = 1, schema: Path | None = None,
                 **spec: Any) -> ProtobufConfluentFormat:
    """The format over a schema file (``protos/<proto>`` unless ``schema``), without a registry (writes
    ``schema_id``)."""
    spec.setdefault("message", EVERYTHING if proto == "all_types.proto" else ORDER)
    fmt = make_format(FormatSpec("protobuf-confluent", schema=schema or PROTOS / proto, schema_id=schema_id, **spec))
    assert isinstance(fmt, ProtobufConfluentFormat)
    return fmt


def serializer(registry: FakeSchemaRegistry, cls: type[Message]) -> ProtobufSerializer:
    write: ProtobufSerializer = ProtobufSerializer(cls, SchemaRegistryClient({"url": registry.url}), SERDE_CONF)
    return write


def value_context(topic: str) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE)


def frame(schema_id: int, indexes: bytes, message: Message) -> bytes:
    """A payload framed by hand (magic byte, id, raw message-index bytes), independent of any serializer."""
    return b"\x00" + schema_id.to_bytes(4, "big") + indexes + message.SerializeToString()


# -- the mapping ---------------------------------------------------------------------------------------------------

def test_every_protobuf_type_maps_to_its_arrow_type() -> None:
    assert local_format().arrow_schema.equals(EVERYTHING_SCHEMA)


def test_every_type_survives_encode_then_decode_exactly() -> None:
    fmt = local_format()
    batch = pa.RecordBatch.from_pylist(everything_rows(3_000), schema=fmt.arrow_schema)
    decoded = fmt.decode(fmt.encode(batch))
    assert decoded.failures == []
    assert decoded.batch.equals(batch)


def test_every_type_is_written_by_the_json_format_maps_as_objects_or_key_value_arrays() -> None:
    """A Protobuf topic written as JSON: maps with string keys are objects (as Connect's JsonConverter writes
    them), maps with other keys are arrays of key/value objects, bytes are base64, nested messages objects."""
    fmt = local_format()
    [row] = everything_rows(6, seed=11)[5:]
    decoded = fmt.decode(fmt.encode(everything_batch(row))).batch
    written = orjson.loads(make_format(FormatSpec("json")).encode(decoded)[0])
    assert written["counts"] == {key: value for key, value in row["counts"]}
    assert written["ratios"] == [{"key": key, "value": value} for key, value in row["ratios"]]
    assert written["addresses"] == [{"key": key, "value": value} for key, value in row["addresses"]]
    assert written["tags"] == row["tags"] and written["address"] == row["address"]
    assert written["blob"] == base64.b64encode(row["blob"]).decode()


def test_rows_read_what_a_producers_messages_hold_value_for_value() -> None:
    rows = everything_rows(2_000, seed=8)
    cls = everything_class()
    fmt = local_format()
    decoded = fmt.decode([frame(1, b"\x00", message_of(cls, row)) for row in rows])
    assert decoded.failures == []
    assert decoded.batch.equals(pa.RecordBatch.from_pylist(rows, schema=EVERYTHING_SCHEMA))


def test_unset_fields_read_as_protobuf_reads_them() -> None:
    """Plain proto3 scalars and enums read as their defaults; optional, oneof, wrapper and message fields as
    null; repeated and map fields as empty."""
    [row] = local_format().decode([frame(1, b"\x00", everything_class()())]).batch.to_pylist()
    assert row == {name: DEFAULTS.get(name) for name in EVERYTHING_SCHEMA.names}


def test_wrappers_and_optional_fields_tell_a_set_default_from_unset() -> None:
    cls = everything_class()
    message = cls(w_string={"value": ""}, w_int64={"value": 0}, w_bool={"value": False}, maybe_count=0,
                  maybe_text="", address={}, account=0)
    [row] = local_format().decode([frame(1, b"\x00", message)]).batch.to_pylist()
    assert (row["w_string"], row["w_int64"], row["w_bool"], row["maybe_count"], row["maybe_text"]) == ("", 0, False,
                                                                                                       0, "")
    assert row["address"] == {"street": "", "zip": None}
    assert (row["account"], row["card"], row["billing"]) == (0, None, None)


def test_enum_numbers_the_enum_does_not_declare_read_as_their_digits_and_write_back() -> None:
    fmt = local_format()
    decoded = fmt.decode([frame(1, b"\x00", everything_class()(color=7, palette=[1, 42]))])
    assert decoded.batch.column("color").to_pylist() == ["7"]
    assert decoded.batch.column("palette").to_pylist() == [["RED", "42"]]
    again = fmt.decode(fmt.encode(decoded.batch))
    assert again.batch.equals(decoded.batch)


def test_timestamps_are_microseconds_utc_and_only_sub_microsecond_digits_are_dropped() -> None:
    cls = everything_class()
    payloads = [frame(1, b"\x00", cls(created={"seconds": seconds, "nanos": nanos}))
                for seconds, nanos in [(-1, 999_999_999), (0, 1_999), (253_402_300_799, 999_999_999),
                                       (-62_135_596_800, 0)]]
    created = local_format().decode(payloads).batch.column("created")
    assert created.type == TS
    assert created.cast(pa.int64()).to_pylist() == [-1, 1, 253_402_300_799_999_999, -62_135_596_800_000_000]
    assert created.to_pylist()[2] == dt.datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=dt.UTC)


def test_timestamps_before_1970_encode_with_nanos_counted_forward() -> None:
    fmt = local_format()
    batch = everything_batch({"created": EPOCH - dt.timedelta(microseconds=1)})
    message = everything_class().FromString(fmt.encode(batch)[0][6:])
    assert (message.created.seconds, message.created.nanos) == (-1, 999_999_000)  # type: ignore[attr-defined]


def test_map_entries_come_out_ordered_by_key() -> None:
    message = everything_class()(counts={k: n for n, k in enumerate("zyxwvutsrq")}, ratios={True: 1.0, False: 0.0})
    [row] = local_format().decode([frame(1, b"\x00", message)]).batch.to_pylist()
    assert [k for k, _ in row["counts"]] == sorted("zyxwvutsrq")
    assert row["ratios"] == [(False, 0.0), (True, 1.0)]


def test_proto2_required_fields_are_not_nullable_and_optional_ones_with_defaults_read_null_when_unset() -> None:
    fmt = local_format("legacy_proto2.proto", message="epochline.test.legacy.Reading")
    assert fmt.arrow_schema == pa.schema([nn("sensor", pa.int64()), pa.field("value", pa.float64()),
                                          pa.field("place", pa.struct([pa.field("room", pa.string())]))])
    reading = compiled("legacy_proto2.proto")["epochline.test.legacy.Reading"]
    decoded = fmt.decode([frame(1, b"\x00", reading(sensor=7, place={"room": "lab"})), b"\x00\x00\x00\x00\x01\x00"])
    assert decoded.batch.to_pylist() == [{"sensor": 7, "value": None, "place": {"room": "lab"}}]
    assert decoded.failures[0].reason == ("Protobuf message epochline.test.legacy.Reading (schema id 1) lacks "
                                          "required field(s): sensor")
    assert fmt.decode(fmt.encode(decoded.batch)).batch.equals(decoded.batch)


def test_a_nested_message_type_can_be_read_by_its_full_name() -> None:
    fmt = local_format(message=f"{EVERYTHING}.Visit")
    assert fmt.arrow_schema.equals(pa.schema(list(VISIT)))
    batch = pa.RecordBatch.from_pylist([{"at": EPOCH, "page": "/"}], schema=fmt.arrow_schema)
    [payload] = fmt.encode(batch)
    assert payload[:8] == b"\x00\x00\x00\x00\x01\x04\x00\x00", "message-index array [0, 0]: length 2, then 0, 0"
    assert fmt.decode([payload]).batch.equals(batch)


def test_encoding_a_file_with_several_messages_needs_one_named_and_the_error_lists_them() -> None:
    """Decoding can wait for a record's framing to name the type (below); encoding has no record to ask."""
    several = make_format(FormatSpec("protobuf-confluent", schema=ALL_TYPES, schema_id=1))
    assert several.arrow_schema is None
    with pytest.raises(SchemaError, match=r"declares 2 message types \(epochline\.test\.Everything, "
                                          r"epochline\.test\.Other\): set `message`"):
        several.encode(everything_batch({"sf64": 1}))
    with pytest.raises(SchemaError, match="has no message type 'epochline.test.Nope'"):
        make_format(FormatSpec("protobuf-confluent", schema=ALL_TYPES, schema_id=1, message="epochline.test.Nope"))


def test_a_file_with_one_message_needs_no_name() -> None:
    fmt = make_format(FormatSpec("protobuf-confluent", schema=PROTOS / "order_v1.proto", schema_id=1))
    assert fmt.arrow_schema == pa.schema([nn("id", pa.int64()), nn("customer", pa.string())])


def test_a_compiled_descriptor_set_reads_like_its_proto_file(tmp_path: Path) -> None:
    for suffix in (".desc", ".pb"):
        path = tmp_path / f"all_types{suffix}"
        path.write_bytes(descriptor_set(ALL_TYPES).SerializeToString())
        from_set = local_format(schema=path)
        assert from_set.arrow_schema.equals(EVERYTHING_SCHEMA)
    payload = frame(1, b"\x00", message_of(everything_class(), everything_rows(1)[0]))
    assert from_set.decode([payload]).batch.equals(local_format().decode([payload]).batch)


def test_a_proto_file_that_does_not_compile_is_a_schema_error_with_protocs_message(tmp_path: Path) -> None:
    broken = tmp_path / "broken.proto"
    broken.write_text('syntax = "proto3";\nmessage Broken { strnig name = 1; }\n')
    with pytest.raises(SchemaError, match=r"broken\.proto does not compile: .*strnig"):
        make_format(FormatSpec("protobuf-confluent", schema=broken, schema_id=1))


def test_a_recursive_message_is_a_schema_error_naming_the_field() -> None:
    with pytest.raises(SchemaError, match=r"field 'children': recursive message epochline\.test\.Node -> "
                                          r"epochline\.test\.Node cannot be represented in Arrow"):
        make_format(FormatSpec("protobuf-confluent", schema=PROTOS / "recursive.proto", schema_id=1))


def test_a_schema_file_that_is_neither_proto_nor_descriptor_set_is_a_schema_error(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match="does not exist"):
        make_format(FormatSpec("protobuf-confluent", schema=tmp_path / "missing.proto"))
    (tmp_path / "schema.json").write_text("{}")
    with pytest.raises(SchemaError, match="expected a .proto file or a compiled descriptor set"):
        make_format(FormatSpec("protobuf-confluent", schema=tmp_path / "schema.json"))
    (tmp_path / "garbage.desc").write_bytes(b"\xff\xff\xff")
    with pytest.raises(SchemaError, match="is not a compiled Protobuf descriptor set"):
        make_format(FormatSpec("protobuf-confluent", schema=tmp_path / "garbage.desc"))


def test_without_schema_file_or_registry_there_is_nothing_to_read_with() -> None:
    with pytest.raises(SchemaError, match="needs a schema"):
        make_format(FormatSpec("protobuf-confluent"))


# -- wire format and per-record failures ----------------------------------------------------------------------------

def test_the_header_is_magic_byte_schema_id_and_message_indexes_with_the_first_message_as_one_zero() -> None:
    batch = pa.RecordBatch.from_pylist([{"note": "hi"}])
    [other] = local_format(message="epochline.test.Other", schema_id=258).encode(batch)
    assert other[:7] == b"\x00\x00\x00\x01\x02\x02\x02", "id 258, then [1]: length 1 and index 1, zigzag"
    [first] = local_format(schema_id=258).encode(everything_batch({"i32": 1}))
    assert first[:6] == b"\x00\x00\x00\x01\x02\x00", "[0] is the single byte 0"
    assert everything_class().FromString(first[6:]).i32 == 1  # type: ignore[attr-defined]


def test_confluents_deserializer_reads_what_encode_writes_without_a_registry() -> None:
    rows = everything_rows(500, seed=4)
    fmt = local_format()
    deserializer = ProtobufDeserializer(everything_class(), SERDE_CONF)
    payloads = fmt.encode(pa.RecordBatch.from_pylist(rows, schema=fmt.arrow_schema))
    assert [deserializer(p, None) for p in payloads] == [message_of(everything_class(), row) for row in rows]


BAD_PAYLOADS = [
    (None, "null payload (tombstone)"),
    (b"\x00\x00\x01", "payload too short for Confluent wire format: 3 byte(s)"),
    (b"\x7b\x22id\x22: 1}", "wrong magic byte 0x7b (expected 0x00: not Confluent wire format)"),
    (b"\x00\x00\x00\x00\x01", "invalid message-index array after the schema id: Unexpected EOF"),
    (b"\x00\x00\x00\x00\x01\x02", "invalid message-index array after the schema id: Unexpected EOF"),
    (b"\x00\x00\x00\x00\x01\x02\x0a\x08\x01", "bad message index [5] for schema id 1: the schema from "),
    (b"\x00\x00\x00\x00\x01\x04\x00\x0a\x08\x01", "bad message index [0, 5] for schema id 1: message type "
                                                  "epochline.test.Everything has 4 nested message type(s) "
                                                  "(epochline.test.Everything.Visit, epochline.test.Everything.Count"
                                                  "sEntry, epochline.test.Everything.AddressesEntry, epochline.test."
                                                  "Everything.RatiosEntry), no index 5 (step 2 of the path)"),
    (b"\x00\x00\x00\x00\x01\x02\x02\x0a\x01x", "record is message epochline.test.Other (schema id 1, message index "
                                               "[1]); this source reads epochline.test.Everything (set by `message`)"),
    (b"\x00\x00\x00\x00\x01\x00\x0a\xff", "Protobuf message bytes (2 after the header) do not parse as "
                                          "epochline.test.Everything (schema id 1)"),
    (b"\x00\x00\x00\x00\x07\x00\x08\x01", "unknown schema id 7 (not found in schema file"),
]


@pytest.mark.parametrize(("payload", "reason"), BAD_PAYLOADS)
def test_a_bad_record_is_a_failure_saying_what_is_wrong(payload: bytes | None, reason: str) -> None:
    decoded = local_format().decode([payload])
    assert decoded.indices == []
    assert [f.index for f in decoded.failures] == [0]
    assert reason in decoded.failures[0].reason


def test_a_bad_top_level_index_names_the_schemas_message_count() -> None:
    [failure] = local_format().decode([BAD_PAYLOADS[5][0]]).failures
    assert failure.reason.endswith("has 2 top-level message type(s) (epochline.test.Everything, epochline.test."
                                   "Other), no index 5 (step 1 of the path)")


def test_good_rows_survive_beside_every_kind_of_bad_one() -> None:
    good = [frame(1, b"\x00", everything_class()(sf64=n)) for n in range(3)]
    bad = [payload for payload, _ in BAD_PAYLOADS]
    decoded = local_format().decode([good[0], *bad[:5], good[1], *bad[5:], good[2]])
    assert decoded.indices == [0, 6, 12]
    assert decoded.batch.column("sf64").to_pylist() == [0, 1, 2]
    assert [f.index for f in decoded.failures] == [1, 2, 3, 4, 5, 7, 8, 9, 10, 11]


def test_without_schema_id_every_id_reads_with_the_schema_file() -> None:
    fmt = local_format(schema_id=None)
    decoded = fmt.decode([frame(5, b"\x00", everything_class()(i32=5)), frame(9, b"\x00", everything_class()())])
    assert decoded.failures == []
    with pytest.raises(SchemaError, match="needs schema_id"):
        fmt.encode(everything_batch({"i32": 1}))


def test_a_value_arrow_cannot_hold_fails_only_its_record() -> None:
    cls = everything_class()
    decoded = local_format().decode([frame(1, b"\x00", cls(sf64=1)), frame(1, b"\x00", cls(created={"seconds": 2**62})),
                                     frame(1, b"\x00", cls(sf64=3))])
    assert decoded.indices == [0, 2]
    assert decoded.batch.column("sf64").to_pylist() == [1, 3]
    assert "epochline.test.Everything holds a value its Arrow column cannot" in decoded.failures[0].reason


# -- schema evolution (no registry: the writer schema is the reader's file) -------------------------------------------

def test_records_of_an_evolved_writer_read_into_the_older_reader_and_the_other_way_round(
        schema_registry: FakeSchemaRegistry) -> None:
    v1, v2 = compiled("order_v1.proto")[ORDER], compiled("order_v2.proto")[ORDER]
    ctx = value_context("orders")
    old = serializer(schema_registry, v1)(v1(id=1, customer="old"), ctx)
    new = serializer(schema_registry, v2)(v2(id=2, customer="new", note="n", tags=["a"]), ctx)
    reader_v1 = make_format(FormatSpec("protobuf-confluent", schema=PROTOS / "order_v1.proto",
                                       registry_url=schema_registry.url))
    assert reader_v1.decode([old, new]).batch.to_pylist() == [{"id": 1, "customer": "old"},
                                                              {"id": 2, "customer": "new"}]
    reader_v2 = make_format(FormatSpec("protobuf-confluent", registry_url=schema_registry.url, topic="orders"))
    assert reader_v2.decode([old, new]).batch.to_pylist() == [
        {"id": 1, "customer": "old", "note": None, "tags": []},
        {"id": 2, "customer": "new", "note": "n", "tags": ["a"]}]


def test_records_of_an_incompatible_writer_fail_naming_the_field(schema_registry: FakeSchemaRegistry) -> None:
    changed = compiled("order_incompatible.proto")[ORDER]
    payload = serializer(schema_registry, changed)(changed(id=1, customer=5), value_context("orders"))
    fmt = make_format(FormatSpec("protobuf-confluent", schema=PROTOS / "order_v1.proto",
                                 registry_url=schema_registry.url))
    [failure] = fmt.decode([payload]).failures
    assert "records written with schema id 1 cannot be read into the reader schema from" in failure.reason
    assert failure.reason.endswith("field 'customer' (number 2) is int64 there and string here")


# -- the registry ----------------------------------------------------------------------------------------------------

def test_records_written_by_confluents_serializer_decode_with_their_import_resolved_as_a_reference(
        schema_registry: FakeSchemaRegistry) -> None:
    rows = everything_rows(300, seed=9)
    write = serializer(schema_registry, everything_class())
    payloads = [write(message_of(everything_class(), row), value_context("orders")) for row in rows]
    assert schema_registry.subjects() == ["common.proto", "orders-value"]
    fmt = everything_format(registry_url=schema_registry.url, topic="orders")
    decoded = fmt.decode(payloads)
    assert decoded.failures == []
    assert decoded.batch.equals(pa.RecordBatch.from_pylist(rows, schema=EVERYTHING_SCHEMA))


def test_schemas_are_fetched_from_the_registry_once_per_id(schema_registry: FakeSchemaRegistry) -> None:
    write = serializer(schema_registry, everything_class())
    payloads = [write(everything_class()(sf64=n), value_context("orders")) for n in range(50)]  # ids 1 and 2
    fmt = everything_format(registry_url=schema_registry.url, topic="orders")  # reads id 2, the latest
    schema_registry.requests.clear()
    first, second = fmt.decode(payloads), fmt.decode(payloads)
    assert first.batch.num_rows == 50 and second.batch.equals(first.batch)
    assert schema_registry.requests == []
    address = frame(1, b"\x00", everything_class()())  # id 1 is common.proto: message index [0] is Address
    for _ in range(2):
        assert fmt.decode([address]).failures[0].reason == (
            "record is message epochline.test.common.Address (schema id 1, message index [0]); this source reads "
            "epochline.test.Everything (set by `message`)")
    assert schema_registry.requests == ["GET /schemas/ids/1"]


def test_an_unknown_schema_id_is_a_failure_and_is_asked_for_again_in_the_next_batch(
        schema_registry: FakeSchemaRegistry) -> None:
    fmt = make_format(FormatSpec("protobuf-confluent", schema=PROTOS / "order_v1.proto",
                                 registry_url=schema_registry.url))
    payload = frame(9, b"\x00", compiled("order_v1.proto")[ORDER](id=1))
    assert fmt.decode([payload]).failures[0].reason == (f"unknown schema id 9 (not found in schema registry "
                                                        f"{schema_registry.url})")
    schema_registry.register("late", (PROTOS / "order_v2.proto").read_text(), "PROTOBUF", schema_id=9)
    assert fmt.decode([payload]).batch.to_pylist() == [{"id": 1, "customer": ""}]


def test_the_reader_schema_defaults_to_the_latest_version_of_the_topics_subject(
        schema_registry: FakeSchemaRegistry) -> None:
    ctx = value_context("orders")
    serializer(schema_registry, compiled("order_v1.proto")[ORDER])(compiled("order_v1.proto")[ORDER](), ctx)
    serializer(schema_registry, compiled("order_v2.proto")[ORDER])(compiled("order_v2.proto")[ORDER](), ctx)
    fmt = make_format(FormatSpec("protobuf-confluent", registry_url=schema_registry.url, topic="orders"))
    assert fmt.arrow_schema is not None and fmt.arrow_schema.names == ["id", "customer", "note", "tags"]
    with pytest.raises(SchemaError, match="subject 'elsewhere-value' has no registered version"):
        make_format(FormatSpec("protobuf-confluent", registry_url=schema_registry.url, topic="elsewhere"))
    with pytest.raises(SchemaError, match="needs the topic"):
        make_format(FormatSpec("protobuf-confluent", registry_url=schema_registry.url))


def test_a_schema_registered_as_proto_text_with_a_text_reference_is_compiled(
        schema_registry: FakeSchemaRegistry) -> None:
    from tests.helpers.schema_registry import Reference

    schema_registry.register("common.proto", (PROTOS / "common.proto").read_text(), "PROTOBUF")
    schema_id = schema_registry.register("orders-value", ALL_TYPES.read_text(), "PROTOBUF",
                                         [Reference("common.proto", "common.proto", 1)])
    fmt = everything_format(registry_url=schema_registry.url, topic="orders")
    assert fmt.arrow_schema.equals(EVERYTHING_SCHEMA)
    row = everything_rows(2)[1]
    assert fmt.decode([frame(schema_id, b"\x00", message_of(everything_class(), row))]).batch.to_pylist() == [row]


def test_a_record_whose_schema_id_is_not_a_protobuf_schema_fails_alone(schema_registry: FakeSchemaRegistry) -> None:
    json_id = schema_registry.register("elsewhere-value", {"type": "object"}, "JSON")
    fmt = make_format(FormatSpec("protobuf-confluent", schema=PROTOS / "order_v1.proto",
                                 registry_url=schema_registry.url))
    decoded = fmt.decode([frame(json_id, b"\x00", compiled("order_v1.proto")[ORDER](id=1))])
    assert decoded.failures[0].reason.startswith(f"schema id {json_id} is not a readable Protobuf schema: ")
    assert decoded.failures[0].reason.endswith("is a JSON schema, not PROTOBUF")


def test_a_configured_schema_id_missing_from_the_registry_is_a_schema_error(
        schema_registry: FakeSchemaRegistry) -> None:
    with pytest.raises(SchemaError, match="schema_id 77 is not in schema registry"):
        everything_format(registry_url=schema_registry.url, schema_id=77)
    schema_registry.register("json", {"type": "object"}, "JSON")
    with pytest.raises(SchemaError, match="is a JSON schema, not PROTOBUF"):
        everything_format(registry_url=schema_registry.url, schema_id=1)


def test_an_unreachable_registry_raises_instead_of_failing_every_record(schema_registry: FakeSchemaRegistry) -> None:
    fmt = everything_format(registry_url=schema_registry.url, schema=ALL_TYPES)
    schema_registry.stop()
    with pytest.raises(RegistryUnavailable, match="schema id 3"):
        fmt.decode([frame(3, b"\x00", everything_class()())])
    with pytest.raises(SchemaError, match="unreachable"):
        everything_format(registry_url=schema_registry.url, topic="orders")


# -- the message type each record's framing names ---------------------------------------------------------------------

ACC = "acc.proto"
ACC_ORDER, ACC_INNER = "acc.Order", "acc.Inner"
INNER = pa.struct([nn("sku", pa.string()), nn("quantity", pa.int32())])
ACC_ORDER_SCHEMA = pa.schema([nn("id", pa.int64()), pa.field("item", INNER), nn("tags", list_of(pa.string())),
                              nn("counts", map_of(pa.string(), pa.int64()))])
CHOSEN_BY_FIRST = "the type of the first record it read; set `message` to read another"


def acc_orders(count: int) -> list[Message]:
    """``count`` acc.Order messages with the nested message (unset in every third), the repeated string and
    the map (empty in some)."""
    order = compiled(ACC)[ACC_ORDER]
    return [order(id=n, item=None if n % 3 == 2 else {"sku": f"sku-{n}", "quantity": n},
                  tags=[f"t{k}" for k in range(n % 3)], counts={f"k{k}": n * k - 1 for k in range(n % 4)})
            for n in range(count)]


def acc_order_row(message: Message) -> dict[str, Any]:
    """The row an acc.Order reads as, written out field by field (map entries ordered by key)."""
    order = cast(Any, message)  # generated, not in stubs
    item = {"sku": order.item.sku, "quantity": order.item.quantity} if order.HasField("item") else None
    return {"id": order.id, "item": item, "tags": list(order.tags), "counts": sorted(order.counts.items())}


def acc_format(registry: FakeSchemaRegistry, topic: str, **spec: Any) -> ProtobufConfluentFormat:
    fmt = make_format(FormatSpec("protobuf-confluent", registry_url=registry.url, topic=topic, **spec))
    assert isinstance(fmt, ProtobufConfluentFormat)
    return fmt


def test_without_message_records_of_a_two_type_schema_read_as_the_type_their_framing_names(
        schema_registry: FakeSchemaRegistry) -> None:
    orders = acc_orders(12)
    write = serializer(schema_registry, compiled(ACC)[ACC_ORDER])
    payloads = [write(order, value_context("acc")) for order in orders]
    assert {payload[5:7] for payload in payloads} == {b"\x02\x02"}, "message-index array [1]: acc.Order"
    fmt = acc_format(schema_registry, "acc")
    assert fmt.arrow_schema is None, "no record has named the type yet"
    decoded = fmt.decode(payloads)
    assert decoded.failures == []
    assert fmt.arrow_schema == ACC_ORDER_SCHEMA
    assert decoded.batch.schema == ACC_ORDER_SCHEMA
    assert decoded.batch.to_pylist() == [acc_order_row(order) for order in orders]
    assert decoded.batch.to_pylist()[5] == {"id": 5, "item": None, "tags": ["t0", "t1"],
                                            "counts": [("k0", -1)]}


def interleaved(registry: FakeSchemaRegistry) -> list[bytes]:
    """acc.Order 0, acc.Inner sku-0, Order 1, Inner sku-1, ... each written by Confluent's serializer."""
    inner_class = compiled(ACC)[ACC_INNER]
    write_order = serializer(registry, compiled(ACC)[ACC_ORDER])
    write_inner = serializer(registry, inner_class)
    ctx = value_context("acc")
    return [payload for n, order in enumerate(acc_orders(4))
            for payload in (write_order(order, ctx), write_inner(inner_class(sku=f"sku-{n}", quantity=n), ctx))]


def test_with_two_types_interleaved_the_batch_holds_the_first_records_type_and_the_others_fail_naming_both(
        schema_registry: FakeSchemaRegistry) -> None:
    payloads = interleaved(schema_registry)
    assert schema_registry.versions("acc-value") == [1], "both types are in the one registered file"
    decoded = acc_format(schema_registry, "acc").decode(payloads)
    assert decoded.indices == [0, 2, 4, 6]
    assert decoded.batch.to_pylist() == [acc_order_row(order) for order in acc_orders(4)]
    assert [(f.index, f.reason) for f in decoded.failures] == [
        (index, f"record is message acc.Inner (schema id 1, message index [0]); this source reads acc.Order "
                f"({CHOSEN_BY_FIRST})") for index in (1, 3, 5, 7)]


def test_with_message_pinned_records_of_the_other_type_fail_naming_both(schema_registry: FakeSchemaRegistry) -> None:
    payloads = interleaved(schema_registry)
    fmt = acc_format(schema_registry, "acc", message=ACC_INNER)
    assert fmt.arrow_schema == pa.schema(list(INNER)), "known at start"
    decoded = fmt.decode(payloads)
    assert decoded.batch.to_pylist() == [{"sku": f"sku-{n}", "quantity": n} for n in range(4)]
    assert [(f.index, f.reason) for f in decoded.failures] == [
        (index, "record is message acc.Order (schema id 1, message index [1]); this source reads acc.Inner "
                "(set by `message`)") for index in (0, 2, 4, 6)]


def test_the_first_records_type_stays_the_formats_type_and_is_the_one_it_encodes(
        schema_registry: FakeSchemaRegistry) -> None:
    payloads = interleaved(schema_registry)
    fmt = acc_format(schema_registry, "acc")
    first = fmt.decode(payloads[1:2])
    assert first.batch.to_pylist() == [{"sku": "sku-0", "quantity": 0}]
    later = fmt.decode(payloads)
    assert later.indices == [1, 3, 5, 7]
    assert later.failures[0].reason.endswith(f"this source reads acc.Inner ({CHOSEN_BY_FIRST})")
    assert fmt.encode(first.batch) == [payloads[1]], "the same bytes as Confluent's serializer"


def test_a_type_whose_field_comes_from_a_referenced_schema_is_read_without_message(
        schema_registry: FakeSchemaRegistry) -> None:
    shipment, address = compiled("acc_shipment.proto")["acc.Shipment"], compiled("common.proto")[
        "epochline.test.common.Address"]
    write = serializer(schema_registry, shipment)
    payloads = [write(shipment(id=n, to={"street": f"{n} Quay", "zip": n} if n else None), value_context("ship"))
                for n in range(3)]
    assert schema_registry.subjects() == ["common.proto", "ship-value"]
    imported = frame(1, b"\x00", address(street="x"))  # id 1 is common.proto, whose [0] is Address
    decoded = acc_format(schema_registry, "ship").decode([imported, *payloads])
    assert decoded.failures[0].reason.startswith("record is message epochline.test.common.Address (schema id 1, "
                                                 "message index [0]), which the reader schema from schema registry")
    assert decoded.failures[0].reason.endswith(" does not declare")
    assert decoded.batch.to_pylist() == [{"id": 0, "to": None}, {"id": 1, "to": {"street": "1 Quay", "zip": 1}},
                                         {"id": 2, "to": {"street": "2 Quay", "zip": 2}}]


def test_a_schema_with_one_top_level_type_reads_it_from_the_start_and_fails_records_of_its_nested_type(
        tmp_path: Path) -> None:
    proto = tmp_path / "basket.proto"
    proto.write_text('syntax = "proto3";\npackage shop;\nmessage Basket {\n  message Line { string sku = 1; }\n'
                     '  repeated Line lines = 1;\n}\n')
    fmt = make_format(FormatSpec("protobuf-confluent", schema=proto, schema_id=1))
    assert fmt.arrow_schema == pa.schema([nn("lines", list_of(pa.struct([nn("sku", pa.string())])))])
    basket, line = b"\x00\x00\x00\x00\x01\x00\x0a\x03\x0a\x01a", b"\x00\x00\x00\x00\x01\x04\x00\x00\x0a\x01b"
    decoded = fmt.decode([line, basket])
    assert decoded.batch.to_pylist() == [{"lines": [{"sku": "a"}]}]
    assert decoded.failures[0].reason == ("record is message shop.Basket.Line (schema id 1, message index [0, 0]); "
                                          "this source reads shop.Basket (the schema's only top-level message type)")


def test_a_record_of_a_type_arrow_cannot_hold_fails_and_leaves_the_choice_to_the_next(tmp_path: Path) -> None:
    proto = tmp_path / "tree.proto"
    proto.write_text('syntax = "proto3";\npackage tree;\nmessage Node { repeated Node children = 1; }\n'
                     'message Leaf { string name = 1; }\n')
    fmt = make_format(FormatSpec("protobuf-confluent", schema=proto, schema_id=1))
    node, leaf = b"\x00\x00\x00\x00\x01\x00", b"\x00\x00\x00\x00\x01\x02\x02\x0a\x01x"  # [0] Node; [1] Leaf "x"
    decoded = fmt.decode([node, leaf])
    assert decoded.batch.to_pylist() == [{"name": "x"}]
    [failure] = decoded.failures
    assert failure.reason.startswith("record is message tree.Node (schema id 1, message index [0]), which this "
                                     "source cannot read: ")
    assert "recursive message tree.Node" in failure.reason
    assert fmt.decode([node]).failures[0].reason == (f"record is message tree.Node (schema id 1, message index "
                                                     f"[0]); this source reads tree.Leaf ({CHOSEN_BY_FIRST})")


# -- encoding against the registry -----------------------------------------------------------------------------------

def test_encode_registers_the_schema_and_its_import_as_confluents_serializer_does(
        schema_registry: FakeSchemaRegistry) -> None:
    fmt = everything_format(schema=ALL_TYPES, registry_url=schema_registry.url, topic="orders")
    [ours] = fmt.encode(everything_batch({"sf64": 1}))
    assert schema_registry.subjects() == ["common.proto", "orders-value"]
    [reference] = schema_registry.latest("orders-value").references
    assert (reference.name, reference.subject, reference.version) == ("common.proto", "common.proto", 1)
    theirs = serializer(schema_registry, everything_class())(everything_class()(sf64=1), value_context("orders"))
    assert ours == theirs, "the same schema id, index array and message bytes as ProtobufSerializer's"
    assert schema_registry.versions("orders-value") == [1]


def test_encode_with_auto_register_off_only_looks_the_schema_up(schema_registry: FakeSchemaRegistry) -> None:
    batch = everything_batch({"sf64": 1})
    lookup_only = everything_format(schema=ALL_TYPES, registry_url=schema_registry.url, topic="orders",
                                    auto_register=False)
    with pytest.raises(SchemaNotRegistered, match="not registered under subject 'common.proto'"):
        lookup_only.encode(batch)
    assert schema_registry.subjects() == []
    everything_format(schema=ALL_TYPES, registry_url=schema_registry.url, topic="orders").encode(batch)
    assert lookup_only.encode(batch)[0][:5] == b"\x00\x00\x00\x00\x02"


@pytest.mark.parametrize(("strategy", "subject"), [("record", EVERYTHING), ("topic-record", f"orders-{EVERYTHING}")])
def test_record_subject_strategies_name_the_message_type(schema_registry: FakeSchemaRegistry, strategy: str,
                                                         subject: str) -> None:
    fmt = everything_format(schema=ALL_TYPES, registry_url=schema_registry.url, topic="orders",
                            subject_strategy=strategy)
    fmt.encode(everything_batch({"sf64": 1}))
    assert subject in schema_registry.subjects()
    reader = everything_format(registry_url=schema_registry.url, topic="orders", subject_strategy=strategy)
    assert reader.arrow_schema.equals(EVERYTHING_SCHEMA)


def test_encoding_from_a_registry_schema_writes_its_id() -> None:
    """(Covered with the broker below for the latest-version case; here by schema id, without a registry.)"""
    [payload] = local_format(schema_id=12).encode(everything_batch({"sf64": 1}))
    assert payload[:6] == b"\x00\x00\x00\x00\x0c\x00"


# -- encode errors ---------------------------------------------------------------------------------------------------

def test_a_row_setting_two_members_of_a_oneof_is_an_encode_error_naming_the_row() -> None:
    batch = everything_batch({"card": "x"}, {"card": "y", "account": 3})
    with pytest.raises(EncodeError, match=r"row 1 sets more than one member of oneof 'payment' of message "
                                          r"epochline\.test\.Everything \(members: card, account, billing\)"):
        local_format().encode(batch)


def test_a_name_that_is_not_a_value_of_the_enum_is_an_encode_error() -> None:
    with pytest.raises(EncodeError, match=r"field 'color' holds 'PURPLE', which is not a value of enum "
                                          r"epochline\.test\.Color"):
        local_format().encode(everything_batch({"color": "PURPLE"}))


def test_a_column_wider_than_its_field_is_an_encode_error_naming_the_column() -> None:
    batch = everything_batch({"sf64": 1}, {"sf64": 2}).drop_columns(["i32"])
    batch = batch.append_column(pa.field("i32", pa.int64()), pa.array([1, 2**40]))
    with pytest.raises(EncodeError, match="column 'i32' of type int64 cannot be converted"):
        local_format().encode(batch)


def test_a_key_twice_in_one_map_is_an_encode_error() -> None:
    batch = everything_batch({"counts": [("a", 1), ("a", 2)]})
    with pytest.raises(EncodeError, match="field 'counts' has a key twice in one map"):
        local_format().encode(batch)


def test_a_missing_nullable_column_is_unset_and_a_missing_plain_one_is_an_encode_error() -> None:
    fmt = local_format()
    [payload] = fmt.encode(everything_batch({"sf64": 5}).drop_columns(["w_string", "address", "card"]))
    assert everything_class().FromString(payload[6:]) == everything_class()(sf64=5)
    with pytest.raises(EncodeError, match="the batch has no column 'i32', which the schema requires"):
        fmt.encode(everything_batch({"sf64": 5}).drop_columns(["i32"]))


def test_a_null_element_of_a_repeated_field_is_an_encode_error() -> None:
    batch = everything_batch({})
    batch = batch.set_column(batch.schema.get_field_index("tags"), "tags", pa.array([["a", None]]))
    with pytest.raises(EncodeError, match="field 'tags' holds an element it cannot"):
        local_format().encode(batch)


def test_sliced_batches_encode_only_their_rows() -> None:
    fmt = local_format()
    batch = pa.RecordBatch.from_pylist(everything_rows(40), schema=fmt.arrow_schema)
    part = batch.slice(13, 9)
    assert fmt.decode(fmt.encode(part)).batch.equals(pa.RecordBatch.from_pylist(part.to_pylist(),
                                                                                schema=fmt.arrow_schema))


# -- through the real broker -----------------------------------------------------------------------------------------

BROKER_ROWS = 50_000




def values_of(batches: list[SourceBatch], sort_key: str) -> pa.Table:
    table = pa.Table.from_batches([b.batch for b in batches]).drop_columns(list(METADATA_COLUMNS))
    return table.sort_by(sort_key).combine_chunks()


def test_50k_records_written_by_confluents_protobuf_serializer_are_read_exactly(
        kafka_bootstrap: str, unique_topic: str, schema_registry: FakeSchemaRegistry) -> None:
    rows = everything_rows(BROKER_ROWS)
    cls = everything_class()
    write, ctx = serializer(schema_registry, cls), value_context(unique_topic)
    create_topic(kafka_bootstrap, unique_topic, partitions=2)
    produce_keyed(kafka_bootstrap, unique_topic, (write(message_of(cls, row), ctx) for row in rows))
    batches = read_batches(kafka_bootstrap, unique_topic,
                          FormatSpec("protobuf-confluent", registry_url=schema_registry.url, topic=unique_topic,
                                     message=EVERYTHING))
    assert [d.reason for b in batches for d in b.dead_letters] == []
    read = values_of(batches, "sf64")
    assert read.schema.equals(EVERYTHING_SCHEMA)
    assert read.num_rows == BROKER_ROWS
    assert read.equals(pa.Table.from_pylist(rows, schema=EVERYTHING_SCHEMA))


def test_50k_rows_encoded_by_protobuf_confluent_are_read_exactly_by_confluents_protobuf_deserializer(
        kafka_bootstrap: str, unique_topic: str, schema_registry: FakeSchemaRegistry) -> None:
    rows = everything_rows(BROKER_ROWS, seed=12)
    fmt = everything_format(schema=ALL_TYPES, registry_url=schema_registry.url, topic=unique_topic)
    create_topic(kafka_bootstrap, unique_topic, partitions=2)
    produce_keyed(kafka_bootstrap, unique_topic, fmt.encode(pa.RecordBatch.from_pylist(rows, schema=fmt.arrow_schema)))
    cls = everything_class()
    deserializer = ProtobufDeserializer(cls, SERDE_CONF, SchemaRegistryClient({"url": schema_registry.url}))
    ctx = value_context(unique_topic)
    messages = [deserializer(value, ctx) for value in read_values(kafka_bootstrap, unique_topic)]
    assert len(messages) == BROKER_ROWS
    messages.sort(key=lambda message: message.sf64)
    assert messages == [message_of(cls, row) for row in rows]


def test_a_run_writes_a_protobuf_topic_with_maps_nested_messages_and_lists_as_json(
        kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    """The reproduction: ``format: protobuf-confluent`` in, a JSON sink out, used to die at the first epoch
    (``column counts (map<string, int64>) has no JSON representation``)."""
    rows = everything_rows(40, seed=5)
    for topic in (unique_topic, f"{unique_topic}-out", f"{unique_topic}-dlq"):
        create_topic(kafka_bootstrap, topic, partitions=1)
    produce_keyed(kafka_bootstrap, unique_topic, local_format().encode(everything_batch(*rows)))
    config = write_config(tmp_path, {
        "name": unique_topic,
        "source": {"topic": unique_topic, "format": "protobuf-confluent", "schema": str(ALL_TYPES),
                   "message": EVERYTHING, "schema_id": 1},
        "sink": {"topic": f"{unique_topic}-out", "format": "json"},
        "dead_letter": {"topic": f"{unique_topic}-dlq"},
        "checkpoint": {"interval": "200ms", "dir": str(tmp_path / "state")},
    })
    done = subprocess.run([sys.executable, "-m", "engine.cli", "run", str(config), "--bootstrap-servers",
                           kafka_bootstrap, "--stop-at-end"], capture_output=True, text=True, timeout=120,
                          cwd=REPO_ROOT, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    written = sorted((orjson.loads(value or b"") for value in read_values(kafka_bootstrap, f"{unique_topic}-out")),
                     key=lambda value: value["sf64"])
    assert [value["counts"] for value in written] == [dict(row["counts"]) for row in rows]
    assert [value["addresses"] for value in written] == [
        [{"key": key, "value": address} for key, address in row["addresses"]] for row in rows]
    assert [(value["address"], value["tags"]) for value in written] == [(row["address"], row["tags"]) for row in rows]
    assert read_values(kafka_bootstrap, f"{unique_topic}-dlq") == []


def test_a_writer_schema_evolved_mid_topic_reads_into_the_reader_schema(
        kafka_bootstrap: str, unique_topic: str, schema_registry: FakeSchemaRegistry) -> None:
    v1, v2 = compiled("order_v1.proto")[ORDER], compiled("order_v2.proto")[ORDER]
    ctx = value_context(unique_topic)
    old, new = serializer(schema_registry, v1), serializer(schema_registry, v2)
    payloads = [old(v1(id=n, customer=f"c{n}"), ctx) for n in range(500)]
    payloads += [new(v2(id=n, customer=f"c{n}", note=None if n % 2 else f"n{n}", tags=["x"] * (n % 3)), ctx)
                 for n in range(500, 1_000)]
    assert schema_registry.versions(f"{unique_topic}-value") == [1, 2]
    create_topic(kafka_bootstrap, unique_topic, partitions=1)
    produce_keyed(kafka_bootstrap, unique_topic, payloads)

    newest = FormatSpec("protobuf-confluent", registry_url=schema_registry.url, topic=unique_topic)  # v2
    latest = values_of(read_batches(kafka_bootstrap, unique_topic, newest), "id")
    assert latest.to_pylist() == [{"id": n, "customer": f"c{n}", "note": None if n < 500 or n % 2 else f"n{n}",
                                   "tags": [] if n < 500 else ["x"] * (n % 3)} for n in range(1_000)]
    oldest = FormatSpec("protobuf-confluent", registry_url=schema_registry.url, schema_id=1)
    read_old = values_of(read_batches(kafka_bootstrap, unique_topic, oldest), "id")
    assert read_old.to_pylist() == [{"id": n, "customer": f"c{n}"} for n in range(1_000)]


def unknown_schema_id(payload: bytes) -> bytes:
    return b"\x00" + (999).to_bytes(4, "big") + payload[5:]


def bad_message_index(payload: bytes) -> bytes:
    assert payload[5] == 0, "encoded with message-index array [0]"
    return payload[:5] + b"\x02\x0a" + payload[6:]


@pytest.mark.parametrize(("corrupt", "reason"), [
    (unknown_schema_id, "unknown schema id 999 (not found in schema registry"),
    (bad_message_index, "bad message index [5] for schema id 1: the schema from schema registry"),
])
def test_an_unknown_schema_id_or_a_bad_message_index_becomes_a_dead_letter_with_its_reason(
        kafka_bootstrap: str, unique_topic: str, schema_registry: FakeSchemaRegistry, corrupt: Any,
        reason: str) -> None:
    spec = FormatSpec("protobuf-confluent", schema=PROTOS / "order_v1.proto", registry_url=schema_registry.url,
                      topic=unique_topic)
    payloads = list(make_format(spec).encode(pa.RecordBatch.from_pylist(
        [{"id": n, "customer": f"c{n}"} for n in range(5)])))
    payloads[2] = corrupt(payloads[2])
    create_topic(kafka_bootstrap, unique_topic, partitions=1)
    produce_keyed(kafka_bootstrap, unique_topic, payloads)
    batches = read_batches(kafka_bootstrap, unique_topic, spec)
    dead = [d for b in batches for d in b.dead_letters]
    assert [(d.topic, d.partition, d.offset, d.key, d.value, d.stage) for d in dead] == [
        (unique_topic, 0, 2, b"2", payloads[2], "decode")]
    assert reason in dead[0].reason
    decoded = pa.Table.from_batches([b.batch for b in batches])
    assert decoded.column("id").to_pylist() == [0, 1, 3, 4]
    assert decoded.column("__kafka_offset").to_pylist() == [0, 1, 3, 4]


def acc_ids(value: bytes | None) -> list[Hashable]:
    """The id of an acc record written by Confluent's serializer: an Order's ``id``, an Inner's ``sku``."""
    assert value is not None and value[:1] == b"\x00"
    if value[5:6] == b"\x00":  # message-index array [0]: acc.Inner
        return [cast(Any, compiled(ACC)[ACC_INNER].FromString(value[6:])).sku]
    assert value[5:7] == b"\x02\x02", "message-index array [1]: acc.Order"
    return [cast(Any, compiled(ACC)[ACC_ORDER].FromString(value[7:])).id]


def acc_order_json(message: Message) -> bytes:
    """An acc.Order as the json sink writes it: the columns in order, the map as an object."""
    row = acc_order_row(message)
    return orjson.dumps({**row, "counts": dict(row["counts"])})


def test_epochline_run_without_message_writes_each_order_as_exact_json_and_dead_letters_the_other_type(
        kafka_bootstrap: str, unique_topic: str, schema_registry: FakeSchemaRegistry, tmp_path: Path) -> None:
    """The reproduction: acc.Order records written by Confluent's ProtobufSerializer, acc.Inner records among
    them, read by ``epochline run`` with no ``message`` into a json sink. The first record is an Order."""
    orders = acc_orders(400)
    inner = compiled(ACC)[ACC_INNER]
    write_order, write_inner = serializer(schema_registry, compiled(ACC)[ACC_ORDER]), serializer(schema_registry, inner)
    ctx = value_context(unique_topic)
    payloads, skus = [], []
    for n, order in enumerate(orders):
        payloads.append(write_order(order, ctx))
        if n % 25 == 0:
            skus.append(f"inner-{n}")
            payloads.append(write_inner(inner(sku=skus[-1], quantity=n), ctx))
    source, sink, dead_letter = f"{unique_topic}", f"{unique_topic}-json", f"{unique_topic}-dlq"
    for topic in (source, sink, dead_letter):
        create_topic(kafka_bootstrap, topic, partitions=1)
    produce_keyed(kafka_bootstrap, source, payloads)
    config = write_config(tmp_path, {
        "name": f"acc-{unique_topic}",
        "source": {"topic": source, "format": "protobuf-confluent", "registry_url": schema_registry.url},
        "sink": {"topic": sink, "format": "json"},
        "dead_letter": {"topic": dead_letter},
        "checkpoint": {"interval": "200ms", "dir": str(tmp_path / "state")},
    })

    run_pipeline(config, kafka_bootstrap)

    reason = (f"record is message acc.Inner (schema id 1, message index [0]); this source reads acc.Order "
              f"({CHOSEN_BY_FIRST})")
    assert_exactly_once(kafka_bootstrap, sink, dead_letter, [*range(400), *skus],
                        dead_lettered=dict.fromkeys(skus, reason), ids_of=acc_ids, output_ids_of=ids_in())
    written = read_values(kafka_bootstrap, sink)
    assert sorted(written, key=lambda value: orjson.loads(value or b"")["id"]) == [acc_order_json(o) for o in orders]
    assert written[5] == b'{"id":5,"item":null,"tags":["t0","t1"],"counts":{"k0":-1}}'
