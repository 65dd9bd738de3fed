"""engine.ports: loopback ports for the processes epochline starts itself."""

from __future__ import annotations

import socket

import pytest

from engine import ports
from engine.ports import free_port
from tests.helpers.processes import kernel_offering


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
