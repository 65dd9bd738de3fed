"""Secret references in connector configs: ``${env:NAME}`` and ``${file:PATH:KEY}``, resolved at the last moment.

Why references: a config is stored, shown (``epochline validate``, a worker's REST API) and logged; a
password in it would be too. A reference names where the secret lives; only the process that opens the Kafka
client resolves it (``engine.wiring``), and only the reference is ever printed. ``${file:PATH:KEY}`` reads
``KEY`` from a ``KEY=VALUE`` properties file, as Kafka Connect's FileConfigProvider does.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_REFERENCE = re.compile(r"\$\{(env|file):([^}]*)\}")
SECRET_KEY_WORDS = ("password", "secret", "token", "credential", "private.key", "key.pem", "keystore.key",
                    "oauthbearer.config", "jaas.config", "user.info")
"""Words that make a key secret-looking: passwords, SASL (``sasl.jaas.config``) and OAuth settings, key
material (``ssl.keystore.key``, PEM keys) and a registry's ``basic.auth.user.info`` (``user:password``)."""
_URL_CREDENTIALS = re.compile(r"://[^/@\s]+@")
_PASSWORD_PARAMETER = re.compile(r"(\bpassword\s*=\s*)(\$\{[^}]*\}|[^&\s]+)", re.IGNORECASE)
REDACTED = "[redacted]"


class SecretReferenceError(ValueError):
    """A reference names a variable, file or key that does not exist; the message names the reference only."""


def resolve(value: str, base_dir: Path | None = None) -> str:
    """``value`` with every reference replaced by what it names."""
    return _REFERENCE.sub(lambda match: _lookup(match.group(1), match.group(2), base_dir), value)


def resolve_all(settings: Mapping[str, str], base_dir: Path | None = None) -> dict[str, str]:
    return {key: resolve(str(value), base_dir) for key, value in settings.items()}


def looks_secret(key: str) -> bool:
    """Keys whose values are redacted wherever settings are shown."""
    lowered = key.lower()
    return any(word in lowered for word in SECRET_KEY_WORDS)


def redacted_tree(value: Any, key: str = "") -> Any:
    """A config (mappings and lists, at any depth) safe to show: values under secret-looking keys that are not
    references are ``[redacted]``, and so are credentials inside URLs (``https://user:pw@registry``)."""
    if isinstance(value, Mapping):
        return {name: redacted_tree(item, str(name)) for name, item in value.items()}
    if isinstance(value, list):
        return [redacted_tree(item, key) for item in value]
    if looks_secret(key) and not (isinstance(value, str) and _REFERENCE.fullmatch(value)):
        return REDACTED
    return without_url_credentials(value) if isinstance(value, str) else value


def without_url_credentials(text: str) -> str:
    """``text`` with the ``user:password@`` of every URL in it redacted (error messages name registry URLs),
    and every ``password=`` value that is not a reference (a PostgreSQL DSN's query string or keywords)."""
    text = _URL_CREDENTIALS.sub("://[redacted]@", text)
    return _PASSWORD_PARAMETER.sub(lambda match: match.group(0) if _REFERENCE.fullmatch(match.group(2))
                                   else f"{match.group(1)}{REDACTED}", text)


def _lookup(kind: str, target: str, base_dir: Path | None) -> str:
    if kind == "env":
        if target not in os.environ:
            raise SecretReferenceError(f"${{env:{target}}}: environment variable {target!r} is not set")
        return os.environ[target]
    path_text, sep, key = target.rpartition(":")
    if not sep or not path_text or not key:
        raise SecretReferenceError(f"${{file:{target}}}: expected ${{file:PATH:KEY}}")
    path = Path(path_text)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        raise SecretReferenceError(f"${{file:{target}}}: cannot read {path}: {error.strerror}") from error
    for line in lines:
        name, equals, found = line.partition("=")
        if equals and name.strip() == key and not line.lstrip().startswith("#"):
            return found.strip()
    raise SecretReferenceError(f"${{file:{target}}}: {path} has no key {key!r}")
