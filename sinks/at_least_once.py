"""The at-least-once sink: an idempotent producer, offsets committed once the epoch's records are delivered."""

from __future__ import annotations

from collections.abc import Sequence

from confluent_kafka import Consumer, KafkaException

from connectors.admin import CLIENT_LOGGER
from schemas import Format
from sinks.errors import EpochAborted
from sinks.writer import KafkaWriter, OffsetCommit, SinkSettings


class AtLeastOnceKafkaSink(KafkaWriter):
    """At-least-once: idempotent producer, offsets committed after every record of the epoch is delivered.

    The trade-off: no transaction, so readers see records as soon as they are written (lower latency, no
    transaction markers), but a crash after delivery and before the offset commit replays that epoch's
    input, duplicating its output.
    """

    def __init__(self, settings: SinkSettings, bootstrap: str, value_format: Format):
        super().__init__(settings, bootstrap, value_format, {"enable.idempotence": True})
        self._committer = Consumer({
            **settings.client_config,
            "bootstrap.servers": bootstrap, "group.id": settings.group_id, "enable.auto.commit": False,
            "logger": CLIENT_LOGGER,
        })

    def start(self) -> None:
        return None

    def begin_epoch(self) -> None:
        return None

    def commit_epoch(self, commits: Sequence[OffsetCommit]) -> None:
        self.flush(self.settings.transaction_timeout_ms / 1000)
        offsets = [tp for commit in commits for tp in commit.offsets]
        if offsets:
            try:
                self._committer.commit(offsets=offsets, asynchronous=False)
            except KafkaException as exc:
                raise EpochAborted(f"committing offsets ({offsets[0].metadata}) failed: {exc.args[0].str()}") from exc

    def abort_epoch(self) -> None:
        """Records already written stay written: at-least-once readers may see them twice after a rewind."""
        self._failed.clear()

    def close(self) -> None:
        self.producer.flush(10)
        self._committer.close()
