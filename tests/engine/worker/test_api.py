"""The worker's REST API (``engine.worker.api``) against its contract: Kafka Connect's paths and status codes,
``{"error_code", "message"}`` errors naming the field or connector, secrets never shown.

Every test drives the FastAPI app through ``TestClient`` over the in-memory fakes of ``engine.testing.worker``:
the cluster's topics are a ``MemoryClusterStore`` (tests put task statuses into it as workers would), the
consumer groups a ``FakeGroups`` and the broker's offset and changelog operations a ``FakeConnectorKafka``
that records its calls. No Kafka, no subprocesses, no sleeps: configs are validated offline as
``epochline validate`` does.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import yaml
from fastapi.testclient import TestClient

from connectors.admin import StoredRecord
from connectors.dead_letter import DeadLetter
from engine.group_status import ConnectorStatus, PartitionStatus
from engine.secrets import REDACTED
from engine.testing.worker import FakeConnectorKafka, FakeGroups, MemoryClusterStore, api_context
from engine.worker.api import MAX_BODY_BYTES, PREVIEW_CHARS, VERSION, create_app
from engine.worker.history import sample_of
from engine.worker.records import STATUS_TTL_S, ConnectorRecord, TaskError, TaskState, TaskStatus
from engine.worker.view import GroupView

SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}}
CONFIG: dict[str, Any] = {"source": {"topic": "in", "format": "json", "schema": SCHEMA},
                          "transform": {"sql": "SELECT id FROM input"}, "sink": {"topic": "out"},
                          "dead_letter": {"topic": "dlq"}}
WINDOW = {"size": "1m", "key": ["name"], "aggregates": {"n": "count(*)"}}
WINDOWED: dict[str, Any] = {**CONFIG, "transform": [{"window": WINDOW}]}
OFFSETS = {"offsets": [{"partition": {"kafka_topic": "in", "kafka_partition": 0}, "offset": {"kafka_offset": 12}},
                       {"partition": {"kafka_topic": "in", "kafka_partition": 1}, "offset": {"kafka_offset": 7}}]}
SECRET = "hunter2"


def config(**changes: Any) -> dict[str, Any]:
    """A valid config (a fresh copy) with top-level keys replaced."""
    return copy.deepcopy({**CONFIG, **changes})


def windowed(**window: Any) -> dict[str, Any]:
    """The valid config with one window step, its settings changed by ``window``."""
    return copy.deepcopy({**WINDOWED, "transform": [{"window": {**WINDOW, **window}}]})


def task(connector: str = "a", worker_id: str = "w1", state: TaskState = "RUNNING", *, age_s: float = 0.0,
         **fields: Any) -> TaskStatus:
    """A task status as its worker writes it, last rewritten ``age_s`` ago."""
    return TaskStatus(connector, worker_id, state, updated_at=time.time() - age_s, **fields)


def partition(topic: str, number: int, committed: int | None, *, role: str = "source", lag: int | None = 0,
              held_by: str | None = "w1", instance: str = "w1", dead_letters: int | None = None) -> PartitionStatus:
    return PartitionStatus(topic=topic, role=role, partition=number, committed=committed,
                           end=(committed or 0) + (lag or 0), lag=lag, checkpoint=3, instance=instance,
                           event_time=None, committed_at=int(time.time() * 1000), metadata=None, held_by=held_by,
                           dead_letters=dead_letters)


def group(name: str, partitions: list[PartitionStatus]) -> GroupView:
    status = ConnectorStatus(name=name, group_id=f"epochline-{name}", bootstrap="fake:9092", state="Stable",
                             exists=True, source_topic="in", repartition_topic=None, members=[],
                             partitions=partitions, changelogs=[])
    return GroupView(status=status, read_at=time.time(), checkpoint_interval_s=1.0, checkpoint_timeout_s=5.0)


@pytest.fixture
def store() -> MemoryClusterStore:
    return MemoryClusterStore()


@pytest.fixture
def groups() -> FakeGroups:
    return FakeGroups()


@pytest.fixture
def kafka() -> FakeConnectorKafka:
    return FakeConnectorKafka()


@pytest.fixture
def client(store: MemoryClusterStore, groups: FakeGroups, kafka: FakeConnectorKafka) -> Iterator[TestClient]:
    with TestClient(create_app(api_context(store=store, groups=groups, kafka=kafka))) as test_client:
        yield test_client


def create(client: TestClient, name: str = "a", body: dict[str, Any] | None = None) -> dict[str, Any]:
    response = client.post("/connectors", json={"name": name, "config": body if body is not None else config()})
    assert response.status_code == 201, response.text
    answer: dict[str, Any] = response.json()
    return answer


def record(store: MemoryClusterStore, name: str = "a") -> ConnectorRecord:
    return store.connectors()[name]


def stop(client: TestClient, name: str = "a") -> None:
    assert client.put(f"/connectors/{name}/stop").status_code == 202


def assert_error(response: Any, status: int, *words: str) -> str:
    """The response is ``{"error_code": status, "message": ...}`` and the message holds every word."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error_code", "message"}
    assert body["error_code"] == status
    message: str = body["message"]
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    return message


# --- the worker and the list of connectors ------------------------------------------------------------------


def test_the_root_names_the_version_the_kafka_cluster_the_worker_cluster_and_this_worker(client: TestClient) -> None:
    response = client.get("/")
    assert response.status_code == 200
    assert response.json() == {"version": VERSION, "kafka_cluster_id": "test-cluster", "cluster": "test",
                               "worker_id": "w1"}


def test_connectors_lists_the_names_sorted_and_nothing_when_none_is_deployed(client: TestClient) -> None:
    assert client.get("/connectors").json() == []
    create(client, "b")
    create(client, "a")
    assert client.get("/connectors").json() == ["a", "b"]


def test_expand_status_and_info_as_repeated_parameters_give_both_for_each_connector(client: TestClient) -> None:
    create(client, "a")
    create(client, "b")
    answer = client.get("/connectors", params=[("expand", "status"), ("expand", "info")]).json()
    assert sorted(answer) == ["a", "b"]
    for name, expanded in answer.items():
        assert set(expanded) == {"status", "info"}
        assert expanded["info"] == {"name": name, "config": {"name": name, **CONFIG}, "tasks": [], "type": "source"}
        assert expanded["status"]["name"] == name
        assert expanded["status"]["connector"]["target"] == "RUNNING"


@pytest.mark.parametrize("expand", ["status", "info"])
def test_expand_one_kind_gives_only_that_kind(client: TestClient, expand: str) -> None:
    create(client, "a")
    answer = client.get(f"/connectors?expand={expand}").json()
    assert list(answer) == ["a"]
    assert list(answer["a"]) == [expand]


# --- creating a connector -------------------------------------------------------------------------------------


def test_create_answers_201_with_the_info_whose_config_holds_the_name(client: TestClient,
                                                                     store: MemoryClusterStore) -> None:
    info = create(client, "orders")
    assert info == {"name": "orders", "config": {"name": "orders", **CONFIG}, "tasks": [], "type": "source"}
    stored = record(store, "orders")
    assert (stored.config["name"], stored.target, stored.version, stored.restart) == ("orders", "RUNNING", 1, 0)
    assert client.get("/connectors/orders").json() == info


def test_create_of_an_existing_name_is_409_and_keeps_the_first_config(client: TestClient,
                                                                      store: MemoryClusterStore) -> None:
    create(client, "a")
    response = client.post("/connectors", json={"name": "a", "config": config(sink={"topic": "other"})})
    assert_error(response, 409, "'a'", "exists")
    assert record(store).config["sink"] == {"topic": "out"}


@pytest.mark.parametrize("body", [{}, {"name": "a"}, {"config": CONFIG}, {"name": 1, "config": CONFIG},
                                  {"name": "a", "config": "x"}, ["a"], None])
def test_create_needs_a_name_and_a_config_object(client: TestClient, store: MemoryClusterStore, body: Any) -> None:
    assert_error(client.post("/connectors", json=body), 400, '"name"', '"config"')
    assert store.connectors() == {}


def test_a_body_that_is_not_json_is_400_saying_why(client: TestClient) -> None:
    response = client.post("/connectors", content=b'{"name": "a", "config": {', headers={"content-type":
                                                                                          "application/json"})
    assert_error(response, 400, "not valid JSON")


def test_a_yaml_body_is_read_when_its_content_type_says_yaml(client: TestClient, store: MemoryClusterStore) -> None:
    body = yaml.safe_dump({"name": "a", "config": CONFIG})
    response = client.post("/connectors", content=body, headers={"content-type": "application/yaml"})
    assert response.status_code == 201, response.text
    assert record(store).config == {"name": "a", **CONFIG}


def test_a_yaml_body_that_does_not_parse_is_400_saying_why(client: TestClient) -> None:
    response = client.post("/connectors", content=b"name: [a\nconfig: {", headers={"content-type": "application/yaml"})
    assert_error(response, 400, "not valid YAML")


def test_an_unknown_key_is_400_naming_the_key_and_nothing_is_stored(client: TestClient,
                                                                    store: MemoryClusterStore) -> None:
    body = config(source={**CONFIG["source"], "bogus": 1})
    assert_error(client.post("/connectors", json={"name": "a", "config": body}), 400, "'a'", "source.bogus",
                 "unknown key")
    assert store.connectors() == {}


def test_sql_on_a_column_the_source_schema_lacks_is_400_naming_the_step(client: TestClient,
                                                                        store: MemoryClusterStore) -> None:
    body = config(transform={"sql": "SELECT missing_column FROM input"})
    assert_error(client.post("/connectors", json={"name": "a", "config": body}), 400, "transform.0.sql",
                 "missing_column")
    assert store.connectors() == {}


def test_a_name_inside_the_config_that_differs_from_the_connector_name_is_400(client: TestClient) -> None:
    response = client.post("/connectors", json={"name": "a", "config": config(name="b")})
    assert_error(response, 400, "'b'", "'a'")


def test_a_name_inside_the_config_equal_to_the_connector_name_is_accepted(client: TestClient) -> None:
    assert create(client, "a", config(name="a"))["config"]["name"] == "a"


SCHEMALESS: dict[str, Any] = {"source": {"topic": "in", "format": "json"}, "sink": {"topic": "out"},
                              "dead_letter": {"topic": "dlq"}}


@pytest.mark.parametrize("sql", ["SELEC 1", "SELECT id FROM input WHERE", "DELETE FROM input"])
def test_sql_that_is_no_single_select_is_400_even_when_the_source_schema_is_inferred(
        client: TestClient, store: MemoryClusterStore, sql: str) -> None:
    body = {**SCHEMALESS, "transform": {"sql": sql}}
    assert_error(client.put("/connectors/r9/config", json=body), 400, "'r9'", "transform.0.sql")
    assert_error(client.post("/connectors", json={"name": "r9", "config": body}), 400, "transform.0.sql")
    assert store.connectors() == {}


def test_every_problem_of_a_config_is_in_one_400_each_with_its_field(client: TestClient,
                                                                     store: MemoryClusterStore) -> None:
    body = config(bogus=1, checkpoint={"interval": "soon"}, sink={"topic": "out", "delivery": "twice"},
                  transform={"sql": "SELECT missing_column FROM input"})
    message = assert_error(client.put("/connectors/a/config", json=body), 400)
    for field in ("bogus: unknown key", "checkpoint.interval:", "sink.delivery:", "transform.0.sql:"):
        assert field in message, message
    assert "missing_column" in message
    answer = client.put(VALIDATE, json=body).json()
    assert sorted(entry["value"]["name"] for entry in answer["configs"]) == \
        ["bogus", "checkpoint.interval", "sink.delivery", "transform.0.sql"]
    assert answer["error_count"] == 4
    assert store.connectors() == {}


@pytest.mark.parametrize("name", ["x" * 201, "has space", "slash/in", "dots..ok-but-ä", ".."])
def test_a_connector_name_that_breaks_the_name_rule_is_400_stating_the_rule(client: TestClient,
                                                                            store: MemoryClusterStore,
                                                                            name: str) -> None:
    assert_error(client.post("/connectors", json={"name": name, "config": config()}), 400, "connector name",
                 "A-Za-z0-9._-", "200")
    if "/" not in name and name != "..":  # in a URL path, those make another path (404)
        assert_error(client.put(f"/connectors/{name}/config", json=config()), 400, "connector name", "200")
    assert store.connectors() == {}


def test_the_longest_name_the_rule_allows_is_accepted(client: TestClient) -> None:
    assert create(client, "n" * 200)["name"] == "n" * 200


def alias_bomb(levels: int) -> str:
    """A YAML "billion laughs" under ``source.schema``: each level repeats the one before nine times."""
    lines = ["config:", "  source:", "    topic: in", "    schema:", '      l0: &l0 ["lol", "lol", "lol"]']
    lines += [f"      l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * 9)}]" for level in range(1, levels)]
    return "\n".join([*lines, "  sink: {topic: out}", "  dead_letter: {topic: dlq}", "name: bomb"])


def test_a_yaml_alias_bomb_is_400_within_a_second_and_nothing_is_stored(client: TestClient,
                                                                        store: MemoryClusterStore) -> None:
    began = time.monotonic()
    response = client.post("/connectors", content=alias_bomb(12), headers={"content-type": "application/yaml"})
    assert time.monotonic() - began < 1.0
    assert_error(response, 400, "not valid YAML", "aliases", "expand")
    assert store.connectors() == {}


def test_yaml_aliases_within_the_bound_are_read(client: TestClient, store: MemoryClusterStore) -> None:
    body = ("name: a\nconfig:\n  source: {topic: in, format: json, schema: &ids {type: object, properties: "
            "{id: {type: integer}}}}\n  transform: {sql: SELECT id FROM input}\n  sink: {topic: out, schema: *ids}\n"
            "  dead_letter: {topic: dlq}\n")
    assert client.post("/connectors", content=body, headers={"content-type": "application/yaml"}).status_code == 201
    assert record(store).config["sink"]["schema"] == record(store).config["source"]["schema"] == \
        {"type": "object", "properties": {"id": {"type": "integer"}}}


@pytest.mark.parametrize(("content", "media", "words"), [
    ("name: &a [*a]", "application/yaml", ("recursive alias",)),
    ("[" * 20_000, "application/yaml", ("nests deeper",)),
    ("[" * 20_000, "application/json", ("not valid JSON",)),
    ("name: a\nconfig: {source: {topic: in, schema: {1: 2}}, sink: {topic: out}, dead_letter: {topic: d}}",
     "application/yaml", ("source.schema", "must be JSON")),
])
def test_a_malformed_body_is_400_saying_why_never_500(client: TestClient, store: MemoryClusterStore, content: str,
                                                     media: str, words: tuple[str, ...]) -> None:
    assert_error(client.post("/connectors", content=content, headers={"content-type": media}), 400, *words)
    assert store.connectors() == {}


def test_a_body_over_the_limit_is_413_naming_the_limit(client: TestClient, store: MemoryClusterStore) -> None:
    body = orjson.dumps({"name": "a", "config": config(sink={"topic": "x" * MAX_BODY_BYTES})})
    assert_error(client.post("/connectors", content=body, headers={"content-type": "application/json"}), 413,
                 str(MAX_BODY_BYTES))
    assert store.connectors() == {}


# --- a connector that does not exist ---------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/connectors/missing"), ("GET", "/connectors/missing/status"), ("GET", "/connectors/missing/config"),
    ("DELETE", "/connectors/missing"), ("PUT", "/connectors/missing/pause"), ("PUT", "/connectors/missing/resume"),
    ("PUT", "/connectors/missing/stop"), ("POST", "/connectors/missing/restart"),
    ("GET", "/connectors/missing/offsets"), ("DELETE", "/connectors/missing/offsets"),
])
def test_a_missing_connector_is_404_naming_it(client: TestClient, method: str, path: str) -> None:
    assert_error(client.request(method, path), 404, "'missing'", "not found")


def test_altering_the_offsets_of_a_missing_connector_is_404(client: TestClient) -> None:
    assert_error(client.patch("/connectors/missing/offsets", json=OFFSETS), 404, "'missing'")


# --- PUT config: create or update ------------------------------------------------------------------------------


def test_put_config_of_a_new_name_creates_it_with_201(client: TestClient, store: MemoryClusterStore) -> None:
    response = client.put("/connectors/a/config", json=CONFIG)
    assert response.status_code == 201, response.text
    assert response.json() == {"name": "a", "config": {"name": "a", **CONFIG}, "tasks": [], "type": "source"}
    assert record(store).version == 1


def test_put_config_of_an_existing_connector_updates_it_with_200_and_a_new_version(
        client: TestClient, store: MemoryClusterStore) -> None:
    create(client, "a")
    response = client.put("/connectors/a/config", json=config(sink={"topic": "elsewhere"}))
    assert response.status_code == 200, response.text
    assert response.json()["config"]["sink"] == {"topic": "elsewhere"}
    assert (record(store).version, record(store).config["sink"]) == (2, {"topic": "elsewhere"})
    assert client.get("/connectors/a/config").json()["sink"] == {"topic": "elsewhere"}


def test_put_of_the_same_config_is_200_and_does_not_restart_the_tasks(client: TestClient,
                                                                      store: MemoryClusterStore) -> None:
    create(client, "a")
    for same in (CONFIG, {"name": "a", **CONFIG}):
        response = client.put("/connectors/a/config", json=same)
        assert response.status_code == 200, response.text
        assert record(store).version == 1


def test_put_config_keeps_the_target_and_restart_counters(client: TestClient, store: MemoryClusterStore) -> None:
    create(client, "a")
    client.put("/connectors/a/pause")
    client.post("/connectors/a/restart")
    assert client.put("/connectors/a/config", json=config(sink={"topic": "x"})).status_code == 200
    assert (record(store).target, record(store).restart, record(store).version) == ("PAUSED", 1, 2)


def test_put_config_whose_name_differs_from_the_url_is_400_and_changes_nothing(
        client: TestClient, store: MemoryClusterStore) -> None:
    create(client, "a")
    assert_error(client.put("/connectors/a/config", json=config(name="b", sink={"topic": "x"})), 400, "'b'", "'a'")
    assert record(store).version == 1
    assert "b" not in store.connectors()


def test_put_of_an_invalid_config_is_400_naming_the_field_and_keeps_the_old_one(
        client: TestClient, store: MemoryClusterStore) -> None:
    create(client, "a")
    assert_error(client.put("/connectors/a/config", json=config(sink={"topic": "x", "bogus": True})), 400,
                 "sink.bogus")
    assert record(store).config["sink"] == {"topic": "out"}


@pytest.mark.parametrize("body", [["a"], "text", None])
def test_put_config_needs_an_object(client: TestClient, body: Any) -> None:
    assert_error(client.put("/connectors/a/config", json=body), 400, "mapping")


# --- keyed state: window steps -----------------------------------------------------------------------------------


def test_a_window_change_is_409_without_reset_state_and_keeps_the_old_window(
        client: TestClient, store: MemoryClusterStore, kafka: FakeConnectorKafka) -> None:
    create(client, "a", windowed())
    assert_error(client.put("/connectors/a/config", json=windowed(size="5m")), 409, "'a'", "reset_state", "[0]")
    assert record(store).config["transform"][0]["window"]["size"] == "1m"
    assert record(store).version == 1
    assert kafka.state_resets == []


def test_reset_state_while_the_connector_is_meant_to_run_is_409_saying_it_must_be_stopped(
        client: TestClient, store: MemoryClusterStore, kafka: FakeConnectorKafka) -> None:
    create(client, "a", windowed())
    response = client.put("/connectors/a/config?reset_state=true", json=windowed(size="5m"))
    assert_error(response, 409, "RUNNING", "STOPPED")
    assert kafka.state_resets == []
    assert record(store).version == 1


def test_reset_state_while_a_task_still_runs_is_409_even_when_the_target_is_stopped(
        client: TestClient, store: MemoryClusterStore, kafka: FakeConnectorKafka) -> None:
    create(client, "a", windowed())
    stop(client)
    store.put_status(task("a", "w2", "RUNNING"))
    assert_error(client.put("/connectors/a/config?reset_state=true", json=windowed(size="5m")), 409, "w2",
                 "STOPPED")
    assert kafka.state_resets == []


def test_reset_state_of_a_stopped_connector_empties_its_keyed_state_and_applies_the_change(
        client: TestClient, store: MemoryClusterStore, kafka: FakeConnectorKafka) -> None:
    create(client, "a", windowed())
    stop(client)
    store.put_status(task("a", "w1", "STOPPED"))
    store.put_status(task("a", "w2", "RUNNING", age_s=STATUS_TTL_S + 1))  # a worker that is gone
    before = record(store)
    response = client.put("/connectors/a/config?reset_state=true", json=windowed(size="5m"))
    assert response.status_code == 200, response.text
    assert [reset.config for reset in kafka.state_resets] == [before.config]
    after = record(store)
    assert (after.config["transform"][0]["window"]["size"], after.version, after.target) == ("5m", 2, "STOPPED")


def test_reset_state_refused_by_a_group_that_still_has_members_is_409(
        client: TestClient, store: MemoryClusterStore, kafka: FakeConnectorKafka) -> None:
    create(client, "a", windowed())
    stop(client)
    kafka.group_not_empty = True
    assert_error(client.put("/connectors/a/config?reset_state=true", json=windowed(size="5m")), 409, "members")
    assert record(store).version == 1


def test_a_change_that_leaves_the_windows_alone_needs_no_reset_state(
        client: TestClient, store: MemoryClusterStore, kafka: FakeConnectorKafka) -> None:
    create(client, "a", windowed())
    response = client.put("/connectors/a/config", json={**windowed(), "sink": {"topic": "elsewhere"}})
    assert response.status_code == 200, response.text
    assert record(store).version == 2
    assert kafka.state_resets == []


# --- target state and restarts -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("action", "target"), [("pause", "PAUSED"), ("stop", "STOPPED"), ("resume", "RUNNING")])
def test_pause_stop_and_resume_answer_202_with_no_body_and_set_the_target(
        client: TestClient, store: MemoryClusterStore, action: str, target: str) -> None:
    create(client, "a")
    if action == "resume":
        stop(client)
    response = client.put(f"/connectors/a/{action}")
    assert response.status_code == 202
    assert response.content == b""
    assert record(store).target == target
    assert record(store).version == 1
    assert client.get("/connectors/a/status").json()["connector"]["target"] == target


def test_restart_answers_202_with_the_status_and_counts_the_request(client: TestClient,
                                                                    store: MemoryClusterStore) -> None:
    create(client, "a")
    response = client.post("/connectors/a/restart")
    assert response.status_code == 202
    assert response.json()["name"] == "a"
    assert (record(store).restart, record(store).restart_only_failed) == (1, False)
    assert client.post("/connectors/a/restart?includeTasks=true").status_code == 202
    assert (record(store).restart, record(store).restart_only_failed, record(store).version) == (2, False, 1)


def test_restart_only_failed_spares_the_healthy_tasks(client: TestClient, store: MemoryClusterStore) -> None:
    create(client, "a")
    assert client.post("/connectors/a/restart?includeTasks=true&onlyFailed=true").status_code == 202
    assert (record(store).restart, record(store).restart_only_failed) == (1, True)


# --- offsets -------------------------------------------------------------------------------------------------------


def test_offsets_are_the_committed_offsets_of_the_source_partitions(client: TestClient, groups: FakeGroups) -> None:
    create(client, "a")
    groups.set("a", group("a", [partition("in", 0, 12), partition("in", 1, None),
                                partition("a-repartition", 0, 5, role="repartition")]))
    response = client.get("/connectors/a/offsets")
    assert response.status_code == 200
    assert response.json() == {"offsets": [{"partition": {"kafka_topic": "in", "kafka_partition": 0},
                                            "offset": {"kafka_offset": 12}}]}


def test_offsets_are_503_while_the_group_cannot_be_read(client: TestClient) -> None:
    create(client, "a")
    assert_error(client.get("/connectors/a/offsets"), 503, "'a'", "consumer group")


def test_offsets_cannot_change_while_the_connector_is_meant_to_run(client: TestClient,
                                                                   kafka: FakeConnectorKafka) -> None:
    create(client, "a")
    assert_error(client.patch("/connectors/a/offsets", json=OFFSETS), 409, "RUNNING", "STOPPED")
    assert_error(client.delete("/connectors/a/offsets"), 409, "RUNNING", "STOPPED")
    client.put("/connectors/a/pause")
    assert_error(client.patch("/connectors/a/offsets", json=OFFSETS), 409, "PAUSED", "STOPPED")
    assert (kafka.altered, kafka.offset_resets) == ([], [])


def test_offsets_cannot_change_while_a_live_task_still_runs_after_stop(
        client: TestClient, store: MemoryClusterStore, kafka: FakeConnectorKafka) -> None:
    create(client, "a")
    stop(client)
    store.put_status(task("a", "w1", "RUNNING"))
    assert_error(client.patch("/connectors/a/offsets", json=OFFSETS), 409, "w1", "not stopped")
    assert_error(client.delete("/connectors/a/offsets"), 409, "w1", "not stopped")
    assert (kafka.altered, kafka.offset_resets) == ([], [])


def test_altering_the_offsets_of_a_stopped_connector_passes_them_parsed(
        client: TestClient, store: MemoryClusterStore, kafka: FakeConnectorKafka) -> None:
    create(client, "a")
    stop(client)
    store.put_status(task("a", "w1", "STOPPED"))
    store.put_status(task("a", "w2", "FAILED"))
    store.put_status(task("a", "w3", "RUNNING", age_s=STATUS_TTL_S + 1))  # gone: its status is stale
    response = client.patch("/connectors/a/offsets", json=OFFSETS)
    assert response.status_code == 200, response.text
    assert "2 partition(s)" in response.json()["message"]
    assert [(altered.name, offsets) for altered, offsets in kafka.altered] == [("a", [("in", 0, 12), ("in", 1, 7)])]


def test_resetting_the_offsets_of_a_stopped_connector_deletes_what_its_group_committed(
        client: TestClient, kafka: FakeConnectorKafka) -> None:
    create(client, "a")
    stop(client)
    response = client.delete("/connectors/a/offsets")
    assert response.status_code == 200, response.text
    assert "were reset" in response.json()["message"]
    kafka.had_offsets = False
    assert "no committed offsets" in client.delete("/connectors/a/offsets").json()["message"]
    assert [reset.name for reset in kafka.offset_resets] == ["a", "a"]


@pytest.mark.parametrize("body", [
    {}, {"offsets": []}, {"offsets": "in:0"}, [OFFSETS], {"offsets": [{"partition": {"kafka_topic": "in"}}]},
    {"offsets": [{"partition": {"kafka_topic": "in", "kafka_partition": 0}, "offset": {"kafka_offset": "x"}}]},
    {"offsets": [{"partition": {"kafka_topic": "in", "kafka_partition": 0}, "offset": {"kafka_offset": -5}}]},
    {"offsets": [{"partition": {"kafka_topic": "in", "kafka_partition": True}, "offset": {"kafka_offset": 1}}]},
    {"offsets": [{"partition": {"kafka_topic": "in", "kafka_partition": 0}, "offset": {"kafka_offset": 1.9}}]},
])
def test_an_offsets_body_not_shaped_like_connects_is_400(client: TestClient, kafka: FakeConnectorKafka,
                                                         body: Any) -> None:
    create(client, "a")
    stop(client)
    assert_error(client.patch("/connectors/a/offsets", json=body), 400, "offset")
    assert kafka.altered == []


def test_an_offsets_body_that_is_not_json_is_400(client: TestClient) -> None:
    create(client, "a")
    stop(client)
    assert_error(client.patch("/connectors/a/offsets", content=b"{offsets", headers={"content-type":
                                                                                      "application/json"}),
                 400, "not valid JSON")


def test_offsets_of_a_topic_the_connector_does_not_read_are_400(client: TestClient,
                                                                 kafka: FakeConnectorKafka) -> None:
    create(client, "a")
    stop(client)
    elsewhere = {"offsets": [{"partition": {"kafka_topic": "elsewhere", "kafka_partition": 0},
                              "offset": {"kafka_offset": 1}}]}
    assert_error(client.patch("/connectors/a/offsets", json=elsewhere), 400, "elsewhere")
    assert kafka.altered == []


def test_moving_or_resetting_the_offsets_of_a_connector_with_keyed_state_is_409(client: TestClient,
                                                                                kafka: FakeConnectorKafka) -> None:
    create(client, "a", windowed())
    stop(client)
    assert_error(client.delete("/connectors/a/offsets"), 409, "keyed state", "reset_state")
    assert_error(client.patch("/connectors/a/offsets", json=OFFSETS), 409, "keyed state")
    assert kafka.offset_resets == [] and kafka.altered == []


def test_unknown_paths_methods_and_bad_query_values_answer_in_the_error_shape(client: TestClient) -> None:
    create(client, "a")
    assert_error(client.get("/no/such/path"), 404, "Not Found")
    assert_error(client.delete("/"), 405, "Method Not Allowed")
    assert_error(client.post("/connectors/a/restart?onlyFailed=maybe"), 400, "onlyFailed")


def test_credentials_inside_urls_are_redacted(client: TestClient) -> None:
    given = config(source={**CONFIG["source"], "registry_url": f"https://user:{SECRET}@registry:8081"})
    answer = client.post("/connectors", json={"name": "a", "config": given})
    assert answer.status_code == 201, answer.text
    shown = client.get("/connectors/a/config").json()
    assert shown["source"]["registry_url"] == "https://[redacted]@registry:8081"
    assert SECRET not in answer.text


def test_a_postgres_sink_is_accepted_and_its_dsn_password_shown_redacted(client: TestClient) -> None:
    sink = {"type": "postgres", "table": "orders", "mode": "upsert", "key": ["id"],
            "dsn": f"postgresql://loader@db:5432/shop?sslmode=require&password={SECRET}"}
    answer = client.post("/connectors", json={"name": "a", "config": config(sink=sink)})
    assert answer.status_code == 201, answer.text
    shown = client.get("/connectors/a/config").json()
    assert shown["sink"]["dsn"] == "postgresql://[redacted]@db:5432/shop?sslmode=require&password=[redacted]"
    assert SECRET not in answer.text
    referenced = {**sink, "dsn": "postgresql://db/shop?user=loader&password=${env:PG_PASSWORD}"}
    assert client.put("/connectors/a/config", json=config(sink=referenced)).status_code == 200
    assert client.get("/connectors/a/config").json()["sink"]["dsn"] == referenced["dsn"]


def test_a_postgres_sink_setting_that_cannot_work_is_400_naming_it(client: TestClient) -> None:
    sink = {"type": "postgres", "table": "orders", "mode": "upsert", "dsn": "postgresql://db/shop"}
    assert_error(client.post("/connectors", json={"name": "a", "config": config(sink=sink)}), 400, "sink", "key")
    assert_error(client.post("/connectors", json={"name": "a", "config": config(sink={"type": "mongo"})}), 400,
                 "unknown sink type 'mongo'")


def test_offset_changes_refused_by_a_group_that_still_has_members_are_409(client: TestClient,
                                                                          kafka: FakeConnectorKafka) -> None:
    create(client, "a")
    stop(client)
    kafka.group_not_empty = True
    assert_error(client.patch("/connectors/a/offsets", json=OFFSETS), 409, "members")
    assert_error(client.delete("/connectors/a/offsets"), 409, "members")


# --- validate ------------------------------------------------------------------------------------------------------

VALIDATE = "/connector-plugins/connector/config/validate"


def test_validate_reports_a_bad_sql_step_as_an_error_of_that_field(client: TestClient) -> None:
    answer = client.put(VALIDATE, json=config(transform={"sql": "SELECT missing_column FROM input"})).json()
    assert answer["error_count"] == 1
    [entry] = answer["configs"]
    assert entry["value"]["name"] == "transform.0.sql"
    assert "missing_column" in entry["value"]["errors"][0]


def test_validate_reports_output_the_sink_format_cannot_write_as_an_error_of_the_sink(client: TestClient) -> None:
    answer = client.put(VALIDATE, json=config(sink={"topic": "out", "format": "raw"})).json()
    assert answer["error_count"] == 1
    [entry] = answer["configs"]
    assert entry["value"]["name"] == "sink"
    assert "column value: the raw format writes the 'value' column" in entry["value"]["errors"][0]


def test_validate_reports_every_unknown_key_and_counts_the_errors(client: TestClient,
                                                                  store: MemoryClusterStore) -> None:
    response = client.put(VALIDATE, json=config(source={**CONFIG["source"], "bogus": 1},
                                                sink={"topic": "out", "bogus": 2}))
    assert response.status_code == 200
    answer = response.json()
    assert answer["name"] == "connector"
    assert answer["error_count"] == 2
    assert {entry["value"]["name"]: entry["value"]["errors"] for entry in answer["configs"]} == \
        {"source.bogus": ["unknown key"], "sink.bogus": ["unknown key"]}
    assert store.connectors() == {}


def test_validate_of_a_valid_config_has_no_errors(client: TestClient, store: MemoryClusterStore) -> None:
    for body in (CONFIG, windowed()):
        answer = client.put(VALIDATE, json=body).json()
        assert (answer["error_count"], answer["configs"]) == (0, [])
    assert store.connectors() == {}


def test_validate_needs_a_config_object(client: TestClient) -> None:
    assert_error(client.put(VALIDATE, json=["a"]), 400, "mapping")


# --- delete --------------------------------------------------------------------------------------------------------


def test_delete_answers_204_and_removes_the_connector_and_every_status_of_it(client: TestClient,
                                                                             store: MemoryClusterStore) -> None:
    create(client, "a")
    create(client, "b")
    store.put_status(task("a", "w1"))
    store.put_status(task("a", "w2", "FAILED", age_s=STATUS_TTL_S + 1))
    store.put_status(task("b", "w1"))
    response = client.delete("/connectors/a")
    assert response.status_code == 204
    assert response.content == b""
    assert list(store.connectors()) == ["b"]
    assert [(status.connector, status.worker_id) for status in store.statuses()] == [("b", "w1")]
    assert_error(client.get("/connectors/a"), 404, "'a'")
    assert client.get("/connectors").json() == ["b"]


# --- status --------------------------------------------------------------------------------------------------------

FAILURE = TaskError(type="SchemaError", message="field amount: expected number, got string", exit_code=2,
                    at="2026-01-01T10:00:00Z")
TRACE = 'Traceback (most recent call last):\n  File "transform.py", line 3\nSchemaError: field amount'


def test_a_failed_task_makes_the_connector_failed_and_shows_its_error_and_trace(client: TestClient,
                                                                                store: MemoryClusterStore) -> None:
    create(client, "a")
    store.put_status(task("a", "w1", "RUNNING", pid=101))
    store.put_status(task("a", "w2", "FAILED", pid=102, restarts=3, error=FAILURE, trace=TRACE))
    status = client.get("/connectors/a/status").json()
    assert status["name"] == "a"
    assert status["connector"] == {"state": "FAILED", "target": "RUNNING", "worker_id": "w1"}
    running, failed = status["tasks"]
    assert (running["id"], running["state"], running["pid"], running["error"], running["trace"]) == \
        ("w1", "RUNNING", 101, None, None)
    assert (failed["id"], failed["worker_id"], failed["state"], failed["restarts"]) == ("w2", "w2", "FAILED", 3)
    assert failed["error"] == {"type": "SchemaError", "message": "field amount: expected number, got string",
                               "exit_code": 2, "at": "2026-01-01T10:00:00Z"}
    assert failed["trace"] == TRACE
    assert (status["lag"], status["checkpoint"], status["last_commit_age_s"], status["dead_letters"]) == \
        (None, None, None, None)  # the group cannot be read: nothing committed is known


def test_a_status_its_worker_stopped_rewriting_is_left_out(client: TestClient, store: MemoryClusterStore) -> None:
    create(client, "a")
    store.put_status(task("a", "w1", "RUNNING"))
    store.put_status(task("a", "w2", "FAILED", error=FAILURE, age_s=STATUS_TTL_S + 1))
    status = client.get("/connectors/a/status").json()
    assert [t["id"] for t in status["tasks"]] == ["w1"]
    assert status["connector"]["state"] == "RUNNING"
    assert client.get("/connectors/a").json()["tasks"] == [{"connector": "a", "task": "w1"}]


def test_a_connector_without_live_tasks_is_unassigned(client: TestClient, store: MemoryClusterStore) -> None:
    create(client, "a")
    assert client.get("/connectors/a/status").json()["connector"] == \
        {"state": "UNASSIGNED", "target": "RUNNING", "worker_id": None}
    store.put_status(task("a", "w1", "RUNNING", age_s=STATUS_TTL_S + 1))
    status = client.get("/connectors/a/status").json()
    assert (status["connector"]["state"], status["tasks"]) == ("UNASSIGNED", [])


def test_a_stopped_connector_shows_its_target_as_its_state(client: TestClient) -> None:
    create(client, "a")
    stop(client)
    assert client.get("/connectors/a/status").json()["connector"]["state"] == "STOPPED"


def test_status_takes_partitions_lag_and_checkpoint_from_the_group(client: TestClient, store: MemoryClusterStore,
                                                                   groups: FakeGroups) -> None:
    create(client, "a")
    store.put_status(task("a", "w1", "RUNNING"))
    groups.set("a", group("a", [partition("in", 0, 10, lag=4), partition("in", 1, 20, lag=1)]))
    status = client.get("/connectors/a/status").json()
    assert (status["lag"], status["checkpoint"]) == (5, 3)
    assert status["last_commit_age_s"] is not None
    assert (status["tasks"][0]["lag"], status["tasks"][0]["checkpoint"]) == (5, 3)
    assert [(p["topic"], p["partition"], p["committed"], p["end"], p["lag"]) for p in status["partitions"]] == \
        [("in", 0, 10, 14, 4), ("in", 1, 20, 21, 1)]


def test_dead_letters_in_status_are_the_counts_the_group_committed_whoever_committed_them(
        client: TestClient, store: MemoryClusterStore, groups: FakeGroups) -> None:
    """Counted from the offsets' metadata of every input (source and repartition), so a restarted task, or
    one that no longer runs, changes nothing; each task shows those of the partitions it committed last."""
    create(client, "a")
    store.put_status(task("a", "w1", "RUNNING"))
    store.put_status(task("a", "w2", "RUNNING"))
    groups.set("a", group("a", [partition("in", 0, 10, dead_letters=4), partition("in", 1, 20, instance="w2",
                                                                                  dead_letters=2),
                                partition("a-repartition", 0, 5, role="repartition", dead_letters=1),
                                partition("in", 2, 30)]))  # committed by an older version: no count
    status = client.get("/connectors/a/status").json()
    assert status["dead_letters"] == 7
    assert {t["id"]: t["dead_letters"] for t in status["tasks"]} == {"w1": 5, "w2": 2}
    assert [p["dead_letters"] for p in status["partitions"]] == [4, 2, 1, None]


def test_history_serves_the_sampled_throughput_and_lag_of_a_connector(store: MemoryClusterStore,
                                                                      groups: FakeGroups) -> None:
    context = api_context(store=store, groups=groups)
    with TestClient(create_app(context)) as client:
        create(client, "a")
        records = list(store.connectors().values())
        for at, committed, lag in ((100.0, 10, 50), (105.0, 60, 20), (110.0, 0, 80)):  # the last: an offset reset
            groups.set("a", group("a", [partition("in", 0, committed, lag=lag)]))
            context.history.record("a", sample_of(groups.read(records[0]), at))
        body = client.get("/connectors/a/history").json()
        assert body["interval_s"] == 5.0 and body["window_s"] == 900.0
        assert [(s["at"], s["records_per_s"], s["lag"]) for s in body["samples"]] == \
            [(100.0, None, 50), (105.0, 10.0, 20), (110.0, None, 80)]
        assert_error(client.get("/connectors/nope/history"), 404, "nope")


def test_dead_letters_are_the_last_committed_ones_newest_first_with_their_reasons(client: TestClient,
                                                                                    kafka: FakeConnectorKafka) -> None:
    create(client, "a")
    without = config(late_rows="drop", source={**CONFIG["source"], "on_error": "halt"})
    del without["dead_letter"]
    create(client, "b", without)
    letters = [DeadLetter("in", 0, offset, b"k", b'{"id": "x"}' + b"!" * 400, f"bad {offset}", "decode")
               for offset in range(30)]
    kafka.records["dlq"] = [StoredRecord(0, n, 1_000 + n, letter.key, letter.value,
                                         [(name, value if isinstance(value, bytes) else None)
                                          for name, value in letter.headers()])
                            for n, letter in enumerate(letters)]
    body = client.get("/connectors/a/dead-letters", params={"limit": 2}).json()
    assert body["topic"] == "dlq"
    newest = body["dead_letters"][0]
    assert [d["reason"] for d in body["dead_letters"]] == ["bad 29", "bad 28"]
    assert (newest["stage"], newest["source"], newest["offset"], newest["timestamp_ms"]) == \
        ("decode", {"topic": "in", "partition": "0", "offset": "29"}, 29, 1_029)
    assert newest["value"].startswith('{"id": "x"}!') and len(newest["value"]) == PREVIEW_CHARS + 1
    assert len(client.get("/connectors/a/dead-letters").json()["dead_letters"]) == 20
    assert client.get("/connectors/b/dead-letters").json() == {"topic": None, "dead_letters": []}
    assert_error(client.get("/connectors/a/dead-letters", params={"limit": 1000}), 400, "limit")


# --- health --------------------------------------------------------------------------------------------------------


def test_health_is_200_when_nothing_is_deployed(client: TestClient) -> None:
    response = client.get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "healthy", "problems": []}


def test_health_is_503_naming_the_connector_whose_task_failed(client: TestClient, store: MemoryClusterStore) -> None:
    create(client, "a")
    create(client, "b")
    store.put_status(task("a", "w1", "FAILED", error=FAILURE, trace=TRACE))
    store.put_status(task("b", "w1", "RUNNING"))
    response = client.get("/health")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unhealthy"
    assert any(problem.startswith("a: FAILED") and FAILURE.message in problem for problem in body["problems"])
    assert not any(problem.startswith("b:") and "FAILED" in problem for problem in body["problems"])


def test_health_is_200_for_a_running_connector_with_nothing_to_read(client: TestClient, store: MemoryClusterStore,
                                                                    groups: FakeGroups) -> None:
    create(client, "a")
    store.put_status(task("a", "w1", "RUNNING"))
    groups.set("a", group("a", [partition("in", 0, 10, lag=0)]))
    assert client.get("/health").json() == {"status": "healthy", "problems": []}


def test_a_stopped_connector_is_not_a_health_problem(client: TestClient, store: MemoryClusterStore) -> None:
    create(client, "a")
    stop(client)
    store.put_status(task("a", "w1", "FAILED", error=FAILURE))
    assert client.get("/health").status_code == 200


# --- auth ----------------------------------------------------------------------------------------------------------


@pytest.fixture
def guarded(store: MemoryClusterStore) -> Iterator[TestClient]:
    with TestClient(create_app(api_context(store=store, token="s3cret"))) as test_client:
        yield test_client


def test_without_a_token_every_call_is_401_with_a_json_error_and_a_bearer_challenge(
        guarded: TestClient, store: MemoryClusterStore) -> None:
    for method, path in [("GET", "/"), ("GET", "/connectors"), ("GET", "/health"), ("GET", "/metrics"),
                         ("POST", "/connectors")]:
        response = guarded.request(method, path, json={"name": "a", "config": CONFIG})
        assert_error(response, 401, "Bearer")
        assert response.headers["www-authenticate"] == "Bearer"
    assert store.connectors() == {}


@pytest.mark.parametrize("header", ["Bearer wrong", "Bearer s3cre", "Basic s3cret", "s3cret", "Bearer "])
def test_a_wrong_token_is_401(guarded: TestClient, header: str) -> None:
    assert_error(guarded.get("/connectors", headers={"Authorization": header}), 401)


def test_the_right_token_is_let_in(guarded: TestClient) -> None:
    response = guarded.get("/connectors", headers={"Authorization": "Bearer s3cret"})
    assert response.status_code == 200
    assert response.json() == []
    assert guarded.get("/", headers={"authorization": "bearer s3cret"}).status_code == 200


def test_the_status_page_needs_no_token_and_is_html(guarded: TestClient) -> None:
    response = guarded.get("/ui")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "<html" in response.text.lower()


def test_metrics_are_prometheus_text(client: TestClient) -> None:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")


# --- secrets -------------------------------------------------------------------------------------------------------


def test_a_literal_secret_is_in_no_answer(client: TestClient, store: MemoryClusterStore) -> None:
    body = config(kafka={"client": {"sasl.password": SECRET, "security.protocol": "PLAINTEXT"}})
    created = client.post("/connectors", json={"name": "a", "config": body})
    assert created.status_code == 201, created.text
    store.put_status(task("a", "w1", "RUNNING"))
    answers = [created,
               client.get("/connectors/a/config"),
               client.get("/connectors/a"),
               client.get("/connectors?expand=info&expand=status"),
               client.get("/connectors/a/status"),
               client.post("/connectors/a/restart"),
               client.put("/connectors/a/config", json={**body, "sink": {"topic": "x"}}),
               client.put(VALIDATE, json=body)]
    for answer in answers:
        assert answer.status_code < 300, answer.text
        assert SECRET not in answer.text, answer.request.url
    shown = client.get("/connectors/a/config").json()["kafka"]["client"]
    assert shown == {"sasl.password": REDACTED, "security.protocol": "PLAINTEXT"}


def test_a_secret_reference_is_shown_as_written_never_resolved(client: TestClient,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_PASSWORD", "value-from-the-environment")
    reference = "${env:KAFKA_PASSWORD}"
    body = config(kafka={"client": {"sasl.password": reference, "security.protocol": "PLAINTEXT"}})
    answers = [client.post("/connectors", json={"name": "a", "config": body}), client.get("/connectors/a/config"),
               client.get("/connectors/a"), client.get("/connectors?expand=info")]
    for answer in answers:
        assert answer.status_code < 300, answer.text
        assert "value-from-the-environment" not in answer.text
    assert client.get("/connectors/a/config").json()["kafka"]["client"]["sasl.password"] == reference
    assert client.get("/connectors?expand=info").json()["a"]["info"]["config"]["kafka"]["client"] == \
        {"sasl.password": reference, "security.protocol": "PLAINTEXT"}
