"""Protobuf message types mapped to Arrow types, and parsed messages converted to and from Arrow columns.

Mapping (Protobuf -> Arrow):

=================================================  ==============================================================
int32 / sint32 / sfixed32                           int32
int64 / sint64 / sfixed64                           int64
uint32 / fixed32  ·  uint64 / fixed64               uint32  ·  uint64
float / double / bool                               float32 / float64 / bool
string / bytes                                      string / binary
enum                                                string: the value's name (a number the enum does not declare,
                                                    which proto3's open enums keep, as its decimal digits)
message (and proto2 group)                          struct, nullable (null when the field is not set)
repeated T                                          list<T> (elements never null: Protobuf has no null element)
map<K, V>                                           map<K, V> (entries ordered by key, see below)
google.protobuf.Timestamp                           timestamp("us", tz="UTC"), nullable (see below)
google.protobuf.DoubleValue, FloatValue,            float64, float32, int64, uint64, int32, uint32, bool,
Int64Value, UInt64Value, Int32Value, UInt32Value,   string, binary: the wrapped scalar, nullable (null when the
BoolValue, StringValue, BytesValue                  wrapper is not set)
proto3 ``optional`` / proto2 ``optional``           the scalar, nullable (null when not set, even where proto2
                                                    declares a default); proto2 ``required``: not nullable
oneof members                                       one nullable field each (null unless it is the member set)
singular scalars without presence (proto3 default)  the scalar, not nullable: unset reads as its default (0, "",
                                                    false, the first enum value), exactly as Protobuf reads it
=================================================  ==============================================================

Other well-known types (Duration, Any, FieldMask, ...) are ordinary messages and map to their structs;
recursive messages (including google.protobuf.Struct/Value) have no Arrow equivalent and raise
``SchemaError`` naming the field.

Why timestamp("us") and not ("ns"): a Timestamp spans years 1 to 9999, and so do the sentinel dates real
data carries (0001-01-01, 9999-12-31); an int64 of nanoseconds only spans 1677-2262 and would turn those
records into failures. Microseconds cover the whole range; the price is that digits below the microsecond
(Timestamp.nanos % 1000) are dropped on decode (floored, so a time never moves past the next microsecond).
It is also the unit Avro's timestamp-micros, Parquet and DuckDB use by default.

Why map entries are sorted by key: a Protobuf map has no order, and the parser hands entries out in hash
order, so the same bytes could become differently ordered Arrow maps. Sorting makes decode deterministic
and ``decode(encode(batch))`` exact for batches whose maps are ordered by key.

Decoding is column-wise over the parsed messages: one attribute read per field and message (the Protobuf
runtime's C parser, upb, does the parsing), then one ``pa.array`` call per leaf column; structs, lists and
maps are assembled from their children's arrays, offsets and validity masks without Python objects per
row. Encoding is the inverse, also field by field: each column is converted column-wise (enum names to
numbers, timestamps to seconds and nanos), turned into Python values once, and set on every message in one
loop; nested messages, repeated fields and maps recurse with their child columns.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from operator import attrgetter
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from schemas.arrow_batches import conform_batch
from schemas.base import EncodeError, SchemaError

_FORMAT = "protobuf-confluent"
_MICROS_PER_SECOND = 1_000_000
_NANOS_PER_MICRO = 1_000

_SCALARS: dict[int, pa.DataType] = {
    FieldDescriptor.CPPTYPE_INT32: pa.int32(),
    FieldDescriptor.CPPTYPE_INT64: pa.int64(),
    FieldDescriptor.CPPTYPE_UINT32: pa.uint32(),
    FieldDescriptor.CPPTYPE_UINT64: pa.uint64(),
    FieldDescriptor.CPPTYPE_FLOAT: pa.float32(),
    FieldDescriptor.CPPTYPE_DOUBLE: pa.float64(),
    FieldDescriptor.CPPTYPE_BOOL: pa.bool_(),
}

WRAPPERS: dict[str, pa.DataType] = {
    "google.protobuf.DoubleValue": pa.float64(),
    "google.protobuf.FloatValue": pa.float32(),
    "google.protobuf.Int64Value": pa.int64(),
    "google.protobuf.UInt64Value": pa.uint64(),
    "google.protobuf.Int32Value": pa.int32(),
    "google.protobuf.UInt32Value": pa.uint32(),
    "google.protobuf.BoolValue": pa.bool_(),
    "google.protobuf.StringValue": pa.string(),
    "google.protobuf.BytesValue": pa.binary(),
}
TIMESTAMP = "google.protobuf.Timestamp"
_SECONDS, _NANOS, _VALUE = attrgetter("seconds"), attrgetter("nanos"), attrgetter("value")
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")


class _Node:
    """How one Protobuf type becomes an Arrow column (decode), and an Arrow column becomes it again (encode)."""

    arrow_type: pa.DataType

    def column(self, values: list[Any], mask: pa.BooleanArray | None) -> pa.Array[Any]:
        """The Arrow array of ``values`` (Python values as the Protobuf runtime returns them); ``mask`` marks
        the rows where the field is not set (null)."""
        raise NotImplementedError


class _ValueNode(_Node):
    """A type the runtime holds as a Python value (number, bool, str, bytes, enum number)."""

    def values(self, array: pa.Array[Any], path: str) -> list[Any]:
        """``array`` as the Python values the message fields take (None where null)."""
        return array.to_pylist()


class _MessageNode(_Node):
    """A type the runtime holds as a message (nested messages, Timestamp, wrappers)."""

    def fill(self, messages: list[Message], array: pa.Array[Any], path: str) -> None:
        """Set the fields of ``messages`` (one per row of ``array``, which has no null rows) from ``array``."""
        raise NotImplementedError


class _Scalar(_ValueNode):
    """Numbers, bool, string, bytes: Arrow converts the Python values in one call."""

    def __init__(self, arrow_type: pa.DataType) -> None:
        self.arrow_type = arrow_type

    def column(self, values: list[Any], mask: pa.BooleanArray | None) -> pa.Array[Any]:
        return pa.array(values, type=self.arrow_type, mask=mask)


class _Enum(_ValueNode):
    """Enum numbers as their names; numbers the enum does not declare as decimal strings (and back)."""

    arrow_type = pa.string()

    def __init__(self, enum: EnumDescriptor) -> None:
        self.full_name = enum.full_name
        self.names: dict[int, str] = {number: value.name for number, value in enum.values_by_number.items()}
        self.numbers: dict[str, int] = {value.name: value.number for value in enum.values}
        self._value_set = pa.array(list(self.numbers), pa.string())
        self._numbers = pa.array(list(self.numbers.values()), pa.int32())
        self._by_number = pa.array(list(self.names), pa.int32())  # the first name of each number (aliases)
        self._names = pa.array(list(self.names.values()), pa.string())

    def column(self, values: list[Any], mask: pa.BooleanArray | None) -> pa.Array[Any]:
        numbers = pa.array(values, pa.int32())
        names: pa.Array[Any] = pc.take(self._names, pc.index_in(numbers, value_set=self._by_number))
        if names.null_count:  # undeclared numbers (proto3 enums are open) as their digits
            names = pc.coalesce(names, numbers.cast(pa.string()))
        return names if mask is None else pc.if_else(mask, pa.scalar(None, pa.string()), names)

    def values(self, array: pa.Array[Any], path: str) -> list[Any]:
        numbers = pc.take(self._numbers, pc.index_in(array, value_set=self._value_set))
        if numbers.null_count == array.null_count:
            return numbers.to_pylist()
        # some names are not declared: numbers written as digits (what decode gives undeclared numbers)
        return [self._number(name, path) for name in array.to_pylist()]

    def _number(self, name: str | None, path: str) -> int | None:
        if name is None or name in self.numbers:
            return None if name is None else self.numbers[name]
        try:
            return int(name)
        except ValueError:
            raise EncodeError(f"{_FORMAT} encode: field '{path}' holds {name!r}, which is not a value of enum "
                              f"{self.full_name} (values: {', '.join(self.numbers)})") from None


class _Timestamp(_MessageNode):
    """google.protobuf.Timestamp as microseconds since the epoch, UTC (see the module doc for the unit)."""

    arrow_type = TIMESTAMP_TYPE

    def column(self, values: list[Any], mask: pa.BooleanArray | None) -> pa.Array[Any]:
        seconds = pa.array(list(map(_SECONDS, values)), pa.int64())
        nanos = pa.array(list(map(_NANOS, values)), pa.int64())
        # checked: a Timestamp beyond what int64 microseconds hold is an error (the record fails), not a wrap
        micros = pc.add_checked(pc.multiply_checked(seconds, _MICROS_PER_SECOND), pc.divide(nanos, _NANOS_PER_MICRO))
        if mask is not None:
            micros = pc.if_else(mask, pa.scalar(None, pa.int64()), micros)
        return micros.cast(TIMESTAMP_TYPE)

    def fill(self, messages: list[Message], array: pa.Array[Any], path: str) -> None:
        micros = array.cast(pa.int64())
        seconds = pc.divide(micros, _MICROS_PER_SECOND)  # integer division truncates toward zero ...
        rest = pc.subtract(micros, pc.multiply(seconds, _MICROS_PER_SECOND))
        before = pc.less(rest, pa.scalar(0, pa.int64()))  # ... so times before 1970 borrow a second (nanos >= 0)
        seconds = pc.if_else(before, pc.subtract(seconds, 1), seconds)
        nanos = pc.multiply(pc.if_else(before, pc.add(rest, _MICROS_PER_SECOND), rest), _NANOS_PER_MICRO)
        for message, whole, fraction in zip(messages, seconds.to_pylist(), nanos.to_pylist()):
            message.seconds = whole  # type: ignore[attr-defined]  # a Timestamp message
            message.nanos = fraction  # type: ignore[attr-defined]


class _Wrapper(_MessageNode):
    """google.protobuf.*Value: the wrapped scalar, null when the wrapper message is not set."""

    def __init__(self, arrow_type: pa.DataType) -> None:
        self.arrow_type = arrow_type

    def column(self, values: list[Any], mask: pa.BooleanArray | None) -> pa.Array[Any]:
        return pa.array(list(map(_VALUE, values)), type=self.arrow_type, mask=mask)

    def fill(self, messages: list[Message], array: pa.Array[Any], path: str) -> None:
        _set_all(messages, "value", array.to_pylist(), path, rows=False)


class _List(_Node):
    """A repeated field: the elements of all rows in one child array, plus offsets."""

    def __init__(self, item: _Node) -> None:
        self.item = item
        self.arrow_type = pa.list_(pa.field("item", item.arrow_type, nullable=False))

    def column(self, values: list[Any], mask: pa.BooleanArray | None) -> pa.Array[Any]:
        items = self.item.column(list(itertools.chain.from_iterable(values)), None)
        return pa.ListArray.from_arrays(_offsets(values), items, type=self.arrow_type)

    def assign(self, containers: list[Any], array: pa.Array[Any], path: str) -> None:
        """Append every row's elements to its repeated-field container (a null list adds none)."""
        spans, values = _spans(array)
        item, where = self.item, f"{path}[]"
        if isinstance(item, _MessageNode):
            elements = [element for container, (start, end) in zip(containers, spans)
                        for element in (container.add() for _ in range(end - start))]
            item.fill(elements, _take_spans(values, spans), where)
            return
        assert isinstance(item, _ValueNode)  # lists hold no lists and no maps (Protobuf has neither)
        flat = item.values(values, where)
        try:
            for container, (start, end) in zip(containers, spans):
                if end > start:
                    container.extend(flat[start:end])
        except (TypeError, ValueError) as exc:
            raise EncodeError(f"{_FORMAT} encode: field '{path}' holds an element it cannot: {exc}") from exc


class _Map(_Node):
    """A map field: keys and values of all rows in two child arrays, plus offsets; entries sorted by key."""

    def __init__(self, key: _ValueNode, value: _Node) -> None:
        self.key = key
        self.value = value
        value_field = pa.field("value", value.arrow_type, nullable=False)
        # pyarrow-stubs: map_ also takes a Field as the item type (it carries the values' nullability)
        self.arrow_type = pa.map_(key.arrow_type, value_field)  # type: ignore[call-overload]

    def column(self, values: list[Any], mask: pa.BooleanArray | None) -> pa.Array[Any]:
        keys_by_row = [sorted(m) if len(m) > 1 else list(m) for m in values]  # upb iterates keys natively
        keys = self.key.column(list(itertools.chain.from_iterable(keys_by_row)), None)
        items = self.value.column([m[k] for m, row in zip(values, keys_by_row) for k in row], None)
        # pyarrow-stubs want int64 offsets and no type= next to keys and items; pyarrow takes int32 and both
        built: pa.Array[Any] = pa.MapArray.from_arrays(  # type: ignore[call-overload]
            _offsets(keys_by_row), keys, items, type=self.arrow_type)
        return built

    def assign(self, containers: list[Any], array: pa.Array[Any], path: str) -> None:
        """Put every row's entries into its map container; a key twice in one row is an ``EncodeError``."""
        spans, entries = _spans(array)
        key_array, item_array = cast(pa.StructArray, entries).flatten()
        keys = self.key.values(key_array, f"{path}{{key}}")
        try:
            if isinstance(self.value, _MessageNode):
                values = [container[keys[n]] for container, (start, end) in zip(containers, spans)
                          for n in range(start, end)]
                self.value.fill(values, _take_spans(item_array, spans), f"{path}{{}}")
            else:
                assert isinstance(self.value, _ValueNode)  # map values are never lists or maps
                items = self.value.values(item_array, f"{path}{{}}")
                for container, (start, end) in zip(containers, spans):
                    for n in range(start, end):
                        container[keys[n]] = items[n]
        except (TypeError, ValueError) as exc:
            raise EncodeError(f"{_FORMAT} encode: field '{path}' holds an entry it cannot: {exc}") from exc
        for row, (container, (start, end)) in enumerate(zip(containers, spans)):
            if len(container) != end - start:
                raise EncodeError(f"{_FORMAT} encode: field '{path}' has a key twice in one map (value {row} of "
                                  "the column); a Protobuf map keeps only one")


class _Field:
    """One field of a message: reads it from every message, and knows whether "not set" is null."""

    def __init__(self, descriptor: FieldDescriptor, node: _Node, *, nullable: bool) -> None:
        self.name = descriptor.name
        self.node = node
        self.nullable = nullable
        self.arrow_field = pa.field(self.name, node.arrow_type, nullable=nullable)
        self._get = attrgetter(self.name)

    def extract(self, messages: Sequence[Message]) -> pa.Array[Any]:
        values = list(map(self._get, messages))
        mask = None
        if self.nullable and messages:
            present = list(map(type(messages[0]).HasField, messages, itertools.repeat(self.name)))
            mask = None if all(present) else pc.invert(pa.array(present, pa.bool_()))
        return self.node.column(values, mask)

    def assign(self, messages: list[Message], array: pa.Array[Any], path: str, *, rows: bool) -> None:
        """Set this field of every message from its row of ``array``; nulls leave it unset.

        ``rows``: ``messages`` are the batch's rows (so errors can name the row).
        """
        node = self.node
        if isinstance(node, (_List, _Map)):
            node.assign(list(map(self._get, messages)), array, path)
        elif isinstance(node, _MessageNode):
            if array.null_count:
                present = array.is_valid()
                messages = list(itertools.compress(messages, present.to_pylist()))
                array = array.filter(present)
            subs = list(map(self._get, messages))
            for sub in subs:
                sub.SetInParent()  # present even when every field of it is at its default
            node.fill(subs, array, path)
        else:
            assert isinstance(node, _ValueNode)
            _set_all(messages, self.name, node.values(array, path), path, rows=rows)


class _Struct(_MessageNode):
    """A message as a struct of its fields, in declaration order."""

    def __init__(self, descriptor: Descriptor, fields: list[_Field]) -> None:
        self.full_name = descriptor.full_name
        self.fields = fields
        self.arrow_type = pa.struct([f.arrow_field for f in fields])
        # real oneofs only: a proto3 `optional` is a synthetic oneof of one field, which cannot clash
        self.oneofs = [(o.name, [f.name for f in o.fields]) for o in descriptor.oneofs if len(o.fields) > 1]

    def column(self, values: list[Any], mask: pa.BooleanArray | None) -> pa.Array[Any]:
        if not self.fields:  # Arrow cannot infer the length of a struct without children
            return pa.array([{}] * len(values), self.arrow_type, mask=mask)
        children = [f.extract(values) for f in self.fields]
        return pa.StructArray.from_arrays(children, fields=[f.arrow_field for f in self.fields], mask=mask)

    def fill(self, messages: list[Message], array: pa.Array[Any], path: str, *, rows: bool = False) -> None:
        struct = cast(pa.StructArray, array)
        if not self.fields:
            return
        children = dict(zip((f.name for f in self.fields), struct.flatten()))
        check_oneofs(self.oneofs, children, path, self.full_name, rows=rows)
        for fld in self.fields:
            fld.assign(messages, children[fld.name], _join(path, fld.name), rows=rows)


class MessageMapping:
    """One Protobuf message type mapped to Arrow: its schema, parsed messages to a batch, and a batch back.

    ``where`` names where the type came from (a file, a registry id) for error messages.
    """

    def __init__(self, descriptor: Descriptor, *, where: str) -> None:
        self.descriptor = descriptor
        self.where = where
        self.message_class: type[Message] = message_factory.GetMessageClass(descriptor)
        self._struct = _Mapper(where).struct(descriptor, path="")
        if not self._struct.fields:
            raise SchemaError(f"Protobuf schema in {where}: message {descriptor.full_name} has no fields, so its "
                              "records would have no columns")
        self.arrow_schema = pa.schema([f.arrow_field for f in self._struct.fields])
        self.has_required = _has_required(descriptor, set())

    def to_batch(self, messages: Sequence[Message]) -> pa.RecordBatch:
        """The batch of ``messages`` (instances of ``message_class``), one row each, in order.

        Raises Arrow's errors (``pa.ArrowInvalid``, ``OverflowError``) when a value does not fit its column,
        e.g. a Timestamp beyond the microsecond range; callers isolate the culprit messages.
        """
        columns = [f.extract(messages) for f in self._struct.fields]
        return pa.RecordBatch.from_arrays(columns, schema=self.arrow_schema)

    def to_messages(self, batch: pa.RecordBatch) -> list[Message]:
        """One message per row of ``batch``; ``EncodeError`` names the column or row that does not fit.

        Column-wise: each field is set on all messages in one loop from its column's Python values (the
        generated constructor with nested dicts is ~10x slower: it walks every dict and map in Python).
        """
        conformed = conform_batch(batch, self.arrow_schema, fmt=_FORMAT)
        struct = pa.StructArray.from_arrays(conformed.columns, fields=list(self.arrow_schema))
        messages = [self.message_class() for _ in range(batch.num_rows)]
        self._struct.fill(messages, struct, path="", rows=True)
        return messages


class _Mapper:
    """One mapping pass over a message type and the types it uses; detects recursion."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.in_progress: list[str] = []  # full names of the messages being mapped, outermost first

    def fail(self, path: str, problem: str) -> SchemaError:
        location = f"field '{path}'" if path else "top level"
        return SchemaError(f"Protobuf schema in {self.where}, {location}: {problem}")

    def struct(self, descriptor: Descriptor, path: str) -> _Struct:
        if descriptor.full_name in self.in_progress:
            chain = " -> ".join([*self.in_progress[self.in_progress.index(descriptor.full_name):],
                                 descriptor.full_name])
            raise self.fail(path, f"recursive message {chain} cannot be represented in Arrow")
        self.in_progress.append(descriptor.full_name)
        fields = [self.field(fd, _join(path, fd.name)) for fd in descriptor.fields]
        self.in_progress.pop()
        return _Struct(descriptor, fields)

    def field(self, fd: FieldDescriptor, path: str) -> _Field:
        if is_map_field(fd):
            entry = cast(Descriptor, fd.message_type)  # a map field's type is its generated entry message
            key = cast(_ValueNode, self.single(entry.fields_by_name["key"], f"{path}{{key}}"))  # keys are scalars
            value = self.single(entry.fields_by_name["value"], f"{path}{{}}")
            return _Field(fd, _Map(key, value), nullable=False)
        node = self.single(fd, path)
        if fd.is_repeated:
            return _Field(fd, _List(node), nullable=False)
        # presence (optional, oneof, message) is null when unset; proto2 `required` is never unset once parsed
        return _Field(fd, node, nullable=fd.has_presence and not fd.is_required)

    def single(self, fd: FieldDescriptor, path: str) -> _Node:
        """The node of one value of ``fd`` (an element, for repeated fields)."""
        if fd.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
            message = cast(Descriptor, fd.message_type)  # set for message (and group) fields
            if message.full_name == TIMESTAMP:
                return _Timestamp()
            if message.full_name in WRAPPERS:
                return _Wrapper(WRAPPERS[message.full_name])
            return self.struct(message, path)
        if fd.cpp_type == FieldDescriptor.CPPTYPE_ENUM:
            return _Enum(cast(EnumDescriptor, fd.enum_type))  # set for enum fields
        if fd.cpp_type == FieldDescriptor.CPPTYPE_STRING:
            return _Scalar(pa.binary() if fd.type == FieldDescriptor.TYPE_BYTES else pa.string())
        if fd.cpp_type in _SCALARS:
            return _Scalar(_SCALARS[fd.cpp_type])
        raise self.fail(path, f"unsupported Protobuf field type {fd.type}")


def _has_required(descriptor: Descriptor, seen: set[str]) -> bool:
    """Whether a proto2 ``required`` field is anywhere in the message (then parsed messages must be checked)."""
    seen.add(descriptor.full_name)
    return any(fd.is_required or (fd.message_type is not None and fd.message_type.full_name not in seen
                                  and _has_required(fd.message_type, seen)) for fd in descriptor.fields)


def is_map_field(fd: FieldDescriptor) -> bool:
    """A ``map<K, V>`` field: protoc turns it into a repeated field of a generated ``*Entry`` message."""
    return bool(fd.is_repeated and fd.message_type is not None and fd.message_type.GetOptions().map_entry)


def check_oneofs(oneofs: list[tuple[str, list[str]]], children: dict[str, pa.Array[Any]], path: str,
                 message: str, *, rows: bool) -> None:
    """Refuse values that set several members of one oneof: Protobuf keeps only the last, losing the others."""
    for oneof, members in oneofs:
        clash = pc.greater(_count_valid(children[m] for m in members), pa.scalar(1, pa.int32()))
        if pc.any(clash).as_py():
            first = pc.index(clash, True).as_py()
            where = f"row {first}" if rows else f"field '{path}' (value {first} of the column)"
            raise EncodeError(f"{_FORMAT} encode: {where} sets more than one member of oneof '{oneof}' of "
                              f"message {message} (members: {', '.join(members)}); set at most one")


def _set_all(messages: list[Message], name: str, values: list[Any], path: str, *, rows: bool) -> None:
    """``message.<name> = value`` for each pair; None leaves the field unset. Errors name the value."""
    message, value = None, None
    try:
        for message, value in zip(messages, values):
            if value is not None:
                setattr(message, name, value)
    except (TypeError, ValueError) as exc:
        row = next(number for number, candidate in enumerate(messages) if candidate is message)
        where = f"row {row}, field '{path}'" if rows else f"field '{path}'"
        raise EncodeError(f"{_FORMAT} encode: {where} holds {value!r}, which the Protobuf field cannot: "
                          f"{exc}") from exc


def _count_valid(arrays: Iterable[pa.Array[Any]]) -> pa.Array[Any]:
    """Per row, how many of ``arrays`` hold a value there."""
    total: pa.Array[Any] | None = None
    for array in arrays:
        valid = array.is_valid().cast(pa.int32())
        total = valid if total is None else pc.add(total, valid)
    assert total is not None  # a oneof has members
    return total


def _entry_key(entry: tuple[Any, Any]) -> Any:
    return entry[0]


def _offsets(containers: list[Any]) -> pa.Int32Array:
    return pa.array(itertools.accumulate(map(len, containers), initial=0), pa.int32())


def _spans(array: pa.Array[Any]) -> tuple[list[tuple[int, int]], pa.Array[Any]]:
    """Per row of a list or map column, the (start, end) of its elements in the returned child array; a null
    row spans nothing. Offsets are rebased, so sliced columns work."""
    lists = cast("pa.ListArray[Any]", array)  # a list or a map column (MapArray is a ListArray)
    offsets = cast(list[int], lists.offsets.to_pylist())  # offsets are never null
    base = offsets[0]
    values = lists.values.slice(base, offsets[-1] - base)
    spans = [(start - base, end - base) for start, end in itertools.pairwise(offsets)]
    if lists.null_count:
        spans = [span if valid else (span[0], span[0]) for span, valid in zip(spans, lists.is_valid().to_pylist())]
    return spans, values


def _take_spans(values: pa.Array[Any], spans: list[tuple[int, int]]) -> pa.Array[Any]:
    """The elements ``spans`` cover, in order (all of ``values`` unless null rows skipped some)."""
    if sum(end - start for start, end in spans) == len(values):
        return values
    return values.take(pa.array([n for start, end in spans for n in range(start, end)], pa.int64()))


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
