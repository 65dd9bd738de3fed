"""The BatchStore contract, run unchanged on SQLite and on PostgreSQL.

Every test gets its own tenant, so the PostgreSQL half can share one cluster (or an external database
from EPOCHLINE_TEST_POSTGRES_DSN) across tests and runs. "Reopen" means: close the store object and open
a new one on the same file or DSN, as a resumed job or a separate census process does.
"""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine.batch.postgres_store import PostgresBatchStore
from engine.batch.sql_store import SqliteBatchStore
from engine.batch.store import (
    RESERVED,
    BatchPlanChanged,
    BatchStore,
    BatchStoreError,
    NotFound,
    Outcome,
    Spend,
    open_batch_store,
)
from engine.ports import free_port

pytestmark = pytest.mark.timeout(180)

BATCH = "nightly-copy"
DIGEST = "sha256:plan-1"
NOTHING_SPENT = Spend()

OpenStore = Callable[..., BatchStore]


@pytest.fixture(params=["sqlite", "postgres"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenStore]:
    """Opens a new store object on this test's location; ``tenant`` defaults to one unique to the test."""
    location = str(tmp_path / "batches.db") if request.param == "sqlite" else request.getfixturevalue("postgres_dsn")
    test_tenant = f"tenant-{uuid.uuid4().hex}"
    opened: list[BatchStore] = []

    def open_new(tenant: str = test_tenant) -> BatchStore:
        store = open_batch_store(location, tenant)
        opened.append(store)
        return store

    yield open_new
    for store in opened:
        store.close()


@pytest.fixture
def store(open_store: OpenStore) -> BatchStore:
    return open_store()


@pytest.fixture
def batch(store: BatchStore) -> str:
    store.open(BATCH, DIGEST)
    return BATCH


def reserve_and_record(store: BatchStore, key: str, outcome: Outcome, spend: Spend = NOTHING_SPENT) -> None:
    store.reserve(BATCH, key, run_id=f"run-{key}")
    store.record(BATCH, key, outcome, spend)


# --- open and plan digest -------------------------------------------------------------------------------

def test_open_is_idempotent_on_the_batch_id(store: BatchStore) -> None:
    store.open(BATCH, DIGEST)
    store.open(BATCH, DIGEST)

    assert store.plan_digest(BATCH) == DIGEST
    assert [info.batch_id for info in store.batches()] == [BATCH]


def test_open_with_a_different_plan_digest_is_refused(store: BatchStore, batch: str) -> None:
    with pytest.raises(BatchPlanChanged, match="sha256:plan-1"):
        store.open(batch, "sha256:plan-2")

    assert store.plan_digest(batch) == DIGEST


def test_plan_digest_of_a_batch_never_opened_is_none(store: BatchStore) -> None:
    assert store.plan_digest("never-opened") is None


def test_batches_lists_each_opened_batch_with_its_digest_and_exhausted_flag(store: BatchStore) -> None:
    store.open("first", "digest-a")
    store.open("second", "digest-b")
    store.mark_exhausted("second")

    listed = {(info.batch_id, info.plan_digest, info.exhausted) for info in store.batches()}

    assert listed == {("first", "digest-a", False), ("second", "digest-b", True)}


# --- exhausted ------------------------------------------------------------------------------------------

def test_exhausted_flag_survives_a_reopen(open_store: OpenStore) -> None:
    first = open_store()
    first.open(BATCH, DIGEST)
    assert first.is_exhausted(BATCH) is False
    first.mark_exhausted(BATCH)
    first.close()

    assert open_store().is_exhausted(BATCH) is True


def test_mark_exhausted_of_an_unknown_batch_raises_not_found(store: BatchStore) -> None:
    with pytest.raises(NotFound, match="never-opened"):
        store.mark_exhausted("never-opened")


def test_is_exhausted_of_an_unknown_batch_raises_not_found(store: BatchStore) -> None:
    with pytest.raises(NotFound, match="never-opened"):
        store.is_exhausted("never-opened")


# --- reserve and record ---------------------------------------------------------------------------------

def test_reserve_returns_the_first_run_id_when_reserved_again(store: BatchStore, batch: str) -> None:
    first = store.reserve(batch, "p0:000", "run-1")
    again = store.reserve(batch, "p0:000", "run-2")

    assert (first.run_id, first.outcome, first.finished_at) == ("run-1", None, None)
    assert again == first


def test_reserve_after_a_reopen_returns_the_first_run_id(open_store: OpenStore) -> None:
    crashed = open_store()
    crashed.open(BATCH, DIGEST)
    crashed.reserve(BATCH, "p0:000", "run-1")
    crashed.close()

    assert open_store().reserve(BATCH, "p0:000", "run-2").run_id == "run-1"


def test_reserve_of_a_recorded_item_returns_its_record_unchanged(store: BatchStore, batch: str) -> None:
    store.reserve(batch, "p0:000", "run-1")
    recorded = store.record(batch, "p0:000", Outcome.SUCCEEDED, Spend(records=3, bytes=30, seconds=0.5))

    assert store.reserve(batch, "p0:000", "run-2") == recorded


def test_reserve_on_an_unknown_batch_raises_not_found(store: BatchStore) -> None:
    with pytest.raises(NotFound, match="never-opened"):
        store.reserve("never-opened", "p0:000", "run-1")


def test_concurrent_reserves_of_one_key_agree_on_the_first_run_id(open_store: OpenStore) -> None:
    open_store().open(BATCH, DIGEST)
    racers = [open_store() for _ in range(4)]
    start = threading.Barrier(len(racers))
    run_ids: dict[str, set[str]] = {f"p0:{n:03d}": set() for n in range(20)}
    guard = threading.Lock()

    def race(store: BatchStore, racer: int) -> None:
        start.wait(timeout=30)
        for key, seen in run_ids.items():
            run_id = store.reserve(BATCH, key, f"run-{racer}").run_id
            with guard:
                seen.add(run_id)

    threads = [threading.Thread(target=race, args=(store, n)) for n, store in enumerate(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert all(len(seen) == 1 for seen in run_ids.values()), run_ids
    assert racers[0].census(BATCH).counts[RESERVED] == len(run_ids)


def test_record_stores_outcome_reason_and_spend(store: BatchStore, batch: str) -> None:
    store.reserve(batch, "p0:000", "run-1")

    recorded = store.record(batch, "p0:000", Outcome.FAILED, Spend(records=2, bytes=20, seconds=1.5), "poison at 17")

    assert (recorded.outcome, recorded.reason, recorded.spend) == (
        Outcome.FAILED, "poison at 17", Spend(records=2, bytes=20, seconds=1.5))
    assert recorded.finished_at is not None and recorded.finished_at >= recorded.reserved_at
    assert store.items(batch) == [recorded]


def test_record_of_an_unreserved_item_raises_not_found(store: BatchStore, batch: str) -> None:
    with pytest.raises(NotFound, match="never reserved"):
        store.record(batch, "p0:000", Outcome.SUCCEEDED, Spend(records=1))

    assert store.items(batch) == []


def test_record_on_an_unknown_batch_raises_not_found(store: BatchStore) -> None:
    with pytest.raises(NotFound, match="never opened"):
        store.record("never-opened", "p0:000", Outcome.SUCCEEDED, Spend(records=1))


def test_a_later_record_replaces_the_outcome_and_spend_of_an_earlier_attempt(store: BatchStore, batch: str) -> None:
    store.reserve(batch, "p0:000", "run-1")
    store.record(batch, "p0:000", Outcome.FAILED, Spend(records=5, bytes=50, seconds=1.0), "broker down")

    final = store.record(batch, "p0:000", Outcome.SUCCEEDED, Spend(records=8, bytes=80, seconds=2.0))

    assert (final.run_id, final.outcome, final.reason) == ("run-1", Outcome.SUCCEEDED, None)
    assert store.census(batch).spend == Spend(records=8, bytes=80, seconds=2.0)


# --- cursor ---------------------------------------------------------------------------------------------

def test_cursor_of_a_batch_without_settled_items_is_none(store: BatchStore, batch: str) -> None:
    assert store.cursor(batch) is None
    store.reserve(batch, "p0:000", "run-1")
    assert store.cursor(batch) is None


def test_cursor_is_held_by_an_unfinished_item_and_moves_once_it_is_recorded(store: BatchStore, batch: str) -> None:
    reserve_and_record(store, "p0:001", Outcome.SUCCEEDED)
    store.reserve(batch, "p0:002", "run-2")
    reserve_and_record(store, "p0:003", Outcome.SUCCEEDED)
    reserve_and_record(store, "p0:004", Outcome.FAILED)
    assert store.cursor(batch) == "p0:001"

    store.record(batch, "p0:002", Outcome.SUCCEEDED, Spend())

    assert store.cursor(batch) == "p0:004"


def test_cursor_is_held_by_a_reserved_but_unfinished_item(store: BatchStore, batch: str) -> None:
    reserve_and_record(store, "p0:001", Outcome.FAILED)
    store.reserve(batch, "p0:002", "run-2")
    reserve_and_record(store, "p0:003", Outcome.SUCCEEDED)

    assert store.cursor(batch) == "p0:001"


# --- census ---------------------------------------------------------------------------------------------

def test_census_counts_outcomes_and_reserved_items_with_spend_totals(store: BatchStore, batch: str) -> None:
    reserve_and_record(store, "p0:001", Outcome.SUCCEEDED, Spend(records=10, bytes=100, seconds=1.0))
    reserve_and_record(store, "p0:002", Outcome.SUCCEEDED, Spend(records=20, bytes=200, seconds=2.0))
    reserve_and_record(store, "p0:003", Outcome.FAILED, Spend(records=1, bytes=10, seconds=0.25))
    reserve_and_record(store, "p0:004", Outcome.FAILED, Spend(records=3, bytes=30, seconds=0.5))
    store.reserve(batch, "p0:005", "run-5")
    store.reserve(batch, "p0:006", "run-6")

    census = store.census(batch)

    assert census.counts == {"succeeded": 2, "failed": 2, "reserved": 2}
    assert census.total == 6
    assert census.spend == Spend(records=34, bytes=340, seconds=3.75)


def test_census_of_an_unknown_batch_is_all_zero(store: BatchStore) -> None:
    census = store.census("never-opened")

    assert (census.total, census.spend, set(census.counts.values())) == (0, Spend(), {0})


# --- items and attention --------------------------------------------------------------------------------

def test_items_are_listed_lowest_key_first_up_to_the_limit(store: BatchStore, batch: str) -> None:
    for key in ["p0:003", "p0:001", "p0:004", "p0:002"]:
        store.reserve(batch, key, f"run-{key}")

    assert [item.key for item in store.items(batch, limit=3)] == ["p0:001", "p0:002", "p0:003"]


def test_items_refuses_a_limit_below_one(store: BatchStore, batch: str) -> None:
    with pytest.raises(ValueError, match="limit"):
        store.items(batch, limit=0)


def test_attention_lists_failed_items_lowest_key_first(store: BatchStore, batch: str) -> None:
    reserve_and_record(store, "p0:004", Outcome.FAILED)
    reserve_and_record(store, "p0:001", Outcome.SUCCEEDED)
    reserve_and_record(store, "p0:002", Outcome.FAILED)
    reserve_and_record(store, "p0:003", Outcome.SUCCEEDED)
    store.reserve(batch, "p0:005", "run-5")

    attention = store.items_needing_attention(batch)

    assert [(item.key, item.outcome) for item in attention] == [
        ("p0:002", Outcome.FAILED), ("p0:004", Outcome.FAILED)]


def test_attention_drops_items_once_resolved(store: BatchStore, batch: str) -> None:
    reserve_and_record(store, "p0:001", Outcome.FAILED)
    reserve_and_record(store, "p0:002", Outcome.FAILED)

    store.record(batch, "p0:001", Outcome.SUCCEEDED, Spend())
    store.record(batch, "p0:002", Outcome.SUCCEEDED, Spend(), reason="fixed and run again")

    assert store.items_needing_attention(batch) == []


def test_attention_of_an_unknown_batch_is_empty(store: BatchStore) -> None:
    assert store.items_needing_attention("never-opened") == []


# --- tenants and key order ------------------------------------------------------------------------------

def test_tenants_do_not_see_each_others_batches(open_store: OpenStore) -> None:
    alice, bob = open_store(tenant=f"alice-{uuid.uuid4().hex}"), open_store(tenant=f"bob-{uuid.uuid4().hex}")
    alice.open(BATCH, DIGEST)
    alice.reserve(BATCH, "p0:001", "run-alice")

    assert (bob.plan_digest(BATCH), bob.batches(), bob.census(BATCH).total) == (None, [], 0)
    with pytest.raises(NotFound):
        bob.reserve(BATCH, "p0:001", "run-bob")
    bob.open(BATCH, "bobs-own-plan")
    assert bob.reserve(BATCH, "p0:001", "run-bob").run_id == "run-bob"
    assert alice.plan_digest(BATCH) == DIGEST
    assert [item.run_id for item in alice.items(BATCH)] == ["run-alice"]


KEYS_WHOSE_BYTE_ORDER_DIFFERS_FROM_LOCALE_ORDER = [
    "item-9", "B", "a", "item-10", "é", "e", "Z", "ä", "z", "😀", "a-b", "ab", "A", "p0003:00000000000000001000",
]


def test_keys_are_ordered_by_their_utf8_bytes(store: BatchStore, batch: str) -> None:
    for key in KEYS_WHOSE_BYTE_ORDER_DIFFERS_FROM_LOCALE_ORDER:
        store.reserve(batch, key, f"run-{key}")
        store.record(batch, key, Outcome.FAILED, Spend())
    byte_order = sorted(KEYS_WHOSE_BYTE_ORDER_DIFFERS_FROM_LOCALE_ORDER, key=lambda key: key.encode())

    assert [item.key for item in store.items(batch)] == byte_order
    assert [item.key for item in store.items_needing_attention(batch)] == byte_order
    assert store.cursor(batch) == byte_order[-1]


# --- opening by URL -------------------------------------------------------------------------------------

def test_open_batch_store_opens_sqlite_for_a_sqlite_url_and_for_a_path(tmp_path: Path) -> None:
    by_url = open_batch_store(f"sqlite://{tmp_path / 'a.db'}")
    by_path = open_batch_store(str(tmp_path / "b.db"), tenant="other")
    try:
        assert isinstance(by_url, SqliteBatchStore) and by_url.path == tmp_path / "a.db"
        assert isinstance(by_path, SqliteBatchStore) and by_path.tenant == "other"
    finally:
        by_url.close()
        by_path.close()


def test_open_batch_store_opens_postgres_for_a_postgresql_url(postgres_dsn: str) -> None:
    store = open_batch_store(postgres_dsn)
    try:
        assert isinstance(store, PostgresBatchStore)
    finally:
        store.close()


def test_open_batch_store_refuses_an_unknown_scheme() -> None:
    with pytest.raises(BatchStoreError, match="mysql://"):
        open_batch_store("mysql://localhost/batches")


def test_sqlite_store_keeps_its_file_in_wal_mode(tmp_path: Path) -> None:
    SqliteBatchStore(tmp_path / "batches.db").close()

    with sqlite3.connect(tmp_path / "batches.db") as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_postgres_store_names_the_server_but_not_the_password_when_it_cannot_connect() -> None:
    dsn = f"postgresql://nobody:secret@127.0.0.1:{free_port()}/batches"
    with pytest.raises(BatchStoreError, match=r"127\.0\.0\.1") as raised:
        PostgresBatchStore(dsn)
    assert "secret" not in str(raised.value)
