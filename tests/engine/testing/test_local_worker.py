"""Specifications of ``start_local_worker``: a worker that cannot start is reported with its own words."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.testing import WorkerProcessFailed, start_local_worker


def test_a_worker_that_exits_at_start_is_reported_with_its_exit_code_and_log(tmp_path: Path) -> None:
    with pytest.raises(WorkerProcessFailed, match=r"(?s)worker w1 exited with 2:.*unrecognized arguments: --no-such"):
        start_local_worker(tmp_path, "127.0.0.1:9", cluster="c", name="w1", extra_args=("--no-such-flag",))
