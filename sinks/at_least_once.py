"""The at-least-once sink: an idempotent producer, offsets committed once the epoch's records are delivered."""

from __future__ import annotations

from collections.abc import Sequence

from confluent_kafka import KafkaException

from schemas import Format
from sinks.errors import EpochAborted, SinkError
from sinks.writer import KafkaWriter, OffsetCommit, SinkSettings


class AtLeastOnceKafkaSink(KafkaWriter):
    """At-least-once: idempotent producer, offsets committed after every record of the epoch is delivered.

    The trade-off: no transaction, so readers see records as soon as they are written (lower latency, no
    transaction markers), but a crash after delivery and before the offset commit replays that epoch's
    input, duplicating its output.
    """

    def __init__(self, settings: SinkSettings, bootstrap: str, value_format: Format | None):
        super().__init__(settings, bootstrap, value_format, {"enable.idempotence": True})

    def start(self) -> None:
        self.check_topics()

    def begin_epoch(self) -> None:
        return None

    def commit_epoch(self, commits: Sequence[OffsetCommit]) -> None:
        """Once every record of the epoch is delivered, each source's member commits its offsets."""
        self.flush(self.settings.transaction_timeout_ms / 1000)
        for commit in commits:
            if not commit.offsets:
                continue
            if commit.commit_through is None:
                raise SinkError("at-least-once: offsets without the group member that can commit them")
            try:
                commit.commit_through(commit.offsets)
            except KafkaException as exc:
                raise EpochAborted(f"committing offsets ({commit.offsets[0].metadata}) failed: "
                                   f"{exc.args[0].str()}") from exc

    def abort_epoch(self) -> None:
        """Records already written stay written: at-least-once readers may see them twice after a rewind."""
        self._failed.clear()

    def close(self) -> None:
        self.producer.flush(10)
