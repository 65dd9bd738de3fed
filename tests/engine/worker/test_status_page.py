"""The worker's status page (``GET /ui``, ``engine/worker/ui/index.html``) rendered in headless chromium.

The page is static HTML whose script polls ``/connectors?expand=status&expand=info`` and builds the table, so it
is proven in a real browser against a canned worker: a stdlib HTTP server that serves the page and fixed JSON
answers shaped like the REST API contract. No skip when chromium is missing: ``render_page`` raises
``BrowserMissing`` and the test fails (CI installs chromium with ``.ci/chromium.sh``).
"""

from __future__ import annotations

import json
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from engine.testing.browser import BrowserMissing, BrowserTimeout, find_browser, render_page, visible_text

PAGE = Path(__file__).resolve().parents[3] / "engine" / "worker" / "ui" / "index.html"
STATUS_PATH = "/connectors?expand=status&expand=info"
ROOT = {"version": "0.1.0", "kafka_cluster_id": "kc-1", "cluster": "eu-prod", "worker_id": "w1"}

Answer = tuple[int, object]  # HTTP status, JSON body


def task(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {"id": "w1", "worker_id": "w1", "state": "RUNNING", "pid": 1234, "partitions": [],
                               "restarts": 0, "checkpoint": 12, "last_commit_age_s": 0.7, "lag": 0,
                               "dead_letters": 0, "error": None, "trace": None}
    return base | fields


def connector(name: str, state: str, tasks: list[dict[str, object]], **totals: object) -> dict[str, object]:
    status = {"name": name, "connector": {"state": state, "worker_id": "w1", "target": "RUNNING"}, "tasks": tasks,
              "lag": 0, "checkpoint": 12, "last_commit_age_s": 0.7, "dead_letters": 0, "type": "source"} | totals
    info = {"name": name, "config": {"name": name}, "tasks": [{"connector": name, "task": "w1"}], "type": "source"}
    return {"status": status, "info": info}


RUNNING = connector("orders-clean", "RUNNING",
                    [task(partitions=[{"topic": "orders", "partition": 1}, {"topic": "orders", "partition": 0}],
                          lag=5, dead_letters=3)],
                    lag=5, dead_letters=3, last_commit_age_s=0.7)
FAILED = connector("payments-enrich", "FAILED",
                   [task(id="w2", worker_id="w2", state="FAILED", partitions=[{"topic": "payments", "partition": 0}],
                         error={"type": "SchemaError", "message": "field amount: expected number, got string",
                                "exit_code": 2, "at": "2026-12-01T10:00:00Z"},
                         trace="Traceback (most recent call last):\n  File \"transform.py\", line 3")],
                   lag=None, last_commit_age_s=None, dead_letters=0)


# --- a canned worker: the page plus fixed JSON answers ------------------------------------------------------


@dataclass
class CannedWorker:
    url: str
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # (path with query, Authorization)


class _Server(ThreadingHTTPServer):
    answers: dict[str, list[Answer]]
    token: str | None
    record: CannedWorker
    lock: threading.Lock


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.record.requests.append((self.path, self.headers.get("Authorization")))
        if self.path == "/ui":
            self._send(200, PAGE.read_bytes(), "text/html; charset=utf-8")
            return
        if self.server.token is not None and self.headers.get("Authorization") != f"Bearer {self.server.token}":
            self._json(401, {"error_code": 401, "message": "missing or wrong bearer token"})
            return
        with self.server.lock:
            queue = self.server.answers.get(self.path)
            answer = (queue.pop(0) if len(queue) > 1 else queue[0]) if queue else None
        if answer is None:
            self._json(404, {"error_code": 404, "message": f"no canned answer for {self.path}"})
        else:
            self._json(*answer)

    def _json(self, status: int, body: object) -> None:
        self._send(status, json.dumps(body).encode(), "application/json")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


StartWorker = Callable[..., CannedWorker]


@pytest.fixture
def canned_worker(request: pytest.FixtureRequest) -> StartWorker:
    """Start a canned worker on 127.0.0.1 (port 0) in a thread: ``answers`` maps a path with its query to the
    answers given in turn (the last one repeats); with ``token`` every path but ``/ui`` wants that bearer."""

    def start(answers: Mapping[str, Sequence[Answer]], token: str | None = None) -> CannedWorker:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.answers = {path: list(queue) for path, queue in answers.items()}
        server.token = token
        server.lock = threading.Lock()
        server.record = CannedWorker(url=f"http://127.0.0.1:{server.server_address[1]}")
        thread = threading.Thread(target=server.serve_forever, name="canned-worker", daemon=True)
        thread.start()

        def stop() -> None:
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)

        request.addfinalizer(stop)
        return server.record

    return start


# --- reading the rendered DOM -------------------------------------------------------------------------------


@dataclass
class Element:
    tag: str
    attrs: dict[str, str | None]
    children: list[Element | str] = field(default_factory=list)

    def iter(self) -> Iterator[Element]:
        yield self
        for child in self.children:
            if isinstance(child, Element):
                yield from child.iter()

    def text(self) -> str:
        parts = [child if isinstance(child, str) else child.text() for child in self.children]
        return " ".join(" ".join(parts).split())

    def has_class(self, name: str) -> bool:
        return name in (self.attrs.get("class") or "").split()


class _TreeBuilder(HTMLParser):
    VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
                      "track", "wbr"})

    def __init__(self) -> None:
        super().__init__()
        self.root = Element("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, dict(attrs))
        self.stack[-1].children.append(element)
        if tag not in self.VOID:
            self.stack.append(element)

    def handle_endtag(self, tag: str) -> None:
        while len(self.stack) > 1 and self.stack.pop().tag != tag:
            pass

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def parse(dom: str) -> Element:
    builder = _TreeBuilder()
    builder.feed(dom)
    builder.close()
    return builder.root


def rows(document: Element) -> dict[str, Element]:
    return {str(tr.attrs["data-connector"]): tr for tr in document.iter()
            if tr.tag == "tr" and "data-connector" in tr.attrs}


def state_cell(row: Element) -> str:
    [cell] = [td for td in row.iter() if td.tag == "td" and td.has_class("state")]
    return cell.text()


def by_id(document: Element, element_id: str) -> Element:
    [element] = [e for e in document.iter() if e.attrs.get("id") == element_id]
    return element


def load(worker: CannedWorker) -> tuple[str, Element]:
    dom = render_page(f"{worker.url}/ui")
    return dom, parse(dom)


# --- the page -----------------------------------------------------------------------------------------------


def test_page_shows_one_row_per_connector_with_state_tasks_lag_commit_age_and_error(
        canned_worker: StartWorker) -> None:
    """Each connector is a row: its name, its state, each task as worker + state + `topic[partitions]`, the
    lag, the last commit's age in seconds (`-` when unknown), dead letters, and a FAILED task's error message
    with its trace; the header names the worker and cluster from `GET /`, and says when it last refreshed."""
    worker = canned_worker({"/": [(200, ROOT)],
                            STATUS_PATH: [(200, {"orders-clean": RUNNING, "payments-enrich": FAILED})]})
    dom, document = load(worker)

    table = rows(document)
    assert sorted(table) == ["orders-clean", "payments-enrich"]
    assert state_cell(table["orders-clean"]) == "RUNNING"
    assert state_cell(table["payments-enrich"]) == "FAILED"
    running = table["orders-clean"].text()
    assert "w1 RUNNING orders[0,1]" in running
    assert "5 0.7 s 3" in running  # lag, last commit age, dead letters
    failed = table["payments-enrich"].text()
    assert "w2 FAILED payments[0]" in failed
    assert "- - 0" in failed  # lag and commit age not known yet
    assert "field amount: expected number, got string" in failed
    assert "Traceback (most recent call last)" in failed

    text = visible_text(dom)
    for expected in ("orders-clean", "RUNNING", "payments-enrich", "FAILED",
                     "field amount: expected number, got string", "w1", "eu-prod", "last refreshed"):
        assert expected in text
    assert "API token" not in text  # no token prompt when the worker wants none
    assert by_id(document, "banner").attrs.keys() >= {"hidden"}
    assert (STATUS_PATH, None) in worker.requests  # the relative URL resolves to the documented endpoint


def test_page_asks_for_the_api_token_when_the_worker_answers_401(canned_worker: StartWorker) -> None:
    """A worker with a token answers 401 to requests without `Authorization: Bearer`: the page does not break,
    it keeps its frame, shows a visible banner and a form asking for the API token, and renders no rows."""
    worker = canned_worker({"/": [(200, ROOT)], STATUS_PATH: [(200, {"orders-clean": RUNNING})]}, token="s3cret")
    dom, document = load(worker)

    assert "hidden" not in by_id(document, "token-form").attrs
    assert "hidden" not in by_id(document, "banner").attrs
    text = visible_text(dom)
    assert "epochline worker" in text
    assert "API token" in text
    assert "Unauthorized" in text
    assert rows(document) == {}
    data_requests = [(path, auth) for path, auth in worker.requests if path != "/ui"]
    assert (STATUS_PATH, None) in data_requests
    assert {auth for _, auth in data_requests} == {None}  # no token stored yet, so none is sent


def test_connector_name_with_markup_is_rendered_as_text(canned_worker: StartWorker) -> None:
    """Connector names are user input: a name like `<b>x</b>` appears literally, and no `<b>` element is made
    from it (cells are set with textContent, never innerHTML)."""
    name = "<b>x</b>"
    worker = canned_worker({"/": [(200, ROOT)], STATUS_PATH: [(200, {name: connector(name, "PAUSED", [])})]})
    dom, document = load(worker)

    assert [row.attrs["data-connector"] for row in rows(document).values()] == [name]
    assert [e for e in document.iter() if e.tag == "b"] == []
    assert "&lt;b&gt;x&lt;/b&gt;" in dom
    assert name in visible_text(dom)
    assert state_cell(rows(document)[name]) == "PAUSED"


def test_failed_refresh_shows_the_error_and_keeps_the_last_table(canned_worker: StartWorker) -> None:
    """The page polls every 2 s; when a later refresh fails, a visible banner carries the worker's error
    message and the rows from the last good answer stay."""
    worker = canned_worker({"/": [(200, ROOT)],
                            STATUS_PATH: [(200, {"orders-clean": RUNNING}),
                                          (500, {"error_code": 500, "message": "worker is rebalancing"})]})
    dom, document = load(worker)

    assert sum(path == STATUS_PATH for path, _ in worker.requests) >= 2
    banner = by_id(document, "banner")
    assert "hidden" not in banner.attrs
    assert "worker is rebalancing" in banner.text()
    assert "500" in banner.text()
    assert list(rows(document)) == ["orders-clean"]
    assert state_cell(rows(document)["orders-clean"]) == "RUNNING"


# --- the tooling the tests stand on -------------------------------------------------------------------------


def test_missing_browser_is_an_error_naming_what_was_looked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without chromium on PATH the page tests fail (they are not skipped): the error names the binaries
    looked for and how to install one."""
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(BrowserMissing, match=r"chromium, chromium-browser, google-chrome.*apt-get install chromium"):
        find_browser()
    with pytest.raises(BrowserMissing):
        render_page("http://127.0.0.1:9/ui")


def test_a_page_that_never_answers_times_out_and_leaves_no_browser_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that accepts the connection but never answers stalls chromium's virtual clock: `render_page`
    gives up after `timeout_s` of real time with `BrowserTimeout`, kills the browser and removes its profile."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with socket.create_server(("127.0.0.1", 0)) as silent:
        started = time.monotonic()
        with pytest.raises(BrowserTimeout, match="within 3 s"):
            render_page(f"http://127.0.0.1:{silent.getsockname()[1]}/ui", timeout_s=3)
        assert time.monotonic() - started < 15
    assert list(tmp_path.iterdir()) == []
    still_running = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(tmp_path).encode() in cmdline.read_bytes():
                still_running.append(cmdline.parent.name)
        except OSError:
            continue  # the process ended while we looked
    assert still_running == []


def test_visible_text_leaves_out_scripts_styles_and_hidden_elements() -> None:
    """`visible_text` is what a reader sees: text with entities decoded and whitespace collapsed, without
    script, style or `hidden` content; block boundaries separate words, inline ones do not."""
    dom = ("<html><head><title>t</title><style>p{}</style></head><body><p>a&lt;b&gt;</p><p>c <b>d</b>e</p>"
           "<div hidden><p>secret</p><br>more</div><input value=x><script>var s = '<p>no</p>';</script>"
           "<td>1</td><td>2</td></body></html>")
    assert visible_text(dom) == "a<b> c de 1 2"
