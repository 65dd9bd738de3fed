"""Event time as int64 epoch milliseconds: the one conversion watermarks, late-row filtering and windows share.

Floored, not truncated: a timestamp of 1.9 ms is at 1 ms, and one of -0.5 ms at -1 ms, so a row falls in
the window and behind the watermark that contain its instant, whatever the unit of its column.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

import pyarrow as pa
import pyarrow.compute as pc

from schemas.base import SchemaError

_MS_PER_UNIT = {"s": 1000}
_UNITS_PER_MS = {"ms": 1, "us": 1_000, "ns": 1_000_000}

Values = TypeVar("Values", "pa.Array[Any]", "pa.ChunkedArray[Any]")  # quoted: not generic at runtime


class EventTimeError(SchemaError):
    """An event-time column is missing or neither a timestamp nor integer milliseconds."""


def is_event_time_type(data_type: pa.DataType) -> bool:
    return pa.types.is_timestamp(data_type) or pa.types.is_integer(data_type)


def event_time_ms(values: Values) -> Values:
    """``values`` (a timestamp of any unit and zone, or an integer already in ms) as int64 epoch ms, floored."""
    if pa.types.is_integer(values.type):
        return values.cast(pa.int64())
    if not pa.types.is_timestamp(values.type):
        raise EventTimeError(f"event times have type {values.type}; expected a timestamp or integer milliseconds")
    unit = values.type.unit
    raw = values.cast(pa.timestamp(unit)).cast(pa.int64())
    if unit in _MS_PER_UNIT:
        return pc.multiply(raw, _MS_PER_UNIT[unit])
    return floor_divide(raw, _UNITS_PER_MS[unit])


def floor_divide(values: Values, divisor: int) -> Values:
    """Integer division rounding towards negative infinity (Arrow's integer divide truncates towards zero)."""
    if divisor == 1:
        return values
    quotient = pc.divide(values, divisor)
    remainder = pc.subtract(values, pc.multiply(quotient, divisor))
    # pyarrow-stubs type every comparison's result as a BooleanArray; a ChunkedArray input gives a ChunkedArray
    is_negative = cast(Values, pc.less(remainder, pa.scalar(0)))
    return pc.subtract(quotient, pc.cast(is_negative, pa.int64()))
