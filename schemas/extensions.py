"""The optional C extensions (``connectors/_native_io.c``, ``schemas/_native_json.c``, ``schemas/_native_avro.c``):
whether one is used, and the Arrow arrays the two codecs take and give as buffers.

Each is built at install when a C compiler is there, and each has an environment variable that switches it
off; without it the pure-Python path does the same work with the same guarantees, more slowly. This module
lives in ``schemas``, the lowest package, so that every package that has an extension can load it the same
way.
"""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType
from typing import Any, cast

import pyarrow as pa

log = logging.getLogger(__name__)


def switched_off(variable: str) -> bool:
    """Whether the environment variable ``variable`` says no (``0``, ``false``, ``off``, ``no``)."""
    return os.environ.get(variable, "1").strip().lower() in ("0", "false", "off", "no")


def load_extension(module: str, *, switch: str, what: str, instead: str) -> ModuleType | None:
    """The extension ``module``, or None when ``switch`` turns it off or it was not built; either is logged
    with ``what`` it is, and (when it is missing) the reason and what happens ``instead``."""
    if switched_off(switch):
        log.info(f"{what} switched off", extra={"variable": switch})
        return None
    try:
        return importlib.import_module(module)
    except ImportError as error:
        log.warning(f"{what} not available: {instead}", extra={"reason": str(error)})
        return None


ArrayBuffers = tuple[bytes | None, bytes, bytes | None, int]
"""What a C codec hands back for one decoded column: validity (None: no nulls), values, offsets (strings and
binary only) and the null count."""


def array_from_buffers(arrow_type: pa.DataType, rows: int, buffers: ArrayBuffers) -> pa.Array[Any]:
    """The Arrow array of ``rows`` rows a C codec filled (no copy of its buffers)."""
    validity, values, offsets, nulls = buffers
    layout = [pa.py_buffer(validity) if validity is not None else None]
    layout += [pa.py_buffer(offsets)] if offsets is not None else []
    return pa.Array.from_buffers(arrow_type, rows, [*layout, pa.py_buffer(values)], null_count=nulls)


def binary_array_from_buffers(rows: int, written: tuple[bytes, bytes]) -> pa.BinaryArray:
    """The binary array of ``rows`` values a C codec wrote as (data, int32 offsets)."""
    data, offsets = written
    return cast(pa.BinaryArray, pa.Array.from_buffers(pa.binary(), rows,
                                                      [None, pa.py_buffer(offsets), pa.py_buffer(data)]))


def column_buffers(column: pa.Array[Any]) -> tuple[Any, Any, Any, int]:
    """A column as a C codec reads it: (validity or None when it has no nulls, values, offsets or None for a
    fixed-width column, its first row)."""
    validity, *rest = column.buffers()
    values = rest[-1] if rest[-1] is not None else b""
    return validity if column.null_count else None, values, rest[0] if len(rest) == 2 else None, column.offset
