"""A Python transform that slows a connector down, so tests can act while it is mid-stream."""

import time

import pyarrow as pa


def slow(batch: pa.RecordBatch) -> pa.RecordBatch:
    time.sleep(0.05)
    return batch
