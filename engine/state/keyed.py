"""``KeyedState``: operator state partitioned like the operator's input, one piece per source partition.

Why (DESIGN.md, "Group mode", rule 1): connector instances share a topic's partitions through a consumer
group, and a rebalance moves a partition to another instance. The state built from that partition's records
must move with it, or the new owner would aggregate on top of nothing. So the state is kept per source
partition: each partition's piece is snapshotted on its own into a compacted changelog topic (one record per
partition, written inside the epoch's Kafka transaction), restored from it by the partition's next owner
before any of its records is processed, and forgotten by the instance it moved away from.

The epoch uses it like this: after the drain, ``changed_partitions()`` names the pieces to write;
``snapshot_partition`` gives each one's bytes for the changelog; ``clear_changed()`` once the transaction
committed. On assignment: ``restore_partition(p, changelog record or None)``; on revoke or loss (after the
epoch committed or aborted): ``drop_partition(p)``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class KeyedState(Protocol):
    """State kept, snapshotted, restored and dropped per source partition."""

    def changed_partitions(self) -> set[int]:
        """Partitions whose snapshot changed since the last ``clear_changed()``: rows absorbed, windows
        emitted, progress (such as how far windows were emitted) moved."""
        ...

    def clear_changed(self) -> None:
        """Forget which partitions changed (their changes were written)."""
        ...

    def snapshot_partition(self, partition: int) -> bytes:
        """That partition's state as bytes; a partition without state gives a valid, small snapshot. Equal
        state gives equal bytes."""
        ...

    def restore_partition(self, partition: int, data: bytes | None) -> None:
        """Replace that partition's state with a snapshot of it (``None``: fresh, nothing seen or emitted).
        Does not mark the partition changed: its state now equals what was written."""
        ...

    def drop_partition(self, partition: int) -> None:
        """Forget that partition's state (it moved to another instance). Does not mark it changed."""
        ...

    def partitions(self) -> set[int]:
        """The partitions holding state."""
        ...

    def open_until(self) -> dict[int, int]:
        """Per partition holding unfinished results (open windows), the event time that finishes them all:
        how far a quiet partition's windows may be closed by the others' progress (``idle_timeout``)."""
        ...

    def closed_through(self) -> dict[int, int]:
        """Per partition, the event time up to which results are final (windows emitted): a row behind it
        can no longer count, so the engine judges it late instead of handing it over."""
        ...
