"""JSON: one JSON object per message value, decoded in bulk by a C reader for flat schemas or Arrow's C++ JSON
reader.

Flat schemas (64-bit integers, doubles, booleans, strings, and the types that travel as strings) are read by
the C reader of ``schemas.native_json`` first: 0.29 against 1.35 µs per record for the benchmark's records.
It takes a batch only when it reads every payload to the values the path below reads, and hands the batch
to that path otherwise (a bad payload anywhere in it), which then gives every verdict and reason.

Decode: the payloads are joined into one newline-delimited buffer and parsed by ``pyarrow.json.read_json``
(with the schema's "wire" types, see ``schemas.json_wire``), then nulls in required fields are found
column-wise and strings are converted to timestamps/dates/times/decimals column-wise. Measured with
bench/decode_bench.py (1M ~180-byte records, batches of 10k): 849k records/s against 465k for
``orjson.loads`` + ``RecordBatch.from_pylist`` with the same schema (1.8x).

When Arrow rejects the batch (one payload is not JSON, not an object, or has a wrong type), each payload is
checked in Python (orjson + the schema) so the culprits get a reason naming the field, and the others are
parsed in bulk again; whatever Arrow still rejects is isolated by bisection. So good rows always decode
beside bad ones, and always through the same Arrow reader.

A payload's verdict never depends on the rest of its batch. Arrow's reader is laxer than orjson (it takes
NaN and Infinity, numbers beyond the double range, invalid UTF-8 inside strings, any depth of nesting), it
reads objects rather than lines (an object cut short runs on into the next payload), and it crashes the
process on a batch whose first record is ``null``. So a batch only goes to Arrow in one go when scans of
the joined buffer in C find none of that (``_framed``, ``_is_plain_json``): every payload starts with
``{`` and ends with ``}``, the buffer is UTF-8, no payload has more than 1024 openers, and no token Arrow
reads differently from orjson is in it (with a schema; without one Arrow keeps every member, and its NaN
and infinite values show them). A false alarm (such a token inside a string) only costs the batch the
per-payload path, where orjson refuses what standard JSON does not allow. The scans cost ~1 ms per 10k
records with a schema (~8% of the bulk decode; most of it finding exponents of 3+ digits after each
``e``), and less than the line-break count they replace without one.

Without a schema the types are inferred by Arrow per call; rows whose field types conflict with the rows
before them become failures.

Encode: column-wise conversion to JSON-printable types, then every row is printed in C: by the C writer of
``schemas.native_json`` when every column is flat (integers, doubles, booleans, strings, timestamps), with
the same bytes as DuckDB's ``to_json``, else by DuckDB's ``to_json`` (372k records/s against 175k for
``to_pylist`` + ``orjson.dumps``, same bench). Keys follow the schema's
field order; nulls are written as ``null``. ``decode(encode(batch))`` equals ``batch`` for every type of
the schema mapping.
"""

from __future__ import annotations

import datetime as dt
import decimal
import operator
import re
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast, overload

import duckdb
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from schemas.arrow_batches import conform_batch, empty_batch, map_batch_leaves, table_to_batch
from schemas.base import NULL_PAYLOAD_REASON, Decoded, DecodeFailure, EncodeError, SchemaError
from schemas.json_wire import text_to_value, unsupported_type, value_to_text, wire_schema
from schemas.native_json import flat_json_reader, flat_json_writer

_MIN_BLOCK_SIZE = 1 << 16
_ARROW_REJECTIONS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, ValueError)

_MAX_DEPTH = 1024
"""orjson's nesting limit (Arrow's reader has none): only a payload with more openers can exceed it."""
_JSON_WHITESPACE = b" \t\r\n"
_LAST_BYTE = operator.itemgetter(-1)
_LINE_START = (rb"\n[^{]",)
"""A payload (a line of the joined buffer) that does not start with '{' (Arrow crashes on a first ``null``)."""
_END_OF_VALUE = rb"[ \t\r\n,\]}]"
_NON_STANDARD = (
    rb"NaN" + _END_OF_VALUE,  # NaN and -NaN
    rb"Inf(?:inity)?" + _END_OF_VALUE,  # Inf, Infinity, -Inf, -Infinity
    rb"e\+?[0-9]{3,}" + _END_OF_VALUE,  # an exponent of 3+ digits (1.8e308): a way out of the double range
    rb"E\+?[0-9]{3,}" + _END_OF_VALUE,
)
"""Tokens Arrow's reader takes and orjson refuses, as regexes that start with a literal byte (so both regex
engines skip ahead with memchr). The other ways to differ: invalid UTF-8, an integer part of 210+ digits
(``_has_long_digit_run``), nesting (``_may_nest_too_deep``)."""
_RE2_FROM = 1 << 15
"""Buffers from this size are searched by Arrow's RE2 (~10x faster than ``re`` on large buffers); smaller
ones by ``re``, which has no per-call overhead (a compute call costs ~10 µs)."""
_LONG_NUMBER = 200
_SAMPLE_STRIDE = 25
_SAMPLED_RUN = 8
"""A run of ``_LONG_NUMBER`` digits covers ``_SAMPLED_RUN`` of the bytes sampled every ``_SAMPLE_STRIDE``."""
_DIGIT_CLASSES = bytes(48 if 48 <= byte <= 57 else 46 for byte in range(256))
"""``translate`` table: digits to ``0``, any other byte to ``.``."""


class _RowCountMismatch(ValueError):
    """Arrow read a different number of rows than payloads were joined (two objects in one payload)."""


@dataclass
class _Piece:
    """Rows decoded from one bulk parse: their input positions, and the payloads refused on the way."""

    indices: list[int]
    batch: pa.RecordBatch
    failures: list[DecodeFailure] = field(default_factory=list)


@dataclass(frozen=True)
class _Framed:
    """Payloads joined for Arrow's reader in one go: one per line, each from its '{' to its '}'."""

    lines: Sequence[bytes]
    buffer: bytes
    longest: int


class _ColumnValues(Sequence[bytes]):
    """An Arrow binary column's values as bytes objects, made only when one is looked at (the bulk path
    looks at none unless a row breaks the schema)."""

    def __init__(self, values: pa.BinaryArray) -> None:
        self._values = values

    def __len__(self) -> int:
        return len(self._values)

    @overload
    def __getitem__(self, index: int) -> bytes: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[bytes]: ...

    def __getitem__(self, index: int | slice) -> bytes | Sequence[bytes]:
        if isinstance(index, slice):
            return cast(list[bytes], self._values[index].to_pylist())
        return self._values[index].as_py()


class JsonFormat:
    """JSON objects, one per message; typed by an Arrow schema, or inferred per call when there is none."""

    name = "json"

    def __init__(self, schema: pa.Schema | None, *, source: str | None = None) -> None:
        if schema is not None:
            found = next((unsupported_type(f.type, f.name) for f in schema if unsupported_type(f.type, f.name)), None)
            if found:
                raise SchemaError(f"json format, schema from {source}: field {found} has no JSON representation "
                                  "(binary, fixed, map and bytes decimals need the avro format)")
        self._schema = schema
        self._expectation = f"the schema from {source}" if source else "the other rows' inferred types"
        self._parse_options = (
            pj.ParseOptions(explicit_schema=wire_schema(schema), unexpected_field_behavior="ignore")
            if schema is not None else pj.ParseOptions()
        )
        self._flat_reader = flat_json_reader(wire_schema(schema)) if schema is not None else None
        self._flat_writer = flat_json_writer()
        self._duckdb: duckdb.DuckDBPyConnection | None = None  # opened by the first encode
        self._duckdb_lock = threading.Lock()

    @property
    def arrow_schema(self) -> pa.Schema | None:
        return self._schema

    # ----------------------------------------------------------------------------------------- decode

    def decode(self, payloads: Sequence[bytes | None]) -> Decoded:
        """The payloads as rows of the schema, each one that is not a JSON object of it as a failure with
        its reason; by the C reader when it takes them all, else by ``_decode_payloads``."""
        if self._flat_reader is not None and None not in payloads:
            piece = self._read_flat(pa.array(payloads, pa.binary()))
            if piece is not None:
                return Decoded(piece.batch, piece.indices, piece.failures)
        return self._decode_payloads(payloads)

    def _decode_payloads(self, payloads: Sequence[bytes | None]) -> Decoded:
        """The reference path: in bulk by Arrow's reader when it may, else payload by payload."""
        indices = list(range(len(payloads)))
        failures: list[DecodeFailure] = []
        if None in payloads:
            failures = [DecodeFailure(index, NULL_PAYLOAD_REASON) for index in indices if payloads[index] is None]
            indices = [index for index in indices if payloads[index] is not None]
        lines = cast(list[bytes], [payloads[index] for index in indices] if failures else list(payloads))
        pieces = self._decode_lines(indices, lines)
        for piece in pieces:
            failures.extend(piece.failures)
        failures.sort(key=lambda failure: failure.index)
        decoded = pieces[0].indices if len(pieces) == 1 else [i for piece in pieces for i in piece.indices]
        return Decoded(self._combine(pieces), decoded, failures)

    def decode_column(self, values: pa.BinaryArray) -> Decoded:
        """``decode`` of an Arrow binary column's values. A batch of a flat schema with no null value is
        read by the C reader (``schemas.native_json``) when it takes every value; else the common batch (no
        null, each value exactly one object, ``_framed_column``) is joined by an Arrow kernel and parsed with
        no bytes object per value; any other goes payload by payload (``_decode_payloads``), so a value's
        verdict is the same whichever way it went."""
        piece = self._read_flat(values)
        if piece is None:
            framed = _framed_column(values)
            piece = self._in_bulk(list(range(len(values))), framed) if framed is not None else None
        if piece is None:
            return self._decode_payloads(values.to_pylist())
        return Decoded(piece.batch, piece.indices, piece.failures)

    def _read_flat(self, values: pa.BinaryArray) -> _Piece | None:
        """The values read by the C reader and typed as ``_parse`` types Arrow's batch, or None when there is
        no C reader for the schema, a value is null, the C reader hands them back or a text value does not
        convert (the reference path then finds the culprit)."""
        if self._flat_reader is None or self._schema is None or not len(values) or values.null_count:
            return None
        batch = self._flat_reader.read(values)
        if batch is None:
            return None
        try:
            return self._typed_piece(list(range(len(values))), _ColumnValues(values), batch, self._schema)
        except _ARROW_REJECTIONS:
            return None

    def _decode_lines(self, indices: list[int], lines: list[bytes]) -> list[_Piece]:
        if not lines:
            return [_Piece([], self._empty())]
        framed = _framed(lines)
        piece = self._in_bulk(indices, framed) if framed is not None else None
        if piece is not None:
            return [piece]
        # payload by payload: orjson refuses what Arrow must not see, and what Arrow reads laxer than orjson
        screened, good_indices, good_lines = self._screen(indices, lines)
        pieces: list[_Piece] = [_Piece([], self._empty(), screened)]
        self._bisect(good_indices, good_lines, pieces)
        return pieces

    def _in_bulk(self, indices: list[int], framed: _Framed) -> _Piece | None:
        """The framed payloads parsed in one Arrow call, or None when they need the per-payload path."""
        # without a schema, Arrow keeps every member: what it reads laxer than orjson shows in its values
        typed = self._schema is not None
        if not _is_plain_json(framed, scan_tokens=typed):
            return None
        try:
            piece = self._parse(indices, framed.lines, framed.buffer, framed.longest)
        except _ARROW_REJECTIONS:
            return None
        return piece if typed or not _has_non_finite(piece.batch.columns) else None

    def _parse(self, indices: list[int], lines: Sequence[bytes], buffer: bytes | None = None,
               longest: int | None = None) -> _Piece:
        """Parse all ``lines`` in one Arrow call; raises if Arrow rejects any of them.

        Only for payloads that are JSON objects (orjson said so, or ``_framed`` and ``_is_plain_json``, which
        also give ``buffer`` and ``longest``): Arrow's reader crashes the process on a first record ``null``."""
        if not lines:
            return _Piece([], self._empty())
        buffer = _ndjson(list(lines)) if buffer is None else buffer
        longest = max(map(len, lines)) if longest is None else longest
        # One block, one thread: the whole batch is parsed in one pass. Arrow's default (blocks parsed on its
        # thread pool) is faster on an idle machine but costs a third more CPU per record (1.42 against
        # 1.08 µs for 10,000 ~180-byte records), and a pipeline shares its cores with the broker and the
        # other stages: CPU per record is what counts.
        block_size = max(_MIN_BLOCK_SIZE, 2 * longest, len(buffer) + 1)
        # pyarrow-stubs: read_json also reads from an Arrow Buffer (any input get_input_stream accepts)
        table = pj.read_json(pa.py_buffer(buffer),  # type: ignore[arg-type]
                             read_options=pj.ReadOptions(block_size=block_size, use_threads=False),
                             parse_options=self._parse_options)
        if table.num_rows != len(lines):  # an empty payload (a skipped blank line), or two objects in one
            raise _RowCountMismatch(f"{table.num_rows} JSON objects in {len(lines)} payloads")
        batch = table_to_batch(table)
        if self._schema is None:
            return _Piece(indices, batch)
        return self._typed_piece(indices, lines, batch, self._schema)

    def _typed_piece(self, indices: list[int], lines: Sequence[bytes], batch: pa.RecordBatch,
                     schema: pa.Schema) -> _Piece:
        failures = []
        batch = batch.select(schema.names)
        violating = _required_nulls(batch, schema)
        if violating is not None:
            flags = violating.to_pylist()
            failures = [DecodeFailure(index, self._problem(line) or "a required field is null")
                        for index, line, bad in zip(indices, lines, flags) if bad]
            batch = batch.filter(pc.invert(violating))
            indices = [index for index, bad in zip(indices, flags) if not bad]
        return _Piece(indices, map_batch_leaves(batch, schema, text_to_value), failures)

    def _screen(self, indices: list[int], lines: list[bytes]) -> tuple[list[DecodeFailure], list[int], list[bytes]]:
        """Check each payload in Python; return the failures and the payloads that passed."""
        failures, good_indices, good_lines = [], [], []
        for index, line in zip(indices, lines):
            problem = self._problem(line)
            if problem is None:
                good_indices.append(index)
                good_lines.append(line)
            else:
                failures.append(DecodeFailure(index, problem))
        return failures, good_indices, good_lines

    def _bisect(self, indices: list[int], lines: list[bytes], pieces: list[_Piece]) -> None:
        """Parse in bulk; on rejection split in halves until the rejected payloads stand alone."""
        if not lines:
            return
        try:
            piece = self._parse(indices, lines)
            self._check_types_agree(pieces, piece)
        except _ARROW_REJECTIONS as exc:
            if len(lines) == 1:
                pieces.append(_Piece([], self._empty(), [
                    DecodeFailure(indices[0], f"JSON payload does not match {self._expectation}: {exc}")]))
                return
            middle = len(lines) // 2
            self._bisect(indices[:middle], lines[:middle], pieces)
            self._bisect(indices[middle:], lines[middle:], pieces)
            return
        pieces.append(piece)

    def _check_types_agree(self, pieces: list[_Piece], piece: _Piece) -> None:
        """Without a schema, a piece whose inferred types conflict with earlier pieces is rejected."""
        if self._schema is None and piece.batch.num_rows:
            earlier = [p.batch.schema for p in pieces if p.batch.num_rows]
            pa.unify_schemas([*earlier, piece.batch.schema], promote_options="permissive")

    def _combine(self, pieces: list[_Piece]) -> pa.RecordBatch:
        batches = [piece.batch for piece in pieces if piece.batch.num_rows]
        if len(batches) == 1:
            return batches[0]
        if not batches:
            return self._empty()
        tables = [pa.Table.from_batches([batch]) for batch in batches]
        return table_to_batch(pa.concat_tables(tables, promote_options="permissive"))

    def _empty(self) -> pa.RecordBatch:
        return empty_batch(self._schema if self._schema is not None else pa.schema([]))

    def _problem(self, line: bytes) -> str | None:
        """Why one payload cannot decode (not JSON, not an object, wrong field type), or None."""
        if not line or line.isspace():
            return "empty payload: not JSON"
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            return f"not JSON: {exc}"
        if not isinstance(value, dict):
            return f"not a JSON object: got {_json_kind(value)}"
        if self._schema is None:
            return None
        return _object_problem(value, list(self._schema), path="")

    # ----------------------------------------------------------------------------------------- encode

    def encode(self, batch: pa.RecordBatch) -> list[bytes]:
        return cast(list[bytes], self.encode_column(batch).to_pylist())  # to_json of a row is never NULL

    def encode_column(self, batch: pa.RecordBatch) -> pa.ChunkedArray[Any]:
        """The rows as JSON values in an Arrow binary column, for a writer that takes Arrow buffers rather
        than a ``bytes`` object per record."""
        if self._schema is not None:
            batch = conform_batch(batch, self._schema, fmt="json")
        else:
            for fld in batch.schema:
                found = unsupported_type(fld.type, fld.name, writing=True)
                if found:
                    raise EncodeError(f"json encode: column {found} has no JSON representation")
        if batch.num_rows == 0:
            return pa.chunked_array([], pa.binary())
        written = self._flat_writer.write(batch) if self._flat_writer is not None else None
        if written is not None:
            return pa.chunked_array([written], pa.binary())
        printable = pa.Table.from_batches([map_batch_leaves(batch, wire_schema(batch.schema), value_to_text)])
        with self._duckdb_lock:
            if self._duckdb is None:
                self._duckdb = duckdb.connect()
            self._duckdb.register("encode_rows", printable)
            try:
                result = self._duckdb.sql("SELECT to_json(encode_rows)::BLOB FROM encode_rows").to_arrow_table()
            finally:
                self._duckdb.unregister("encode_rows")
        return cast("pa.ChunkedArray[Any]", result.column(0))


def _ndjson(lines: list[bytes]) -> bytes:
    """The payloads (that orjson read as objects) as newline-delimited JSON, one per line.

    Raw line breaks inside valid JSON can only be whitespace between tokens (in strings they are escaped),
    so blanking them is safe; the common case (none) is detected with one count over the joined buffer.
    """
    joined = b"\n".join(lines)
    if joined.count(b"\n") == len(lines) - 1 and b"\r" not in joined:
        return joined
    return b"\n".join(line.replace(b"\n", b" ").replace(b"\r", b" ") for line in lines)


def _framed(lines: list[bytes]) -> _Framed | None:
    """The payloads one per line, each starting with '{' and ending with '}' (JSON whitespace around them is
    dropped, which changes no verdict), or None if one does not.

    Framed so, a parse with one row per payload has read each payload as exactly one object: an object that
    ends early leaves a '}' that starts nothing, one that runs on meets the next payload's '{' where only a
    ',' or a closing bracket may be (or a line break inside a string). No line break is blanked (that would
    make a raw one inside a string valid), and each one must be followed by '{': Arrow splits its blocks at
    line breaks, and a block must not start with ``null``."""
    buffer = b"\n".join(lines)
    if not _is_framed(buffer, lines):
        lines = [line.strip(_JSON_WHITESPACE) for line in lines]
        buffer = b"\n".join(lines)
        if not _is_framed(buffer, lines):
            return None
    return _Framed(lines, buffer, max(map(len, lines)))


def _framed_column(values: pa.BinaryArray) -> _Framed | None:
    """``_framed`` of a column's values when they need no whitespace stripped and none is null, made by Arrow
    kernels over the column (the values joined once, no bytes object per value); else None."""
    if not len(values) or values.null_count:
        return None
    ends = pc.binary_slice(values, -1)
    if not pc.all(pc.equal(ends, pa.scalar(b"}", pa.binary()))).as_py():  # an empty value too
        return None
    joined = pc.call_function("binary_join_element_wise", [values, pa.scalar(b""), pa.scalar(b"\n")])
    _, offsets, data = joined.buffers()
    bounds = np.frombuffer(offsets, np.int32)
    start, end = int(bounds[joined.offset]), int(bounds[joined.offset + len(joined)])
    buffer = data[start:end - 1].to_pybytes()  # without the last line break, as b"\n".join makes it
    if not _lines_start_framed(buffer):
        return None
    return _Framed(_ColumnValues(values), buffer, int(pc.max(pc.binary_length(values)).as_py() or 0))


def _is_framed(buffer: bytes, lines: list[bytes]) -> bool:
    try:
        if bytes(map(_LAST_BYTE, lines)).strip(b"}"):
            return False
    except IndexError:  # an empty payload
        return False
    return _lines_start_framed(buffer)


def _lines_start_framed(buffer: bytes) -> bool:
    """The joined buffer's half of ``_framed``'s check: it starts with '{', has no '\\r', and every line
    break is followed by '{' (``_framed`` and ``_framed_column`` check the last bytes their own way)."""
    return buffer.startswith(b"{") and b"\r" not in buffer and not _matches(buffer, _LINE_START)


def _is_plain_json(framed: _Framed, *, scan_tokens: bool) -> bool:
    """Whether nothing in the framed payloads is read differently by Arrow and by orjson (see module doc).

    False may be a false alarm (such a token inside a string), which only costs the batch the per-payload
    path; True never is, so a payload's verdict does not depend on its neighbours. Without ``scan_tokens``
    the caller checks the parsed values instead (``_has_non_finite``)."""
    buffer = framed.buffer
    if not (buffer.isascii() or _is_utf8(buffer)) or _may_nest_too_deep(framed):
        return False
    return not (scan_tokens and (_matches(buffer, _NON_STANDARD) or _has_long_digit_run(buffer)))


def _has_non_finite(arrays: list[pa.Array[Any]]) -> bool:
    """Whether a float anywhere in ``arrays`` (inside structs and lists too) is NaN or infinite: what Arrow
    reads of NaN, Infinity and numbers beyond the double range, which JSON (and orjson) does not allow.
    Iterative: inferred types nest as deep as the payloads (1024 levels)."""
    pending = list(arrays)
    while pending:
        array = pending.pop()
        kind = array.type
        if pa.types.is_floating(kind):  # (all-null: pc.all would say null)
            if array.null_count < len(array) and not pc.all(pc.is_finite(array)).as_py():
                return True
        elif pa.types.is_struct(kind):
            pending.extend(cast(pa.StructArray, array).flatten())
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
            pending.append(cast("pa.ListArray[Any]", array).flatten())
    return False


def _whole(buffer: bytes, kind: pa.DataType) -> pa.Array[Any]:
    """``buffer`` as a one-value array of ``kind`` (large binary or large string), without copying it."""
    offsets = pa.py_buffer(struct.pack("<2q", 0, len(buffer)))
    return pa.Array.from_buffers(kind, 1, [None, offsets, pa.py_buffer(buffer)])


def _is_utf8(buffer: bytes) -> bool:
    """Arrow's UTF-8 validation (as strict as Python's decoder, and 5x faster on non-ASCII text)."""
    try:
        _whole(buffer, pa.large_string()).validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


_COMPILED = {pattern: re.compile(pattern) for pattern in (*_LINE_START, *_NON_STANDARD)}


def _matches(buffer: bytes, patterns: tuple[bytes, ...]) -> bool:
    """Whether one of the regexes matches somewhere in ``buffer`` (byte-wise, by ``re`` or by RE2)."""
    if len(buffer) < _RE2_FROM:
        return any(_COMPILED[pattern].search(buffer) for pattern in patterns)
    whole = _whole(buffer, pa.large_binary())  # RE2 matches binary values byte-wise
    return any(pc.match_substring_regex(whole, pattern.decode())[0].as_py() for pattern in patterns)


def _has_long_digit_run(buffer: bytes) -> bool:
    """Whether ``buffer`` may hold ``_LONG_NUMBER`` digits in a row (an integer part beyond the double range
    has 309, or 210 with an exponent below 100). Looks at every ``_SAMPLE_STRIDE``th byte first: a run that
    long holds ``_SAMPLED_RUN`` sampled bytes in a row, and only where those are digits is it looked at in full."""
    if len(buffer) < _LONG_NUMBER:
        return False
    needle = b"0" * _SAMPLED_RUN
    sample = buffer[::_SAMPLE_STRIDE].translate(_DIGIT_CLASSES)
    at, looked = sample.find(needle), 0
    while at >= 0:
        if buffer[at * _SAMPLE_STRIDE:(at + _SAMPLED_RUN - 1) * _SAMPLE_STRIDE + 1].isdigit():
            return True
        looked += 1
        if looked > 8:  # digits nearly everywhere: one exact pass instead
            return b"0" * _LONG_NUMBER in buffer.translate(_DIGIT_CLASSES)
        at = sample.find(needle, at + 1)
    return False


def _may_nest_too_deep(framed: _Framed) -> bool:
    """Whether a payload may nest deeper than orjson reads: only one with more than ``_MAX_DEPTH`` openers
    can, so only one longer than twice that (Arrow rejects an object that is not closed)."""
    if framed.longest <= 2 * _MAX_DEPTH:
        return False
    return any(line.count(b"[") + line.count(b"{") > _MAX_DEPTH
               for line in framed.lines if len(line) > 2 * _MAX_DEPTH)


def _required_nulls(batch: pa.RecordBatch, schema: pa.Schema) -> pa.BooleanArray | None:
    """Rows holding a null where the schema requires a value (also inside structs and lists), or None."""
    found = None
    for column, fld in zip(batch.columns, schema):
        found = _union(found, _null_violations(column, fld))
    return found if found is not None and pc.any(found).as_py() else None


def _null_violations(array: pa.Array[Any], fld: pa.Field[pa.DataType]) -> pa.BooleanArray | None:
    found = array.is_null() if not fld.nullable and array.null_count else None
    kind = fld.type
    if pa.types.is_struct(kind):
        for child, child_field in zip(cast(pa.StructArray, array).flatten(), kind):
            child_rows = _null_violations(child, child_field)
            if child_rows is not None:
                found = _union(found, pc.and_(child_rows, array.is_valid()))
    elif pa.types.is_list(kind):
        item_rows = _null_violations(cast("pa.ListArray[Any]", array).flatten(), kind.value_field)
        if item_rows is not None and pc.any(item_rows).as_py():
            parents = pc.filter(pc.list_parent_indices(array), item_rows)
            found = _union(found, pc.is_in(pa.array(range(len(array))), value_set=parents))
    return found


def _union(first: pa.BooleanArray | None, second: pa.BooleanArray | None) -> pa.BooleanArray | None:
    if first is None:
        return second
    if second is None:
        return first
    return pc.or_(first, second)


def _object_problem(obj: dict[str, Any], fields: list[pa.Field[pa.DataType]], path: str) -> str | None:
    for fld in fields:
        name = f"{path}.{fld.name}" if path else fld.name
        value = obj.get(fld.name)
        if value is None:
            if fld.nullable:
                continue
            if fld.name not in obj:
                return f"missing required field '{name}'"
            return f"field '{name}' is null but the schema does not allow null"
        problem = _value_problem(value, fld.type, name)
        if problem:
            return problem
    return None


def _value_problem(value: Any, kind: pa.DataType, name: str) -> str | None:
    if pa.types.is_integer(kind):
        if not isinstance(value, int) or isinstance(value, bool):
            return _expected(name, "integer", value)
        low, high = _integer_range(kind)
        if not low <= value <= high:
            return f"field '{name}': {value} is out of range for {kind}"
        return None
    if pa.types.is_floating(kind):
        is_number = isinstance(value, int | float) and not isinstance(value, bool)
        return None if is_number else _expected(name, "number", value)
    if pa.types.is_boolean(kind):
        return None if isinstance(value, bool) else _expected(name, "boolean", value)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return None if isinstance(value, str) else _expected(name, "string", value)
    if pa.types.is_list(kind):
        return _list_problem(value, kind.value_field, name)
    if pa.types.is_struct(kind):
        return _object_problem(value, list(kind), name) if isinstance(value, dict) else _expected(name, "object", value)
    if pa.types.is_null(kind):
        return _expected(name, "null", value)
    return _text_problem(value, kind, name)


def _list_problem(value: Any, item: pa.Field[pa.DataType], name: str) -> str | None:
    if not isinstance(value, list):
        return _expected(name, "array", value)
    for position, element in enumerate(value):
        element_name = f"{name}[{position}]"
        if element is None:
            if not item.nullable:
                return f"field '{element_name}' is null but the schema does not allow null"
            continue
        problem = _value_problem(element, item.type, element_name)
        if problem:
            return problem
    return None


_TEXT_PARSERS: list[tuple[Any, str, Any]] = [
    (pa.types.is_timestamp, "an ISO-8601 date-time", dt.datetime.fromisoformat),
    (pa.types.is_date32, "an ISO-8601 date (YYYY-MM-DD)", dt.date.fromisoformat),
    (pa.types.is_time, "an ISO-8601 time (HH:MM:SS)", dt.time.fromisoformat),
    (pa.types.is_decimal, "a decimal number", decimal.Decimal),
]


def _text_problem(value: Any, kind: pa.DataType, name: str) -> str | None:
    """Timestamps, dates, times and decimals are strings in JSON; check the string parses.

    Python's parsers refuse year 0, which Arrow's conversion (the bulk path's) takes: the only strings they
    refuse and Arrow takes (a differential fuzz of both found no other), and no problem, or their verdict
    would depend on the batch they are read in."""
    for matches, description, parse in _TEXT_PARSERS:
        if matches(kind):
            if not isinstance(value, str):
                return _expected(name, f"string ({description})", value)
            try:
                parse(value)
            except (ValueError, decimal.InvalidOperation):
                if not (value.startswith("0000") and _arrow_converts(value, kind)):
                    return f"field '{name}': {value!r} is not {description}"
            return None
    return None


def _arrow_converts(value: str, kind: pa.DataType) -> bool:
    try:
        text_to_value(pa.array([value], pa.string()), kind)
    except _ARROW_REJECTIONS:
        return False
    return True


def _integer_range(kind: pa.DataType) -> tuple[int, int]:
    bits = kind.bit_width
    if pa.types.is_signed_integer(kind):
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def _expected(name: str, expected: str, value: Any) -> str:
    return f"field '{name}': expected {expected}, got {_json_kind(value)} {_preview(value)}"


_JSON_KINDS: tuple[tuple[type, str], ...] = (
    (bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"), (dict, "object"))
"""Python type of a parsed JSON value -> its JSON name; bool before int, since a bool is an int."""


def _json_kind(value: Any) -> str:
    return next((name for kind, name in _JSON_KINDS if isinstance(value, kind)), "null")


def _preview(value: Any) -> str:
    """The start of ``value`` as JSON text, at most 40 characters; never raises."""
    try:
        text = orjson.dumps(value).decode()
    except orjson.JSONEncodeError:  # nested deeper than orjson writes (254 levels; it reads 1024)
        text = _nested_start(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _nested_start(value: Any) -> str:
    """The first characters of a deeply nested value as JSON text, following its first members down."""
    parts: list[str] = []
    while len(parts) < 40 and isinstance(value, list | dict) and value:
        if isinstance(value, list):
            parts.append("[")
            value = value[0]
        else:
            key = next(iter(value))
            parts.append("{" + orjson.dumps(key).decode() + ":")
            value = value[key]
    return "".join(parts) + "..."
