"""A JSON-lines file sink, exactly once by rename: ``sink: {type: "examples.jsonl_sink:PLUGIN", directory: out}``.

An epoch's rows go to ``<directory>/staging/<instance>.jsonl``, which no reader looks at. Prepare fsyncs it and
renames it to ``prepared/<instance>-<checkpoint>.jsonl`` (durable, unpublished); commit renames that into
``published/``. A rename is atomic, so a crash leaves each epoch either prepared or published, never half.
"""

import json
import os
from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa

from sinks.api import Guarantee, RefusedRow, SinkAssignment, SinkSettingsError


class JsonLinesSink:
    guarantee = Guarantee.EXACTLY_ONCE

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def open(self, assignment: SinkAssignment) -> None:
        self.instance = f"{assignment.connector}-{assignment.instance}"
        for folder in ("staging", "prepared", "published"):
            (self.directory / folder).mkdir(parents=True, exist_ok=True)
        self.staging = self.directory / "staging" / f"{self.instance}.jsonl"
        self.staging.unlink(missing_ok=True)  # an epoch a crash cut short: never prepared, so never committed

    def recover(self, last_committed_checkpoint_id: int | None) -> None:
        """Publish what Kafka committed, discard the rest: the previous incarnation is fenced."""
        for path in (self.directory / "prepared").glob(f"{self.instance}-*.jsonl"):
            instance, _, checkpoint = path.stem.rpartition("-")
            if instance != self.instance:
                continue  # another instance whose name starts like this one's
            if last_committed_checkpoint_id is not None and int(checkpoint) <= last_committed_checkpoint_id:
                self.commit(int(checkpoint))
            else:
                path.unlink()

    def write(self, batch: pa.Table) -> list[RefusedRow]:
        with self.staging.open("a") as staging:
            staging.writelines(json.dumps(row, default=str) + "\n" for row in batch.to_pylist())
        return []

    def prepare(self, checkpoint_id: int) -> None:
        with self.staging.open("a") as staging:  # created even for an epoch without rows
            os.fsync(staging.fileno())
        self.staging.rename(self._epoch_file("prepared", checkpoint_id))

    def commit(self, checkpoint_id: int) -> None:
        self._epoch_file("prepared", checkpoint_id).rename(self._epoch_file("published", checkpoint_id))

    def abort(self, checkpoint_id: int | None) -> None:
        self.staging.unlink(missing_ok=True)
        if checkpoint_id is not None:
            self._epoch_file("prepared", checkpoint_id).unlink(missing_ok=True)

    def close(self) -> None:
        """Nothing held open; a prepared epoch stays for the next start's ``recover``."""

    def _epoch_file(self, folder: str, checkpoint_id: int) -> Path:
        return self.directory / folder / f"{self.instance}-{checkpoint_id}.jsonl"


class JsonLinesPlugin:
    def check_settings(self, settings: Mapping[str, object]) -> None:
        if not isinstance(settings.get("directory"), str):
            raise SinkSettingsError("directory: the directory to write to is required")
        if unknown := sorted(set(settings) - {"directory"}):
            raise SinkSettingsError(f"{unknown[0]}: unknown key")

    def create(self, settings: Mapping[str, object]) -> JsonLinesSink:
        return JsonLinesSink(Path(str(settings["directory"])))


PLUGIN = JsonLinesPlugin()
