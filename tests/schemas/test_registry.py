"""Specification of schemas.registry (framing, subject names, register-or-lookup) and of the fake Schema Registry
the Confluent formats are specified against: it must answer confluent-kafka's own client as Confluent's does."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from schemas import SchemaError
from schemas.registry import (
    SchemaNotRegistered,
    SubjectRegistration,
    header_problem,
    register_or_lookup,
    schema_id_of,
    subject_name,
    wire_header,
)

if TYPE_CHECKING:  # imported by pytest as the plugin below; importing it here first would skip assert rewriting
    from tests.helpers.schema_registry import FakeSchemaRegistry

pytest_plugins = ["tests.helpers.schema_registry"]

USER = {"type": "record", "name": "User", "namespace": "shop", "fields": [{"name": "id", "type": "long"}]}
ORDER = {"title": "Order", "type": "object", "properties": {"id": {"type": "integer"}}}


def avro(document: Any = USER, references: list[SchemaReference] | None = None) -> Schema:
    return Schema(json.dumps(document), "AVRO", references or [])


def client_of(registry: FakeSchemaRegistry) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": registry.url})


def error_of(call: Any, *args: Any) -> tuple[int, int]:
    with pytest.raises(SchemaRegistryError) as caught:
        call(*args)
    return caught.value.http_status_code, caught.value.error_code


# -- schemas.registry ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("strategy", "topic", "record", "subject"), [
    ("topic", "orders", None, "orders-value"),
    ("record", None, "shop.Order", "shop.Order"),
    ("topic-record", "orders", "shop.Order", "orders-shop.Order"),
])
def test_subject_names_follow_confluents_strategies(strategy: Any, topic: str | None, record: str | None,
                                                     subject: str) -> None:
    assert subject_name(strategy, topic, record) == subject
    assert SubjectRegistration(strategy, topic).subject(record) == subject


def test_a_strategy_without_its_input_is_a_schema_error_saying_what_is_missing() -> None:
    with pytest.raises(SchemaError, match="'topic' needs the topic"):
        subject_name("topic", None, "shop.Order")
    with pytest.raises(SchemaError, match="'topic-record' needs a record name"):
        subject_name("topic-record", "orders", None)
    with pytest.raises(SchemaError, match="unknown subject_strategy 'value'"):
        subject_name("value", "orders", None)  # type: ignore[arg-type]


def test_the_wire_header_is_confluents_magic_byte_and_big_endian_id() -> None:
    assert wire_header("JSON", 258) == b"\x00\x00\x00\x01\x02"
    assert schema_id_of(wire_header("AVRO", 70_000) + b"body") == 70_000
    assert header_problem(wire_header("AVRO", 1)) is None
    assert header_problem(None) == "null payload (tombstone)"
    assert header_problem(b"\x00\x01") is not None and "2 byte(s)" in str(header_problem(b"\x00\x01"))
    assert header_problem(b"\x01\x00\x00\x00\x01") == "wrong magic byte 0x01 (expected 0x00: not Confluent wire format)"


def test_register_or_lookup_registers_once_and_looks_up_the_same_id(schema_registry: FakeSchemaRegistry) -> None:
    client = client_of(schema_registry)
    schema_id = register_or_lookup(client, "users-value", avro(), auto_register=True)
    assert register_or_lookup(client_of(schema_registry), "users-value", avro(), auto_register=True) == schema_id
    assert register_or_lookup(client_of(schema_registry), "users-value", avro(), auto_register=False) == schema_id
    assert schema_registry.versions("users-value") == [1]


def test_lookup_of_an_unregistered_schema_names_the_subject(schema_registry: FakeSchemaRegistry) -> None:
    client = client_of(schema_registry)
    with pytest.raises(SchemaNotRegistered, match="not registered under subject 'users-value'.*40401"):
        register_or_lookup(client, "users-value", avro(), auto_register=False)
    schema_registry.register("users-value", {**USER, "name": "Other"})
    with pytest.raises(SchemaNotRegistered, match="not registered under subject 'users-value'.*40403"):
        register_or_lookup(client, "users-value", avro(), auto_register=False)


def test_a_schema_the_registry_refuses_is_a_schema_error_with_its_message(schema_registry: FakeSchemaRegistry) -> None:
    with pytest.raises(SchemaError, match="refused to register the schema under subject 'bad-value'.*42201"):
        register_or_lookup(client_of(schema_registry), "bad-value", avro({"type": "recrd"}), auto_register=True)


# -- the fake registry, through confluent-kafka's client -------------------------------------------------------

def test_the_same_schema_has_one_id_across_subjects_and_is_no_new_version(
        schema_registry: FakeSchemaRegistry) -> None:
    client = client_of(schema_registry)
    first = client.register_schema("a-value", avro())
    reordered = {"fields": USER["fields"], "namespace": "shop", "name": "User", "type": "record"}
    assert client_of(schema_registry).register_schema("a-value", avro(reordered)) == first, "Avro: order-free"
    assert client.register_schema("b-value", avro()) == first
    assert client.get_versions("a-value") == [1] and client.get_versions("b-value") == [1]
    assert [(v.subject, v.version) for v in client.get_schema_versions(first)] == [("a-value", 1), ("b-value", 1)]
    assert client.register_schema("a-value", Schema(json.dumps(ORDER), "JSON")) == first + 1
    assert client.get_subjects() == ["a-value", "b-value"]


def test_reads_answer_as_the_registry_does(schema_registry: FakeSchemaRegistry) -> None:
    client = client_of(schema_registry)
    schema_id = client.register_schema("orders-value", Schema(json.dumps(ORDER, indent=4), "JSON"))
    fetched = client.get_schema(schema_id)
    assert (fetched.schema_type, json.loads(fetched.schema_str or "")) == ("JSON", ORDER)
    assert fetched.schema_str == json.dumps(ORDER, separators=(",", ":")), "stored compact, as the registry does"
    latest = client.get_latest_version("orders-value")
    assert (latest.subject, latest.version, latest.schema_id) == ("orders-value", 1, schema_id)
    looked_up = client.lookup_schema("orders-value", Schema(json.dumps(ORDER), "JSON"))
    assert (looked_up.version, looked_up.schema_id) == (1, schema_id)
    assert client.get_schema(schema_id, subject_name="orders-value").schema_type == "JSON"


def test_missing_things_are_404s_with_confluents_error_codes(schema_registry: FakeSchemaRegistry) -> None:
    client = client_of(schema_registry)
    client.register_schema("users-value", avro())
    assert error_of(client.get_schema, 99) == (404, 40403)
    assert error_of(client.get_versions, "nobody") == (404, 40401)
    assert error_of(client.get_version, "nobody", 1) == (404, 40401)
    assert error_of(client.get_version, "users-value", 2) == (404, 40402)
    assert error_of(client.get_version, "users-value", 0) == (422, 42202)
    assert error_of(client.lookup_schema, "nobody", avro()) == (404, 40401)
    assert error_of(client.lookup_schema, "users-value", avro({**USER, "name": "X"})) == (404, 40403)


def test_invalid_schemas_are_refused_with_42201(schema_registry: FakeSchemaRegistry) -> None:
    client = client_of(schema_registry)
    unknown_type = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "shop.Nowhere"}]}
    assert error_of(client.register_schema, "s", avro(unknown_type)) == (422, 42201)
    assert error_of(client.register_schema, "s", Schema("{not json", "AVRO")) == (422, 42201)
    assert error_of(client.register_schema, "s", Schema('{"type": 12}', "JSON")) == (422, 42201)
    assert error_of(client.register_schema, "s", Schema("", "PROTOBUF")) == (422, 42201)
    dangling = [SchemaReference("shop.Address", "address-value", 1)]
    assert error_of(client.register_schema, "s", avro(USER, dangling)) == (422, 42201)
    assert schema_registry.subjects() == []


def test_references_resolve_named_types_from_other_subjects(schema_registry: FakeSchemaRegistry) -> None:
    client = client_of(schema_registry)
    address = {"type": "record", "name": "Address", "namespace": "shop", "fields": [{"name": "street",
                                                                                      "type": "string"}]}
    client.register_schema("address-value", avro(address))
    customer = {"type": "record", "name": "Customer", "namespace": "shop",
                "fields": [{"name": "address", "type": "shop.Address"}]}
    assert error_of(client.register_schema, "customer-value", avro(customer)) == (422, 42201)
    reference = SchemaReference("shop.Address", "address-value", 1)
    schema_id = client.register_schema("customer-value", avro(customer, [reference]))
    fetched = client.get_schema(schema_id)
    assert [(r.name, r.subject, r.version) for r in fetched.references or []] == [("shop.Address", "address-value", 1)]
    assert client.get_referenced_by("address-value", 1) == [schema_id]


def test_compatibility_config_and_checks(schema_registry: FakeSchemaRegistry) -> None:
    client = client_of(schema_registry)
    client.register_schema("users-value", avro())
    assert client.get_compatibility() == "BACKWARD"
    assert error_of(client.get_compatibility, "users-value") == (404, 40408)
    assert client.set_compatibility("users-value", "full") == {"compatibility": "FULL"}
    assert client.get_compatibility("users-value") == "FULL"
    assert error_of(client.set_compatibility, None, "SIDEWAYS") == (422, 42203)
    assert client.test_compatibility("users-value", avro({**USER, "doc": "v2"})) is True
    assert error_of(client.test_compatibility, "users-value", avro(), 9) == (404, 40402)


def test_deletes_are_soft_first_then_permanent(schema_registry: FakeSchemaRegistry) -> None:
    client = client_of(schema_registry)
    schema_id = client.register_schema("users-value", avro())
    assert error_of(client.delete_subject, "users-value", True) == (404, 40405)
    assert client.delete_subject("users-value") == [1]
    assert client.get_subjects() == [] and client.get_subjects(deleted=True) == ["users-value"]
    assert error_of(client.delete_subject, "users-value") == (404, 40404)
    assert client.delete_subject("users-value", permanent=True) == [1]
    assert client.get_schema(schema_id).schema_str, "ids stay readable after their subject is gone"
    assert client_of(schema_registry).register_schema("users-value", avro()) == schema_id


def test_unknown_endpoints_and_methods_answer_as_jersey_does(schema_registry: FakeSchemaRegistry) -> None:
    def status(method: str, path: str) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(schema_registry.url + path, method=method)
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    assert status("GET", "/no/such/thing") == (404, {"error_code": 404, "message": "HTTP 404 Not Found"})
    assert status("PUT", "/schemas/types") == (405, {"error_code": 405, "message": "HTTP 405 Method Not Allowed"})
    assert status("GET", "/schemas/types") == (200, ["AVRO", "JSON", "PROTOBUF"])  # type: ignore[comparison-overlap]
