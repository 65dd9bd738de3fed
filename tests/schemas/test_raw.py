"""Specification of the raw format: bytes in, bytes out, tombstones kept."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from schemas import EncodeError, FormatSpec, make_format
from schemas.raw import RawFormat


def test_round_trip_of_100k_payloads_including_tombstones_is_exact() -> None:
    rng = random.Random(1)
    payloads = [None if n % 17 == 0 else rng.randbytes(rng.randrange(0, 200)) for n in range(100_000)]
    fmt = make_format(FormatSpec("raw"))
    decoded = fmt.decode(payloads)
    assert decoded.failures == []
    assert decoded.indices == list(range(100_000))
    assert fmt.encode(decoded.batch) == payloads


def test_decoded_batch_is_one_nullable_binary_value_column() -> None:
    decoded = make_format(FormatSpec("raw")).decode([b"a", None, b""])
    assert decoded.batch.schema == pa.schema([pa.field("value", pa.binary())])
    assert decoded.batch.column("value").to_pylist() == [b"a", None, b""]


def test_string_values_encode_as_utf8() -> None:
    batch = pa.RecordBatch.from_pydict({"value": ["zoë", None], "key": ["k", "k"]})
    assert make_format(FormatSpec("raw")).encode(batch) == ["zoë".encode(), None]


def test_encode_without_a_value_column_names_it() -> None:
    with pytest.raises(EncodeError, match="no 'value' column"):
        make_format(FormatSpec("raw")).encode(pa.RecordBatch.from_pydict({"payload": [b"x"]}))


def test_encode_of_a_non_binary_value_column_names_its_type() -> None:
    with pytest.raises(EncodeError, match="'value' is int64"):
        make_format(FormatSpec("raw")).encode(pa.RecordBatch.from_pydict({"value": [1]}))


def test_a_column_decodes_to_itself_without_a_copy() -> None:
    values = pa.array([b"a", None, b"", b"\x00\xff"], pa.binary())
    decoded = RawFormat().decode_column(values)
    assert decoded.indices == [0, 1, 2, 3] and decoded.failures == []
    data, original = decoded.batch.column("value").buffers()[2], values.buffers()[2]
    assert data is not None and original is not None and data.address == original.address


def test_encode_column_gives_the_values_as_binary_with_tombstones() -> None:
    batch = pa.RecordBatch.from_pydict({"value": pa.array(["zoë", None, ""], pa.large_string())})
    column = RawFormat().encode_column(batch)
    assert column.type == pa.binary()
    assert column.to_pylist() == ["zoë".encode(), None, b""]
