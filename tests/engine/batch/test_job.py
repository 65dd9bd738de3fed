"""Bounded exactly-once batch jobs (``epochline batch``), proven against the real broker.

Output and dead letters are always read back with ``read_committed`` and compared, as a multiset of ids,
with what the input holds (no dead letters here); the crash test kills real ``epochline batch run``
processes (SIGKILL, and injected crashes at the two moments that matter: after an item's records are
flushed but before its commit, and after its commit but before the store hears of it) and resumes until
the batch is done.
"""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from connectors.admin import create_topic, end_offsets
from engine.batch import BatchItem, BatchPlan, BatchStore, Outcome, open_batch_store, split_into_items, store_url_for
from engine.cli import main
from engine.config import load_config
from engine.testing import produce_transactions, read_values
from engine.testing.accounting import assert_exactly_once
from engine.testing.connectors import (
    Connector,
    produce_values,
    start_connector,
    write_config,
)

pytestmark = pytest.mark.timeout(150)

PARTITIONS = 4
SQL = "SELECT id, amount * 2 AS amount2 FROM input WHERE id % 7 <> 0"
SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "amount": {"type": "number"}},
          "required": ["id", "amount"]}
POISON = b'{"id": 13, "amount": '  # malformed JSON


def order(i: int) -> bytes:
    return orjson.dumps({"id": i, "amount": float(i % 100)})


def kept(ids: range | list[int]) -> Counter:
    """The ids the SQL step lets through, once each."""
    return Counter(i for i in ids if i % 7 != 0)


@dataclass(frozen=True)
class Topics:
    source: str
    sink: str
    dlq: str


@pytest.fixture
def topics(kafka_bootstrap: str, unique_topic: str) -> Topics:
    names = Topics(f"{unique_topic}-in", f"{unique_topic}-out", f"{unique_topic}-dlq")
    create_topic(kafka_bootstrap, names.source, PARTITIONS)
    create_topic(kafka_bootstrap, names.sink, PARTITIONS)
    create_topic(kafka_bootstrap, names.dlq, 1)
    return names


def batch_config(directory: Path, topics: Topics, *, on_error: str = "dead-letter", item_records: int = 500,
                 sql: str = SQL, transform: list[dict] | None = None, sink: dict | None = None) -> Path:
    schema_path = directory / "order.schema.json"
    schema_path.write_bytes(orjson.dumps(SCHEMA))
    return write_config(directory, {
        "name": "orders-batch",
        "source": {"topic": topics.source, "format": "json", "schema": str(schema_path), "on_error": on_error},
        "transform": transform or [{"sql": sql}],
        "sink": {"topic": topics.sink, "format": "json", **(sink or {})},
        "dead_letter": {"topic": topics.dlq},
        "checkpoint": {"dir": str(directory / "state")},
        "batch": {"item_records": item_records},
    })


def epochline(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``epochline ARGS`` in this process: exit code, stdout, stderr."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def batch_run(capsys: pytest.CaptureFixture[str], config: Path, bootstrap: str, batch_id: str,
              *extra: str) -> tuple[int, str, str]:
    return epochline(capsys, "batch", "run", str(config), "--batch-id", batch_id, "--bootstrap-servers", bootstrap,
                     *extra)


@contextmanager
def ledger(config: Path, tenant: str = "default") -> Iterator[BatchStore]:
    store = open_batch_store(store_url_for(load_config(config, batch=True)), tenant)
    try:
        yield store
    finally:
        store.close()


def frozen_plan(config: Path, batch_id: str, tenant: str = "default") -> BatchPlan:
    path = load_config(config, batch=True).state_dir / "batches" / tenant / f"{batch_id}.plan.json"
    return BatchPlan.from_json(path.read_bytes(), path)


# -- the plan --------------------------------------------------------------------------------------------


def test_partitions_are_split_into_ranges_in_key_order() -> None:
    items = split_into_items(starts={0: 0, 1: 150, 12: 0}, ends={0: 250, 1: 150, 12: 100}, item_records=100)
    assert items == (BatchItem(0, 0, 100), BatchItem(0, 100, 200), BatchItem(0, 200, 250), BatchItem(12, 0, 100))
    assert [item.key for item in items] == sorted(item.key for item in items)
    assert items[3].key == "p0012:00000000000000000000"


# -- exactly once across crashes -------------------------------------------------------------------------

RECORDS = 100_000
CRASH_ITEM_RECORDS = 1_000
ABORTED_IDS = range(1_000_000, 1_003_000)


def start_batch_job(config: Path, bootstrap: str, batch_id: str, faults: str, log_name: str) -> Connector:
    """``epochline batch run`` as its own process, so SIGKILL is a real crash."""
    return start_connector(config, bootstrap, command=("batch", "run"), extra_args=("--batch-id", batch_id),
                           faults=faults, log_name=log_name)


def wait_for_first_item(job: Connector, timeout: float = 60) -> None:
    """Until the job settled its first item, or exited (an injected crash, or nothing left to do)."""
    deadline = time.monotonic() + timeout
    while job.process.poll() is None and '"item settled"' not in job.log_path.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"no item settled in {timeout}s:\n{job.log_tail()}"
        time.sleep(0.05)


def write_crash_input(bootstrap: str, topic: str) -> None:
    """80% plain records, the rest in transactions, one of them aborted: markers and aborted records land
    inside the items' ranges."""
    plain = int(RECORDS * 0.8)
    produce_values(bootstrap, topic, [order(i) for i in range(plain)], PARTITIONS)
    half = plain + (RECORDS - plain) // 2
    produce_transactions(bootstrap, topic, [
        ([order(i) for i in range(plain, half)], True),
        ([order(i) for i in ABORTED_IDS], False),
        ([order(i) for i in range(half, RECORDS)], True),
    ], PARTITIONS)


def test_batch_job_killed_at_random_points_resumes_to_exactly_once_output(
        kafka_bootstrap: str, topics: Topics, tmp_path: Path) -> None:
    write_crash_input(kafka_bootstrap, topics.source)
    config = batch_config(tmp_path, topics, item_records=CRASH_ITEM_RECORDS)
    rng = random.Random(6)
    # Runs 1 and 3 crash at their first commit: after it (the store never hears: reconcile) and just
    # before it (records flushed, transaction left open: fenced, aborted and re-run). The others are
    # SIGKILLed at a random moment after their first item.
    faults = ["", "batch-between-commit-and-record:1", "", "between-flush-and-commit:1", "", "", ""]
    killed_while_running = 0
    for attempt, fault in enumerate(faults):
        job = start_batch_job(config, kafka_bootstrap, "nightly", fault, f"run{attempt}")
        wait_for_first_item(job)
        time.sleep(rng.uniform(0.0, 0.4))
        killed_while_running += job.process.poll() is None
        job.kill()
        assert not fault or job.crashed_by_fault(), f"run {attempt} did not crash at {fault}:\n{job.log_tail()}"
    final = start_batch_job(config, kafka_bootstrap, "nightly", "", "final")
    assert final.wait(120) == 0, final.log_tail()

    assert killed_while_running >= 3, "the SIGKILLs did not land while the job was running"
    logs = "".join(path.read_text(errors="replace") for path in tmp_path.glob("*.log"))
    assert '"item reconciled: its transaction committed"' in logs
    assert '"item did not commit: running it again"' in logs
    committed = assert_exactly_once(kafka_bootstrap, topics.sink, topics.dlq, kept(range(RECORDS))).output
    uncommitted = read_values(kafka_bootstrap, topics.sink, isolation="read_uncommitted")
    assert len(uncommitted) > sum(committed.values()), "no item transaction was ever cut short"
    plan = frozen_plan(config, "nightly")
    with ledger(config) as store:
        census = store.census("nightly")
        assert census.counts[Outcome.SUCCEEDED.value] == census.total == len(plan.items)
        assert store.is_exhausted("nightly")
        assert store.cursor("nightly") == plan.items[-1].key
        assert census.spend.records == RECORDS


def test_items_whose_ranges_end_on_transaction_markers_are_read_to_their_end(
        kafka_bootstrap: str, unique_topic: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topics = Topics(f"{unique_topic}-in", f"{unique_topic}-out", f"{unique_topic}-dlq")
    for topic in (topics.source, topics.sink, topics.dlq):
        create_topic(kafka_bootstrap, topic, 1)
    produce_values(kafka_bootstrap, topics.source, [order(i) for i in range(1, 6)], 1)  # offsets 0-4
    producer_rows = [([order(i) for i in range(6, 10)], True),  # 5-8, commit marker at 9
                     ([order(i) for i in range(100, 103)], False)]  # 10-12 aborted, abort marker at 13
    for values, commit in producer_rows:
        produce_transactions(kafka_bootstrap, topics.source, [(values, commit)], partitions=1)
    produce_values(kafka_bootstrap, topics.source, [order(i) for i in range(10, 15)], 1)  # offsets 14-18
    assert end_offsets(kafka_bootstrap, topics.source) == {0: 19}
    config = batch_config(tmp_path, topics, item_records=5, sql="SELECT id FROM input")

    code, _, err = batch_run(capsys, config, kafka_bootstrap, "markers")

    assert code == 0, err
    assert [(i.start, i.end) for i in frozen_plan(config, "markers").items] == [(0, 5), (5, 10), (10, 15), (15, 19)]
    assert_exactly_once(kafka_bootstrap, topics.sink, topics.dlq, range(1, 15))


# -- poison records --------------------------------------------------------------------------------------

SMALL = 4_000
POISON_IDS = (777, 2_222)  # partitions 1 and 2, offsets 194 and 555: items p0001:…0 and p0002:…500


def write_small_input(bootstrap: str, topic: str, poison: tuple[int, ...] = ()) -> None:
    produce_values(bootstrap, topic, [POISON if i in poison else order(i) for i in range(SMALL)], PARTITIONS)


def test_poison_records_fail_their_items_which_need_attention_while_the_rest_completes(
        kafka_bootstrap: str, topics: Topics, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_small_input(kafka_bootstrap, topics.source, POISON_IDS)
    config = batch_config(tmp_path, topics, on_error="fail-item")

    code, out, err = batch_run(capsys, config, kafka_bootstrap, "poisoned")
    assert code == 1, err
    assert "FAILED items: 2" in out

    code, out, _ = epochline(capsys, "batch", "attention", "poisoned", "--config", str(config), "--json")
    assert code == 0
    attention = orjson.loads(out)
    assert [item["key"] for item in attention] == ["p0001:00000000000000000000", "p0002:00000000000000000500"]
    assert all(item["outcome"] == "failed" for item in attention)
    assert "partition 1 offset 194" in attention[0]["reason"] and "not JSON" in attention[0]["reason"]
    assert "partition 2 offset 555" in attention[1]["reason"]
    lost = [i for i in range(SMALL) if (i % PARTITIONS, i // PARTITIONS // 500) in {(1, 0), (2, 1)}]
    assert_exactly_once(kafka_bootstrap, topics.sink, topics.dlq, kept(sorted(set(range(SMALL)) - set(lost))))
    with ledger(config) as store:
        census = store.census("poisoned")
        assert census.counts[Outcome.FAILED.value] == 2
        assert census.counts[Outcome.SUCCEEDED.value] == census.total - 2 == 6
        assert store.is_exhausted("poisoned")


def test_poison_record_with_on_error_halt_stops_the_job_without_committing_its_item(
        kafka_bootstrap: str, topics: Topics, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_small_input(kafka_bootstrap, topics.source, POISON_IDS[:1])
    config = batch_config(tmp_path, topics, on_error="halt")

    code, _, err = batch_run(capsys, config, kafka_bootstrap, "halting")

    assert code == 2
    assert "partition 1 offset 194" in err and "halting" in err
    with ledger(config) as store:
        census = store.census("halting")
        assert census.counts["reserved"] == 1 and not store.is_exhausted("halting")
    only_partition_0 = kept([i for i in range(SMALL) if i % PARTITIONS == 0])  # partition 0 came first
    assert_exactly_once(kafka_bootstrap, topics.sink, topics.dlq, only_partition_0)


def test_a_row_the_sink_schema_cannot_hold_is_dead_lettered_and_its_item_completes(
        kafka_bootstrap: str, topics: Topics, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An id beyond an Avro int: the transformed row goes to the dead-letter topic as JSON, the others out."""
    sink_schema = tmp_path / "out.avsc"
    sink_schema.write_bytes(orjson.dumps({"type": "record", "name": "Out", "fields": [
        {"name": "id", "type": "int"}, {"name": "amount2", "type": "double"}]}))
    config = batch_config(tmp_path, topics, sink={"format": "avro", "schema": str(sink_schema)})
    produce_values(kafka_bootstrap, topics.source, [order(i) for i in (1, 2, 2**40, 3)], PARTITIONS)

    code, _, err = batch_run(capsys, config, kafka_bootstrap, "unfit")

    assert code == 0, err
    [letter] = read_values(kafka_bootstrap, topics.dlq)
    assert orjson.loads(letter or b"") == {"id": 2**40, "amount2": float(2**40 % 100) * 2}
    assert len(read_values(kafka_bootstrap, topics.sink)) == 3


# -- resume rules ----------------------------------------------------------------------------------------


def test_resume_with_an_edited_config_is_refused(
        kafka_bootstrap: str, topics: Topics, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_small_input(kafka_bootstrap, topics.source)
    config = batch_config(tmp_path, topics)
    assert batch_run(capsys, config, kafka_bootstrap, "edited")[0] == 0

    batch_config(tmp_path, topics, sql="SELECT id FROM input")
    code, _, err = batch_run(capsys, config, kafka_bootstrap, "edited")

    assert code == 2
    assert "the plan changed, so this batch cannot be resumed" in err


def test_resume_after_completion_does_nothing_and_exits_zero(
        kafka_bootstrap: str, topics: Topics, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_small_input(kafka_bootstrap, topics.source)
    config = batch_config(tmp_path, topics)
    assert batch_run(capsys, config, kafka_bootstrap, "twice")[0] == 0

    code, out, err = batch_run(capsys, config, kafka_bootstrap, "twice")

    assert code == 0, err
    assert "0 items run, 0 reconciled" in out
    assert_exactly_once(kafka_bootstrap, topics.sink, topics.dlq, kept(range(SMALL)))


def test_resume_without_the_frozen_plan_file_is_refused(
        kafka_bootstrap: str, topics: Topics, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_small_input(kafka_bootstrap, topics.source)
    config = batch_config(tmp_path, topics)
    assert batch_run(capsys, config, kafka_bootstrap, "planless")[0] == 0
    (tmp_path / "state" / "batches" / "default" / "planless.plan.json").unlink()

    code, _, err = batch_run(capsys, config, kafka_bootstrap, "planless")

    assert code == 2
    assert "plan file" in err and "missing" in err


def test_records_appended_after_open_are_not_processed(
        kafka_bootstrap: str, topics: Topics, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_small_input(kafka_bootstrap, topics.source)
    config = batch_config(tmp_path, topics)
    first = start_batch_job(config, kafka_bootstrap, "frozen", "batch-between-commit-and-record:1", "first")
    assert first.wait(60) == -9 and first.crashed_by_fault(), first.log_tail()
    produce_values(kafka_bootstrap, topics.source, [order(i) for i in range(SMALL, SMALL + 1000)], PARTITIONS)

    code, out, err = batch_run(capsys, config, kafka_bootstrap, "frozen")

    assert code == 0, err
    assert "1 reconciled" in out
    assert_exactly_once(kafka_bootstrap, topics.sink, topics.dlq, kept(range(SMALL)))


# -- config rules ----------------------------------------------------------------------------------------


def test_streaming_run_rejects_on_error_fail_item_naming_the_key(
        topics: Topics, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = batch_config(tmp_path, topics, on_error="fail-item")

    code, _, err = epochline(capsys, "run", str(config), "--bootstrap-servers", "127.0.0.1:1")

    assert code == 2
    assert "source.on_error: 'fail-item' is only valid for batch jobs" in err


def test_batch_run_rejects_window_steps(topics: Topics, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    window = {"window": {"size": "10s", "key": ["id"], "aggregates": {"n": "count(*)"}}}
    config = batch_config(tmp_path, topics, transform=[{"sql": SQL}, window])

    code, _, err = batch_run(capsys, config, "127.0.0.1:1", "windowed")

    assert code == 2
    assert "transform.1.window: window steps are not supported in batch jobs" in err


# -- census, attention, list -----------------------------------------------------------------------------


def test_census_and_list_print_tables_and_json(
        kafka_bootstrap: str, topics: Topics, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_small_input(kafka_bootstrap, topics.source)
    config = batch_config(tmp_path, topics)
    assert batch_run(capsys, config, kafka_bootstrap, "reported")[0] == 0
    store = ["--store", store_url_for(load_config(config, batch=True))]

    census = orjson.loads(epochline(capsys, "batch", "census", "reported", *store, "--json")[1])
    listed = orjson.loads(epochline(capsys, "batch", "list", *store, "--json")[1])
    census_table = epochline(capsys, "batch", "census", "reported", *store)[1]
    list_table = epochline(capsys, "batch", "list", *store)[1]

    assert census["counts"]["succeeded"] == census["total"] == 8 and census["exhausted"] is True
    assert census["spend"]["records"] == SMALL and census["cursor"] == "p0003:00000000000000000500"
    assert [(batch["batch_id"], batch["exhausted"]) for batch in listed] == [("reported", True)]
    assert "batch reported" in census_table and "succeeded" in census_table
    assert "reported" in list_table


def test_census_of_an_unknown_batch_says_it_does_not_exist(
        topics: Topics, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = batch_config(tmp_path, topics)

    code, out, err = epochline(capsys, "batch", "census", "nigthly", "--config", str(config))

    assert code == 2 and not out
    assert "batch 'nigthly' does not exist" in err


# -- PostgreSQL ------------------------------------------------------------------------------------------


def test_batch_job_runs_on_a_postgresql_store(kafka_bootstrap: str, topics: Topics, tmp_path: Path,
                                              postgres_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    write_small_input(kafka_bootstrap, topics.source)
    config = batch_config(tmp_path, topics)
    tenant = f"t-{uuid.uuid4().hex[:12]}"

    code, _, err = batch_run(capsys, config, kafka_bootstrap, "on-postgres", "--store", postgres_dsn,
                             "--tenant", tenant)

    assert code == 0, err
    assert_exactly_once(kafka_bootstrap, topics.sink, topics.dlq, kept(range(SMALL)))
    store = open_batch_store(postgres_dsn, tenant)
    try:
        assert store.census("on-postgres").counts[Outcome.SUCCEEDED.value] == 8
        assert store.is_exhausted("on-postgres")
    finally:
        store.close()
