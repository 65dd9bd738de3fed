"""Sample Python transforms for epochline's ``PythonOperator``.

Configure one as ``"examples.transforms:tag_large_orders"``.

A transform receives one cycle's rows as a ``pa.RecordBatch`` and returns a ``pa.RecordBatch`` or
``pa.Table``. Keep it vectorised (``pyarrow.compute``) and free of side effects: after a failure the engine
replays the epoch's rows, and the transaction only stays exactly-once if the same rows give the same output.
It is also called once at start with an empty batch so the engine learns the output schema.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

LARGE_ORDER_CENTS = 100_00


def tag_large_orders(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Keep orders with a customer, add ``amount`` in currency units and a ``large`` flag.

    Expects columns ``customer`` (string) and ``amount_cents`` (integer)."""
    with_customer = batch.filter(pc.is_valid(batch.column("customer")))
    cents = with_customer.column("amount_cents")
    amount = pc.divide(cents.cast(pa.float64()), 100.0)
    large = pc.greater_equal(cents, LARGE_ORDER_CENTS)
    return with_customer.append_column("amount", amount).append_column("large", large)
