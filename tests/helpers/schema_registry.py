"""A fake Confluent Schema Registry for the specifications: Confluent's REST API, in memory, in a thread.

It answers what confluent-kafka's ``SchemaRegistryClient`` and its Avro/JSON/Protobuf serializers call,
with the status codes, error codes (``{"error_code": N, "message": "..."}``) and response bodies of the
real registry (``io.confluent.kafka.schemaregistry.rest``), so the formats are specified against the
protocol and not against a stub that agrees with them:

==========================================================  =================================================
``POST /subjects/{s}/versions``                              register: ``{"id": N}``; the same schema again
                                                             (in any subject) has the same id, and is no new
                                                             version where the subject already has it;
                                                             ``schemaType`` AVRO (default), JSON, PROTOBUF;
                                                             ``references`` [{name, subject, version}]
``POST /subjects/{s}``                                       look up: 40401 unknown subject, 40403 not there
``GET /schemas/ids/{id}[?subject=]``, ``.../schema``         40403 unknown id
``GET /schemas/ids/{id}/versions``, ``.../subjects``
``GET /schemas/types``, ``GET /subjects``                    (``deleted=true`` includes soft-deleted ones)
``GET /subjects/{s}/versions``                               40401
``GET /subjects/{s}/versions/{v|latest|-1}[/schema]``        40401, 40402 unknown version, 42202 invalid one
``GET /subjects/{s}/versions/{v}/referencedby``
``DELETE /subjects/{s}[/versions/{v}][?permanent=true]``     soft, then permanent (40404-40407 as Confluent)
``GET/PUT /config``, ``GET/PUT/DELETE /config/{s}``          ``{"compatibilityLevel": ...}`` / 40408 / 42203
``POST /compatibility/subjects/{s}/versions[/{v}]``          ``{"is_compatible": true}``
``GET /mode``, ``GET /contexts``
anything else                                                404 / 405 as Jersey answers them
==========================================================  =================================================

Schemas are checked as the registry checks them (422, error code 42201): Avro by fastavro's parser with
the named types of its references, JSON Schema by its metaschema (jsonschema), Protobuf only for being
non-empty text (there is no protobuf compiler here). Dedup compares the canonical form: Avro and JSON are
compared as compact JSON (Avro with sorted keys, since Avro attributes have no order), Protobuf with
whitespace collapsed. What is stored and returned is the compact JSON, as the real registry returns it.

Deliberately not modelled: compatibility rules (every check answers compatible, registration never 409),
contexts, modes other than READWRITE, auth, and metadata/rule sets (accepted and ignored).
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self, cast
from urllib.parse import parse_qs, unquote, urlparse

import fastavro
import pytest
from jsonschema.exceptions import SchemaError as JsonSchemaError
from jsonschema.validators import Draft7Validator, validator_for

SCHEMA_TYPES = ("AVRO", "JSON", "PROTOBUF")
COMPATIBILITY_LEVELS = ("NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL",
                        "FULL_TRANSITIVE")
_MAX_VERSION = 2**31 - 1
_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class ApiError(Exception):
    """An error answer: HTTP ``status`` with Confluent's ``error_code`` and ``message``."""

    def __init__(self, status: int, error_code: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code
        self.message = message


def _subject_not_found(subject: str) -> ApiError:
    return ApiError(404, 40401, f"Subject '{subject}' not found.")


def _version_not_found(version: object) -> ApiError:
    return ApiError(404, 40402, f"Version {version} not found.")


def _invalid_schema(detail: str) -> ApiError:
    return ApiError(422, 42201, f"Invalid schema: {detail}")


@dataclass(frozen=True)
class Reference:
    """A schema reference: the ``name`` the referring schema uses for ``subject`` at ``version``."""

    name: str
    subject: str
    version: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "subject": self.subject, "version": self.version}


@dataclass(frozen=True)
class StoredSchema:
    """A schema as the registry keeps it: one id for one (type, canonical text, references)."""

    schema_id: int
    schema_type: str
    text: str
    references: tuple[Reference, ...]

    def to_json(self) -> dict[str, Any]:
        """The fields ``GET /schemas/ids/{id}`` answers (schemaType and references only when not default)."""
        body: dict[str, Any] = {"schema": self.text}
        if self.schema_type != "AVRO":
            body["schemaType"] = self.schema_type
        if self.references:
            body["references"] = [ref.to_json() for ref in self.references]
        return body


@dataclass
class _Version:
    number: int
    schema_id: int
    deleted: bool = False


@dataclass
class _Subject:
    versions: list[_Version] = field(default_factory=list)
    compatibility: str | None = None

    def live(self, deleted: bool = False) -> list[_Version]:
        return [v for v in self.versions if deleted or not v.deleted]


class RegistryState:
    """The registry's contents; every method runs under one lock, as requests arrive on several threads."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.schemas: dict[int, StoredSchema] = {}
            self.ids_by_identity: dict[tuple[str, str, tuple[Reference, ...]], int] = {}
            self.subjects: dict[str, _Subject] = {}
            self.compatibility = "BACKWARD"
            self.next_id = 1

    # -- writes ----------------------------------------------------------------------------------------------

    def register(self, subject: str, body: Mapping[str, Any], forced_id: int | None = None) -> int:
        with self.lock:
            candidate = self.candidate(body)
            schema_id = self.ids_by_identity.get(self._identity(candidate))
            entry = self.subjects.setdefault(subject, _Subject())
            if schema_id is not None and any(v.schema_id == schema_id for v in entry.live()):
                return schema_id
            if schema_id is None:
                schema_id = self._store(candidate, forced_id)
            number = max((v.number for v in entry.versions), default=0) + 1
            entry.versions.append(_Version(number, schema_id))
            return schema_id

    def _store(self, candidate: StoredSchema, forced_id: int | None) -> int:
        schema_id = forced_id if forced_id is not None else self.next_id
        if schema_id in self.schemas:
            raise ApiError(422, 42207, f"Schema id {schema_id} is already used by another schema")
        self.schemas[schema_id] = StoredSchema(schema_id, candidate.schema_type, candidate.text,
                                               candidate.references)
        self.ids_by_identity[self._identity(candidate)] = schema_id
        self.next_id = max(self.next_id, schema_id + 1)
        return schema_id

    def delete_subject(self, subject: str, permanent: bool) -> list[int]:
        with self.lock:
            entry = self._subject(subject, deleted=True)
            if permanent:
                if entry.live():
                    raise ApiError(404, 40405, f"Subject '{subject}' was not deleted first before being "
                                               "permanently deleted")
                del self.subjects[subject]
                return [v.number for v in entry.versions]
            if not entry.live():
                raise ApiError(404, 40404, f"Subject '{subject}' was soft deleted.Set permanent=true to delete "
                                           "permanently")
            numbers = [v.number for v in entry.live()]
            for version in entry.versions:
                version.deleted = True
            return numbers

    def delete_version(self, subject: str, version: str, permanent: bool) -> int:
        with self.lock:
            entry = self._subject(subject, deleted=True)
            found = self._version(entry, subject, version, deleted=True)
            if not permanent:
                if found.deleted:
                    raise ApiError(404, 40406, f"Subject '{subject}' Version {found.number} was soft deleted.Set "
                                               "permanent=true to delete permanently")
                found.deleted = True
                return found.number
            if not found.deleted:
                raise ApiError(404, 40407, f"Subject '{subject}' Version {found.number} was not deleted "
                                           "first before being permanently deleted")
            entry.versions.remove(found)
            if not entry.versions:
                del self.subjects[subject]
            return found.number

    # -- reads -----------------------------------------------------------------------------------------------

    def lookup(self, subject: str, body: Mapping[str, Any], deleted: bool) -> dict[str, Any]:
        with self.lock:
            candidate = self.candidate(body)
            entry = self.subjects.get(subject)
            if entry is None or not entry.live(deleted):
                raise _subject_not_found(subject)
            schema_id = self.ids_by_identity.get(self._identity(candidate))
            match = next((v for v in reversed(entry.live(deleted)) if v.schema_id == schema_id), None)
            if match is None:
                raise ApiError(404, 40403, "Schema not found")
            return self.version_json(subject, match)

    def schema(self, schema_id: int) -> StoredSchema:
        with self.lock:
            found = self.schemas.get(schema_id)
            if found is None:
                raise ApiError(404, 40403, f"Schema {schema_id} not found")
            return found

    def subject_version(self, subject: str, version: str, deleted: bool = False) -> dict[str, Any]:
        with self.lock:
            entry = self._subject(subject, deleted)
            return self.version_json(subject, self._version(entry, subject, version, deleted))

    def versions_of(self, subject: str, deleted: bool = False) -> list[int]:
        with self.lock:
            return [v.number for v in self._subject(subject, deleted).live(deleted)]

    def subject_names(self, deleted: bool = False, prefix: str = "") -> list[str]:
        with self.lock:
            return sorted(name for name, entry in self.subjects.items()
                          if entry.live(deleted) and name.startswith(prefix))

    def usages(self, schema_id: int, deleted: bool = False) -> list[dict[str, Any]]:
        with self.lock:
            self.schema(schema_id)
            return [{"subject": name, "version": v.number} for name, entry in sorted(self.subjects.items())
                    for v in entry.live(deleted) if v.schema_id == schema_id]

    def referenced_by(self, subject: str, version: str) -> list[int]:
        with self.lock:
            number = self._version(self._subject(subject), subject, version).number
            return sorted(stored.schema_id for stored in self.schemas.values()
                          if (subject, number) in {(ref.subject, ref.version) for ref in stored.references})

    def version_json(self, subject: str, version: _Version) -> dict[str, Any]:
        return {"subject": subject, "version": version.number, "id": version.schema_id,
                **self.schemas[version.schema_id].to_json()}

    def _subject(self, subject: str, deleted: bool = False) -> _Subject:
        entry = self.subjects.get(subject)
        if entry is None or not entry.live(deleted):
            raise _subject_not_found(subject)
        return entry

    def _version(self, entry: _Subject, subject: str, version: str, deleted: bool = False) -> _Version:
        live = entry.live(deleted)
        if version in ("latest", "-1"):
            return live[-1]
        number = _version_number(version)
        found = next((v for v in live if v.number == number), None)
        if found is None:
            raise _version_not_found(number)
        return found

    # -- schema checks ---------------------------------------------------------------------------------------

    def candidate(self, body: Mapping[str, Any]) -> StoredSchema:
        """The schema a register/look-up/compatibility request carries, checked as the registry checks it."""
        text = body.get("schema")
        if not isinstance(text, str) or not text.strip():
            raise _invalid_schema("Empty schema")
        schema_type = body.get("schemaType") or "AVRO"
        if schema_type not in SCHEMA_TYPES:
            raise _invalid_schema(f"unknown schema type {schema_type!r}, expected one of {', '.join(SCHEMA_TYPES)}")
        references = tuple(self._reference(raw) for raw in body.get("references") or [])
        return StoredSchema(0, schema_type, _checked_text(schema_type, text, self._referenced(references)),
                            references)

    def _reference(self, raw: Any) -> Reference:
        if not isinstance(raw, dict) or not {"name", "subject", "version"} <= raw.keys():
            raise _invalid_schema(f"a reference needs name, subject and version, got {raw!r}")
        reference = Reference(str(raw["name"]), str(raw["subject"]), int(raw["version"]))
        try:
            self._version(self._subject(reference.subject), reference.subject, str(reference.version))
        except ApiError as exc:
            raise _invalid_schema(f"reference '{reference.name}' cannot be resolved: {exc.message}") from exc
        return reference

    def _referenced(self, references: Sequence[Reference]) -> list[StoredSchema]:
        """Every schema ``references`` lead to, depth first (so named types are defined before use)."""
        found: list[StoredSchema] = []
        for reference in references:
            schema_id = self._version(self._subject(reference.subject), reference.subject,
                                      str(reference.version)).schema_id
            stored = self.schemas[schema_id]
            found.extend(self._referenced(stored.references))
            found.append(stored)
        return found

    @staticmethod
    def _identity(candidate: StoredSchema) -> tuple[str, str, tuple[Reference, ...]]:
        if candidate.schema_type == "PROTOBUF":
            return candidate.schema_type, " ".join(candidate.text.split()), candidate.references
        sort_keys = candidate.schema_type == "AVRO"
        canonical = json.dumps(json.loads(candidate.text), sort_keys=sort_keys, separators=(",", ":"))
        return candidate.schema_type, canonical, candidate.references


def _version_number(version: str) -> int:
    try:
        number = int(version)
    except ValueError:
        number = 0
    if not 1 <= number <= _MAX_VERSION:
        raise ApiError(422, 42202, f"The specified version '{version}' is not a valid version id. Allowed values "
                                   f"are between [1, 2^31-1] and the string \"latest\"")
    return number


def _checked_text(schema_type: str, text: str, referenced: Sequence[StoredSchema]) -> str:
    """The text the registry stores for a valid schema (compact JSON for Avro/JSON); 42201 if invalid."""
    if schema_type == "PROTOBUF":
        return text
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _invalid_schema(f"not valid JSON: {exc}") from exc
    if schema_type == "AVRO":
        _check_avro(document, referenced)
    else:
        _check_json_schema(document)
    return json.dumps(document, separators=(",", ":"))


def _check_avro(document: Any, referenced: Sequence[StoredSchema]) -> None:
    named: dict[str, Any] = {}
    try:
        for stored in referenced:
            fastavro.parse_schema(json.loads(stored.text), named_schemas=named)
        fastavro.parse_schema(document, named_schemas=named)
    except Exception as exc:  # fastavro raises several unrelated types for a bad schema
        raise _invalid_schema(f"{type(exc).__name__}: {exc}") from exc


def _check_json_schema(document: Any) -> None:
    if not isinstance(document, dict | bool):
        raise _invalid_schema(f"a JSON Schema is an object or a boolean, got {type(document).__name__}")
    try:
        # types-jsonschema wants a dict; a boolean is a valid JSON Schema too (true: anything, false: nothing)
        validator_for(document, default=Draft7Validator).check_schema(cast(dict[str, Any], document))
    except JsonSchemaError as exc:
        raise _invalid_schema(exc.message) from exc


# ------------------------------------------------------------------------------------------------- HTTP routes


@dataclass
class _Request:
    method: str
    params: tuple[str, ...]
    query: dict[str, str]
    body: Any

    def flag(self, name: str) -> bool:
        return self.query.get(name, "").lower() == "true"

    def json_object(self) -> Mapping[str, Any]:
        if not isinstance(self.body, dict):
            raise ApiError(422, 422, "Unrecognized request body: expected a JSON object")
        return self.body


Route = Callable[[RegistryState, _Request], Any]
_SEGMENT = r"([^/]+)"


def _register(state: RegistryState, request: _Request) -> Any:
    return {"id": state.register(request.params[0], request.json_object())}


def _lookup(state: RegistryState, request: _Request) -> Any:
    return state.lookup(request.params[0], request.json_object(), request.flag("deleted"))


def _delete_subject(state: RegistryState, request: _Request) -> Any:
    return state.delete_subject(request.params[0], request.flag("permanent"))


def _schema_by_id(state: RegistryState, request: _Request) -> Any:
    return state.schema(_schema_id(request.params[0])).to_json()


def _raw_schema_by_id(state: RegistryState, request: _Request) -> Any:
    return _raw(state.schema(_schema_id(request.params[0])))


def _schema_versions(state: RegistryState, request: _Request) -> Any:
    return state.usages(_schema_id(request.params[0]), request.flag("deleted"))


def _schema_subjects(state: RegistryState, request: _Request) -> Any:
    return sorted({usage["subject"] for usage in state.usages(_schema_id(request.params[0]),
                                                                request.flag("deleted"))})


def _subjects(state: RegistryState, request: _Request) -> Any:
    return state.subject_names(request.flag("deleted"), request.query.get("subjectPrefix", ""))


def _versions(state: RegistryState, request: _Request) -> Any:
    return state.versions_of(request.params[0], request.flag("deleted"))


def _version(state: RegistryState, request: _Request) -> Any:
    subject, version = request.params
    if request.method == "DELETE":
        return state.delete_version(subject, version, request.flag("permanent"))
    return state.subject_version(subject, version, request.flag("deleted"))


def _raw_version(state: RegistryState, request: _Request) -> Any:
    subject, version = request.params
    return _raw(state.schema(state.subject_version(subject, version)["id"]))


def _raw(stored: StoredSchema) -> Any:
    """The bare schema the ``.../schema`` endpoints answer: the Avro/JSON document, or the Protobuf text."""
    return stored.text if stored.schema_type == "PROTOBUF" else json.loads(stored.text)


def _referenced_by(state: RegistryState, request: _Request) -> Any:
    return state.referenced_by(*request.params)


def _global_config(state: RegistryState, request: _Request) -> Any:
    if request.method == "PUT":
        with state.lock:
            state.compatibility = _level(request)
        return {"compatibility": state.compatibility}
    return {"compatibilityLevel": state.compatibility}


def _subject_config(state: RegistryState, request: _Request) -> Any:
    subject = request.params[0]
    with state.lock:
        if request.method == "PUT":
            chosen = _level(request)
            state.subjects.setdefault(subject, _Subject()).compatibility = chosen
            return {"compatibility": chosen}
        entry = state.subjects.get(subject)
        level = entry.compatibility if entry is not None else None
        if level is None:
            if request.method == "DELETE" or not request.flag("defaultToGlobal"):
                raise ApiError(404, 40408, f"Subject '{subject}' does not have subject-level compatibility "
                                           "configured")
            return {"compatibilityLevel": state.compatibility}
        if request.method == "DELETE":
            assert entry is not None
            entry.compatibility = None
        return {"compatibilityLevel": level}


def _compatibility(state: RegistryState, request: _Request) -> Any:
    """Checks the candidate schema and that the version exists; compatibility rules are not modelled."""
    state.candidate(request.json_object())
    subject = request.params[0]
    if len(request.params) > 1:
        state.subject_version(subject, request.params[1])
    answer: dict[str, Any] = {"is_compatible": True}
    if request.flag("verbose"):
        answer["messages"] = []
    return answer


def _level(request: _Request) -> str:
    level = str(request.json_object().get("compatibility", "")).upper()
    if level not in COMPATIBILITY_LEVELS:
        raise ApiError(422, 42203, "Invalid compatibility level. Valid values are none, backward, forward, full, "
                                   "backward_transitive, forward_transitive, and full_transitive")
    return level


def _schema_id(text: str) -> int:
    if not text.isdigit():
        raise ApiError(404, 404, "HTTP 404 Not Found")
    return int(text)


ROUTES: list[tuple[re.Pattern[str], dict[str, Route]]] = [
    (re.compile(pattern), methods) for pattern, methods in [
        (r"/schemas/types", {"GET": lambda state, request: list(SCHEMA_TYPES)}),
        (rf"/schemas/ids/{_SEGMENT}", {"GET": _schema_by_id}),
        (rf"/schemas/ids/{_SEGMENT}/schema", {"GET": _raw_schema_by_id}),
        (rf"/schemas/ids/{_SEGMENT}/versions", {"GET": _schema_versions}),
        (rf"/schemas/ids/{_SEGMENT}/subjects", {"GET": _schema_subjects}),
        (r"/subjects", {"GET": _subjects}),
        (rf"/subjects/{_SEGMENT}", {"POST": _lookup, "DELETE": _delete_subject}),
        (rf"/subjects/{_SEGMENT}/versions", {"GET": _versions, "POST": _register}),
        (rf"/subjects/{_SEGMENT}/versions/{_SEGMENT}", {"GET": _version, "DELETE": _version}),
        (rf"/subjects/{_SEGMENT}/versions/{_SEGMENT}/schema", {"GET": _raw_version}),
        (rf"/subjects/{_SEGMENT}/versions/{_SEGMENT}/referencedby", {"GET": _referenced_by}),
        (r"/config", {"GET": _global_config, "PUT": _global_config}),
        (rf"/config/{_SEGMENT}", {"GET": _subject_config, "PUT": _subject_config, "DELETE": _subject_config}),
        (rf"/compatibility/subjects/{_SEGMENT}/versions", {"POST": _compatibility}),
        (rf"/compatibility/subjects/{_SEGMENT}/versions/{_SEGMENT}", {"POST": _compatibility}),
        (r"/mode", {"GET": lambda state, request: {"mode": "READWRITE"}}),
        (r"/contexts", {"GET": lambda state, request: ["."]}),
    ]
]


def answer(state: RegistryState, method: str, target: str, body: Any) -> tuple[int, Any]:
    """The status and JSON body the registry answers ``method target`` (path and query) with."""
    parsed = urlparse(target)
    path = parsed.path.rstrip("/") or "/"
    query = {name: values[-1] for name, values in parse_qs(parsed.query).items()}
    for pattern, methods in ROUTES:
        matched = pattern.fullmatch(path)
        if matched is None:
            continue
        route = methods.get(method)
        if route is None:
            return 405, {"error_code": 405, "message": "HTTP 405 Method Not Allowed"}
        params = tuple(unquote(group) for group in matched.groups())
        try:
            return 200, route(state, _Request(method, params, query, body))
        except ApiError as exc:
            return exc.status, {"error_code": exc.error_code, "message": exc.message}
    return 404, {"error_code": 404, "message": "HTTP 404 Not Found"}


# ------------------------------------------------------------------------------------------------- server


class FakeSchemaRegistry:
    """The fake registry on 127.0.0.1 and a free port, serving from a daemon thread while entered.

    ``requests`` lists every request as ``"METHOD /path"`` (no query), for tests that count round trips.
    ``register`` puts a schema in directly, as a producer would have; ``stop`` is an outage: the port
    refuses connections and open keep-alive connections are cut.
    """

    def __init__(self) -> None:
        self.state = RegistryState()
        self.requests: list[str] = []
        self._connections: set[socket.socket] = set()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_class(self))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"fake-schema-registry-{self.server.server_address[1]}", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self._thread.is_alive():
            self.server.shutdown()
            self._thread.join(timeout=5)
        self.server.server_close()
        for connection in list(self._connections):
            _cut(connection)

    def register(self, subject: str, schema: str | Mapping[str, Any] | Sequence[Any],
                 schema_type: str = "AVRO", references: Sequence[Reference | Mapping[str, Any]] = (), *,
                 schema_id: int | None = None) -> int:
        """Register ``schema`` (text, or a JSON document) under ``subject`` as ``POST .../versions`` does.

        ``references`` are ``Reference``s or ``{"name", "subject", "version"}`` dicts, as in the REST body.
        ``schema_id`` chooses the id of a new schema, as a registry in IMPORT mode allows. Invalid schemas
        raise ``ApiError`` with the registry's error code.
        """
        text = schema if isinstance(schema, str) else json.dumps(schema)
        body = {"schema": text, "schemaType": schema_type,
                "references": [ref.to_json() if isinstance(ref, Reference) else dict(ref) for ref in references]}
        return self.state.register(subject, body, forced_id=schema_id)

    def schema(self, schema_id: int) -> StoredSchema:
        return self.state.schema(schema_id)

    def subjects(self) -> list[str]:
        return self.state.subject_names()

    def versions(self, subject: str) -> list[int]:
        return self.state.versions_of(subject)

    def latest(self, subject: str) -> StoredSchema:
        return self.state.schema(self.state.subject_version(subject, "latest")["id"])

    def track(self, connection: socket.socket, open_: bool) -> None:
        if open_:
            self._connections.add(connection)
        else:
            self._connections.discard(connection)


def _cut(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed by the client
        connection.shutdown(socket.SHUT_RDWR)


def _handler_class(registry: FakeSchemaRegistry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the real registry (and httpx's connection pool) use
        disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall

        def setup(self) -> None:
            super().setup()
            registry.track(self.connection, open_=True)

        def finish(self) -> None:
            registry.track(self.connection, open_=False)
            super().finish()

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

        def _serve(self, method: str) -> None:
            registry.requests.append(f"{method} {urlparse(self.path).path}")
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except json.JSONDecodeError as exc:
                self._send(400, {"error_code": 400, "message": f"Unrecognized JSON: {exc}"})
                return
            self._send(*answer(registry.state, method, self.path, body))

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", _CONTENT_TYPE)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def schema_registry() -> Iterator[FakeSchemaRegistry]:
    """A fresh, empty fake registry per test (starting one takes about a millisecond)."""
    with FakeSchemaRegistry() as registry:
        yield registry
