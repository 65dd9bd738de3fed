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
import importlib
import logging
import os
from types import ModuleType

log = logging.getLogger(__name__)

SWITCH = "EPOCHLINE_NATIVE_IO"
"""Environment variable: ``0`` (or ``false``/``off``/``no``) keeps the C module unused."""


@functools.cache
def native_io() -> ModuleType | None:
    """The C module, or None when it is switched off or was not built (logged once, with the reason)."""
    if os.environ.get(SWITCH, "1").strip().lower() in ("0", "false", "off", "no"):
        log.info("native Kafka I/O switched off", extra={"variable": SWITCH})
        return None
    import confluent_kafka  # noqa: F401 - the C module finds the librdkafka this loads

    try:
        return importlib.import_module("connectors._native_io")
    except ImportError as error:
        log.warning("native Kafka I/O not available: records go through confluent-kafka one by one",
                    extra={"reason": str(error)})
        return None
