"""The worker's REST API: Kafka Connect's paths and status codes over epochline's connectors.

Every answer comes from the cluster's topics and the connectors' consumer groups, so every worker answers
for all; a change is a record written to ``<cluster>-configs`` that every worker's supervisor acts on.
Bodies are JSON, or YAML with ``Content-Type: application/yaml``, at most ``MAX_BODY_BYTES``; YAML is read
with the bounds of ``engine.bounded_yaml``, so no body holds the API or answers 500. Errors are
``{"error_code": <status>, "message": <reason>}`` as in Connect. Configs are shown with secret-looking values
redacted (``engine.secrets``): references (``${env:NAME}``) are shown as written, never resolved here.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from importlib.resources import files
from typing import Annotated, Any, Protocol, TypeVar

import orjson
import yaml
from fastapi import FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from connectors.admin import GroupNotEmpty, StoredRecord, TopicAdminError
from connectors.dead_letter import described
from engine.bounded_yaml import MAX_YAML_BYTES, read_yaml
from engine.config import ConfigError
from engine.names import InvalidName, check_name
from engine.secrets import SecretReferenceError, redacted_tree
from engine.worker.errors import RecordTooLarge, StoreError
from engine.worker.guard import LOOPBACK, YAML_TYPES, RequestGuard, media_type
from engine.worker.history import ConnectorHistory
from engine.worker.kafka_ops import ConnectorKafka
from engine.worker.records import ConnectorRecord, TargetState
from engine.worker.store import ClusterStore
from engine.worker.task_config import field_problems, keyed_state_change, with_name
from engine.worker.view import GroupView, connector_view, health_problem, live_tasks

MAX_BODY_BYTES = MAX_YAML_BYTES
MAX_DEAD_LETTERS = 100
"""The most dead letters ``GET /connectors/{name}/dead-letters`` reads at once (``?limit=``, default 20)."""
PREVIEW_CHARS = 300
"""How much of a dead letter's key and value the API shows (as text): enough to recognise the record."""
VERSION = "0.1.0"
T = TypeVar("T")
log = logging.getLogger(__name__)


class GroupSource(Protocol):
    def read(self, record: ConnectorRecord) -> GroupView | None: ...


@dataclass
class WorkerContext:
    """What the API answers from: the shared store, the groups, Kafka operations, and this worker's names."""

    store: ClusterStore
    groups: GroupSource
    kafka: ConnectorKafka
    worker_id: str
    cluster: str
    kafka_cluster_id: str | None
    token: str | None
    metrics: Callable[[], bytes]
    supervising: Callable[[], bool] = lambda: True
    """False when this worker's supervisor has stopped (its tasks with it): the worker is then unhealthy."""
    guard: RequestGuard = LOOPBACK
    """Which hosts the API answers to (``engine.worker.guard``)."""
    history: ConnectorHistory = field(default_factory=ConnectorHistory)
    """The connectors' recent throughput and lag, sampled by the worker (``engine.worker.history``)."""


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def create_app(context: WorkerContext) -> FastAPI:
    app = FastAPI(title="epochline worker", version=VERSION, docs_url=None, redoc_url=None, openapi_url=None)
    api = _Api(context)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, error: ApiError) -> JSONResponse:
        return JSONResponse({"error_code": error.status, "message": error.message}, status_code=error.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error_code": error.status_code, "message": str(error.detail)},
                            status_code=error.status_code, headers=error.headers)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, error: RequestValidationError) -> JSONResponse:
        details = "; ".join(f"{'.'.join(str(part) for part in problem['loc'][1:])}: {problem['msg']}"
                            for problem in error.errors())
        return JSONResponse({"error_code": 400, "message": f"invalid request: {details}"}, status_code=400)

    @app.exception_handler(RecordTooLarge)
    async def _too_large_to_store(request: Request, error: RecordTooLarge) -> JSONResponse:
        message = f"the connector config is too large to store: {error}"
        return JSONResponse({"error_code": 400, "message": message}, status_code=400)

    @app.exception_handler(StoreError)
    async def _store_error(request: Request, error: StoreError) -> JSONResponse:
        return JSONResponse({"error_code": 503, "message": str(error)}, status_code=503)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> JSONResponse:
        log.exception("the API failed", extra={"path": request.url.path})
        return JSONResponse({"error_code": 500, "message": f"{type(error).__name__}: {error}"}, status_code=500)

    _check_requests(app, context)

    @app.get("/")
    def root() -> dict[str, Any]:
        return {"version": VERSION, "kafka_cluster_id": context.kafka_cluster_id, "cluster": context.cluster,
                "worker_id": context.worker_id}

    @app.get("/connectors", response_model=None)
    def list_connectors(expand: Annotated[list[str] | None, Query()] = None) -> list[str] | dict[str, Any]:
        records = context.store.connectors()
        if not expand:
            return sorted(records)
        return {name: api.expanded(records[name], expand) for name in sorted(records)}

    @app.post("/connectors", status_code=201)
    async def create(request: Request) -> dict[str, Any]:
        body = await _body(request)
        if not isinstance(body, dict) or not isinstance(body.get("name"), str) or \
                not isinstance(body.get("config"), dict):
            raise ApiError(400, 'the body must be {"name": <connector name>, "config": {<connector config>}}')
        return await run_in_threadpool(api.create, body["name"], body["config"])

    @app.get("/connectors/{name}")
    def info(name: str) -> dict[str, Any]:
        return api.info(api.record(name))

    @app.get("/connectors/{name}/config")
    def get_config(name: str) -> dict[str, Any]:
        return dict(redacted_tree(api.record(name).config))

    @app.put("/connectors/{name}/config")
    async def put_config(name: str, request: Request, response: Response, reset_state: bool = False) -> dict[str, Any]:
        body = await _body(request)
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be the connector config, a mapping of keys")
        created, result = await run_in_threadpool(api.put, name, body, reset_state)
        response.status_code = 201 if created else 200
        return result

    @app.delete("/connectors/{name}", status_code=204)
    def delete(name: str) -> Response:
        api.delete(name)
        return Response(status_code=204)

    @app.get("/connectors/{name}/status")
    def status(name: str) -> dict[str, Any]:
        return api.status(api.record(name))

    targets: tuple[tuple[str, TargetState], ...] = (("pause", "PAUSED"), ("resume", "RUNNING"), ("stop", "STOPPED"))
    for action, target in targets:
        app.put(f"/connectors/{{name}}/{action}", status_code=202)(_target_route(api, target))

    @app.post("/connectors/{name}/restart", status_code=202)
    def restart(name: str, includeTasks: bool = False, onlyFailed: bool = False) -> dict[str, Any]:
        """``includeTasks`` is accepted for Connect's clients: a connector's tasks are its only moving part,
        so a restart always restarts them (``onlyFailed`` spares the healthy ones)."""
        return api.restart(name, only_failed=onlyFailed)

    @app.get("/connectors/{name}/offsets")
    def offsets(name: str) -> dict[str, Any]:
        return api.offsets(api.record(name))

    @app.get("/connectors/{name}/history")
    def history(name: str) -> dict[str, Any]:
        return context.history.series(api.record(name).name)

    @app.get("/connectors/{name}/dead-letters")
    def dead_letters(name: str, limit: Annotated[int, Query(ge=1, le=MAX_DEAD_LETTERS)] = 20) -> dict[str, Any]:
        return api.dead_letters(api.record(name), limit)

    @app.patch("/connectors/{name}/offsets")
    async def alter_offsets(name: str, request: Request) -> dict[str, Any]:
        body = await _body(request)
        return await run_in_threadpool(api.alter_offsets, name, body)

    @app.delete("/connectors/{name}/offsets")
    def reset_offsets(name: str) -> dict[str, Any]:
        return api.reset_offsets(name)

    @app.put("/connector-plugins/connector/config/validate")
    async def validate(request: Request) -> dict[str, Any]:
        body = await _body(request)
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be the connector config, a mapping of keys")
        return await run_in_threadpool(validation_report, body)

    @app.get("/health")
    def health() -> JSONResponse:
        problems = api.health()
        return JSONResponse({"status": "unhealthy" if problems else "healthy", "problems": problems},
                            status_code=503 if problems else 200)

    @app.get("/ui", response_class=HTMLResponse)
    def ui() -> str:
        return files("engine.worker").joinpath("ui/index.html").read_text()

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(context.metrics(), media_type="text/plain; version=0.0.4")

    return app


def _target_route(api: _Api, target: TargetState) -> Callable[[str], Response]:
    def change_target(name: str) -> Response:
        api.set_target(name, target)
        return Response(status_code=202)

    change_target.__name__ = f"target_{target.lower()}"
    return change_target


def _authorized(request: Request, token: str) -> bool:
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def _check_requests(app: FastAPI, context: WorkerContext) -> None:
    """The guard (``engine.worker.guard``) first, then the token: both before any endpoint runs."""
    @app.middleware("http")
    async def _require_token(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if context.token is not None and request.url.path != "/ui" and not _authorized(request, context.token):
            return JSONResponse({"error_code": 401, "message": "missing or wrong bearer token (Authorization: "
                                 "Bearer <token>)"}, status_code=401, headers={"WWW-Authenticate": "Bearer"})
        return await call_next(request)

    @app.middleware("http")  # added last, so it runs first: before the token, before any endpoint
    async def _guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        has_body = request.headers.get("content-length", "0") not in ("", "0") or "transfer-encoding" in request.headers
        refused = context.guard.refusal(request.method, request.headers, has_body)
        if refused is not None:
            log.warning("request refused", extra={"method": request.method, "path": request.url.path,
                                                  "status": refused.status, "reason": refused.message})
            return JSONResponse({"error_code": refused.status, "message": refused.message},
                                status_code=refused.status)
        return await call_next(request)


async def _body(request: Request) -> Any:
    """The body as JSON, or YAML by content type (parsed off the event loop, with the bounds of
    ``engine.bounded_yaml``); too large or unreadable is an error naming why. Reading stops at the limit, so
    a huge body is never held whole."""
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise ApiError(413, f"the body has more than {MAX_BODY_BYTES} bytes (a connector config has kilobytes)")
    return await run_in_threadpool(_parsed, bytes(raw),
                                   media_type(request.headers, "application/json") in YAML_TYPES)


def _parsed(raw: bytes, is_yaml: bool) -> Any:
    try:
        return read_yaml(raw) if is_yaml else orjson.loads(raw or b"null")
    except (yaml.YAMLError, orjson.JSONDecodeError) as error:
        raise ApiError(400, f"the body is not valid {'YAML' if is_yaml else 'JSON'}: {error}") from None


def validation_report(config: dict[str, Any]) -> dict[str, Any]:
    """Connect's validate answer: per field, the errors ``epochline validate`` finds offline."""
    by_field: dict[str, list[str]] = {}
    for name, message in field_problems({"name": "connector", **config}):
        by_field.setdefault(name, []).append(message)
    return {"name": "connector", "error_count": sum(len(errors) for errors in by_field.values()),
            "configs": [{"value": {"name": field, "errors": errors}} for field, errors in by_field.items()]}


class _Api:
    """The endpoints' logic, synchronous (FastAPI runs it off the event loop)."""

    def __init__(self, context: WorkerContext) -> None:
        self._context = context

    def record(self, name: str) -> ConnectorRecord:
        record = self._context.store.connectors().get(name)
        if record is None:
            raise ApiError(404, f"connector {name!r} not found")
        return record

    def info(self, record: ConnectorRecord) -> dict[str, Any]:
        tasks = live_tasks(record.name, self._context.store.statuses())
        return {"name": record.name, "config": redacted_tree(record.config),
                "tasks": [{"connector": record.name, "task": task.worker_id} for task in tasks], "type": "source"}

    def status(self, record: ConnectorRecord) -> dict[str, Any]:
        return connector_view(record, self._context.store.statuses(), self._context.groups.read(record))

    def expanded(self, record: ConnectorRecord, expand: list[str]) -> dict[str, Any]:
        answer: dict[str, Any] = {}
        if "status" in expand:
            answer["status"] = self.status(record)
        if "info" in expand:
            answer["info"] = self.info(record)
        return answer

    def create(self, name: str, config: dict[str, Any]) -> dict[str, Any]:
        if name in self._context.store.connectors():
            raise ApiError(409, f"connector {name!r} already exists")
        record = ConnectorRecord(name, self._valid(name, config))
        self._context.store.put_connector(record)
        return self.info(record)

    def put(self, name: str, config: dict[str, Any], reset_state: bool) -> tuple[bool, dict[str, Any]]:
        config = self._valid(name, config)
        existing = self._context.store.connectors().get(name)
        if existing is None:
            record = ConnectorRecord(name, config)
            self._context.store.put_connector(record)
            return True, self.info(record)
        if existing.config == config:
            return False, self.info(existing)
        change = keyed_state_change(existing.config, config)
        if change is not None:
            if not reset_state:
                raise ApiError(409, f"connector {name!r}: {change}")
            self._reset_state(existing)
        record = replace(existing, config=config, version=existing.version + 1)
        self._context.store.put_connector(record)
        return False, self.info(record)

    def delete(self, name: str) -> None:
        record = self.record(name)
        self._context.store.delete_connector(name)
        for task in self._context.store.statuses():
            if task.connector == record.name:
                self._context.store.delete_status(task.connector, task.worker_id)

    def set_target(self, name: str, target: TargetState) -> None:
        record = self.record(name)
        if record.target != target:
            self._context.store.put_connector(record.with_target(target))

    def restart(self, name: str, only_failed: bool) -> dict[str, Any]:
        record = self.record(name)
        record = replace(record, restart=record.restart + 1, restart_only_failed=only_failed)
        self._context.store.put_connector(record)
        return self.status(record)

    def offsets(self, record: ConnectorRecord) -> dict[str, Any]:
        group = self._context.groups.read(record)
        if group is None:
            raise ApiError(503, f"connector {record.name!r}: its consumer group cannot be read now")
        return {"offsets": [{"partition": {"kafka_topic": p.topic, "kafka_partition": p.partition},
                             "offset": {"kafka_offset": p.committed}}
                            for p in group.status.partitions if p.role == "source" and p.committed is not None]}

    def dead_letters(self, record: ConnectorRecord, limit: int) -> dict[str, Any]:
        """The connector's last ``limit`` committed dead letters, newest first, each with why it failed."""
        topic = (record.config.get("dead_letter") or {}).get("topic")
        if not topic:
            return {"topic": None, "dead_letters": []}
        found = self._on_kafka(lambda: self._context.kafka.last_records(topic, limit))
        return {"topic": topic, "dead_letters": [_dead_letter_view(stored) for stored in found]}

    def alter_offsets(self, name: str, body: Any) -> dict[str, Any]:
        record = self._stopped(name, "its offsets can only be changed while it is STOPPED")
        self._without_keyed_state(record, "moving its offsets")
        offsets = _offsets_body(body)
        inputs = {record.config["source"]["topic"], f"{name}-repartition"}
        foreign = sorted({topic for topic, _, _ in offsets} - inputs)
        if foreign:
            raise ApiError(400, f"connector {name!r} does not read topic(s) {foreign}: it reads {sorted(inputs)}")
        self._on_kafka(lambda: self._context.kafka.alter_offsets(record, offsets))
        return {"message": f"the offsets of {len(offsets)} partition(s) of connector {name!r} were altered; "
                           "it resumes from them"}

    def reset_offsets(self, name: str) -> dict[str, Any]:
        record = self._stopped(name, "its offsets can only be reset while it is STOPPED")
        self._without_keyed_state(record, "reprocessing from the start")
        existed = self._on_kafka(lambda: self._context.kafka.reset_offsets(record))
        return {"message": f"the committed offsets of connector {name!r} were reset" if existed else
                           f"connector {name!r} had no committed offsets"}

    def health(self) -> list[str]:
        problems = [] if self._context.supervising() else [f"worker {self._context.worker_id}: its supervisor "
                                                           "has stopped, so none of its tasks runs"]
        statuses = self._context.store.statuses()
        for record in self._context.store.connectors().values():
            group = self._context.groups.read(record) if record.target == "RUNNING" else None
            problem = health_problem(record, connector_view(record, statuses, group), group)
            if problem is not None:
                problems.append(problem)
        return problems

    def _valid(self, name: str, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` named ``name``, if both pass every check ``epochline validate`` makes offline; else a 400
        listing every problem."""
        try:
            named = with_name(config, check_name(name), f"connector {name!r}")
        except (InvalidName, ConfigError) as error:
            raise ApiError(400, str(error)) from None
        problems = field_problems(named)
        if problems:
            details = "; ".join(f"{field}: {message}" for field, message in problems)
            raise ApiError(400, f"connector {name!r}: invalid config: {details}")
        return named

    def _stopped(self, name: str, why: str) -> ConnectorRecord:
        record = self.record(name)
        running = [task.worker_id for task in live_tasks(name, self._context.store.statuses())
                   if task.state not in ("STOPPED", "FAILED")]
        if record.target != "STOPPED" or running:
            raise ApiError(409, f"connector {name!r} is {record.target}" +
                           (f" with task(s) on {running} not stopped yet" if running else "") + f": {why}")
        return record

    def _without_keyed_state(self, record: ConnectorRecord, what: str) -> None:
        if keyed_state_change(record.config, {}) is not None:
            raise ApiError(409, f"connector {record.name!r} keeps keyed state (window steps): {what} would mix "
                                "rows into state built from others; resend its config with reset_state=true first")

    def _reset_state(self, record: ConnectorRecord) -> None:
        self._stopped(record.name, "its keyed state can only be reset while it is STOPPED")
        self._on_kafka(lambda: self._context.kafka.reset_state(record))

    def _on_kafka(self, call: Callable[[], T]) -> T:
        try:
            return call()
        except GroupNotEmpty as error:
            raise ApiError(409, str(error)) from None
        except TopicAdminError as error:
            raise ApiError(503, str(error)) from None
        except SecretReferenceError as error:
            raise ApiError(503, f"this worker cannot resolve the connector's Kafka settings: {error}") from None


def _dead_letter_view(stored: StoredRecord) -> dict[str, Any]:
    headers = described(stored.headers)
    return {"partition": stored.partition, "offset": stored.offset, "timestamp_ms": stored.timestamp_ms,
            "stage": headers.get("stage"), "reason": headers.get("reason"),
            "source": {"topic": headers.get("topic"), "partition": headers.get("partition"),
                       "offset": headers.get("offset")},
            "key": _preview(stored.key), "value": _preview(stored.value)}


def _preview(data: bytes | None) -> str | None:
    """Bytes as text a person can read (undecodable bytes replaced), cut at ``PREVIEW_CHARS``."""
    if data is None:
        return None
    text = data.decode(errors="replace")
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…"


def _offsets_body(body: Any) -> list[tuple[str, int, int]]:
    """``{"offsets": [{"partition": {"kafka_topic", "kafka_partition"}, "offset": {"kafka_offset"}}]}``."""
    try:
        entries = body["offsets"]
        found = [(str(entry["partition"]["kafka_topic"]), _count(entry["partition"]["kafka_partition"]),
                  _count(entry["offset"]["kafka_offset"])) for entry in entries]
    except (KeyError, TypeError, ValueError) as error:
        raise ApiError(400, 'the body must be {"offsets": [{"partition": {"kafka_topic": T, "kafka_partition": P}, '
                            f'"offset": {{"kafka_offset": N}}}}] ({type(error).__name__}: {error})') from None
    if not found:
        raise ApiError(400, "the body names no offsets")
    return found


__all__ = ["ApiError", "WorkerContext", "create_app"]


def _count(value: Any) -> int:
    """A partition or an offset: a whole number, zero or more (not a bool, not a float)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a partition or offset (a whole number >= 0)")
    return value
