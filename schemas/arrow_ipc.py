"""``arrow-ipc``: one Kafka record holds many rows, as one Arrow IPC stream.

Why: rows epochline hands to itself (the repartition topic between a connector's stages) need their Arrow
types exactly (timestamps, decimals, nested types) and should cost nothing per row; a record per row would
cost a produce call and an IPC header each. So ``encode`` turns a whole batch into ONE payload, and
``decode`` turns each payload back into its rows, reporting for every row the record it came from
(``Decoded.indices``), so the Kafka metadata columns of a row are those of its record.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from schemas.base import Decoded, DecodeFailure


class ArrowIpcFormat:
    name = "arrow-ipc"
    arrow_schema: pa.Schema | None = None
    """Any schema: each record carries its own."""

    def decode(self, payloads: Sequence[bytes | None]) -> Decoded:
        tables: list[pa.Table] = []
        indices: list[int] = []
        failures: list[DecodeFailure] = []
        for index, payload in enumerate(payloads):
            if payload is None:
                failures.append(DecodeFailure(index, "arrow-ipc: a record without a value"))
                continue
            try:
                table = pa.ipc.open_stream(payload).read_all()
            except (pa.ArrowInvalid, OSError) as error:
                failures.append(DecodeFailure(index, f"arrow-ipc: not an Arrow IPC stream ({error})"))
                continue
            tables.append(table)
            indices += [index] * table.num_rows
        if not tables:
            return Decoded(pa.RecordBatch.from_pylist([]), [], failures, rows_per_record=None)
        table = pa.concat_tables(tables, promote_options="default").combine_chunks()
        batches = table.to_batches()
        batch = batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)
        return Decoded(batch, indices, failures, rows_per_record=None)

    def encode(self, batch: pa.RecordBatch) -> Sequence[bytes | None]:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        return [sink.getvalue().to_pybytes()]
