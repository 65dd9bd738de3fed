"""Whether Kafka records move between librdkafka and Arrow buffers in C (``connectors/_native_io.c``).

The C module does the two per-record loops of a pipeline, reading records into Arrow buffers and producing
the rows of an Arrow binary column, on the librdkafka handle of confluent-kafka's own Consumer and Producer,
with the GIL released and no Python object per record. Everything else (configuration, group membership,
rebalance callbacks, offsets, transactions) stays confluent-kafka's. Measured on the benchmark's JSON job:
1.5x the records per second of the per-record Python calls (bench/native_spike/README.md).

It is built at install when a C compiler is there (an optional extension: the install does not fail
without one). ``EPOCHLINE_NATIVE_IO=0`` turns it off; sources and sinks then make confluent-kafka's
per-record calls, with the same guarantees.
"""

from __future__ import annotations

import functools
from types import ModuleType

from schemas.extensions import load_extension

SWITCH = "EPOCHLINE_NATIVE_IO"
"""Environment variable: ``0`` (or ``false``/``off``/``no``) keeps the C module unused."""


@functools.cache
def native_io() -> ModuleType | None:
    """The C module, or None when it is switched off or was not built (logged once, with the reason)."""
    import confluent_kafka  # noqa: F401 - the C module finds the librdkafka this loads

    return load_extension("connectors._native_io", switch=SWITCH, what="native Kafka I/O",
                          instead="records go through confluent-kafka one by one")
