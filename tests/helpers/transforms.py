"""Python transforms the connector tests load by ``module:function`` (connectors run from the repository root)."""

import os
import time
from pathlib import Path

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


FAIL_FLAG_ENV = "EPOCHLINE_TEST_FAIL_FLAG"


def fail_while_flagged(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Fails every cycle with rows while the file named by ``$EPOCHLINE_TEST_FAIL_FLAG`` exists: a task that
    crashes on purpose until the test removes the file."""
    flag = os.environ.get(FAIL_FLAG_ENV)
    if batch.num_rows and flag and Path(flag).exists():
        raise RuntimeError("failing on purpose: the flag file is present")
    return batch
