"""No web page on another site can drive a worker: forged Host, foreign Origin and form-like bodies are refused.

Proven three ways: the rules (``RequestGuard``), the API answering through ``TestClient`` (nothing is
written to the cluster), and a real headless chromium page on another origin that tries a cross-site
``fetch`` and a form POST against a real worker server on loopback, while the worker's own status page,
same-origin, still reads the API.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import uvicorn
from fastapi.testclient import TestClient

from engine.testing.browser import render_page, visible_text
from engine.testing.worker import MemoryClusterStore, api_context
from engine.worker.api import create_app
from engine.worker.guard import RequestGuard
from engine.worker.records import ConnectorRecord

CONFIG = {"name": "evil", "config": {"source": {"topic": "in"}, "sink": {"topic": "out"},
                                     "dead_letter": {"topic": "dlq"}}}
guard = RequestGuard.serving("127.0.0.1", ["workers.example"])


@pytest.mark.parametrize("host", ["127.0.0.1:8083", "[::1]:8083", "localhost:8083", "LOCALHOST", "10.1.2.3:8083",
                                  "workers.example:8083"])
def test_the_worker_answers_to_ip_addresses_localhost_and_the_names_it_was_given(host: str) -> None:
    assert guard.refusal("GET", {"host": host}, has_body=False) is None


@pytest.mark.parametrize("host", ["attacker.example:8083", "127.0.0.1.attacker.example", "", "localhost.evil"])
def test_a_host_it_does_not_serve_is_refused_as_dns_rebinding_would_send_it(host: str) -> None:
    refused = guard.refusal("GET", {"host": host}, has_body=False)
    assert refused is not None and refused.status == 403 and "--rest-allowed-hosts" in refused.message


def test_an_origin_other_than_the_workers_own_is_refused_and_its_own_is_not() -> None:
    same = {"host": "127.0.0.1:8083", "origin": "http://127.0.0.1:8083", "content-type": "application/json"}
    assert guard.refusal("POST", same, has_body=True) is None
    for origin in ("http://evil.example", "http://127.0.0.1:9999", "null"):
        refused = guard.refusal("GET", {**same, "origin": origin}, has_body=False)
        assert refused is not None and refused.status == 403 and origin in refused.message


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          ""])
def test_a_change_with_a_body_a_form_could_send_is_refused(content_type: str) -> None:
    refused = guard.refusal("POST", {"host": "127.0.0.1", "content-type": content_type}, has_body=True)
    assert refused is not None and refused.status == 415


def test_json_yaml_and_bodiless_changes_go_on() -> None:
    for content_type in ("application/json", "application/json; charset=utf-8", "application/yaml"):
        assert guard.refusal("PUT", {"host": "127.0.0.1", "content-type": content_type}, has_body=True) is None
    assert guard.refusal("POST", {"host": "127.0.0.1"}, has_body=False) is None  # curl -X POST .../restart


def test_the_api_writes_nothing_for_a_cross_site_request() -> None:
    store = MemoryClusterStore()
    with TestClient(create_app(api_context(store=store))) as client:
        forms = client.post("/connectors", content=b'{"name": "evil"}', headers={"Content-Type": "text/plain"})
        foreign = client.post("/connectors", json=CONFIG, headers={"Origin": "http://evil.example"})
        rebound = client.post("/connectors", json=CONFIG, headers={"Host": "attacker.example:8083"})
        assert [r.status_code for r in (forms, foreign, rebound)] == [415, 403, 403]
        assert foreign.json()["error_code"] == 403
        assert store.connectors() == {}
        assert client.post("/connectors", json=CONFIG).status_code == 201  # the same request, from the CLI


# -- a real browser --------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def worker() -> Iterator[tuple[str, MemoryClusterStore]]:
    """A real worker API server on loopback (uvicorn, in this process) over an in-memory cluster."""
    store = MemoryClusterStore()
    port = free_port()
    context = api_context(store=store)
    context.guard = RequestGuard.serving("127.0.0.1")
    server = uvicorn.Server(uvicorn.Config(create_app(context), host="127.0.0.1", port=port, log_config=None,
                                           access_log=False, lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the worker server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", store
    server.should_exit = True
    thread.join(10)


def attacker_page(worker_url: str) -> str:
    """What a page on another site would do: a simple cross-site fetch and a form POST, no preflight."""
    return f"""<!doctype html><html><body><p id="out">started</p>
<form id="f" method="POST" action="{worker_url}/connectors" enctype="text/plain" target="sink">
<input name='{{"name": "evil-form", "config": {{}}, "x": "' value='"}}'></form><iframe name="sink"></iframe>
<script>
fetch("{worker_url}/connectors", {{method: "POST", mode: "no-cors", headers: {{"Content-Type": "text/plain"}},
  body: JSON.stringify({json.dumps({**CONFIG, "name": "evil-fetch"})})}})
  .then(() => document.getElementById("out").textContent = "fetch sent")
  .catch(e => document.getElementById("out").textContent = "fetch failed " + e);
document.getElementById("f").submit();
</script></body></html>"""


@pytest.fixture
def attacker(worker: tuple[str, MemoryClusterStore]) -> Iterator[str]:
    """Another origin (another port of loopback) serving the attacker's page."""
    page = attacker_page(worker[0]).encode()

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


def test_a_page_on_another_origin_cannot_deploy_a_connector_in_a_real_browser(
        worker: tuple[str, MemoryClusterStore], attacker: str, caplog: pytest.LogCaptureFixture) -> None:
    _, store = worker
    with caplog.at_level(logging.WARNING, logger="engine.worker.api"):
        dom = render_page(attacker, wait_ms=3000)
    assert "fetch sent" in visible_text(dom)  # the browser sent it (no-cors: the answer stays opaque)
    assert store.connectors() == {}  # without the guard the fetch's config is deployed
    refused = [(record.method, record.path, record.status) for record in caplog.records  # type: ignore[attr-defined]
               if record.getMessage() == "request refused"]
    assert refused.count(("POST", "/connectors", 403)) == 2, refused  # the fetch and the form, both refused


def test_the_status_page_still_reads_the_api_from_its_own_origin(worker: tuple[str, MemoryClusterStore]) -> None:
    url, store = worker
    store.put_connector(ConnectorRecord("orders-clean", {"source": {"topic": "orders"}}))
    text = visible_text(render_page(f"{url}/ui", wait_ms=3000))
    assert "orders-clean" in text
