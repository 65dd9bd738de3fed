"""A repartitioned tumbling window over a JSON order stream, and the check that its output is exact.

The input: ``RECORDS`` orders (``id``, ``user`` one of ``USERS``, ``amount``, ``ts`` ``STEP_MS`` apart from
``T0``), each user's rows on 3 of the 6 source partitions, so the window (keyed by ``user``) is re-keyed
through the connector's repartition topic. The check (``check_windows``) accounts for every input id:

- it is dead-lettered (once, with a reason and an allowed stage), or
- it is counted into exactly one emitted window: the reference over every id NOT dead-lettered equals the
  emitted windows (``n`` and ``total`` per (user, window_start)), no window is emitted twice, or
- its window is still open at the end: its end is after the input's largest event time minus the allowed
  lateness, so no watermark reached it (and it is not emitted).

Every window whose end is at or before the largest event time minus the allowed lateness must be emitted.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pyarrow as pa
import yaml
from confluent_kafka import Consumer, KafkaError, TopicPartition

from connectors.admin import create_topic, partitions_of
from engine.testing.topics import read_values

PARTITIONS = 6
RECORDS = 60_000
USERS = 40
STEP_MS = 5
WINDOW_MS = 10_000
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
T0_MS = int(T0.timestamp() * 1000)

SCHEMA = {"type": "object",
          "properties": {"id": {"type": "integer"}, "user": {"type": "string"}, "amount": {"type": "number"},
                         "ts": {"type": "string", "format": "date-time"}},
          "required": ["id", "user", "amount", "ts"]}
TRANSFORM = [{"window": {"kind": "tumbling", "size": f"{WINDOW_MS // 1000}s", "key": ["user"], "time_column": "ts",
                         "aggregates": {"total": "sum(amount)", "n": "count(*)"}}}]


def event_time(allowed_lateness_s: int, idle_timeout: str = "5s") -> dict[str, str]:
    return {"column": "ts", "allowed_lateness": f"{allowed_lateness_s}s", "idle_timeout": idle_timeout}


def user_of(i: int) -> str:
    return f"u{i % USERS}"


def ts_ms(i: int) -> int:
    return T0_MS + STEP_MS * i


def amount_of(i: int) -> float:
    return float(i % 7)  # integral: sums are exact in any order


def partition_of(i: int) -> int:
    """Each user's rows go round-robin over 3 of the 6 partitions (user, user+1, user+2)."""
    return (i % USERS + (i // USERS) % 3) % PARTITIONS


def order(i: int) -> bytes:
    ts = (T0 + dt.timedelta(milliseconds=STEP_MS * i)).isoformat().replace("+00:00", "Z")
    return orjson.dumps({"id": i, "user": user_of(i), "amount": amount_of(i), "ts": ts})


def orders(first: int, end: int) -> tuple[list[bytes], Callable[[int], tuple[int, None]]]:
    """Rows ``first..end-1`` and the ``key_of`` that puts row k of them on its partition (for
    ``produce_values`` / ``LiveInput``)."""
    return [order(i) for i in range(first, end)], lambda k: (partition_of(first + k), None)


def create_topics(bootstrap: str, prefix: str) -> dict[str, str]:
    """Source, sink and dead-letter topics with 6 partitions each (``assert_no_open_transactions`` reads 6)."""
    names = {"source": f"{prefix}-in", "sink": f"{prefix}-out", "dlq": f"{prefix}-dlq"}
    for topic in names.values():
        create_topic(bootstrap, topic, PARTITIONS)
    return names


def window_start_ms(value: str) -> int:
    return int(dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)


@dataclass(frozen=True)
class DeadLetterRecord:
    value: bytes
    headers: dict[str, str]

    def rows(self) -> list[dict]:
        """The row(s) it holds: a source record's original JSON bytes, or an Arrow IPC stream of rows (a
        record of the repartition stage may hold several)."""
        try:
            return [orjson.loads(self.value)]
        except orjson.JSONDecodeError:
            return pa.ipc.open_stream(self.value).read_all().to_pylist()


def read_dead_letters(bootstrap: str, topic: str, timeout: float = 60.0) -> list[DeadLetterRecord]:
    """Every committed record of ``topic`` with its headers (``read_values`` gives no headers), read with
    read_committed to each partition's end; cross-checked against ``read_values``."""
    partitions = partitions_of(bootstrap, topic, timeout)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"dlq-check-{topic}-{time.monotonic_ns()}",
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "enable.auto.commit": False, "log_level": 0})
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    letters: list[DeadLetterRecord] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(at_end) < len(partitions):
            assert time.monotonic() < deadline, f"{topic}: partitions {sorted(at_end)} of {partitions} read"
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                at_end.add(message.partition())
                continue
            at_end.discard(message.partition())
            value = message.value()
            assert value is not None, f"{topic}: a dead letter without a value at offset {message.offset()}"
            headers = {key: raw.decode(errors="replace") for key, raw in (message.headers() or [])
                       if raw is not None}
            letters.append(DeadLetterRecord(value, headers))
    finally:
        consumer.close()
    values = read_values(bootstrap, topic, timeout=timeout)
    assert sorted(v or b"" for v in values) == sorted(letter.value for letter in letters), \
        f"{topic}: the header read and read_values disagree"
    return letters


@dataclass
class WindowReport:
    """What a run produced, for the per-run line and the failure message."""

    emitted_windows: int = 0
    dead_lettered_ids: int = 0
    dead_letter_records: int = 0
    open_window_ids: int = 0
    reasons: Counter = field(default_factory=Counter)
    stages: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"windows_emitted={self.emitted_windows} dead_lettered_ids={self.dead_lettered_ids} "
                f"dead_letter_records={self.dead_letter_records} open_window_ids={self.open_window_ids} "
                f"stages={dict(self.stages)} reasons={dict(self.reasons.most_common(3))}")


def _reason_kind(reason: str) -> str:
    return reason.split(" {", maxsplit=1)[0]


def _ids_text(ids: Iterable[int], limit: int = 20) -> str:
    ordered = sorted(ids)
    more = f" ... ({len(ordered)} in all)" if len(ordered) > limit else ""
    return f"{ordered[:limit]}{more}"


def check_windows(bootstrap: str, topics: dict[str, str], records: int = RECORDS, allowed_lateness_ms: int = 0,
                  stages: frozenset[str] = frozenset({"late"})) -> WindowReport:
    """The accounting described in the module docstring; raises AssertionError naming every problem."""
    report = WindowReport()
    emitted = [orjson.loads(value) for value in read_values(bootstrap, topics["sink"]) if value is not None]
    letters = read_dead_letters(bootstrap, topics["dlq"])
    report.emitted_windows = len(emitted)
    report.dead_letter_records = len(letters)

    lettered: Counter = Counter()
    reason_of: dict[int, str] = {}
    for letter in letters:
        reason, stage = letter.headers.get("epochline.reason", ""), letter.headers.get("epochline.stage", "")
        rows = letter.rows()
        report.reasons[_reason_kind(reason)] += len(rows)
        report.stages[stage] += len(rows)
        if not reason.strip():
            report.problems.append(f"a dead letter without a reason (stage {stage!r}, ids "
                                   f"{_ids_text(r.get('id') for r in rows)})")
        if stage not in stages:
            report.problems.append(f"a dead letter of stage {stage!r} (allowed {sorted(stages)}): {reason!r}, ids "
                                   f"{_ids_text(r.get('id') for r in rows)}")
        if stage == "late" and not reason.startswith("late row"):
            report.problems.append(f"a late dead letter whose reason is {reason!r}")
        for row in rows:
            lettered[row["id"]] += 1
            reason_of[row["id"]] = reason
    report.dead_lettered_ids = len(lettered)
    twice = sorted(i for i, n in lettered.items() if n > 1)
    if twice:
        report.problems.append(f"{len(twice)} ids dead-lettered more than once: {_ids_text(twice)}")
    unknown = sorted(i for i in lettered if not (isinstance(i, int) and 0 <= i < records))
    if unknown:
        report.problems.append(f"dead letters with ids not in the input: {unknown[:20]}")

    # The reference: every input id not dead-lettered, per (user, window_start).
    reference: dict[tuple[str, int], list] = defaultdict(lambda: [0.0, 0, []])
    for i in range(records):
        if i in lettered:
            continue
        window = reference[(user_of(i), ts_ms(i) - ts_ms(i) % WINDOW_MS)]
        window[0] += amount_of(i)
        window[1] += 1
        window[2].append(i)
    closed_through = ts_ms(records - 1) - allowed_lateness_ms  # windows ending at or before it must be out

    seen = Counter((row["user"], window_start_ms(row["window_start"])) for row in emitted)
    doubled = sorted(key for key, n in seen.items() if n > 1)
    if doubled:
        report.problems.append(f"{len(doubled)} windows emitted more than once: {doubled[:10]}")
    for row in emitted:
        key = (row["user"], window_start_ms(row["window_start"]))
        if window_start_ms(row["window_end"]) - key[1] != WINDOW_MS:
            report.problems.append(f"window {key} ends at {row['window_end']}")
        if key not in reference:
            late = sorted(i for i in lettered if (user_of(i), ts_ms(i) - ts_ms(i) % WINDOW_MS) == key)
            report.problems.append(f"window {key} emitted (n={row['n']}, total={row['total']}) but every row of "
                                   f"it was dead-lettered: {_ids_text(late)}")
            continue
        total, count, ids = reference[key]
        if (row["n"], row["total"]) != (count, total):
            late = sorted(i for i in lettered if (user_of(i), ts_ms(i) - ts_ms(i) % WINDOW_MS) == key)
            report.problems.append(
                f"window {key} emitted n={row['n']} total={row['total']}, the reference over its ids not "
                f"dead-lettered says n={count} total={total} ({count - row['n']} rows short); its rows not "
                f"dead-lettered: {_ids_text(ids, 10)}; its dead-lettered rows: {_ids_text(late, 10)}")
    for key, (_, count, ids) in sorted(reference.items()):
        if key in seen:
            continue
        if key[1] + WINDOW_MS <= closed_through:
            report.problems.append(f"window {key} (end {key[1] + WINDOW_MS - T0_MS} ms after T0, at or before "
                                   f"the largest event time minus the lateness, {closed_through - T0_MS} ms) was "
                                   f"never emitted: {count} rows, ids {_ids_text(ids, 10)}")
        else:
            report.open_window_ids += count
    if lettered:
        by_partition = Counter(partition_of(i) for i in lettered)
        print(f"dead-lettered ids by source partition {dict(sorted(by_partition.items()))}, e.g. reasons "
              f"{sorted(set(reason_of.values()))[:3]}")
    assert not report.problems, "window output not exact:\n" + "\n".join(report.problems[:40]) + \
        f"\n({len(report.problems)} problems) {report.line()}"
    return report


@contextmanager
def logs_kept_on_failure(tmp_path: Path, label: str) -> Iterator[None]:
    """On any failure, copy the connector logs under ``tmp_path`` to ``$EPOCHLINE_KEEP_LOGS/<label>`` (when that
    variable names a directory), so a failed repetition can be read after pytest cleans up."""
    try:
        yield
    except BaseException:
        keep = os.environ.get("EPOCHLINE_KEEP_LOGS")
        if keep:
            target = Path(keep) / label
            target.mkdir(parents=True, exist_ok=True)
            for log in tmp_path.rglob("*.log"):
                shutil.copy2(log, target / log.name)
            for config in tmp_path.rglob("*.yaml"):
                shutil.copy2(config, target / config.name)
            print(f"logs kept in {target}")
        raise


def with_source_settings(config: Path, **settings: object) -> Path:
    """Rewrite ``config``'s ``source`` section: each setting set, or removed (its default) when None."""
    loaded = yaml.safe_load(config.read_text())
    for key, value in settings.items():
        if value is None:
            loaded["source"].pop(key, None)
        else:
            loaded["source"][key] = value
    config.write_text(yaml.safe_dump(loaded, sort_keys=False))
    return config
