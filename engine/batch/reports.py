"""What ``epochline batch census|attention|list`` report: as dicts (``--json``) or as rich tables."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.table import Table

from engine.batch.errors import BatchNotFound
from engine.batch.store import BatchStore, ItemRecord


def census_report(store: BatchStore, batch_id: str) -> dict[str, Any]:
    digest = store.plan_digest(batch_id)
    if digest is None:
        raise BatchNotFound(f"batch {batch_id!r} does not exist in this store and tenant (never opened; "
                            "mistyped id, or another --store/--tenant?)")
    census = store.census(batch_id)
    return {"batch_id": batch_id, "plan_digest": digest, "exhausted": store.is_exhausted(batch_id),
            "cursor": store.cursor(batch_id), "total": census.total, "counts": census.counts,
            "spend": {"records": census.spend.records, "bytes": census.spend.bytes,
                      "seconds": round(census.spend.seconds, 3)}}


def _item_report(record: ItemRecord) -> dict[str, Any]:
    return {"key": record.key, "run_id": record.run_id, "outcome": record.outcome and record.outcome.value,
            "reason": record.reason, "records": record.spend.records, "bytes": record.spend.bytes,
            "seconds": round(record.spend.seconds, 3)}


def attention_report(store: BatchStore, batch_id: str, limit: int) -> list[dict[str, Any]]:
    if store.plan_digest(batch_id) is None:
        raise BatchNotFound(f"batch {batch_id!r} does not exist in this store and tenant")
    return [_item_report(record) for record in store.items_needing_attention(batch_id, limit)]


def list_report(store: BatchStore) -> list[dict[str, Any]]:
    return [{"batch_id": info.batch_id, "plan_digest": info.plan_digest, "exhausted": info.exhausted,
             "opened_at": info.opened_at} for info in store.batches()]


def print_census(report: dict[str, Any], console: Console) -> None:
    table = Table(title=f"batch {report['batch_id']}")
    table.add_column("outcome")
    table.add_column("items", justify="right")
    for outcome, count in report["counts"].items():
        table.add_row(outcome, str(count))
    table.add_row("total", str(report["total"]), style="bold")
    console.print(table)
    spend = report["spend"]
    console.print(f"exhausted: {report['exhausted']}  cursor: {report['cursor']}  records: {spend['records']:,}  "
                  f"bytes: {spend['bytes']:,}  seconds: {spend['seconds']:.1f}")


def print_attention(batch_id: str, items: list[dict[str, Any]], console: Console) -> None:
    table = Table(title=f"batch {batch_id}: items needing attention ({len(items)} shown)")
    for column in ("key", "outcome", "reason", "run_id"):
        table.add_column(column, overflow="fold")
    for item in items:
        table.add_row(item["key"], item["outcome"], item["reason"] or "", item["run_id"])
    console.print(table)


def print_list(batches: list[dict[str, Any]], console: Console) -> None:
    table = Table(title="batches")
    for column in ("batch_id", "exhausted", "opened_at", "plan_digest"):
        table.add_column(column, overflow="fold")
    for batch in batches:
        opened = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(batch["opened_at"]))
        table.add_row(batch["batch_id"], str(batch["exhausted"]), opened, batch["plan_digest"][:19])
    console.print(table)
