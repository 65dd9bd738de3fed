"""Python transforms the connector tests load by ``module:function`` (connectors run from the repository root)."""

import time

import pyarrow as pa
import pyarrow.compute as pc

POISON_ID = 1313


def slow(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Slows a connector down, so tests can act while it is mid-stream."""
    time.sleep(0.05)
    return batch


def fail_on_poison(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Fails deterministically on the cycle that holds ``POISON_ID``: a poison input."""
    if batch.num_rows and pc.any(pc.equal(batch.column("id"), POISON_ID)).as_py():
        raise ValueError(f"cannot handle id {POISON_ID}")
    return batch
