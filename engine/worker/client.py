"""A typed client of the worker's REST API (docs: the worker API contract), for the CLI and for scripts.

Why a client of its own: every command of ``epochline connectors`` is one or two calls, and what they share is
how a failure reads. A worker that answers with an error becomes a :class:`WorkerApiError` whose text names the
call and carries the server's message (``PUT /connectors/a/config: 409 <message>``); a worker that cannot be
reached becomes a :class:`WorkerUnreachable` naming the URL, so a wrong ``--url`` is told apart from a refused
change at a glance.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

TOKEN_ENV = "EPOCHLINE_API_TOKEN"
MAX_BODY_IN_MESSAGE = 200
"""An error answer that is not the API's JSON (a proxy's HTML page) is quoted up to this many characters."""

Json = dict[str, Any]


class WorkerApiError(RuntimeError):
    """The worker answered a call with an error; ``status_code`` is its HTTP status, ``message`` its reason."""

    def __init__(self, method: str, path: str, status_code: int | None, message: str) -> None:
        shown = f"{status_code} {message}" if status_code is not None else message
        super().__init__(f"{method} {path}: {shown}")
        self.method = method
        self.path = path
        self.status_code = status_code
        self.message = message


class WorkerUnreachable(WorkerApiError):
    """No answer at all (connection refused, name not resolved, timed out): ``status_code`` is None."""


class TokenFileError(ValueError):
    """The API token file named on the command line cannot be read or is empty."""


def token_from(token_file: Path | None) -> str | None:
    """The token to send: the file's stripped content, else ``$EPOCHLINE_API_TOKEN``, else None (no auth).

    A file that was named but cannot be used is an error rather than a silent fall-back: requests without the
    intended token would fail later with a 401 that no longer says which file was wrong."""
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as error:
            raise TokenFileError(f"cannot read API token file {token_file}: {error.strerror}") from error
        if not token:
            raise TokenFileError(f"API token file {token_file} is empty")
        return token
    return os.environ.get(TOKEN_ENV) or None


def _segment(name: str) -> str:
    """A connector name as one path segment: nothing in it can reach another route."""
    return quote(name, safe="")


def _flag(value: bool) -> str:
    return "true" if value else "false"


class WorkerClient:
    """Synchronous calls to one worker; ``transport`` lets tests answer without a network."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 30.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.url = url.rstrip("/")
        headers = {"Accept": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> WorkerClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    # -- the worker and its connectors ------------------------------------------------------------------------

    def info(self) -> Json:
        """Version, Kafka cluster id, cluster name and worker id."""
        return self._object("GET", "/")

    def list(self) -> list[str]:
        """The names of the connectors the worker runs."""
        names = self._call("GET", "/connectors")
        if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
            raise self._unexpected("GET", "/connectors", "a list of connector names")
        return names

    def configs(self) -> dict[str, Json]:
        """Every connector's config (secrets redacted), by name: one call, as ``connectors apply`` plans from."""
        return {name: self._field(entry, "info", "/connectors")["config"]
                for name, entry in self._expanded("info").items()}

    def statuses(self) -> dict[str, Json]:
        """Every connector's STATUS by name, in one call."""
        return {name: self._field(entry, "status", "/connectors") for name, entry in self._expanded("status").items()}

    def get_config(self, name: str) -> Json:
        return self._object("GET", f"/connectors/{_segment(name)}/config")

    def put_config(self, name: str, config: Json, reset_state: bool = False) -> tuple[bool, Json]:
        """Create or replace a connector's config: ``(created, INFO)``. The worker answers 409 when the change
        invalidates the connector's keyed state; ``reset_state`` accepts dropping it."""
        path = f"/connectors/{_segment(name)}/config"
        params = {"reset_state": "true"} if reset_state else None
        response = self._send("PUT", path, json=config, params=params)
        return response.status_code == 201, self._json_object("PUT", path, response)

    def create(self, name: str, config: Json) -> Json:
        """A new connector; 409 when the name is taken (``put_config`` creates or updates)."""
        return self._object("POST", "/connectors", json={"name": name, "config": config})

    def delete(self, name: str) -> None:
        self._send("DELETE", f"/connectors/{_segment(name)}")

    def status(self, name: str) -> Json:
        return self._object("GET", f"/connectors/{_segment(name)}/status")

    def pause(self, name: str) -> None:
        self._send("PUT", f"/connectors/{_segment(name)}/pause")

    def resume(self, name: str) -> None:
        self._send("PUT", f"/connectors/{_segment(name)}/resume")

    def stop(self, name: str) -> None:
        """Stopped, not paused: the state offsets can only be altered or reset in."""
        self._send("PUT", f"/connectors/{_segment(name)}/stop")

    def restart(self, name: str, include_tasks: bool = False, only_failed: bool = False) -> Json:
        """The STATUS right after the restart was ordered (the worker restarts asynchronously: 202)."""
        params = {"includeTasks": _flag(include_tasks), "onlyFailed": _flag(only_failed)}
        return self._object("POST", f"/connectors/{_segment(name)}/restart", params=params)

    # -- offsets and validation -------------------------------------------------------------------------------

    def offsets(self, name: str) -> Json:
        return self._object("GET", f"/connectors/{_segment(name)}/offsets")

    def alter_offsets(self, name: str, offsets: Json) -> str:
        """The worker's confirmation; 409 unless the connector is STOPPED."""
        return self._message(self._object("PATCH", f"/connectors/{_segment(name)}/offsets", json=offsets))

    def reset_offsets(self, name: str) -> str:
        """The worker's confirmation; 409 unless the connector is STOPPED."""
        return self._message(self._object("DELETE", f"/connectors/{_segment(name)}/offsets"))

    def validate(self, config: Json) -> Json:
        """VALIDATION: ``error_count`` and, per field with problems, its errors."""
        return self._object("PUT", "/connector-plugins/connector/config/validate", json=config)

    # -- plumbing ---------------------------------------------------------------------------------------------

    def _expanded(self, expand: str) -> dict[str, Json]:
        found = self._object("GET", "/connectors", params={"expand": expand})
        if not all(isinstance(entry, dict) for entry in found.values()):
            raise self._unexpected("GET", "/connectors", "an object per connector")
        return found

    def _field(self, entry: Json, key: str, path: str) -> Json:
        value = entry.get(key)
        if not isinstance(value, dict) or (key == "info" and not isinstance(value.get("config"), dict)):
            raise self._unexpected("GET", path, f"{key!r} for every connector")
        return value

    def _message(self, answer: Json) -> str:
        return str(answer.get("message", ""))

    def _object(self, method: str, path: str, *, json: Any = None, params: dict[str, str] | None = None) -> Json:
        return self._json_object(method, path, self._send(method, path, json=json, params=params))

    def _call(self, method: str, path: str) -> Any:
        return self._json(method, path, self._send(method, path))

    def _send(self, method: str, path: str, *, json: Any = None,
              params: dict[str, str] | None = None) -> httpx.Response:
        """One request; any answer but 2xx, or none, becomes the error that names this call."""
        try:
            response = self._http.request(method, path, json=json, params=params)
        except httpx.TransportError as error:
            raise WorkerUnreachable(method, path, None,
                                    f"cannot reach the worker at {self.url} ({str(error) or type(error).__name__})"
                                    ) from error
        if not response.is_success:
            raise WorkerApiError(method, path, response.status_code, _error_message(response))
        return response

    def _json(self, method: str, path: str, response: httpx.Response) -> Any:
        try:
            return response.json()
        except ValueError as error:
            raise self._unexpected(method, path, "a JSON body") from error

    def _json_object(self, method: str, path: str, response: httpx.Response) -> Json:
        value = self._json(method, path, response)
        if not isinstance(value, dict):
            raise self._unexpected(method, path, "a JSON object")
        return value

    def _unexpected(self, method: str, path: str, wanted: str) -> WorkerApiError:
        """A 2xx answer of the wrong shape: most likely ``--url`` names something that is not a worker."""
        return WorkerApiError(method, path, None, f"{self.url} did not answer with {wanted}: is it an epochline "
                                                  "worker?")


def _error_message(response: httpx.Response) -> str:
    """The API's ``message``; for any other body its start, else the HTTP reason phrase."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    text = response.text.strip()
    return text[:MAX_BODY_IN_MESSAGE] if text else response.reason_phrase


__all__ = ["TOKEN_ENV", "TokenFileError", "WorkerApiError", "WorkerClient", "WorkerUnreachable", "token_from"]
