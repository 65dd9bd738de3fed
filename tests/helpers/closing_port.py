"""A port where Kafka should be but is not: it accepts every connection and closes it at once, counting them,
so a test sees how often a client tries (a refused port would count nothing)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class ClosingPort:
    """A listening loopback socket that accepts and closes connections on a thread until closed."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0), backlog=128)
        self._socket.settimeout(0.1)
        self.port: int = self._socket.getsockname()[1]
        self.accepted = 0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                connection, _ = self._socket.accept()
            except TimeoutError:
                continue
            connection.close()
            self.accepted += 1

    def close(self) -> None:
        self._stopped.set()
        self._thread.join(5)
        self._socket.close()


@contextmanager
def closing_port() -> Iterator[ClosingPort]:
    port = ClosingPort()
    try:
        yield port
    finally:
        port.close()
