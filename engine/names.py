"""The one rule for connector names, checked by the config loader and by the worker's REST API alike.

Why a rule of its own: a connector's name is not only a label. It is part of Kafka names epochline derives
from it (the consumer group ``epochline-<name>``, the transactional ids ``epochline-<name>-<instance>``, the
topics ``<name>-repartition`` and ``<name>-step<N>-window-changelog``) and of directory names on disk (a
worker's ``connectors/<name>/``, the default ``state/<name>/``). So it may use only the characters Kafka allows
in topic names, ``[A-Za-z0-9._-]``, and must be short enough that every derived name still fits: Kafka takes
topic names of 249 characters at most, and the longest suffix epochline adds is a changelog's
``-step<N>-window-changelog`` (25 characters for a step index below 1000), which leaves 224; a file name
component may have 255 bytes. ``MAX_NAME_LENGTH`` is 200, below both with room to spare. A name broken on
any of these counts would be accepted, then fail at every start of its task (``File name too long``, an
invalid topic): it is refused before it is stored instead.
"""

from __future__ import annotations

import re

MAX_NAME_LENGTH = 200
NAME_CHARACTERS = "A-Za-z0-9._-"
_NAME = re.compile(f"[{NAME_CHARACTERS}]+")
NAME_RULE = (f"1 to {MAX_NAME_LENGTH} characters of {NAME_CHARACTERS} (letters, digits, '.', '_', '-'), "
             "not '.' or '..'")


class InvalidName(ValueError):
    """A connector name breaks the rule; the message names the name (shortened) and the rule."""


def check_name(name: str) -> str:
    """``name`` if it follows the rule, else ``InvalidName`` saying which name and what the rule is."""
    shown = repr(name) if len(name) <= 40 else f"{name[:40]!r}... ({len(name)} characters)"
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidName(f"connector name {shown} is too long: a name is {NAME_RULE}")
    if not _NAME.fullmatch(name) or name in (".", ".."):
        raise InvalidName(f"connector name {shown} is not allowed: a name is {NAME_RULE}")
    return name
