"""``epochline connectors ...`` against a worker's REST API: what it prints when piped, and as JSON."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
import pytest

from engine.cli import main

LONG_NAME = "payments-settlement-reconciliation-to-the-ledger-of-every-region-" * 2
STATUS = {"name": LONG_NAME, "connector": {"state": "RUNNING", "worker_id": "worker-in-the-eu-west-datacenter-1",
                                           "target": "RUNNING"},
          "tasks": [{"id": "worker-in-the-eu-west-datacenter-1", "worker_id": "worker-in-the-eu-west-datacenter-1",
                     "state": "RUNNING", "pid": 1234, "partitions": [{"topic": f"{LONG_NAME}-in", "partition": 0}],
                     "restarts": 0, "checkpoint": 12, "last_commit_age_s": 0.7, "lag": 0, "dead_letters": 3,
                     "error": None, "trace": None}],
          "lag": 0, "checkpoint": 12, "last_commit_age_s": 0.7, "dead_letters": 3, "type": "source"}


class _StatusAnswers(BaseHTTPRequestHandler):
    """A fake worker: the STATUS above for ``GET /connectors/<LONG_NAME>/status``, 404 for anything else."""

    def do_GET(self) -> None:
        found = self.path == f"/connectors/{LONG_NAME}/status"
        body = orjson.dumps(STATUS if found else {"error_code": 404, "message": "no such connector"})
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        """Silent: the test reads what the command printed, not the server's access log."""


@pytest.fixture
def worker_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StatusAnswers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_piped_the_status_table_prints_every_cell_in_full(worker_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["connectors", "status", LONG_NAME, "--url", worker_url]) == 0

    out = capsys.readouterr().out
    assert "…" not in out
    assert f"{LONG_NAME}-in[0]" in out
    assert out.count("worker-in-the-eu-west-datacenter-1") == 3  # the header's worker, the task's id and worker


def test_with_json_the_status_is_one_json_document_of_the_workers_status(
        worker_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["connectors", "status", LONG_NAME, "--url", worker_url, "--json"]) == 0

    assert orjson.loads(capsys.readouterr().out) == STATUS
