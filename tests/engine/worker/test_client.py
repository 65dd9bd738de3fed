"""``WorkerClient``: one method per call of the worker's REST API, the token as a bearer header, and every
failure an error naming the call — the server's message for a refusal, the URL when nothing answers."""

from __future__ import annotations

import io
import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console

from engine.cli.connectors import print_connector_status, worker_url
from engine.worker.client import TokenFileError, WorkerApiError, WorkerClient, WorkerUnreachable, token_from

URL = "http://worker.test:8083"
CONFIG = {"name": "orders", "source": {"topic": "orders", "format": "json"}, "sink": {"topic": "out"},
          "dead_letter": {"topic": "dlq"}}
INFO = {"name": "orders", "config": CONFIG, "tasks": [{"connector": "orders", "task": "w1"}], "type": "source"}
STATUS = {"name": "orders", "connector": {"state": "RUNNING", "worker_id": "w1", "target": "RUNNING"},
          "tasks": [{"id": "w1", "worker_id": "w1", "state": "RUNNING", "pid": 1234,
                     "partitions": [{"topic": "orders", "partition": 0}, {"topic": "orders", "partition": 1}],
                     "restarts": 0, "checkpoint": 12, "last_commit_age_s": 0.7, "lag": 0, "dead_letters": 3,
                     "error": None, "trace": None}],
          "lag": 0, "checkpoint": 12, "last_commit_age_s": 0.7, "dead_letters": 3, "type": "source"}
OFFSETS = {"offsets": [{"partition": {"kafka_topic": "orders", "kafka_partition": 0}, "offset": {"kafka_offset": 12}}]}


class Recorder:
    """A mock transport's handler: records each request and answers with the next canned response."""

    def __init__(self, status: int = 200, body: Any = None, content: bytes | None = None) -> None:
        self.requests: list[httpx.Request] = []
        self.status, self.body, self.content = status, body, content

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.content is not None:
            return httpx.Response(self.status, content=self.content)
        if self.body is None:
            return httpx.Response(self.status)
        return httpx.Response(self.status, json=self.body)

    @property
    def last(self) -> httpx.Request:
        return self.requests[-1]

    def last_json(self) -> Any:
        return json.loads(self.last.content)


def client_answering(recorder: Recorder, token: str | None = None) -> WorkerClient:
    return WorkerClient(URL, token=token, transport=httpx.MockTransport(recorder))


def call_of(request: httpx.Request) -> tuple[str, str]:
    """``(method, path?query)`` as the API contract writes them."""
    query = request.url.query.decode()
    return request.method, request.url.raw_path.decode().split("?")[0] + (f"?{query}" if query else "")


# -- requests ---------------------------------------------------------------------------------------------------

def test_a_token_is_sent_as_a_bearer_authorization_header() -> None:
    recorder = Recorder(body={"version": "0.1.0"})

    client_answering(recorder, token="s3cret").info()

    assert recorder.last.headers["Authorization"] == "Bearer s3cret"


def test_without_a_token_no_authorization_header_is_sent() -> None:
    recorder = Recorder(body={"version": "0.1.0"})

    client_answering(recorder).info()

    assert "Authorization" not in recorder.last.headers


def test_info_reads_the_root() -> None:
    recorder = Recorder(body={"version": "0.1.0", "kafka_cluster_id": "k", "cluster": "c", "worker_id": "w1"})

    assert client_answering(recorder).info()["worker_id"] == "w1"
    assert call_of(recorder.last) == ("GET", "/")


def test_list_returns_the_connector_names() -> None:
    recorder = Recorder(body=["a", "b"])

    assert client_answering(recorder).list() == ["a", "b"]
    assert call_of(recorder.last) == ("GET", "/connectors")


def test_configs_reads_every_connector_config_in_one_call_expanding_info() -> None:
    recorder = Recorder(body={"orders": {"info": INFO}})

    assert client_answering(recorder).configs() == {"orders": CONFIG}
    assert call_of(recorder.last) == ("GET", "/connectors?expand=info")


def test_statuses_reads_every_connector_status_in_one_call_expanding_status() -> None:
    recorder = Recorder(body={"orders": {"status": STATUS}})

    assert client_answering(recorder).statuses() == {"orders": STATUS}
    assert call_of(recorder.last) == ("GET", "/connectors?expand=status")


@pytest.mark.parametrize(("status", "created"), [(201, True), (200, False)])
def test_put_config_says_whether_the_connector_was_created_or_updated(status: int, created: bool) -> None:
    recorder = Recorder(status, INFO)

    assert client_answering(recorder).put_config("orders", CONFIG) == (created, INFO)
    assert call_of(recorder.last) == ("PUT", "/connectors/orders/config")
    assert recorder.last_json() == CONFIG


def test_put_config_with_reset_state_asks_the_worker_to_drop_keyed_state() -> None:
    recorder = Recorder(200, INFO)

    client_answering(recorder).put_config("orders", CONFIG, reset_state=True)

    assert call_of(recorder.last) == ("PUT", "/connectors/orders/config?reset_state=true")


def test_create_posts_the_name_and_the_config() -> None:
    recorder = Recorder(201, INFO)

    assert client_answering(recorder).create("orders", CONFIG) == INFO
    assert call_of(recorder.last) == ("POST", "/connectors")
    assert recorder.last_json() == {"name": "orders", "config": CONFIG}


def test_get_config_and_status_and_offsets_read_one_connector() -> None:
    recorder = Recorder(body=CONFIG)
    client = client_answering(recorder)

    assert client.get_config("orders") == CONFIG
    assert call_of(recorder.last) == ("GET", "/connectors/orders/config")
    recorder.body = STATUS
    assert client.status("orders") == STATUS
    assert call_of(recorder.last) == ("GET", "/connectors/orders/status")
    recorder.body = OFFSETS
    assert client.offsets("orders") == OFFSETS
    assert call_of(recorder.last) == ("GET", "/connectors/orders/offsets")


@pytest.mark.parametrize("action", ["pause", "resume", "stop"])
def test_pause_resume_and_stop_put_to_their_route_and_accept_an_empty_202(action: str) -> None:
    recorder = Recorder(202)
    method: Callable[[str], None] = getattr(client_answering(recorder), action)

    method("orders")

    assert call_of(recorder.last) == ("PUT", f"/connectors/orders/{action}")


def test_delete_accepts_an_empty_204() -> None:
    recorder = Recorder(204)

    client_answering(recorder).delete("orders")

    assert call_of(recorder.last) == ("DELETE", "/connectors/orders")


def test_restart_passes_its_flags_as_the_contract_spells_them_and_returns_the_status() -> None:
    recorder = Recorder(202, STATUS)

    assert client_answering(recorder).restart("orders", include_tasks=True) == STATUS
    assert call_of(recorder.last) == ("POST", "/connectors/orders/restart?includeTasks=true&onlyFailed=false")


def test_altering_and_resetting_offsets_return_the_worker_confirmation() -> None:
    recorder = Recorder(200, {"message": "offsets altered"})
    client = client_answering(recorder)

    assert client.alter_offsets("orders", OFFSETS) == "offsets altered"
    assert call_of(recorder.last) == ("PATCH", "/connectors/orders/offsets")
    assert recorder.last_json() == OFFSETS
    recorder.body = {"message": "offsets reset"}
    assert client.reset_offsets("orders") == "offsets reset"
    assert call_of(recorder.last) == ("DELETE", "/connectors/orders/offsets")


def test_validate_puts_the_config_to_the_validation_route() -> None:
    validation = {"name": "connector", "error_count": 0, "configs": []}
    recorder = Recorder(200, validation)

    assert client_answering(recorder).validate(CONFIG) == validation
    assert call_of(recorder.last) == ("PUT", "/connector-plugins/connector/config/validate")
    assert recorder.last_json() == CONFIG


def test_a_name_is_one_path_segment_whatever_it_contains() -> None:
    recorder = Recorder(body=STATUS)

    client_answering(recorder).status("a/../b")

    assert recorder.last.url.raw_path.decode() == "/connectors/a%2F..%2Fb/status"


# -- errors -----------------------------------------------------------------------------------------------------

def test_an_error_answer_carries_the_status_code_and_the_server_message() -> None:
    recorder = Recorder(404, {"error_code": 404, "message": "connector nope not found"})

    with pytest.raises(WorkerApiError) as raised:
        client_answering(recorder).status("nope")

    assert raised.value.status_code == 404
    assert raised.value.message == "connector nope not found"
    assert str(raised.value) == "GET /connectors/nope/status: 404 connector nope not found"
    assert not isinstance(raised.value, WorkerUnreachable)


def test_a_refused_config_change_names_the_call_without_its_query() -> None:
    recorder = Recorder(409, {"error_code": 409, "message": "keyed state of step1-window changes"})

    with pytest.raises(WorkerApiError, match=r"^PUT /connectors/a/config: 409 keyed state of step1-window changes$"):
        client_answering(recorder).put_config("a", CONFIG, reset_state=True)


def test_an_error_answer_that_is_not_the_api_json_is_quoted() -> None:
    recorder = Recorder(502, content=b"<html>bad gateway</html>")

    with pytest.raises(WorkerApiError, match="502 <html>bad gateway</html>"):
        client_answering(recorder).list()


def test_an_empty_error_answer_reads_as_its_reason_phrase() -> None:
    with pytest.raises(WorkerApiError, match="GET /: 401 Unauthorized"):
        client_answering(Recorder(401)).info()


def test_a_success_of_the_wrong_shape_suggests_the_url_is_not_a_worker() -> None:
    with pytest.raises(WorkerApiError, match=f"{URL} did not answer with a list of connector names"):
        client_answering(Recorder(200, {"not": "a list"})).list()
    with pytest.raises(WorkerApiError, match="did not answer with a JSON body"):
        client_answering(Recorder(200, content=b"<html></html>")).info()


def closed_port() -> int:
    """A local port nothing listens on: bound once to get a free number, then released."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_a_worker_that_cannot_be_reached_is_unreachable_naming_the_url() -> None:
    url = f"http://127.0.0.1:{closed_port()}"

    with pytest.raises(WorkerUnreachable) as raised, WorkerClient(url, timeout_s=5) as client:
        client.list()

    assert raised.value.status_code is None
    assert str(raised.value).startswith(f"GET /connectors: cannot reach the worker at {url} (")


# -- the token and the URL --------------------------------------------------------------------------------------

def test_the_token_file_content_is_the_token_stripped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPOCHLINE_API_TOKEN", "from-env")
    token_file = tmp_path / "token"
    token_file.write_text("  s3cret\n")

    assert token_from(token_file) == "s3cret"


def test_without_a_file_the_token_is_epochline_api_token_else_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPOCHLINE_API_TOKEN", "from-env")
    assert token_from(None) == "from-env"
    monkeypatch.delenv("EPOCHLINE_API_TOKEN")
    assert token_from(None) is None


def test_a_token_file_that_is_missing_or_empty_is_an_error_naming_it(tmp_path: Path) -> None:
    """Falling back to the environment would send the wrong token and fail later, less clearly."""
    with pytest.raises(TokenFileError, match="cannot read API token file .*missing"):
        token_from(tmp_path / "missing")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(TokenFileError, match="empty"):
        token_from(tmp_path / "empty")


def test_the_worker_url_is_the_option_else_epochline_url_else_the_local_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EPOCHLINE_URL", raising=False)
    assert worker_url(None) == "http://127.0.0.1:8083"
    monkeypatch.setenv("EPOCHLINE_URL", "http://env:8083")
    assert worker_url(None) == "http://env:8083"
    assert worker_url("http://given:8083") == "http://given:8083"


# -- the status view --------------------------------------------------------------------------------------------

def rendered(status: dict[str, Any]) -> str:
    output = io.StringIO()
    print_connector_status(status, Console(file=output, width=200, color_system=None))
    return output.getvalue()


def test_the_status_view_shows_the_connector_state_and_a_row_per_task() -> None:
    text = rendered(STATUS)

    assert "orders  RUNNING (target RUNNING)  worker w1" in text
    assert "orders[0,1]" in text
    assert "1234" in text


def test_the_status_view_shows_why_a_task_failed_and_its_trace() -> None:
    failed = {**STATUS["tasks"][0], "state": "FAILED", "pid": None,  # type: ignore[index]
              "error": {"type": "ConnectorFailed", "message": "sink [topic] missing", "exit_code": 2,
                        "at": "2025-01-01T00:00:00Z"},
              "trace": "Traceback (most recent call last):\n  boom [bold]"}

    text = rendered({**STATUS, "tasks": [failed]})

    assert "ConnectorFailed: sink [topic] missing (exit 2)" in text
    assert "task w1 trace:" in text
    assert "boom [bold]" in text
