"""``SourceBatch``: what a source hands the engine in one poll."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from connectors.dead_letter import DeadLetter


@dataclass
class SourceBatch:
    """Decoded rows (value columns + ``METADATA_COLUMNS``) and the records of the same poll that failed."""

    source: str
    batch: pa.RecordBatch
    dead_letters: list[DeadLetter]
    value_bytes: int = 0
    """Bytes of the records' values as they came off the wire (the ``bytes_in`` metric)."""
