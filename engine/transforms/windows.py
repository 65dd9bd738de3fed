"""Keyed tumbling and hopping windows over event time, with state kept per source partition.

How a cycle runs (``WindowOperator.process(table, watermark)``), all of it vectorised with pyarrow:

1. Each row's event time (``time_column``, timestamp of any unit/zone or int64 epoch ms) is assigned to every
   window containing it: ``window_start <= t < window_start + size``, window starts being multiples of the
   slide (of the size for tumbling windows), counted from the epoch.
2. A window is emitted exactly once and never updated, so a row can no longer count once its partition
   emitted a window containing it (``window_end <=`` that partition's ``emitted_through``), and a row
   without an event time fits no window. The engine sets such rows apart as dead letters with their
   reason before they get here (``closed_through`` says where a partition's results are final); a cycle
   that still brings one fails with ``OperatorRuntimeError`` naming the rows, so no row is ever dropped
   with only a counter to show for it.
3. The remaining assignments are pre-aggregated per (source partition, key, window) and merged into the open
   windows' partial aggregates (count, sum, min, max; avg is kept as sum and count).
4. If the cycle has a watermark W, every partition that holds state or got rows this cycle advances its
   ``emitted_through`` to ``max(emitted_through, W)``; every open window whose end its partition's
   ``emitted_through`` has reached is emitted and dropped from state. Rows of this cycle count towards
   windows this cycle's watermark closes.

State per source partition (the ``__kafka_partition`` column, which the input must therefore carry): in
group mode connector instances share a topic's partitions, and when a partition moves to another instance
its windows must move with it, through a compacted changelog topic holding one record per partition
(DESIGN.md, "Group mode", rule 1). So the partials and ``emitted_through`` are kept per partition, and
``WindowState`` implements ``engine.state.KeyedState``: snapshot, restore and drop one partition, and which
partitions changed. A window therefore aggregates the rows of one partition: the input must be partitioned
by the window key (a key spread over several partitions gives one row per partition and window), else it is
re-keyed through a repartition topic first (rule 2). Internally the partition is one more group-by column
of the partials, so one group-by still does a whole cycle.

Output: the key columns, ``window_start`` and ``window_end`` (timestamp ms UTC), then the aggregates in the
order given; rows ordered by window end, then by key (nulls last), then by source partition. A null key is a
key of its own. The source partition is not an output column.

End of input: ``process(empty_table, END_OF_INPUT_WATERMARK)`` emits every open window, like the final
MAX watermark Flink sends when a bounded source ends.

Determinism (which exactly-once replay relies on: a restored run must emit the same rows as the original):
aggregation runs single-threaded so floating-point sums add in a fixed order, and a partition's snapshot is
its partial aggregates sorted by window and key, written as one Arrow IPC stream with the partition's
``emitted_through`` in the schema metadata.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, cast

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from connectors.metadata import PARTITION, TIMESTAMP
from engine.transforms.operator import OperatorConfigError, OperatorRuntimeError, Watermark
from schemas.event_time import event_time_ms, floor_divide, is_event_time_type

DEFAULT_TIME_COLUMN = TIMESTAMP
END_OF_INPUT_WATERMARK = 2**63 - 1
"""The watermark that closes every window: pass it with an empty table when bounded input ends."""

OUTPUT_TIMESTAMP = pa.timestamp("ms", tz="UTC")
STATE_FORMAT = "2"
"""Version of the snapshot layout; ``restore_partition`` refuses any other. 2: state per source partition."""
_RESERVED_PREFIX = "__window"
_WINDOW_START = "__window_start"
_PARTITION = "__window_partition"
"""The row's source partition (``__kafka_partition`` as int32): the first group-by column of the partials."""
_PARTITION_TYPE = pa.int32()
_MIN_INT64 = -(2**63)

_FORMAT_KEY = "epochline.window.format"
_SPEC_KEY = "epochline.window.spec"
_CONTENT_KEY = "epochline.window.content"
_PARTITION_KEY = "epochline.window.partition"
_EMITTED_KEY = "epochline.window.emitted_through"
_ONE_PARTITION = "partition"
"""``_CONTENT_KEY`` of every snapshot: one partition's state (anything else is refused on restore)."""
_AGGREGATE = re.compile(r"^\s*(count|sum|min|max|avg)\s*\(\s*(.+?)\s*\)\s*$", re.IGNORECASE)

PartialFunction = Literal["count_all", "count", "sum", "min", "max"]
"""The pyarrow group-by aggregations that compute a cycle's partial aggregates."""
MergeFunction = Literal["sum", "min", "max"]
"""The pyarrow group-by aggregations that merge partial aggregates across cycles."""
SortOrder = Literal["ascending", "descending"]


@dataclass(frozen=True)
class WindowSpec:
    kind: Literal["tumbling", "hopping"]
    size_ms: int
    slide_ms: int | None
    key: list[str]
    time_column: str | None
    aggregates: dict[str, str]
    """Output column -> ``count(*)``, ``count(col)``, ``sum(col)``, ``min(col)``, ``max(col)`` or ``avg(col)``."""

    @property
    def step_ms(self) -> int:
        """Distance between consecutive window starts."""
        return self.size_ms if self.kind == "tumbling" or self.slide_ms is None else self.slide_ms

    @property
    def event_time_column(self) -> str:
        return self.time_column or DEFAULT_TIME_COLUMN


@dataclass(frozen=True)
class Partial:
    """One pre-aggregate kept in state: ``function`` over the cycle's rows, merged across cycles by ``merge``.

    Internal column names start with ``__window`` so they cannot collide with key columns (checked)."""

    column: str
    source: str | None
    function: PartialFunction
    merge: MergeFunction

    @property
    def source_column(self) -> str | None:
        """The name the source column has inside the operator, after window assignment."""
        return None if self.source is None else _internal_source(self.source)


def _internal_source(column: str) -> str:
    return f"{_RESERVED_PREFIX}_src__{column}"


@dataclass(frozen=True)
class Aggregate:
    output: str
    function: str
    source: str | None
    partials: tuple[Partial, ...]


def parse_aggregate(output: str, expression: str, operator_name: str) -> Aggregate:
    match = _AGGREGATE.match(expression)
    if match is None:
        raise OperatorConfigError(
            f"operator {operator_name!r}: aggregate {output!r} = {expression!r} is not one of "
            "count(*), count(col), sum(col), min(col), max(col), avg(col)"
        )
    function, argument = match.group(1).lower(), match.group(2).strip('"')
    if argument == "*":
        if function != "count":
            raise OperatorConfigError(f"operator {operator_name!r}: aggregate {output!r}: only count takes '*'")
        return Aggregate(output, function, None, (Partial(f"{_RESERVED_PREFIX}_count_all", None, "count_all", "sum"),))

    def partial(kind: PartialFunction, merge: MergeFunction) -> Partial:
        return Partial(f"{_RESERVED_PREFIX}_{kind}__{argument}", argument, kind, merge)

    partials = {
        "count": (partial("count", "sum"),),
        "sum": (partial("sum", "sum"),),
        "min": (partial("min", "min"),),
        "max": (partial("max", "max"),),
        "avg": (partial("sum", "sum"), partial("count", "sum")),
    }[function]
    return Aggregate(output, function, argument, partials)


class WindowState:
    """The open windows' partial aggregates plus how far windows have been emitted, per source partition.

    ``partials``: one row per open (partition, key, window) with ``__window_partition`` (int32), the key
    columns, ``__window_start`` (int64 epoch ms) and one column per partial aggregate; ``None`` until the
    first rows arrive. ``emitted_through``: per partition, the highest watermark it has seen; every window
    of that partition ending at or before it has been emitted. A partition absent from it has emitted
    nothing.

    Implements ``engine.state.KeyedState``.
    """

    def __init__(self, fingerprint: str, key: list[str], operator_name: str, size_ms: int) -> None:
        self._fingerprint = fingerprint
        self._size_ms = size_ms
        self._order: list[tuple[str, SortOrder]] = [
            (_WINDOW_START, "ascending"), *((column, "ascending") for column in key)
        ]
        self._operator_name = operator_name
        self.partials: pa.Table | None = None
        self._emitted_through: dict[int, int] = {}
        self._changed: set[int] = set()
        self.partials_schema: pa.Schema | None = None
        """The partials' schema the validated input produces; restored partitions must have it."""

    @property
    def emitted_through(self) -> dict[int, int]:
        """Partition -> the highest watermark it has seen (a copy)."""
        return dict(self._emitted_through)

    def closed_through(self) -> dict[int, int]:
        """``KeyedState``: every window of a partition ending at or before its ``emitted_through`` is out."""
        return self.emitted_through

    def open_until(self) -> dict[int, int]:
        """``KeyedState``: per partition holding open windows, the end of its last one."""
        if self.partials is None or self.partials.num_rows == 0:
            return {}
        last = self.partials.group_by(_PARTITION, use_threads=False).aggregate([(_WINDOW_START, "max")])
        partitions = cast(list[int], last[_PARTITION].to_pylist())  # group keys and maxima are never null
        starts = cast(list[int], last[f"{_WINDOW_START}_max"].to_pylist())
        return {partition: start + self._size_ms for partition, start in zip(partitions, starts, strict=True)}

    # -- KeyedState -----------------------------------------------------------------------------------

    def changed_partitions(self) -> set[int]:
        return set(self._changed)

    def clear_changed(self) -> None:
        self._changed.clear()

    def partitions(self) -> set[int]:
        return self._partitions_with_rows() | set(self._emitted_through)

    def snapshot_partition(self, partition: int) -> bytes:
        """Arrow IPC stream of the partition's partials sorted by window and key (without the partition
        column), its partition and ``emitted_through`` in the schema metadata: equal state gives equal bytes.
        A partition without open windows is a stream without columns."""
        rows = self._rows_of(partition)
        table = pa.table({}) if rows.num_rows == 0 else rows.drop_columns([_PARTITION]).sort_by(self._order)
        emitted = self._emitted_through.get(partition)
        return _write_stream(table, {
            **self._identity(),
            _PARTITION_KEY: str(partition),
            _EMITTED_KEY: "" if emitted is None else str(emitted),
        })

    def restore_partition(self, partition: int, data: bytes | None) -> None:
        """Replace the partition's state by ``data`` (from ``snapshot_partition``; None: fresh). A snapshot
        of another format, spec, partition or partials schema is refused and leaves the state as it was."""
        rows, emitted = (None, None) if data is None else self._decode_partition(partition, data)
        if rows is not None:
            self._check_schema(rows.schema, self._held_schema())
        self.drop_partition(partition)
        if emitted is not None:
            self._emitted_through[partition] = emitted
        if rows is not None:
            current = self.partials
            self.partials = rows if current is None or current.num_rows == 0 else pa.concat_tables([current, rows])

    def drop_partition(self, partition: int) -> None:
        if self.partials is not None and self.partials.num_rows:
            others = pc.not_equal(self.partials[_PARTITION], pa.scalar(partition, _PARTITION_TYPE))
            self.partials = self.partials.filter(others)
        self._emitted_through.pop(partition, None)
        self._changed.discard(partition)

    # -- used by the operator's cycle -----------------------------------------------------------------

    def mark_changed(self, partitions: Iterable[int]) -> None:
        self._changed.update(partitions)

    def advance(self, watermark: int, partitions: Iterable[int]) -> None:
        """Each of ``partitions`` has now seen ``watermark`` (a lower one changes nothing)."""
        for partition in partitions:
            old = self._emitted_through.get(partition)
            if old is None or watermark > old:
                self._emitted_through[partition] = watermark
                self._changed.add(partition)

    # -- helpers --------------------------------------------------------------------------------------

    def _identity(self) -> dict[str, str]:
        return {_FORMAT_KEY: STATE_FORMAT, _SPEC_KEY: self._fingerprint, _CONTENT_KEY: _ONE_PARTITION}

    def _partitions_with_rows(self) -> set[int]:
        if self.partials is None or self.partials.num_rows == 0:
            return set()
        return _distinct(self.partials[_PARTITION])

    def _rows_of(self, partition: int) -> pa.Table:
        if self.partials is None:
            return pa.table({})
        return self.partials.filter(pc.equal(self.partials[_PARTITION], pa.scalar(partition, _PARTITION_TYPE)))

    def _held_schema(self) -> pa.Schema | None:
        """The schema restored rows must share with the rows already held."""
        if self.partials is None or self.partials.num_rows == 0:
            return None
        return self.partials.schema

    def _check_schema(self, schema: pa.Schema, other: pa.Schema | None) -> None:
        for expected, what in ((self.partials_schema, "the input now produces"), (other, "the state holds")):
            if expected is not None and not schema.equals(expected):
                raise OperatorConfigError(
                    f"operator {self._operator_name!r}: restored window state has columns {schema} but {what} "
                    f"{expected}"
                )

    def _decode_partition(self, partition: int, data: bytes) -> tuple[pa.Table | None, int | None]:
        """A partition snapshot -> its partials (with the partition column; None if it has no open windows)
        and its ``emitted_through``."""
        table, metadata = self._read(data)
        if metadata.get(_PARTITION_KEY) != str(partition):
            raise OperatorRuntimeError(
                f"operator {self._operator_name!r}: window state of partition {metadata.get(_PARTITION_KEY)} "
                f"cannot be restored as partition {partition}"
            )
        emitted = metadata.get(_EMITTED_KEY, "")
        if not table.num_columns:
            return None, int(emitted) if emitted else None
        rows = table.add_column(0, pa.field(_PARTITION, _PARTITION_TYPE),
                                pa.repeat(pa.scalar(partition, _PARTITION_TYPE), table.num_rows))
        return rows, int(emitted) if emitted else None

    def _read(self, data: bytes) -> tuple[pa.Table, dict[str, str]]:
        """A snapshot's table (without schema metadata) and metadata, after checking format, spec and kind."""
        try:
            table = pa.ipc.open_stream(data).read_all()
        except pa.ArrowInvalid as exc:
            raise OperatorRuntimeError(
                f"operator {self._operator_name!r}: window state is not a readable Arrow IPC stream: {exc}"
            ) from exc
        metadata = {key.decode(): value.decode() for key, value in (table.schema.metadata or {}).items()}
        if metadata.get(_FORMAT_KEY) != STATE_FORMAT:
            raise OperatorRuntimeError(
                f"operator {self._operator_name!r}: window state has format "
                f"{metadata.get(_FORMAT_KEY)!r}, this version reads {STATE_FORMAT!r}"
            )
        if metadata.get(_SPEC_KEY) != self._fingerprint:
            raise OperatorConfigError(
                f"operator {self._operator_name!r}: checkpointed window state was written for spec "
                f"{metadata.get(_SPEC_KEY)}, not for the configured {self._fingerprint}"
            )
        if metadata.get(_CONTENT_KEY) != _ONE_PARTITION:
            raise OperatorRuntimeError(
                f"operator {self._operator_name!r}: window state holds {metadata.get(_CONTENT_KEY)!r}, "
                f"expected {_ONE_PARTITION!r}"
            )
        return table.replace_schema_metadata(None), metadata


def _write_stream(table: pa.Table, metadata: dict[str, str]) -> bytes:
    table = table.replace_schema_metadata(metadata).combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


class WindowOperator:
    """Keyed tumbling/hopping windows over event time; see the module docstring for the exact semantics."""

    def __init__(self, spec: WindowSpec, name: str = "window") -> None:
        self.name = name
        self.spec = spec
        self._check_spec()
        self.aggregates = [
            parse_aggregate(output, expression, name) for output, expression in spec.aggregates.items()
        ]
        self._partials = _unique_partials(self.aggregates)
        self._state = WindowState(self._state_fingerprint(), spec.key, name, spec.size_ms)
        self._output_schema: pa.Schema | None = None

    @property
    def state(self) -> WindowState:
        return self._state

    def validate(self, input_schema: pa.Schema) -> pa.Schema:
        """Check columns, types and output names; return the output schema, found by a dry run over an
        empty table so it is exactly what ``process`` emits."""
        self._check_columns(input_schema)
        try:
            partials = self._pre_aggregate(input_schema.empty_table())
            output = self._finalize(partials)
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise OperatorConfigError(
                f"operator {self.name!r}: aggregates {self.spec.aggregates} do not apply to the input types: {exc}"
            ) from exc
        state = self._state.partials
        if state is not None and not state.schema.equals(partials.schema):
            raise OperatorConfigError(
                f"operator {self.name!r}: restored window state has columns {state.schema} but the input now "
                f"produces {partials.schema}"
            )
        self._state.partials_schema = partials.schema
        self._output_schema = output.schema
        return output.schema

    def process(self, table: pa.Table, watermark: Watermark) -> pa.Table:
        """One cycle. Validates lazily against the first table with columns if ``validate`` was not called;
        an end-of-input flush may pass a table with no columns."""
        if self._output_schema is None and table.num_columns:
            self.validate(table.schema)
        try:
            arrived = self._absorb(table) if table.num_rows else set()
            return self._emit(watermark, arrived)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, KeyError) as exc:
            raise OperatorRuntimeError(f"operator {self.name!r}: window cycle failed: {exc}") from exc

    def _state_fingerprint(self) -> str:
        """What state layout depends on, stored in snapshots so state is never restored under an incompatible
        spec. Output names and their order are not part of it: renaming an output keeps the state usable."""
        spec = self.spec
        layout = {
            "kind": spec.kind,
            "size_ms": spec.size_ms,
            "step_ms": spec.step_ms,
            "key": spec.key,
            "time_column": spec.event_time_column,
            "partials": sorted(p.column for p in self._partials),
        }
        return orjson.dumps(layout, option=orjson.OPT_SORT_KEYS).decode()

    # -- configuration checks -------------------------------------------------------------------------

    def _check_spec(self) -> None:
        spec = self.spec
        problems = []
        if spec.kind not in ("tumbling", "hopping"):
            problems.append(f"kind {spec.kind!r} is not 'tumbling' or 'hopping'")
        if spec.size_ms <= 0:
            problems.append(f"size_ms {spec.size_ms} must be positive")
        if spec.kind == "hopping" and (spec.slide_ms is None or not 0 < spec.slide_ms <= spec.size_ms):
            problems.append(f"hopping slide_ms {spec.slide_ms} must be positive and at most size_ms {spec.size_ms}")
        if spec.kind == "tumbling" and spec.slide_ms not in (None, spec.size_ms):
            problems.append(f"tumbling windows take no slide_ms (got {spec.slide_ms})")
        if not spec.aggregates:
            problems.append("no aggregates given")
        outputs = [*spec.key, "window_start", "window_end", *spec.aggregates]
        duplicates = sorted({column for column in outputs if outputs.count(column) > 1})
        if duplicates:
            problems.append(f"output columns {duplicates} appear more than once")
        reserved = [key for key in spec.key if key.startswith(_RESERVED_PREFIX)]
        if reserved:
            problems.append(f"key columns {reserved} start with the reserved prefix {_RESERVED_PREFIX!r}")
        if problems:
            raise OperatorConfigError(f"operator {self.name!r}: bad window spec: {'; '.join(problems)}")

    def _check_columns(self, schema: pa.Schema) -> None:
        wanted = [*self.spec.key, self.spec.event_time_column]
        wanted += [aggregate.source for aggregate in self.aggregates if aggregate.source is not None]
        missing = sorted({column for column in wanted if column not in schema.names})
        if missing:
            raise OperatorConfigError(
                f"operator {self.name!r}: input has no column(s) {missing}; it has {schema.names}"
            )
        if PARTITION not in schema.names:
            raise OperatorConfigError(
                f"operator {self.name!r}: input has no {PARTITION!r} column; window state is kept per source "
                f"partition, so keep {PARTITION} in the preceding step's output (e.g. SELECT ..., {PARTITION} "
                f"FROM input); it has {schema.names}"
            )
        partition_type = schema.field(PARTITION).type
        if not pa.types.is_integer(partition_type):
            raise OperatorConfigError(
                f"operator {self.name!r}: partition column {PARTITION!r} is {partition_type}; it must be an integer"
            )
        time_type = schema.field(self.spec.event_time_column).type
        if not is_event_time_type(time_type):
            raise OperatorConfigError(
                f"operator {self.name!r}: time column {self.spec.event_time_column!r} is {time_type}; "
                "it must be a timestamp or an integer of epoch milliseconds"
            )
        for aggregate in self.aggregates:
            # sum and avg always have a source column (only count takes '*').
            if aggregate.function in ("sum", "avg") and aggregate.source is not None:
                value_type = schema.field(aggregate.source).type
                if not (pa.types.is_integer(value_type) or pa.types.is_floating(value_type)
                        or pa.types.is_decimal(value_type)):
                    raise OperatorConfigError(
                        f"operator {self.name!r}: {aggregate.function}({aggregate.source}) needs a numeric "
                        f"column, {aggregate.source!r} is {value_type}"
                    )

    # -- one cycle ------------------------------------------------------------------------------------

    def _absorb(self, table: pa.Table) -> set[int]:
        """Merge the cycle's rows into state; returns the partitions the cycle has rows of."""
        partitions = table[PARTITION]
        if partitions.null_count:
            raise OperatorRuntimeError(
                f"operator {self.name!r}: {partitions.null_count} row(s) have no {PARTITION}; window state is "
                "kept per source partition"
            )
        arrived = _distinct(partitions)
        partials = self._pre_aggregate(table)
        if partials.num_rows == 0:
            return arrived
        current = self._state.partials
        if current is None or current.num_rows == 0:
            self._state.partials = partials
        else:
            self._state.partials = self._merge(pa.concat_tables([current, partials]))
        self._state.mark_changed(_distinct(partials[_PARTITION]))
        return arrived

    def _pre_aggregate(self, table: pa.Table) -> pa.Table:
        """The cycle's rows as partial aggregates per (partition, key, window start)."""
        assigned = self._assign_windows(table)
        if assigned.num_rows:
            self._refuse_emitted_windows(assigned)
        groups = [_PARTITION, *self.spec.key, _WINDOW_START]
        grouped = assigned.group_by(groups, use_threads=False).aggregate(
            [(_column_selector(p), p.function) for p in self._partials]
        )
        pyarrow_names = [_pyarrow_aggregate_name(p.source_column, p.function) for p in self._partials]
        return grouped.select([*groups, *pyarrow_names]).rename_columns(
            [*groups, *(p.column for p in self._partials)]
        )

    def _refuse_emitted_windows(self, assigned: pa.Table) -> None:
        """A row counted into a window its partition already emitted would be lost: fail the cycle instead
        (the engine judges such rows late before they get here, so this means a step before the window
        moved event time backwards)."""
        emitted = self._emitted_window_starts(assigned[_PARTITION])
        if emitted is None:
            return
        # No threshold (null): nothing of that partition was emitted yet.
        closed = _booleans(pc.less_equal(assigned[_WINDOW_START], emitted)).fill_null(pa.scalar(False))
        refused = assigned.filter(closed)
        if refused.num_rows:
            partitions = sorted(_distinct(refused[_PARTITION]))
            raise OperatorRuntimeError(
                f"operator {self.name!r}: {refused.num_rows} row(s) of partition(s) {partitions} belong to windows "
                f"already emitted (emitted through {self._state.emitted_through}); a step before the window "
                f"changed {self.spec.event_time_column!r}, which must stay the source's event time")

    def _assign_windows(self, table: pa.Table) -> pa.Table:
        """One row per (input row, window containing it), with the window's start in ``__window_start``."""
        times = event_time_ms(table[self.spec.event_time_column])
        if times.null_count:
            raise OperatorRuntimeError(
                f"operator {self.name!r}: {times.null_count} row(s) have no event time in "
                f"{self.spec.event_time_column!r}; the engine dead-letters such source rows, so a step before "
                "the window set it to null")
        columns = {_PARTITION: table[PARTITION].cast(_PARTITION_TYPE)}
        columns.update({key: table[key] for key in self.spec.key})
        for partial in self._partials:
            if partial.source is not None:
                columns[_internal_source(partial.source)] = table[partial.source]
        step, size = self.spec.step_ms, self.spec.size_ms
        last_start = pc.multiply(floor_divide(times, step), step)
        pieces = []
        for hop in range(-(-size // step)):
            start = pc.subtract(last_start, hop * step)
            contains = pc.greater(pc.add(start, size), times)
            pieces.append(pa.table({**columns, _WINDOW_START: start}).filter(contains))
        return pa.concat_tables(pieces)

    def _merge(self, partials: pa.Table) -> pa.Table:
        groups = [_PARTITION, *self.spec.key, _WINDOW_START]
        merged = partials.group_by(groups, use_threads=False).aggregate(
            [(p.column, p.merge) for p in self._partials]
        )
        return merged.select([*groups, *(f"{p.column}_{p.merge}" for p in self._partials)]).rename_columns(
            [*groups, *(p.column for p in self._partials)]
        )

    def _emit(self, watermark: Watermark, arrived: set[int]) -> pa.Table:
        """Advance the partitions holding state or having rows this cycle to ``watermark`` (each to its own,
        given per partition); emit the windows their ``emitted_through`` has reached."""
        state = self._state
        if isinstance(watermark, int):
            state.advance(watermark, state.partitions() | arrived)
        elif watermark is not None:
            for partition, partition_watermark in watermark.items():
                state.advance(partition_watermark, [partition])
        partials = state.partials
        if partials is None:
            return self._empty_output()
        emitted_starts = self._emitted_window_starts(partials[_PARTITION]) if partials.num_rows else None
        if emitted_starts is None:
            return self._finalize(partials.slice(0, 0))
        due = _booleans(pc.less_equal(partials[_WINDOW_START], emitted_starts)).fill_null(pa.scalar(False))
        emitted = partials.filter(due)
        if emitted.num_rows:
            state.partials = partials.filter(pc.invert(due))
            state.mark_changed(_distinct(emitted[_PARTITION]))
        return self._finalize(emitted)

    def _emitted_window_starts(self, partitions: pa.ChunkedArray[Any]) -> pa.ChunkedArray[Any] | None:
        """Per row of ``partitions``: the highest window start its partition has emitted through
        (``emitted_through - size``), null where the partition emitted nothing; None if no partition did."""
        emitted_through = self._state.emitted_through
        if not emitted_through:
            return None
        starts = [max(end - self.spec.size_ms, _MIN_INT64) for end in emitted_through.values()]
        index = pc.index_in(partitions, value_set=pa.array(list(emitted_through), _PARTITION_TYPE))
        # ``index`` is chunked like ``partitions``, so the result is a ChunkedArray too.
        return cast("pa.ChunkedArray[Any]", pc.take(pa.array(starts, pa.int64()), index))

    def _finalize(self, partials: pa.Table) -> pa.Table:
        """Partial aggregates of closed windows -> output rows (without the partition), ordered by window end,
        then key, then partition."""
        ordered = partials.sort_by([(_WINDOW_START, "ascending"), *((k, "ascending") for k in self.spec.key),
                                    (_PARTITION, "ascending")])
        starts = ordered[_WINDOW_START]
        columns = {key: ordered[key] for key in self.spec.key}
        columns["window_start"] = starts.cast(OUTPUT_TIMESTAMP)
        columns["window_end"] = pc.add(starts, self.spec.size_ms).cast(OUTPUT_TIMESTAMP)
        for aggregate in self.aggregates:
            columns[aggregate.output] = _final_value(aggregate, ordered)
        return pa.table(columns)

    def _empty_output(self) -> pa.Table:
        """No open windows: an empty table of the output schema (no columns if the input was never seen)."""
        return self._output_schema.empty_table() if self._output_schema is not None else pa.table({})


def _distinct(partitions: pa.ChunkedArray[Any]) -> set[int]:
    """The partitions occurring in a partition column (one Python int per distinct partition)."""
    return {partition for partition in pc.unique(partitions).to_pylist() if partition is not None}


def _booleans(values: object) -> pa.ChunkedArray[pa.BooleanScalar]:
    """A comparison of two ChunkedArrays, typed as what it is (the stubs type it as an Array)."""
    return cast("pa.ChunkedArray[pa.BooleanScalar]", values)


def _final_value(aggregate: Aggregate, partials: pa.Table) -> pa.ChunkedArray[Any]:
    if aggregate.function != "avg":
        return partials[aggregate.partials[0].column]
    total, count = (partials[p.column] for p in aggregate.partials)
    # The sum is null exactly when the count is 0 (no non-null values), so the quotient is null there too.
    return pc.divide(total.cast(pa.float64()), count.cast(pa.float64()))


def _unique_partials(aggregates: list[Aggregate]) -> tuple[Partial, ...]:
    """Each (function, column) pre-aggregate once, however many outputs use it (e.g. sum(x) and avg(x))."""
    return tuple(dict.fromkeys(p for aggregate in aggregates for p in aggregate.partials))


def _column_selector(partial: Partial) -> str | list[str]:
    """The columns pyarrow's group-by aggregates a partial over: its source, or none (``count_all``)."""
    if partial.source_column is None:
        return []
    return partial.source_column


def _pyarrow_aggregate_name(source: str | None, function: str) -> str:
    return function if source is None else f"{source}_{function}"
