"""Which requests the worker's REST API answers at all: no web page on another site may drive it.

Why: a connector config can name a Python function, so whoever deploys a connector runs code. A worker on
loopback without a token is reachable by every page the user's browser opens: a cross-site "simple" request
(a form POST, or ``fetch`` with ``Content-Type: text/plain``) needs no CORS preflight, and a DNS-rebinding
page (``attacker.example`` made to resolve to 127.0.0.1) is even same-origin to the browser. Three rules,
checked before anything else:

- **Host**: the ``Host`` header must name the worker as its users reach it: an IP address (a rebinding page
  always sends its own domain name), ``localhost``, the name it was bound to, or one of
  ``--rest-allowed-hosts``. Otherwise 403.
- **Origin**: when a browser sends one (it does on every cross-origin request and every non-GET request), it
  must be the worker's own origin (the same host and port as ``Host``). Otherwise 403. CORS stays closed: no
  ``Access-Control-Allow-*`` header is ever sent.
- **Content type**: a request that changes something (POST, PUT, PATCH, DELETE) and carries a body must say
  it is JSON or YAML (what a form or ``text/plain`` cannot say without a preflight). Otherwise 415.

Non-browser clients (the CLI, curl, scripts) send no ``Origin`` and are unaffected.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

JSON_TYPES = ("application/json",)
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml")
CHANGING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
LOCAL_NAMES = frozenset({"localhost"})


@dataclass(frozen=True)
class Refusal:
    status: int
    message: str


@dataclass(frozen=True)
class RequestGuard:
    """The Host, Origin and Content-Type rules of the module docstring."""

    allowed_names: frozenset[str]
    """Host names (lower case, no port) besides IP addresses the worker answers to."""

    @classmethod
    def serving(cls, bound_host: str, allowed_hosts: Iterable[str] = ()) -> RequestGuard:
        """For a worker bound to ``bound_host``, also reachable as ``allowed_hosts``."""
        names = {name.strip().lower() for name in (bound_host, *allowed_hosts) if name.strip()}
        return cls(frozenset(LOCAL_NAMES | {name for name in names if not _is_ip(name)}))

    def refusal(self, method: str, headers: Mapping[str, str], has_body: bool) -> Refusal | None:
        """Why a request with these headers is refused, or None when it may go on."""
        host_header = headers.get("host", "")
        host = _hostname(host_header)
        if not (_is_ip(host) or host in self.allowed_names):
            return Refusal(403, f"Host {host_header!r} is not a name this worker serves (an IP address, localhost, "
                                f"{', '.join(sorted(self.allowed_names - LOCAL_NAMES)) or 'no other name'}; "
                                "add one with --rest-allowed-hosts)")
        origin = headers.get("origin")
        if origin is not None and urlsplit(origin).netloc.lower() != host_header.lower():
            return Refusal(403, f"Origin {origin!r} is not this worker's own ({host_header}): the API does not "
                                "answer pages of other sites")
        content_type = media_type(headers)
        if method.upper() in CHANGING_METHODS and (has_body or content_type) and \
                content_type not in JSON_TYPES + YAML_TYPES:
            return Refusal(415, f"Content-Type {content_type or '(none)'!r}: a request that changes something "
                                "sends application/json or application/yaml")
        return None


def media_type(headers: Mapping[str, str], default: str = "") -> str:
    """``Content-Type`` without its parameters, lower case (``application/json; charset=utf-8`` ->
    ``application/json``)."""
    return headers.get("content-type", default).split(";")[0].strip().lower()


def _hostname(host_header: str) -> str:
    """``Host``'s name without the port, lower case (``[::1]:8083`` -> ``::1``)."""
    return (urlsplit(f"//{host_header}").hostname or "").lower()


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


LOOPBACK = RequestGuard.serving("127.0.0.1")
"""A worker on loopback reached as 127.0.0.1, ::1 or localhost."""
