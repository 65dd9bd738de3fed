"""Every input record accounted for: output + dead letters = input, by id (DESIGN.md, "Event time judges only
what holds event-time state").

An exactly-once test that counts only its sink topic passes when a record moved from the sink to the
dead-letter topic without a cause, or was dead-lettered twice. ``assert_exactly_once`` reads both topics with
``read_committed`` and checks that each expected id is in exactly one of them, once; that the dead-letter
topic holds exactly the ids the test expects there (none by default), each with its reason and stage. A
windowed job has no output row per input id: ``assert_dead_letters`` checks the dead-letter side alone and
returns the dead letters, so the test can compare its windows over the rows that were not dead-lettered.

A dead letter's value is the record as it came: JSON bytes for a JSON source (possibly malformed), an Arrow
IPC stream of one or more rows when the repartition stage of a windowed connector dead-lettered them.
"""

from __future__ import annotations

import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass

import orjson
import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from connectors.admin import ClientConfig, partition_offsets
from engine.testing.topics import MARKER_GRACE_S, read_values

REASON = "epochline.reason"
STAGE = "epochline.stage"
SHOWN = 5
"""How many ids of each kind a failure message names."""

IdsOf = Callable[[bytes | None], list[Hashable]]
"""A record's value -> the ids it carries (one for a JSON record, one per row of an Arrow IPC stream)."""

ARROW_IPC_STREAM = b"\xff\xff\xff\xff"
"""Every Arrow IPC stream starts with this continuation marker; no JSON text does."""


def ids_in(field: str = "id") -> IdsOf:
    """The ids ``field`` holds in a JSON record, an Arrow IPC stream, or a JSON record cut short (a poison
    record such as ``{"id": 13, "amount": ``: the number after ``"id":``); no id: an empty list."""
    cut_short = re.compile(rb'"' + re.escape(field.encode()) + rb'"\s*:\s*(-?\d+)')

    def ids(value: bytes | None) -> list[Hashable]:
        if not value:
            return []
        if value.startswith(ARROW_IPC_STREAM):
            table = pa.ipc.open_stream(value).read_all()
            return list(table.column(field).to_pylist()) if field in table.column_names else []
        try:
            row = orjson.loads(value)
        except orjson.JSONDecodeError:
            found = cut_short.search(value)
            return [int(found.group(1))] if found else []
        return [row[field]] if isinstance(row, dict) and field in row else []

    return ids


@dataclass(frozen=True)
class DeadLetterRecord:
    """One record of a dead-letter topic: the ids it carries, its value as it came, why and where it failed."""

    ids: tuple[Hashable, ...]
    value: bytes | None
    stage: str
    reason: str
    headers: dict[str, bytes]

    def describe(self) -> str:
        shown = list(self.ids[:SHOWN]) if self.ids else (self.value or b"")[:60]
        return f"{shown!r} ({self.stage or 'no stage'}: {self.reason or 'no reason'})"


@dataclass(frozen=True)
class Accounting:
    """What a job committed: each output id with its count, and every dead letter."""

    output: Counter[Hashable]
    dead_letters: list[DeadLetterRecord]

    @property
    def dead_lettered(self) -> Counter[Hashable]:
        return Counter(i for letter in self.dead_letters for i in letter.ids)


def read_dead_letters(bootstrap: str, topic: str, *, ids_of: IdsOf | None = None,
                      client_config: ClientConfig | None = None, timeout: float = 60.0) -> list[DeadLetterRecord]:
    """Every committed record of the dead-letter ``topic`` (read_committed), with its ids and headers."""
    ids_of = ids_of or ids_in()
    letters = []
    for value, headers in _read_with_headers(bootstrap, topic, client_config, timeout):
        letters.append(DeadLetterRecord(ids=tuple(ids_of(value)), value=value,
                                        stage=headers.get(STAGE, b"").decode(errors="replace"),
                                        reason=headers.get(REASON, b"").decode(errors="replace"), headers=headers))
    return letters


def assert_dead_letters(bootstrap: str, topic: str, expected: Mapping[Hashable, str] | Collection[Hashable] = (),
                        *, reason: str = "", stage: str = "decode", ids_of: IdsOf | None = None,
                        client_config: ClientConfig | None = None, timeout: float = 60.0) -> list[DeadLetterRecord]:
    """The dead-letter topic holds exactly the ``expected`` ids, once each (none by default: an empty topic),
    each with a reason (containing ``expected[id]``, or ``reason``, case-insensitively) and ``stage``.
    Returns the dead letters."""
    letters = read_dead_letters(bootstrap, topic, ids_of=ids_of, client_config=client_config, timeout=timeout)
    problems = dead_letter_problems(letters, expected, reason=reason, stage=stage)
    assert not problems, f"dead-letter topic {topic}:\n" + "\n".join(problems)
    return letters


def assert_exactly_once(bootstrap: str, sink: str, dead_letter_topic: str, expected: Iterable[Hashable],
                        *, dead_lettered: Mapping[Hashable, str] | Collection[Hashable] = (), reason: str = "",
                        stage: str = "decode", ids_of: IdsOf | None = None, output_ids_of: IdsOf | None = None,
                        client_config: ClientConfig | None = None, timeout: float = 60.0) -> Accounting:
    """Output + dead letters = ``expected``, by id, read with read_committed: each expected id is in exactly
    one of the two topics, once (a ``Counter`` asks for an id that many times). The dead-letter topic holds
    exactly the ``dead_lettered`` ids (none by default), each with a reason (containing
    ``dead_lettered[id]``, or ``reason``) and ``stage``; ``expected`` includes them. ``ids_of`` finds the ids in
    a record (default: field ``id`` of JSON or Arrow IPC), ``output_ids_of`` in an output record when the sink
    writes another format than the source (dead letters are the source's records). Returns what was read."""
    ids_of = ids_of or ids_in()
    want = expected if isinstance(expected, Counter) else Counter(expected)
    output = Counter(i for value in read_values(bootstrap, sink, client_config=client_config, timeout=timeout)
                     for i in (output_ids_of or ids_of)(value))
    letters = read_dead_letters(bootstrap, dead_letter_topic, ids_of=ids_of, client_config=client_config,
                                timeout=timeout)
    accounting = Accounting(output, letters)
    problems = count_problems(output + accounting.dead_lettered, want, "output + dead letters")
    both = sorted(set(output) & set(accounting.dead_lettered), key=_in_order)
    if both:
        problems.append(f"{len(both)} ids both in the output and dead-lettered, e.g. {both[:SHOWN]}")
    problems += dead_letter_problems(letters, dead_lettered, reason=reason, stage=stage)
    assert not problems, (f"records not accounted for exactly once (sink {sink}, dead letters "
                          f"{dead_letter_topic}):\n" + "\n".join(problems))
    return accounting


def _in_order(value: Hashable) -> tuple[str, float | str]:
    """Numbers in numeric order, anything else by its repr: failure messages name the smallest ids first."""
    return ("", value) if isinstance(value, int | float) else (type(value).__name__, repr(value))


def count_problems(got: Counter[Hashable], expected: Counter[Hashable], what: str) -> list[str]:
    """What differs between two multisets of ids, a few of each kind named; empty when they are equal."""
    if got == expected:
        return []
    missing = expected - got
    surplus = got - expected
    duplicated = {i: got[i] for i in surplus if got[i] > 1}
    unexpected = sorted((i for i in surplus if i not in expected), key=_in_order)
    problems = [f"{what}: {sum(got.values())} ids read, {sum(expected.values())} expected"]
    if missing:
        shown_missing = sorted(missing, key=_in_order)[:SHOWN]
        problems.append(f"{len(missing)} ids missing (or short of copies), e.g. {shown_missing}")
    if duplicated:
        shown = dict(sorted(duplicated.items(), key=lambda item: _in_order(item[0]))[:SHOWN])
        problems.append(f"{len(duplicated)} ids read more often than expected (id: times), e.g. {shown}")
    if unexpected:
        problems.append(f"{len(unexpected)} ids not expected at all, e.g. {unexpected[:SHOWN]}")
    return problems


def dead_letter_problems(letters: list[DeadLetterRecord], expected: Mapping[Hashable, str] | Collection[Hashable],
                         *, reason: str = "", stage: str = "decode") -> list[str]:
    """What is wrong with ``letters`` against the ``expected`` ids (and their reasons); empty when nothing."""
    reasons = dict(expected) if isinstance(expected, Mapping) else dict.fromkeys(expected, reason)
    got = Counter(i for letter in letters for i in letter.ids)
    problems = [f"unexpected dead letter {letter.describe()}" for letter in letters
                if not letter.ids or any(i not in reasons for i in letter.ids)][:SHOWN]
    problems += count_problems(got, Counter(list(reasons)), "dead-lettered ids")
    for letter in letters:
        if not letter.reason.strip():
            problems.append(f"dead letter without a reason ({REASON} header): {letter.describe()}")
        if letter.stage != stage:
            problems.append(f"dead letter at stage {letter.stage!r}, expected {stage!r}: {letter.describe()}")
        wanted = {reasons[i] for i in letter.ids if reasons.get(i)}
        problems += [f"dead letter whose reason does not mention {part!r}: {letter.describe()}"
                     for part in wanted if part.lower() not in letter.reason.lower()]
    return problems[:4 * SHOWN]


def _read_with_headers(bootstrap: str, topic: str, client_config: ClientConfig | None,
                       timeout: float) -> list[tuple[bytes | None, dict[str, bytes]]]:
    """Every record of ``topic`` up to its last stable offsets, read_committed, with its headers, in partition
    then offset order. Like ``engine.testing.read_values``, it gives a transaction that committed a moment ago
    ``MARKER_GRACE_S`` for its markers to move the last stable offsets."""
    ends = _stable_ends(bootstrap, topic, client_config, timeout)
    if not ends:
        return []
    consumer = Consumer({**(client_config or {}), "bootstrap.servers": bootstrap,
                         "group.id": f"epochline-accounting-{uuid.uuid4().hex}", "isolation.level": "read_committed",
                         "enable.auto.commit": False, "enable.partition.eof": True, "log_level": 0})
    records: list[tuple[int, int, bytes | None, dict[str, bytes]]] = []
    try:
        consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING) for partition in ends])
        pending = dict(ends)
        deadline = time.monotonic() + timeout
        while pending:
            assert time.monotonic() < deadline, f"reading {topic}: partitions {pending} not read to their end"
            for message in consumer.consume(10_000, 0.2):
                partition, offset, error = message.partition() or 0, message.offset() or 0, message.error()
                if error is None:
                    if offset < ends[partition]:
                        records.append((partition, offset, message.value(), _headers(message.headers())))
                elif error.code() != KafkaError._PARTITION_EOF:
                    raise AssertionError(f"reading {topic} partition {partition} failed: {error}")
            for position in consumer.position([TopicPartition(topic, p) for p in pending]):
                if position.offset >= pending[position.partition]:
                    del pending[position.partition]
    finally:
        consumer.close()
    return [(value, headers) for _, _, value, headers in sorted(records, key=lambda r: (r[0], r[1]))]


def _headers(pairs: Mapping[str, str | bytes | None] | Iterable[tuple[str, str | bytes | None]] | None,
             ) -> dict[str, bytes]:
    """A record's headers by name, values as bytes (a header without a value: empty)."""
    items = pairs.items() if isinstance(pairs, Mapping) else pairs or []
    return {name: value.encode() if isinstance(value, str) else value or b"" for name, value in items}


def _stable_ends(bootstrap: str, topic: str, client_config: ClientConfig | None, timeout: float) -> dict[int, int]:
    """Per partition holding records, its last stable offset, once it reached the high watermark (or after
    ``MARKER_GRACE_S``: an open transaction's records are not waited for)."""
    highs = partition_offsets(bootstrap, topic, timeout, client_config, isolation="read_uncommitted")
    deadline = time.monotonic() + MARKER_GRACE_S
    while True:
        stable = partition_offsets(bootstrap, topic, timeout, client_config)
        if all(end >= highs[p][1] for p, (_, end) in stable.items()) or time.monotonic() >= deadline:
            return {p: end for p, (low, end) in stable.items() if end > low}
        time.sleep(0.02)
