"""Checks that need a process of their own: a fresh interpreter, a kernel that offers given ports."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import types
from collections.abc import Iterator

WATCH_CONNECT = """
import threading, time
import duckdb
opened_on = []
real_connect = duckdb.connect
def connect(*args, **kwargs):
    opened_on.append(threading.current_thread().name)
    return real_connect(*args, **kwargs)
duckdb.connect = connect
"""
"""Prefix for ``run_python``: ``opened_on`` lists the thread that opened each DuckDB database."""


def run_python(code: str, *args: str) -> str:
    """What ``code`` prints, run in a fresh interpreter with ``args`` as its ``sys.argv[1:]``."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def kernel_offering(offers: Iterator[int]) -> types.SimpleNamespace:
    """A stand-in for the ``socket`` module (set as ``engine.ports.socket``) whose port-0 binds get ``offers``
    in turn."""

    class Probe:
        def __enter__(self) -> Probe:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def bind(self, address: tuple[str, int]) -> None:
            assert address == ("127.0.0.1", 0)
            self.port = next(offers)

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", self.port)

    return types.SimpleNamespace(AF_INET=socket.AF_INET, SOCK_STREAM=socket.SOCK_STREAM,
                                 socket=lambda family, kind: Probe())
