"""Fuzzed: malformed records never break a connector, and none is lost or doubled.

Hypothesis writes streams of message values in three wire formats (JSON with a JSON Schema, schemaless Avro
with an ``.avsc``, Confluent-framed Avro with a ``schema_dir`` of ``<id>.avsc`` files) and mixes good
records with bad ones in random order, over random partitions and keys, with checkpoints at random points
and random source batch sizes. Each stream runs through a real connector pipeline on the
``TransformTestDriver``. The pipeline projects every row to its id, a few value columns and its source
partition and offset, so the output names each record it came from.

Every bad payload is built so that it is bad by construction, never merely "probably bad": a strict
prefix of a record, bytes after a record, invalid UTF-8 where a string's bytes are, a declared length
longer than the payload, an enum or union index past the schema's, a decimal wider than 16 bytes or than
its precision, an Avro int beyond 32 bits, a time of day outside a day, an Avro varint longer than 64
bits, a magic byte other than 0, a schema id with no ``<id>.avsc``, a writer schema that cannot be
resolved into the reader's, a JSON value that is not an object (``null`` too), of the wrong type, a
missing field, an integer beyond int64, JSON that Arrow's reader takes and orjson refuses (NaN, Infinity,
numbers beyond the double range, a byte order mark, nesting beyond 1024 levels in a member the schema
ignores), a deeply nested document, empty payloads and tombstones. Huge values (1 MB strings, integers
with up to 100k digits, nesting up to 100k levels) appear in good and bad records alike.

The properties, for every stream:

- the driver never raises;
- every bad record is in the dead-letter topic once, at stage ``decode``, with a non-empty reason, its
  original bytes (a tombstone's as ``b""``, as the Kafka sink writes it) and its key;
- every good record is in the output exactly once, with its own id and values;
- nothing is lost: the output's and the dead-letter topic's offsets together are exactly the sent ones.

Each bug the fuzz found also has its own test at the end of the module, with the payload that showed it:
a top-level JSON ``null`` (it crashed the process when it came first in a batch), a wrong-typed JSON value
nested 255 to 1023 levels deep, invalid UTF-8 inside a JSON string, JSON that Arrow reads and orjson
refuses (its verdict depended on its neighbours), an Avro int beyond 32 bits, an Avro varint longer than
64 bits, an Avro decimal wider than its precision but within 16 bytes, and a Confluent record cut inside
a field the reader skips.
"""

from __future__ import annotations

import copy
import datetime as dt
import io
import json
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro
import orjson
import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from connectors.metadata import OFFSET, PARTITION
from engine.config import ConnectorConfig, load_config
from engine.testing import TransformTestDriver
from engine.testing.connectors import write_config
from engine.testing.driver import DriverRecord
from schemas.base import NULL_PAYLOAD_REASON
from tests.helpers import EXAMPLES, REPO_ROOT
from tests.helpers.schema_samples import ALL_TYPES_AVSC, all_types_rows

FUZZ = settings(max_examples=50, deadline=None, derandomize=True, database=None,
                phases=[Phase.explicit, Phase.generate, Phase.shrink],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
"""Reproducible (derandomized, no example database) and bounded: the module runs in about half a minute.
A failure is shrunk to a minimal stream (that can take minutes; the explain phase is skipped)."""

BATCH_SIZES = (1, 3, 10_000)
"""``source.max_batch_records``: one record a batch, small batches mixing good and bad, everything at once."""
MAX_RECORDS = 20

MEGABYTE = 1 << 20
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
UTC = dt.UTC

SENTINEL = "\x01fuzz-sentinel\x01"
"""A string field's value in records whose string bytes are then overwritten (it occurs nowhere else)."""

INVALID_UTF8 = (b"\xff", b"\xfe\xfe", b"\x80", b"\xc0\xaf", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80",
                b"\xf4\x90\x80\x80", b"\xe2\x82")
"""Byte sequences no UTF-8 decoder accepts: bad leading bytes, stray continuation bytes, overlong forms,
UTF-16 surrogates, code points past U+10FFFF, and a sequence cut short."""


# -- what is sent, and what must come out -------------------------------------------------------------------

class Payload:
    """One message value; ``expected`` is the projected output row of a good record, None for a bad one.

    Not a dataclass: hypothesis prints a dataclass field by field, and falsifying examples hold megabyte
    values, so this one shows the size of a long value instead of its bytes."""

    __slots__ = ("expected", "kind", "value")

    def __init__(self, kind: str, value: bytes | None, expected: dict[str, Any] | None = None) -> None:
        self.kind = kind
        self.value = value
        self.expected = expected

    def __repr__(self) -> str:
        shown = repr(self.value) if self.value is None or len(self.value) <= 120 else (
            f"{self.value[:60]!r}...<{len(self.value)} bytes>")
        return f"Payload({self.kind!r}, {shown})"


@dataclass(frozen=True)
class Sent:
    payload: Payload
    partition: int
    key: bytes | None
    checkpoint_after: bool


@dataclass(frozen=True)
class Traffic:
    """A stream of records over ``partitions`` partitions, read ``max_batch_records`` at a time."""

    partitions: int
    max_batch_records: int
    records: list[Sent]


def stream_of(*payloads: Payload) -> Traffic:
    """The payloads on one partition, read in one batch (for the hand-written cases)."""
    return Traffic(1, 10_000, [Sent(payload, 0, None, False) for payload in payloads])


@dataclass(frozen=True)
class Good:
    """A good record, with what its bad variants are made from: its fields and (for JSON) its raw members."""

    value: bytes
    expected: dict[str, Any]
    fields: dict[str, Any]
    members: tuple[tuple[str, bytes], ...] = ()
    skipped_tail: int = 0
    """Trailing bytes of a field the reader's schema drops (where fastavro once missed a cut)."""


@dataclass(frozen=True)
class Mutation:
    """One way to break a good record: ``apply`` it with parameters drawn from ``params``."""

    params: st.SearchStrategy[Any]
    apply: Callable[[Good, Any], bytes | None]


@dataclass(frozen=True)
class WireFormat:
    """How to make a good record of one format (from a unique id and drawn parameters), and how to break one."""

    name: str
    columns: tuple[str, ...]
    good_params: st.SearchStrategy[Any]
    make_good: Callable[[int, Any], Good]
    mutations: Mapping[str, Mutation]


KEYS = st.none() | st.binary(max_size=8)


def traffic(wire: WireFormat) -> st.SearchStrategy[Traffic]:
    """Streams whose records are good about a third of the time, else one of the format's bad variants."""
    kinds = st.sampled_from(["good"] * (len(wire.mutations) // 2) + sorted(wire.mutations))

    @st.composite
    def build(draw: st.DrawFn) -> Traffic:
        partitions = draw(st.integers(1, 3))
        batch = draw(st.sampled_from(BATCH_SIZES))
        records = []
        for ident in range(draw(st.integers(1, MAX_RECORDS))):
            good = wire.make_good(ident, draw(wire.good_params))
            kind = draw(kinds)
            if kind == "good":
                payload = Payload(kind, good.value, good.expected)
            else:
                mutation = wire.mutations[kind]
                payload = Payload(kind, mutation.apply(good, draw(mutation.params)))
            records.append(Sent(payload, draw(st.integers(0, partitions - 1)), draw(KEYS),
                                draw(st.integers(0, 5)) == 0))
        return Traffic(partitions, batch, records)

    return build()


def rarely(strategy: st.SearchStrategy[Any], otherwise: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``strategy`` about one draw in sixteen, else ``otherwise`` (for values too big to be common)."""
    return st.integers(0, 15).flatmap(lambda n: strategy if n == 0 else otherwise)


def short_texts(max_size: int = 30) -> st.SearchStrategy[str]:
    return st.text(st.characters(codec="utf-8"), max_size=max_size)


HUGE_STRINGS = st.builds(lambda char, size: char * size, st.characters(codec="utf-8"), st.just(MEGABYTE))
"""One character repeated to a megabyte (up to 4 MB of UTF-8)."""
TEXTS = rarely(HUGE_STRINGS, short_texts())
FINITE_FLOATS = st.floats(allow_nan=False, allow_infinity=False)
FRACTIONS = st.integers(0, (1 << 16) - 1)
"""Where to cut a payload, as a fraction of its length in 1/65536ths (shrinks towards the empty prefix)."""


def prefix(value: bytes, fraction: int, start: int = 0) -> bytes:
    """A strict prefix of ``value``, at least ``start`` bytes long."""
    return value[:start + fraction * (len(value) - start) // (1 << 16)]


# -- running a stream, and the properties -------------------------------------------------------------------

Position = tuple[int, int]


def header(letter: DriverRecord, name: str) -> str:
    values = [value for key, value in letter.headers if key == f"epochline.{name}"]
    assert len(values) == 1, f"dead letter without exactly one epochline.{name} header: {letter.headers}"
    value = values[0]
    return value.decode() if isinstance(value, bytes) else str(value)


def position(letter: DriverRecord) -> Position:
    return int(header(letter, "partition")), int(header(letter, "offset"))


def run(config: ConnectorConfig, stream: Traffic) -> tuple[dict[Position, Sent], list[dict[str, Any]],
                                                           list[DriverRecord]]:
    """Send the stream, checkpointing where it says; the sent records by position, the output rows and
    the dead letters."""
    sent: dict[Position, Sent] = {}
    ends: Counter[int] = Counter()
    with TransformTestDriver(config, partitions=stream.partitions) as driver:
        for record in stream.records:
            driver.send_raw([record.payload.value], partition=record.partition, key=record.key)
            sent[(record.partition, ends[record.partition])] = record
            ends[record.partition] += 1
            if record.checkpoint_after:
                driver.output()
        return sent, driver.output_rows(), driver.dead_letters()


def count_kinds(wire: WireFormat, stream: Traffic) -> None:
    """For ``--hypothesis-show-statistics``: which kinds of record the fuzzed streams held."""
    for record in stream.records:
        event(f"{wire.name}: {record.payload.kind}")


def assert_nothing_lost_or_doubled(wire: WireFormat, config: ConnectorConfig, stream: Traffic) -> None:
    sent, rows, letters = run(config, stream)

    output_at = Counter((row[PARTITION], row[OFFSET]) for row in rows)
    dead_at = Counter(position(letter) for letter in letters)
    kinds = {at: record.payload.kind for at, record in sent.items()}

    # none is lost, none is doubled, and each lands where its kind says
    assert {at: count for at, count in (output_at + dead_at).items() if count != 1} == {}
    assert set(output_at) | set(dead_at) == set(sent)
    assert {at: kinds[at] for at in dead_at} == {at: kind for at, kind in kinds.items() if kind != "good"}
    assert {at: kinds[at] for at in output_at} == {at: kind for at, kind in kinds.items() if kind == "good"}

    # every good record once, with its own id and values
    assert {(row[PARTITION], row[OFFSET]): {column: row[column] for column in wire.columns} for row in rows} == {
        at: record.payload.expected for at, record in sent.items() if record.payload.expected is not None}
    assert [ident for ident, count in Counter(row["id"] for row in rows).items() if count > 1] == []

    # every bad record with its bytes, its key and a reason
    for letter in letters:
        record = sent[position(letter)]
        assert header(letter, "stage") == "decode"
        assert header(letter, "reason").strip(), f"no reason given for {record.payload}"
        assert letter.value == (record.payload.value or b"")
        assert letter.key == record.key
        if record.payload.value is None:
            assert header(letter, "reason") == NULL_PAYLOAD_REASON


# -- JSON: examples/orders.schema.json (id integer, user string, amount number, ts date-time; all required) --

JSON_FIELDS = ("id", "user", "amount", "ts")
JSON_SEPARATORS = (b",", b", ", b",\n  ", b" ,\r\n\t")
MAX_MEMBERS = len(JSON_FIELDS) + 4  # the extras and the deeply nested extra below


def json_object(members: Sequence[tuple[str, bytes]], separator: bytes = b",") -> bytes:
    """A JSON object from already encoded member values (so they can be any text, valid or not)."""
    return b"{" + separator.join(orjson.dumps(name) + b":" + value for name, value in members) + b"}"


def nested(depth: int, kind: str) -> bytes:
    """``depth`` nested arrays, or objects, around a 1."""
    if kind == "array":
        return b"[" * depth + b"1" + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


JSON_SCALARS = (st.booleans() | st.integers(INT64_MIN, INT64_MAX) | FINITE_FLOATS | short_texts(10))
JSON_VALUES = st.recursive(st.none() | JSON_SCALARS, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(short_texts(5), inner, max_size=3), max_leaves=8)
NON_OBJECTS = st.none() | JSON_SCALARS | st.lists(JSON_VALUES, max_size=3)
"""Top-level JSON that is not an object (``null`` crashed Arrow's reader when it came first in a batch)."""

ISO_TIMESTAMPS = st.tuples(
    st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1), timezones=st.just(UTC)),
    st.sampled_from([UTC, dt.timezone(dt.timedelta(hours=5, minutes=30)), dt.timezone(-dt.timedelta(hours=8))]),
    st.booleans(),
).map(lambda t: t[0].astimezone(t[1]).isoformat().replace("+00:00", "Z" if t[2] else "+00:00"))
"""RFC 3339 date-times with ``Z``, ``+00:00`` or another offset, with and without fractions of a second."""

JSON_AMOUNTS = (FINITE_FLOATS.map(lambda x: (orjson.dumps(x), x))
                | st.integers(-(10 ** 300), 10 ** 300).map(lambda n: (str(n).encode(), float(n))))
"""An amount as JSON text and the float it denotes: any finite double, or an integer up to 10^300."""

JSON_EXTRAS = st.dictionaries(short_texts(6).filter(lambda name: name not in JSON_FIELDS), JSON_VALUES, max_size=3)
"""Members the schema does not name (ignored when decoding)."""

GOOD_JSON_PARAMS = st.tuples(TEXTS, JSON_AMOUNTS, ISO_TIMESTAMPS, JSON_EXTRAS,
                             rarely(st.tuples(st.integers(1, 500), st.sampled_from(["array", "object"])), st.none()),
                             st.permutations(range(MAX_MEMBERS)), st.sampled_from(JSON_SEPARATORS))


def good_json(ident: int, params: Any) -> Good:
    user, (amount_text, amount), ts, extras, deep, order, separator = params
    members = [("id", str(ident).encode()), ("user", orjson.dumps(user)), ("amount", amount_text),
               ("ts", orjson.dumps(ts)), *((name, orjson.dumps(value)) for name, value in extras.items())]
    if deep is not None:  # nested deeply, but within what every JSON parser here takes (1024 levels)
        members.append(("deep", nested(*deep)))
    members = [members[i] for i in sorted(range(len(members)), key=order.__getitem__)]
    return Good(json_object(members, separator), {"id": ident, "user": user, "amount": amount}, {"user": user},
                tuple(members))


def replaced(good: Good, name: str, value: bytes | None) -> bytes:
    """The good record with member ``name`` set to ``value`` (raw JSON text), or removed (None)."""
    if value is None:
        return json_object([(member, text) for member, text in good.members if member != name])
    return json_object([(member, value if member == name else text) for member, text in good.members])


def invalid_utf8_in_a_json_string(good: Good, bad: bytes, where: str) -> bytes:
    """The good record with invalid UTF-8 in one of its strings, or in a member or member name it adds."""
    if where == "unknown member":
        return json_object([*good.members, ("not_utf8", b'"a' + bad + b'"')])
    if where == "member name":
        return b'{"' + bad + b'":1,' + good.value[1:]
    return replaced(good, where, b'"2026' + bad + b'"')


def with_member(good: Good, where: str, number: bytes) -> bytes:
    """The good record with ``number`` as its amount, or in a member the schema does not name."""
    if where == "amount":
        return replaced(good, "amount", number)
    value = number if where == "unknown member" else b"[1," + number + b"]"
    return json_object([*good.members, ("extra_number", value)])


WRONG_JSON_TYPES: dict[str, st.SearchStrategy[Any]] = {
    "id": st.none() | st.booleans() | st.floats() | short_texts() | st.lists(st.integers(), max_size=2)
    | st.dictionaries(short_texts(3), st.integers(), max_size=2),
    "user": st.none() | st.booleans() | st.integers(INT64_MIN, INT64_MAX) | FINITE_FLOATS
    | st.lists(short_texts(), max_size=2) | st.dictionaries(short_texts(3), short_texts(), max_size=2),
    "amount": st.none() | st.booleans() | short_texts() | st.lists(FINITE_FLOATS, max_size=2)
    | st.dictionaries(short_texts(3), FINITE_FLOATS, max_size=2),
    "ts": st.none() | st.booleans() | st.integers(INT64_MIN, INT64_MAX) | FINITE_FLOATS
    | st.sampled_from(["", "yesterday", "2026-13-01T00:00:00Z", "2026-02-30T00:00:00Z", "2026-01-01T25:00:00Z",
                       "1767225600", "01/01/2026 00:00"]) | st.lists(short_texts(), max_size=2),
}
"""Per field, values of a type the schema does not allow (null included: every field is required)."""

GIANT_INTEGERS = (
    (st.integers(INT64_MAX + 1, 10 ** 400) | st.integers(-(10 ** 400), INT64_MIN - 1)).map(lambda n: str(n).encode())
    | st.tuples(st.sampled_from([b"", b"-"]), st.integers(20, 100_000)).map(lambda t: t[0] + b"9" * t[1]))
"""Integers beyond int64: just past either end, far past, and up to 100k digits."""

NON_STANDARD_NUMBERS = (
    st.sampled_from([b"NaN", b"-NaN", b"Inf", b"-Inf", b"Infinity", b"-Infinity",
                     b"1.8e308", b"-1.797693134862316e308"])
    | st.tuples(st.sampled_from([b"", b"-"]), st.integers(309, 5_000)).map(lambda t: t[0] + b"9" * t[1])
    | st.tuples(st.sampled_from([b"", b"-"]), st.integers(1, 9), st.sampled_from([b"e", b"E", b"e+", b"E+"]),
                st.integers(309, 99_999)).map(lambda t: b"%s%d%s%d" % t))
"""JSON numbers Arrow's reader takes and orjson refuses: NaN and the infinities, and numbers beyond the
double range (as digits or with an exponent)."""

JSON_MUTATIONS: dict[str, Mutation] = {
    "truncated": Mutation(FRACTIONS, lambda good, f: prefix(good.value, f)),
    "trailing garbage": Mutation(st.sampled_from([b"x", b"}", b",", b"]", b"{", b"\x00", b"null"]),
                                 lambda good, tail: good.value + tail),
    "two objects in one payload": Mutation(st.sampled_from([b"", b" ", b"\n", b"\r\n"]),
                                           lambda good, gap: good.value + gap + good.value),
    "not an object": Mutation(NON_OBJECTS, lambda good, value: orjson.dumps(value)),
    "deeply nested document": Mutation(st.integers(1, 100_000), lambda good, depth: nested(depth, "array")),
    "deeply nested object without the fields": Mutation(st.integers(1, 100_000),
                                                        lambda good, depth: nested(depth, "object")),
    "deeply nested field": Mutation(
        st.tuples(st.sampled_from(JSON_FIELDS), st.integers(1, 50_000), st.sampled_from(["array", "object"])),
        lambda good, p: replaced(good, p[0], nested(p[1], p[2]))),
    "wrong type": Mutation(st.one_of([st.tuples(st.just(name), values) for name, values in WRONG_JSON_TYPES.items()]),
                           lambda good, p: replaced(good, p[0], orjson.dumps(p[1]))),
    "huge string of the wrong type": Mutation(st.tuples(st.sampled_from(["id", "amount", "ts"]), HUGE_STRINGS),
                                              lambda good, p: replaced(good, p[0], orjson.dumps(p[1]))),
    "missing field": Mutation(st.sampled_from(JSON_FIELDS), lambda good, name: replaced(good, name, None)),
    "giant integer id": Mutation(GIANT_INTEGERS, lambda good, text: replaced(good, "id", text)),
    "invalid UTF-8 between tokens": Mutation(
        st.tuples(st.sampled_from(INVALID_UTF8), st.integers(0, 2)),
        lambda good, p: [p[0] + good.value, good.value[:1] + p[0] + good.value[1:], good.value + p[0]][p[1]]),
    "invalid escape in a string": Mutation(
        st.sampled_from([b"\\ud800", b"\\udfff", b"\\ud83dx", b"\\u12", b"\\u", b"\\x41", b"\\q", b"\x01", b"\x1f",
                         b"\n", b"\r", b"\r\n", b"\t"]),
        lambda good, escape: replaced(good, "user", b'"a' + escape + b'b"')),
    "invalid UTF-8 in a string": Mutation(
        st.tuples(st.sampled_from(INVALID_UTF8), st.sampled_from(["user", "ts", "unknown member", "member name"])),
        lambda good, p: invalid_utf8_in_a_json_string(good, *p)),
    "non-standard number": Mutation(
        st.tuples(st.sampled_from(["amount", "unknown member", "in an array"]), NON_STANDARD_NUMBERS),
        lambda good, p: with_member(good, p[0], p[1])),
    "byte order mark": Mutation(st.sampled_from([b"", b" "]), lambda good, gap: b"\xef\xbb\xbf" + gap + good.value),
    "nested too deep in an unknown member": Mutation(
        st.tuples(st.integers(1024, 20_000), st.sampled_from(["array", "object"])),
        lambda good, p: json_object([*good.members, ("too_deep", nested(*p))])),
    "empty": Mutation(st.sampled_from([b"", b" ", b"\n", b"\t\r\n "]), lambda good, blank: blank),
    "null": Mutation(st.none(), lambda good, _: None),
}

JSON = WireFormat("json", ("id", "user", "amount"), GOOD_JSON_PARAMS, good_json, JSON_MUTATIONS)


# -- Avro: examples/schema-files/all_types.avsc, schemaless -----------------------------------------------

ALL_TYPES: dict[str, Any] = json.loads(ALL_TYPES_AVSC.read_text())
BASE_ROWS = all_types_rows(16)
"""Every other field's values come from these rows (every Avro type and logical type epochline maps)."""


def writer_schema(schema: dict[str, Any], changes: Mapping[str, Any]) -> Any:
    """fastavro's parsed form of ``schema`` with the types of some fields replaced."""
    changed = copy.deepcopy(schema)
    for fld in changed["fields"]:
        if fld["name"] in changes:
            fld["type"] = copy.deepcopy(changes[fld["name"]])
    return fastavro.parse_schema(changed)


def avro_body(parsed: Any, row: Mapping[str, Any]) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, parsed, dict(row))
    return buffer.getvalue()


def zigzag_varint(number: int) -> bytes:
    """Avro's int/long encoding, for any Python int (past 64 bits it is no valid Avro any more)."""
    left = number << 1 if number >= 0 else ((-number) << 1) - 1
    out = bytearray()
    while left > 0x7F:
        out.append(left & 0x7F | 0x80)
        left >>= 7
    out.append(left)
    return bytes(out)


LONG_SENTINEL = 0x0123_4567_89AB_CDEF
"""A long field's value in records whose varint is then overwritten (its encoding occurs nowhere else)."""
BEYOND_INT64 = st.integers(INT64_MAX + 1, 1 << 100) | st.integers(-(1 << 100), INT64_MIN - 1)


def overwrite_once(body: bytes, old: bytes, new: bytes) -> bytes:
    assert body.count(old) == 1, f"{old!r} must occur once in the record to be overwritten"
    return body.replace(old, new)


def invalid_utf8_in_sentinel(body: bytes, bad: bytes) -> bytes:
    """The sentinel string's bytes overwritten, same length (so the record still frames), to invalid UTF-8."""
    return overwrite_once(body, SENTINEL.encode(), bad + b"a" * (len(SENTINEL) - len(bad)))


def declared_length_past_the_end(body: bytes, extra: int) -> bytes:
    """The sentinel string's length prefix overwritten to say more bytes follow than the whole payload has."""
    return overwrite_once(body, zigzag_varint(len(SENTINEL)) + SENTINEL.encode(),
                          zigzag_varint(len(body) + 1 + extra) + SENTINEL.encode())


Reencode = Callable[[Good, Mapping[str, Any]], bytes]


def avro_common_mutations(reencode: Reencode, string_field: str, long_field: str,
                          header_size: int = 0) -> dict[str, Mutation]:
    """Breakages every Avro framing shares; ``reencode`` writes the good record with some fields changed."""
    return {
        "truncated": Mutation(FRACTIONS, lambda good, f: prefix(good.value, f)),
        "trailing bytes": Mutation(st.binary(min_size=1, max_size=16), lambda good, tail: good.value + tail),
        "invalid UTF-8 in a string": Mutation(st.sampled_from(INVALID_UTF8), lambda good, bad: invalid_utf8_in_sentinel(
            reencode(good, {string_field: SENTINEL}), bad)),
        "string length past the end": Mutation(st.integers(0, 1 << 61), lambda good, extra: (
            declared_length_past_the_end(reencode(good, {string_field: SENTINEL}), extra))),
        "huge string truncated": Mutation(st.tuples(HUGE_STRINGS, FRACTIONS), lambda good, p: prefix(
            reencode(good, {string_field: p[0]}), p[1], start=header_size)),
        "long varint wider than 64 bits": Mutation(BEYOND_INT64, lambda good, value: overwrite_once(
            reencode(good, {long_field: LONG_SENTINEL}), zigzag_varint(LONG_SENTINEL), zigzag_varint(value))),
        "empty": Mutation(st.just(b""), lambda good, blank: blank),
        "null": Mutation(st.none(), lambda good, _: None),
    }


ALL_TYPES_PARSED = fastavro.parse_schema(copy.deepcopy(ALL_TYPES))
COLOR = next(f["type"] for f in ALL_TYPES["fields"] if f["name"] == "color")
MORE_SYMBOLS_WRITER = writer_schema(ALL_TYPES, {"color": {**COLOR, "symbols": [*COLOR["symbols"], "PURPLE", "CYAN"]}})
MORE_BRANCHES_WRITER = writer_schema(ALL_TYPES, {"opt_s": ["null", "string", "long", "double"]})
RAW_PRICE_WRITER = writer_schema(ALL_TYPES, {"price": "bytes"})
RAW_DECIMAL_WRITERS = {"price": RAW_PRICE_WRITER,
                       "rate": writer_schema(ALL_TYPES, {"rate": {"type": "fixed", "name": "Rate", "size": 8}})}
"""The decimals' bytes as the reader sees them (bytes decimal(10, 2), fixed(8) decimal(12, 4)), unchecked."""
INT_AS_LONG_WRITERS = {name: writer_schema(ALL_TYPES, {name: "long"}) for name in ("i", "day", "t_ms")}
"""The same varint as the reader's ``int`` (and date, time-millis), without its 32-bit bound."""
TIMES_OF_DAY = {"t_ms": (writer_schema(ALL_TYPES, {"t_ms": "int"}), INT32_MIN, INT32_MAX, 86_400_000),
                "t_us": (writer_schema(ALL_TYPES, {"t_us": "long"}), INT64_MIN, INT64_MAX, 86_400_000_000)}
"""Per time field: a writer of its plain integer, the integer's range, and the ticks in a day."""

INT64S = st.sampled_from([INT64_MIN, INT64_MAX, 0, -1]) | st.integers(INT64_MIN, INT64_MAX)
INT32S = st.sampled_from([INT32_MIN, INT32_MAX]) | st.integers(INT32_MIN, INT32_MAX)
GOOD_AVRO_PARAMS = st.tuples(st.sampled_from(BASE_ROWS), TEXTS, INT64S, INT32S)


def good_avro(ident: int, params: Any) -> Good:
    base, text, long_value, int_value = params
    row = {**base, "id": str(uuid.UUID(int=ident)), "s": text, "l": long_value, "i": int_value}
    return Good(avro_body(ALL_TYPES_PARSED, row), {"id": row["id"], "s": text, "l": long_value, "i": int_value}, row)


def reencode_avro(good: Good, changes: Mapping[str, Any], parsed: Any = ALL_TYPES_PARSED) -> bytes:
    return avro_body(parsed, {**good.fields, **changes})


def two_complement(value: int, size: int | None = None) -> bytes:
    """Avro's decimal bytes for an unscaled ``value``: minimal, or ``size`` bytes."""
    return value.to_bytes(size or (value if value >= 0 else ~value).bit_length() // 8 + 1, "big", signed=True)


BEYOND_PRECISION = (
    st.tuples(st.just("price"), st.integers(10 ** 10, (1 << 127) - 1) | st.integers(-(1 << 127), -(10 ** 10)))
    | st.tuples(st.just("rate"), st.integers(10 ** 12, INT64_MAX) | st.integers(INT64_MIN, -(10 ** 12))))
"""Unscaled decimals with more digits than the field's precision, within its 16 (or 8 fixed) bytes."""
OUTSIDE_A_DAY = st.sampled_from(sorted(TIMES_OF_DAY)).flatmap(lambda name: st.tuples(
    st.just(name), st.integers(TIMES_OF_DAY[name][3], TIMES_OF_DAY[name][2]) | st.integers(TIMES_OF_DAY[name][1], -1)))

WIDE_DECIMALS = st.tuples(st.integers(0x40, 0xBF), st.binary(min_size=16, max_size=39)).map(
    lambda t: bytes([t[0]]) + t[1])
"""Two's-complement integers of 17 to 40 bytes whose magnitude is at least 2^134: no decimal128 holds them."""

AVRO_MUTATIONS: dict[str, Mutation] = {
    **avro_common_mutations(reencode_avro, "s", "l"),
    "enum index past the symbols": Mutation(st.sampled_from(["PURPLE", "CYAN"]), lambda good, symbol: reencode_avro(
        good, {"color": symbol}, MORE_SYMBOLS_WRITER)),
    "union index past the branches": Mutation(st.integers(INT64_MIN, INT64_MAX) | FINITE_FLOATS, lambda good, value: (
        reencode_avro(good, {"opt_s": value}, MORE_BRANCHES_WRITER))),
    "decimal wider than 128 bits": Mutation(WIDE_DECIMALS, lambda good, raw: reencode_avro(
        good, {"price": raw}, RAW_PRICE_WRITER)),
    "decimal beyond its precision": Mutation(BEYOND_PRECISION, lambda good, p: reencode_avro(
        good, {p[0]: two_complement(p[1], 8 if p[0] == "rate" else None)}, RAW_DECIMAL_WRITERS[p[0]])),
    "int beyond 32 bits": Mutation(
        st.tuples(st.sampled_from(sorted(INT_AS_LONG_WRITERS)),
                  st.integers(INT32_MAX + 1, INT64_MAX) | st.integers(INT64_MIN, INT32_MIN - 1)),
        lambda good, p: reencode_avro(good, {p[0]: p[1]}, INT_AS_LONG_WRITERS[p[0]])),
    "time of day outside a day": Mutation(OUTSIDE_A_DAY, lambda good, p: reencode_avro(
        good, {p[0]: p[1]}, TIMES_OF_DAY[p[0]][0])),
}

AVRO = WireFormat("avro", ("id", "s", "l", "i"), GOOD_AVRO_PARAMS, good_avro, AVRO_MUTATIONS)


# -- Confluent-framed Avro: schema ids 1, 2 (a compatible evolution) and 3 (an incompatible one) ------------

EVENT: dict[str, Any] = json.loads((EXAMPLES / "schema-files" / "event.avsc").read_text())
SCHEMA_FILES = {
    1: EVENT,
    2: {**EVENT, "fields": [*EVENT["fields"], {"name": "channel", "type": "string", "default": "web"}]},
    3: {**EVENT, "fields": [{**f, "type": "string"} if f["name"] == "id" else f for f in EVENT["fields"]]},
}
"""``schema_dir``: the reader's schema (id 1), a writer adding a field with a default (2: readable into 1),
and a writer whose id is a string (3: cannot be resolved into 1)."""
EVENT_PARSED = {schema_id: fastavro.parse_schema(copy.deepcopy(schema)) for schema_id, schema in SCHEMA_FILES.items()}
CHANNEL_ONLY = fastavro.parse_schema({"type": "record", "name": "Channel", "fields": [SCHEMA_FILES[2]["fields"][-1]]})
"""The encoding of id 2's last field, ``channel``, which the reader (id 1) skips."""
ID_BASES = (0, INT64_MIN, INT64_MAX - 1_000)
"""Good ids are ``base + n``: unique within a stream, and near both ends of the long range."""

GOOD_CONFLUENT_PARAMS = st.tuples(
    st.sampled_from([1, 2]), st.sampled_from(ID_BASES), TEXTS, FINITE_FLOATS,
    st.datetimes(min_value=dt.datetime(1, 1, 1), timezones=st.just(UTC)), st.none() | short_texts(8), st.booleans(),
    st.uuids(), st.none() | TEXTS, short_texts(8))


def framed(schema_id: int, body: bytes, magic: int = 0) -> bytes:
    return bytes([magic]) + schema_id.to_bytes(4, "big") + body


def good_confluent(ident: int, params: Any) -> Good:
    schema_id, base, user, amount, ts, country, flag, session, note, channel = params
    row = {"id": base + ident, "user": user, "amount": amount, "ts": ts, "country": country, "flag": flag,
           "session": str(session), "note": note, "channel": channel, "schema_id": schema_id}
    expected = {"id": row["id"], "user": user, "amount": amount}
    skipped = len(avro_body(CHANNEL_ONLY, {"channel": channel})) if schema_id == 2 else 0
    return Good(framed(schema_id, avro_body(EVENT_PARSED[schema_id], row)), expected, row, skipped_tail=skipped)


def reencode_framed(good: Good, changes: Mapping[str, Any]) -> bytes:
    row = {**good.fields, **changes}
    return framed(row["schema_id"], avro_body(EVENT_PARSED[row["schema_id"]], row))


CONFLUENT_MUTATIONS: dict[str, Mutation] = {
    **avro_common_mutations(reencode_framed, "user", "id", header_size=5),
    "shorter than the header": Mutation(st.binary(max_size=4), lambda good, raw: raw),
    "wrong magic byte": Mutation(st.integers(1, 255), lambda good, magic: bytes([magic]) + good.value[1:]),
    "unknown schema id": Mutation(st.integers(0, (1 << 32) - 1).filter(lambda n: n not in SCHEMA_FILES),
                                  lambda good, schema_id: framed(schema_id, good.value[5:])),
    "writer schema that does not resolve": Mutation(st.none(), lambda good, _: framed(3, avro_body(
        EVENT_PARSED[3], {**good.fields, "id": str(good.fields["id"])}))),
}

CONFLUENT = WireFormat("avro-confluent", ("id", "user", "amount"), GOOD_CONFLUENT_PARAMS, good_confluent,
                       CONFLUENT_MUTATIONS)


# -- connectors ---------------------------------------------------------------------------------------------

SOURCES: dict[str, dict[str, Any]] = {
    "json": {"format": "json", "schema": "orders.schema.json"},
    "avro": {"format": "avro", "schema": "all_types.avsc"},
    "avro-confluent": {"format": "avro-confluent", "schema_dir": "schemas", "schema_id": 1},
}


class Connectors:
    """The fuzzed connectors by format and batch size (a class, so a falsifying example prints one line)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._configs: dict[tuple[str, int], ConnectorConfig] = {}

    def path(self, wire: WireFormat, batch: int = 10_000) -> Path:
        return self.directory / f"fuzz-{wire.name}-{batch}.yaml"

    def write(self, wire: WireFormat, batch: int) -> None:
        projection = ", ".join(f'"{column}"' for column in (*wire.columns, PARTITION, OFFSET))
        write_config(self.directory, {
            "name": self.path(wire, batch).stem,
            "source": {"topic": "in", **SOURCES[wire.name], "max_batch_records": batch},
            "transform": {"sql": f"SELECT {projection} FROM input"},
            "sink": {"topic": "out", "format": "json", "include_metadata": [PARTITION, OFFSET]},
            "dead_letter": {"topic": "dlq"},
        })
        self._configs[(wire.name, batch)] = load_config(self.path(wire, batch))

    def __call__(self, wire: WireFormat, batch: int = 10_000) -> ConnectorConfig:
        return self._configs[(wire.name, batch)]

    def __repr__(self) -> str:
        return f"Connectors({str(self.directory)!r})"


@pytest.fixture(scope="module")
def connectors(tmp_path_factory: pytest.TempPathFactory) -> Connectors:
    """One connector per format and batch size, with its schema files beside its config (module-scoped, as
    hypothesis runs every example of a test inside one call of it)."""
    directory = tmp_path_factory.mktemp("fuzz-connectors")
    (directory / "orders.schema.json").write_bytes((EXAMPLES / "orders.schema.json").read_bytes())
    (directory / "all_types.avsc").write_bytes(ALL_TYPES_AVSC.read_bytes())
    (directory / "schemas").mkdir()
    for schema_id, schema in SCHEMA_FILES.items():
        (directory / "schemas" / f"{schema_id}.avsc").write_text(json.dumps(schema))
    found = Connectors(directory)
    for wire in (JSON, AVRO, CONFLUENT):
        for batch in BATCH_SIZES:
            found.write(wire, batch)
    return found


# -- the fuzz tests -----------------------------------------------------------------------------------------

@FUZZ
@given(stream=traffic(JSON))
def test_malformed_json_is_dead_lettered_and_every_good_record_is_output_once(
        connectors: Connectors, stream: Traffic) -> None:
    count_kinds(JSON, stream)
    assert_nothing_lost_or_doubled(JSON, connectors(JSON, stream.max_batch_records), stream)


@FUZZ
@given(stream=traffic(AVRO))
def test_malformed_avro_is_dead_lettered_and_every_good_record_is_output_once(
        connectors: Connectors, stream: Traffic) -> None:
    count_kinds(AVRO, stream)
    assert_nothing_lost_or_doubled(AVRO, connectors(AVRO, stream.max_batch_records), stream)


@FUZZ
@given(stream=traffic(CONFLUENT))
def test_malformed_confluent_avro_is_dead_lettered_and_every_good_record_is_output_once(
        connectors: Connectors, stream: Traffic) -> None:
    count_kinds(CONFLUENT, stream)
    assert_nothing_lost_or_doubled(CONFLUENT, connectors(CONFLUENT, stream.max_batch_records), stream)


# -- the bugs the fuzz found, each with the payload that showed it --------------------------------------------

GOOD_JSON = good_json(1, ("ada", (b"1.5", 1.5), "2026-01-01T00:00:00Z", {}, None, range(MAX_MEMBERS), b","))
GOOD_AVRO = good_avro(1, (BASE_ROWS[0], "ada", 7, 7))


def good_json_payload() -> Payload:
    return Payload("good", GOOD_JSON.value, GOOD_JSON.expected)


def good_avro_payload() -> Payload:
    return Payload("good", GOOD_AVRO.value, GOOD_AVRO.expected)


NULL_FIRST_SCRIPT = """
import sys
from engine.testing import TransformTestDriver
with TransformTestDriver(sys.argv[1]) as driver:
    driver.send_raw([b"null", sys.argv[2].encode()])
    print(len(driver.output()), len(driver.dead_letters()))
"""


def test_a_json_null_literal_first_in_a_batch_is_dead_lettered_instead_of_crashing_the_process(
        connectors: Connectors) -> None:
    """``pyarrow.json.read_json`` segfaults (pyarrow 26.0.1, cf. apache/arrow#47409) when the first record of
    a batch is ``null``. In a child process: a crash would take this test run down with it."""
    result = subprocess.run([sys.executable, "-X", "faulthandler", "-c", NULL_FIRST_SCRIPT,
                             str(connectors.path(JSON)), GOOD_JSON.value.decode()],
                            cwd=REPO_ROOT, capture_output=True, timeout=120)
    assert (result.returncode, result.stdout.split()) == (0, [b"1", b"1"]), (
        f"exit code {result.returncode}; stderr ends with:\n{result.stderr.decode(errors='replace')[-1500:]}")


@pytest.mark.parametrize("depth", [255, 1023])
def test_a_json_field_of_the_wrong_type_nested_hundreds_of_levels_deep_is_dead_lettered(
        connectors: Connectors, depth: int) -> None:
    """The reason's preview of the value was ``orjson.dumps(value)``, which refuses more than 254 levels
    (``orjson.loads`` takes 1024): decode raised TypeError 'Recursion limit reached'."""
    bad = Payload("deeply nested field", replaced(GOOD_JSON, "user", nested(depth, "array")))
    assert_nothing_lost_or_doubled(JSON, connectors(JSON), stream_of(good_json_payload(), bad))


def test_json_with_invalid_utf8_inside_a_string_is_dead_lettered(connectors: Connectors) -> None:
    """Arrow's JSON reader does not validate UTF-8 inside strings: the record was output, and the JSON sink's
    encode of its invalid string column failed."""
    bad = Payload("invalid UTF-8 in a string", replaced(GOOD_JSON, "user", b'"\xff"'))
    assert_nothing_lost_or_doubled(JSON, connectors(JSON), stream_of(good_json_payload(), bad))


NEIGHBOUR_DEPENDENT_JSON = {
    "NaN": replaced(GOOD_JSON, "amount", b"NaN"),
    "Infinity": replaced(GOOD_JSON, "amount", b"Infinity"),
    "-Infinity": replaced(GOOD_JSON, "amount", b"-Infinity"),
    "an integer beyond the double range": replaced(GOOD_JSON, "amount", b"1" + b"0" * 400),
    "a byte order mark": b"\xef\xbb\xbf" + GOOD_JSON.value,
    "1100 levels of nesting in an unknown member": json_object([*GOOD_JSON.members, ("x", nested(1100, "array"))]),
}
"""Payloads Arrow's reader takes and orjson refuses: their verdict depended on the rest of the batch."""


def verdicts(connectors: Connectors, values: list[bytes]) -> list[str]:
    with TransformTestDriver(connectors(JSON)) as driver:
        driver.send_raw(values)
        output = {row[OFFSET] for row in driver.output_rows()}
        dead = {position(letter)[1] for letter in driver.dead_letters()}
    return ["output" if offset in output else "dead letter" if offset in dead else "lost"
            for offset in range(len(values))]


@pytest.mark.parametrize("payload", list(NEIGHBOUR_DEPENDENT_JSON.values()), ids=list(NEIGHBOUR_DEPENDENT_JSON))
def test_a_json_payload_gets_the_same_verdict_whatever_batch_it_is_read_in(
        connectors: Connectors, payload: bytes) -> None:
    """A batch was parsed by Arrow in one go, and only re-checked by orjson when Arrow rejected something: what
    Arrow takes and orjson refuses was output or dead-lettered depending on its neighbours (a BOM only at the
    start of a batch), so a replay cut into other batches could change the output."""
    alone = verdicts(connectors, [payload])[0]
    after_a_good_record = verdicts(connectors, [GOOD_JSON.value, payload])[1]
    after_a_bad_record = verdicts(connectors, [b"{", payload])[1]
    assert {alone, after_a_good_record, after_a_bad_record} == {alone}, (
        alone, after_a_good_record, after_a_bad_record)


def test_a_json_payload_cut_short_does_not_run_on_into_the_next_ones(connectors: Connectors) -> None:
    """Arrow's reader reads objects, not lines: the first object runs on into the second payload, and the
    third payload's two objects made up the count, so all three were output (found beside the fuzz)."""
    cut = GOOD_JSON.value[:-1] + b', "x":'
    stream = stream_of(Payload("truncated", cut), Payload("trailing garbage", b'{"y": 1}}'),
                       Payload("two objects in one payload", GOOD_JSON.value + GOOD_JSON.value), good_json_payload())
    assert_nothing_lost_or_doubled(JSON, connectors(JSON), stream)


@pytest.mark.parametrize(("column", "value"), [("i", INT32_MAX + 1), ("i", INT32_MIN - 1), ("day", 1 << 40)])
def test_an_avro_int_beyond_32_bits_is_dead_lettered(connectors: Connectors, column: str, value: int) -> None:
    """fastavro reads an Avro int as an unbounded varint, and Arrow's int32 conversion raised for the batch."""
    writer = writer_schema(ALL_TYPES, {column: "long"})  # the same varint, without the int's 32-bit bound
    bad = Payload("int beyond 32 bits", reencode_avro(GOOD_AVRO, {column: value}, writer))
    assert_nothing_lost_or_doubled(AVRO, connectors(AVRO), stream_of(good_avro_payload(), bad))


def test_an_avro_long_varint_wider_than_64_bits_is_dead_lettered(connectors: Connectors) -> None:
    """fastavro's C reader takes a varint longer than ten bytes and wraps it to 64 bits: the record was output
    with a value it does not hold."""
    body = reencode_avro(GOOD_AVRO, {"l": LONG_SENTINEL})
    overlong = overwrite_once(body, zigzag_varint(LONG_SENTINEL), zigzag_varint(LONG_SENTINEL + (1 << 70)))
    bad = Payload("long varint wider than 64 bits", overlong)
    assert_nothing_lost_or_doubled(AVRO, connectors(AVRO), stream_of(good_avro_payload(), bad))


def test_an_avro_decimal_wider_than_its_precision_is_dead_lettered(connectors: Connectors) -> None:
    """Only the 16 bytes were checked, not the precision: a decimal(10, 2) holding 38 digits was output, as an
    Arrow array that fails ``validate(full=True)``."""
    bad = Payload("decimal wider than its precision",
                  reencode_avro(GOOD_AVRO, {"price": b"\x7f" + b"\xff" * 15}, RAW_PRICE_WRITER))
    assert_nothing_lost_or_doubled(AVRO, connectors(AVRO), stream_of(good_avro_payload(), bad))


def test_a_confluent_record_cut_inside_a_field_the_reader_skips_is_dead_lettered(connectors: Connectors) -> None:
    """fastavro skips a string the reader drops by reading its declared length without noticing a short read,
    so the check that every byte was consumed passed: a record cut inside a skipped field was output."""
    params = (2, 0, "ada", 1.5, dt.datetime(2026, 1, 1, tzinfo=UTC), None, True, uuid.UUID(int=5), None, "mobile")
    good, other = good_confluent(0, params), good_confluent(1, params)
    assert good.skipped_tail > 3
    bad = Payload("cut inside the skipped field channel", other.value[:-3])
    assert_nothing_lost_or_doubled(CONFLUENT, connectors(CONFLUENT), stream_of(
        Payload("good", good.value, good.expected), bad))
