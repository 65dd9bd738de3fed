"""A sink that claims exactly once but publishes in ``write`` (autocommit): at-least-once whatever it says, the
mistake the sink conformance kit must catch. It is the example JSON-lines sink with that one change."""

from __future__ import annotations

import time
from collections.abc import Mapping

import pyarrow as pa

from examples.jsonl_sink import JsonLinesPlugin, JsonLinesSink
from sinks.api import RefusedRow


class PublishingInWriteSink(JsonLinesSink):
    def write(self, batch: pa.Table) -> list[RefusedRow]:
        refused = super().write(batch)
        self.staging.rename(self.directory / "published" / f"{self.instance}-w{time.time_ns()}.jsonl")
        return refused


class PublishingInWritePlugin(JsonLinesPlugin):
    def create(self, settings: Mapping[str, object]) -> JsonLinesSink:
        return PublishingInWriteSink(super().create(settings).directory)


PLUGIN = PublishingInWritePlugin()
