"""``epochline connectors apply DIR``: a folder of connector configs becomes a plan (create, update, delete,
unchanged) against what the worker runs, with schema files inlined and secrets compared as the worker shows them."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

import engine.cli
from engine.config import ConfigError
from engine.worker.apply import ApplyPlan, desired_configs, diff_text, plan, redact

ORDER_SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
AVRO_SCHEMA = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}


def connector_config(name: str, **overrides: Any) -> dict[str, Any]:
    """The smallest valid connector config: dead-lettering by default needs the dead-letter topic."""
    return {"name": name, "source": {"topic": f"{name}-in", "format": "json"}, "sink": {"topic": f"{name}-out"},
            "dead_letter": {"topic": f"{name}-dlq"}, **overrides}


def write_yaml(directory: Path, file_name: str, config: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / file_name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# -- the folder -------------------------------------------------------------------------------------------------

def test_every_yaml_and_yml_file_directly_in_the_folder_is_one_connector_by_its_name(tmp_path: Path) -> None:
    write_yaml(tmp_path, "a.yaml", connector_config("orders"))
    write_yaml(tmp_path, "b.yml", connector_config("payments"))
    write_yaml(tmp_path / "nested", "c.yaml", connector_config("nested"))
    (tmp_path / "notes.txt").write_text("not a config")

    desired = desired_configs(tmp_path)

    assert desired == {"orders": connector_config("orders"), "payments": connector_config("payments")}


def test_the_raw_mapping_is_kept_as_written_without_defaults_filled_in(tmp_path: Path) -> None:
    """The worker is sent what the file says, so a default changing in a later version is not a diff."""
    config = connector_config("orders", transform={"sql": "SELECT * FROM input"})
    write_yaml(tmp_path, "orders.yaml", config)

    assert desired_configs(tmp_path)["orders"] == config


def test_schema_paths_are_replaced_by_the_schemas_they_name_relative_to_the_config_file(tmp_path: Path) -> None:
    """The worker has no shared disk: a path would name nothing there, so the content travels instead."""
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "order.schema.json").write_text(json.dumps(ORDER_SCHEMA))
    (tmp_path / "schemas" / "order.avsc").write_text(json.dumps(AVRO_SCHEMA))
    write_yaml(tmp_path, "orders.yaml", connector_config(
        "orders", source={"topic": "orders", "format": "json", "schema": "schemas/order.schema.json"},
        sink={"topic": "out", "format": "avro", "schema": "schemas/order.avsc"}))

    desired = desired_configs(tmp_path)["orders"]

    assert desired["source"] == {"topic": "orders", "format": "json", "schema": ORDER_SCHEMA}
    assert desired["sink"] == {"topic": "out", "format": "avro", "schema": AVRO_SCHEMA}


def test_a_postgres_sink_travels_as_written_with_the_source_schema_inlined(tmp_path: Path) -> None:
    (tmp_path / "order.schema.json").write_text(json.dumps(ORDER_SCHEMA))
    sink = {"type": "postgres", "dsn": "postgresql://db/shop?password=${env:PG_PASSWORD}", "table": "orders",
            "create_table": True}
    write_yaml(tmp_path, "orders.yaml", connector_config(
        "orders", source={"topic": "orders", "format": "json", "schema": "order.schema.json"}, sink=sink))

    desired = desired_configs(tmp_path)["orders"]

    assert desired["sink"] == sink
    assert desired["source"]["schema"] == ORDER_SCHEMA


def test_a_missing_schema_file_is_a_config_error_naming_the_config_and_the_schema(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "orders.yaml", connector_config(
        "orders", source={"topic": "orders", "format": "json", "schema": "missing.json"}))

    with pytest.raises(ConfigError, match="cannot read schema file") as raised:
        desired_configs(tmp_path)

    assert str(path) in str(raised.value)
    assert "missing.json" in str(raised.value)


def test_a_schema_that_is_not_json_cannot_be_inlined(tmp_path: Path) -> None:
    (tmp_path / "order.proto").write_text('syntax = "proto3"; message Order { int64 id = 1; }')
    write_yaml(tmp_path, "orders.yaml", connector_config(
        "orders", source={"topic": "orders", "format": "protobuf-confluent", "schema": "order.proto",
                          "registry_url": "http://registry:8081"}))

    with pytest.raises(ConfigError, match=r"order\.proto is not JSON"):
        desired_configs(tmp_path)


def test_an_invalid_config_is_refused_as_epochline_validate_refuses_it_naming_the_file(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "orders.yaml", connector_config("orders", chekpoint={"interval": "1s"}))

    with pytest.raises(ConfigError, match="chekpoint: unknown key") as raised:
        desired_configs(tmp_path)

    assert str(path) in str(raised.value)


def test_two_files_declaring_the_same_connector_are_refused_naming_both(tmp_path: Path) -> None:
    """Which of the two would win is an accident of file names, so neither does."""
    first = write_yaml(tmp_path, "a.yaml", connector_config("orders"))
    second = write_yaml(tmp_path, "b.yaml", connector_config("orders", sink={"topic": "elsewhere"}))

    with pytest.raises(ConfigError, match="'orders' is already declared") as raised:
        desired_configs(tmp_path)

    assert str(first) in str(raised.value)
    assert str(second) in str(raised.value)


def test_a_path_that_is_not_a_directory_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a directory"):
        desired_configs(tmp_path / "missing")


# -- the plan ---------------------------------------------------------------------------------------------------

def test_connectors_only_in_the_folder_are_created_and_differing_ones_updated() -> None:
    desired = {"new": connector_config("new"), "changed": connector_config("changed", late_rows="drop"),
               "same": connector_config("same")}
    current = {"changed": connector_config("changed"), "same": connector_config("same")}

    assert plan(desired, current, prune=False) == ApplyPlan(create=["new"], update=["changed"], delete=[],
                                                            unchanged=["same"])


def test_connectors_only_on_the_worker_are_left_alone_unless_pruning() -> None:
    desired = {"kept": connector_config("kept")}
    current = {"kept": connector_config("kept"), "legacy": connector_config("legacy")}

    assert plan(desired, current, prune=False).delete == []
    assert plan(desired, current, prune=True) == ApplyPlan(create=[], update=[], delete=["legacy"],
                                                           unchanged=["kept"])
    assert plan(desired, current, prune=False).changes_nothing


def test_configs_that_differ_only_in_key_order_are_unchanged() -> None:
    desired = {"orders": {"sink": {"topic": "out", "format": "json"}, "name": "orders"}}
    current = {"orders": {"name": "orders", "sink": {"format": "json", "topic": "out"}}}

    assert plan(desired, current, prune=False).unchanged == ["orders"]


def test_a_secret_the_worker_shows_redacted_counts_as_unchanged() -> None:
    """The API never shows a literal secret, so a config differing only there cannot be told apart; applying
    the folder again must not restart the connector every time."""
    client = {"security.protocol": "SASL_SSL", "sasl.password": "hunter2"}
    desired = {"orders": connector_config("orders", kafka={"client": client})}
    current = {"orders": connector_config("orders", kafka={"client": {**client, "sasl.password": "[redacted]"}})}

    assert plan(desired, current, prune=False).unchanged == ["orders"]


def test_a_secret_reference_is_shown_by_the_worker_and_compared_as_written() -> None:
    desired = {"orders": connector_config("orders", kafka={"client": {"sasl.password": "${env:NEW_PASSWORD}"}})}
    current = {"orders": connector_config("orders", kafka={"client": {"sasl.password": "${env:OLD_PASSWORD}"}})}

    assert plan(desired, current, prune=False).update == ["orders"]


def test_a_setting_beside_a_redacted_secret_still_counts_as_a_change() -> None:
    desired = {"orders": connector_config("orders", sink={"topic": "out", "producer": {
        "ssl.key.password": "hunter2", "linger.ms": "10"}})}
    current = {"orders": connector_config("orders", sink={"topic": "out", "producer": {
        "ssl.key.password": "[redacted]", "linger.ms": "5"}})}

    assert plan(desired, current, prune=False).update == ["orders"]


def test_redaction_reaches_secret_looking_keys_at_any_depth_and_keeps_references() -> None:
    config = {"name": "a", "source": {"consumer": {"sasl.password": "p", "group.id": "g"}},
              "transform": [{"python": "m:f", "api_token": "t"}],
              "kafka": {"client": {"ssl.key.password": "${file:secrets.properties:key}"}},
              "port_secret": 1234,
              "registry": {"basic.auth.user.info": "u:p", "ssl.keystore.key": "-----BEGIN", "url": "https://r"},
              "producer": {"sasl.jaas.config": "... password=\"p\";"}}

    assert redact(config) == {"name": "a", "source": {"consumer": {"sasl.password": "[redacted]", "group.id": "g"}},
                              "transform": [{"python": "m:f", "api_token": "[redacted]"}],
                              "kafka": {"client": {"ssl.key.password": "${file:secrets.properties:key}"}},
                              "port_secret": "[redacted]",
                              "registry": {"basic.auth.user.info": "[redacted]", "ssl.keystore.key": "[redacted]",
                                           "url": "https://r"},
                              "producer": {"sasl.jaas.config": "[redacted]"}}


# -- the diff ---------------------------------------------------------------------------------------------------

def test_the_diff_shows_changed_lines_of_both_configs_as_yaml() -> None:
    text = diff_text("orders", connector_config("orders"), connector_config("orders", late_rows="drop"))

    assert text.startswith("--- orders (worker)\n+++ orders (desired)\n")
    assert "+late_rows: drop\n" in text


def test_the_diff_of_a_new_connector_adds_every_line() -> None:
    text = diff_text("orders", None, connector_config("orders"))

    assert "+name: orders\n" in text
    assert not [line for line in text.splitlines()[2:] if line.startswith("-")]


def test_the_diff_never_prints_a_secret_from_the_folder() -> None:
    desired = connector_config("orders", kafka={"client": {"sasl.password": "hunter2"}}, late_rows="drop")

    text = diff_text("orders", connector_config("orders"), desired)

    assert "hunter2" not in text
    assert "sasl.password: '[redacted]'" in text


def test_equal_configs_have_an_empty_diff() -> None:
    assert diff_text("orders", connector_config("orders"), connector_config("orders")) == ""


# -- through the command line, against a stand-in worker ---------------------------------------------------------

@dataclass
class StandInWorker:
    """Answers canned ``(status, body)`` per ``"METHOD /path?query"``; 404 otherwise. Records every request."""

    url: str
    answers: dict[str, tuple[int, Any]]
    requests: list[tuple[str, str, Any]] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)


@pytest.fixture
def worker() -> Iterator[StandInWorker]:
    answers: dict[str, tuple[int, Any]] = {}
    requests: list[tuple[str, str, Any]] = []
    authorizations: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            requests.append((self.command, self.path, body))
            authorizations.append(self.headers.get("Authorization"))
            status, reply = answers.get(f"{self.command} {self.path}",
                                        (404, {"error_code": 404, "message": f"no route {self.path}"}))
            data = b"" if reply is None else json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = answer

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the test output is the CLI's."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield StandInWorker(f"http://127.0.0.1:{server.server_address[1]}", answers, requests, authorizations)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def worker_info(config: dict[str, Any]) -> dict[str, Any]:
    return {"info": {"name": config["name"], "config": config, "tasks": [], "type": "source"}}


def folder_and_worker(tmp_path: Path, worker: StandInWorker) -> Path:
    """A folder with one new, one changed and one unchanged connector; the worker also runs ``legacy``."""
    folder = tmp_path / "connectors"
    (tmp_path / "connectors").mkdir()
    (folder / "steady.schema.json").write_text(json.dumps(ORDER_SCHEMA))
    steady = connector_config("steady", source={"topic": "in", "format": "json", "schema": "steady.schema.json"},
                              kafka={"client": {"sasl.password": "hunter2"}})
    write_yaml(folder, "steady.yaml", steady)
    write_yaml(folder, "orders.yaml", connector_config("orders", late_rows="drop"))
    write_yaml(folder, "fresh.yaml", connector_config("fresh"))
    on_worker = {**steady, "source": {**steady["source"], "schema": ORDER_SCHEMA},
                 "kafka": {"client": {"sasl.password": "[redacted]"}}}
    worker.answers["GET /connectors?expand=info"] = (200, {
        "steady": worker_info(on_worker), "orders": worker_info(connector_config("orders")),
        "legacy": worker_info(connector_config("legacy"))})
    return folder


def test_apply_dry_run_prints_the_plan_with_diffs_and_changes_nothing(
        tmp_path: Path, worker: StandInWorker, capsys: pytest.CaptureFixture[str]) -> None:
    folder = folder_and_worker(tmp_path, worker)

    code = engine.cli.main(["connectors", "apply", str(folder), "--prune", "--dry-run", "--url", worker.url])

    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.splitlines()
    assert [line for line in lines if not line.startswith(("---", "+", "-", " ", "@@"))] == [
        "create fresh", "update orders (restarts)", "delete legacy", "unchanged steady", "dry run: nothing changed"]
    assert "+++ fresh (desired)" in lines
    assert "+late_rows: drop" in lines
    assert [(method, path) for method, path, _ in worker.requests] == [("GET", "/connectors?expand=info")]


def test_apply_without_pruning_leaves_connectors_only_on_the_worker_out_of_the_plan(
        tmp_path: Path, worker: StandInWorker, capsys: pytest.CaptureFixture[str]) -> None:
    folder = folder_and_worker(tmp_path, worker)

    code = engine.cli.main(["connectors", "apply", str(folder), "--dry-run", "--url", worker.url])

    out, _ = capsys.readouterr()
    assert code == 0
    assert "legacy" not in out


def test_apply_puts_created_and_updated_configs_deletes_pruned_ones_and_says_what_it_did(
        tmp_path: Path, worker: StandInWorker, capsys: pytest.CaptureFixture[str]) -> None:
    folder = folder_and_worker(tmp_path, worker)
    worker.answers["PUT /connectors/fresh/config"] = (201, worker_info(connector_config("fresh"))["info"])
    worker.answers["PUT /connectors/orders/config"] = (200, worker_info(connector_config("orders"))["info"])
    worker.answers["DELETE /connectors/legacy"] = (204, None)

    code = engine.cli.main(["connectors", "apply", str(folder), "--prune", "--url", worker.url])

    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.splitlines() == ["created fresh", "updated orders (restarting)", "deleted legacy", "unchanged steady"]
    assert worker.requests[1:] == [("PUT", "/connectors/fresh/config", connector_config("fresh")),
                                   ("PUT", "/connectors/orders/config", connector_config("orders", late_rows="drop")),
                                   ("DELETE", "/connectors/legacy", None)]


def test_a_change_the_worker_refuses_exits_2_with_its_message(
        tmp_path: Path, worker: StandInWorker, capsys: pytest.CaptureFixture[str]) -> None:
    folder = folder_and_worker(tmp_path, worker)
    worker.answers["PUT /connectors/fresh/config"] = (409, {"error_code": 409, "message": "keyed state differs"})

    code = engine.cli.main(["connectors", "apply", str(folder), "--url", worker.url])

    _, err = capsys.readouterr()
    assert code == 2
    assert err.strip() == "epochline: PUT /connectors/fresh/config: 409 keyed state differs"


def test_an_invalid_file_stops_apply_before_the_worker_is_asked_anything(
        tmp_path: Path, worker: StandInWorker, capsys: pytest.CaptureFixture[str]) -> None:
    folder = folder_and_worker(tmp_path, worker)
    write_yaml(folder, "broken.yaml", {"name": "broken"})

    code = engine.cli.main(["connectors", "apply", str(folder), "--url", worker.url])

    _, err = capsys.readouterr()
    assert code == 2
    assert "broken.yaml" in err
    assert worker.requests == []


def test_the_worker_url_comes_from_epochline_url_when_not_given(
        tmp_path: Path, worker: StandInWorker, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    folder = folder_and_worker(tmp_path, worker)
    monkeypatch.setenv("EPOCHLINE_URL", worker.url)

    code = engine.cli.main(["connectors", "apply", str(folder), "--dry-run"])

    assert code == 0, capsys.readouterr().err
    assert worker.requests


def test_the_api_token_file_is_sent_as_a_bearer_token(
        tmp_path: Path, worker: StandInWorker, capsys: pytest.CaptureFixture[str]) -> None:
    folder = folder_and_worker(tmp_path, worker)
    (tmp_path / "token").write_text("s3cret\n")

    code = engine.cli.main(["connectors", "apply", str(folder), "--dry-run", "--url", worker.url,
                            "--api-token-file", str(tmp_path / "token")])

    assert code == 0, capsys.readouterr().err
    assert worker.authorizations == ["Bearer s3cret"]


def test_a_worker_that_cannot_be_reached_exits_2_naming_its_url(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"

    code = engine.cli.main(["connectors", "list", "--url", url])

    _, err = capsys.readouterr()
    assert code == 2
    assert f"cannot reach the worker at {url}" in err
