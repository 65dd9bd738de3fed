"""What the worker cluster keeps in its topics (``engine.worker.records``)."""

from __future__ import annotations

from engine.worker.records import TaskStatus


def test_a_task_status_written_by_another_version_decodes_by_the_fields_both_know() -> None:
    written = b'{"connector": "a", "worker_id": "w1", "state": "RUNNING", "dead_letters": 3, "updated_at": 1.0}'
    assert TaskStatus.decode(written) == TaskStatus("a", "w1", "RUNNING", updated_at=1.0)
