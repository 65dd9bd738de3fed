"""The optional C extensions (``connectors/_native_io.c``, ``schemas/_native_json.c``, ``schemas/_native_avro.c``):
whether one is used.

Each is built at install when a C compiler is there, and each has an environment variable that switches it
off; without it the pure-Python path does the same work with the same guarantees, more slowly. This module
lives in ``schemas``, the lowest package, so that every package that has an extension can load it the same
way.
"""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType

log = logging.getLogger(__name__)


def switched_off(variable: str) -> bool:
    """Whether the environment variable ``variable`` says no (``0``, ``false``, ``off``, ``no``)."""
    return os.environ.get(variable, "1").strip().lower() in ("0", "false", "off", "no")


def load_extension(module: str, *, switch: str, what: str, instead: str) -> ModuleType | None:
    """The extension ``module``, or None when ``switch`` turns it off or it was not built; either is logged
    with ``what`` it is, and (when it is missing) the reason and what happens ``instead``."""
    if switched_off(switch):
        log.info(f"{what} switched off", extra={"variable": switch})
        return None
    try:
        return importlib.import_module(module)
    except ImportError as error:
        log.warning(f"{what} not available: {instead}", extra={"reason": str(error)})
        return None
