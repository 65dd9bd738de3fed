"""engine.ports: loopback ports for the processes epochline starts itself."""

from __future__ import annotations

import socket
import types
from collections.abc import Iterator

import pytest

from engine import ports
from engine.ports import free_port


def kernel_offering(offers: Iterator[int]) -> types.SimpleNamespace:
    """A stand-in for the ``socket`` module whose port-0 binds get ``offers`` in turn."""

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


def test_a_port_handed_out_a_moment_ago_is_not_handed_out_again_for_the_same_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel may offer a port again until something binds it: a broker once got one port for both its
    listeners and refused to start."""
    monkeypatch.setattr(ports, "socket", kernel_offering(iter([47805, 47805, 47805, 47806])))

    first = free_port()
    second = free_port(besides={first})

    assert (first, second) == (47805, 47806)


def test_a_free_port_is_one_a_server_can_bind() -> None:
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", port))
        server.listen()
