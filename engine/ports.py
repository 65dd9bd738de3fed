"""Loopback ports for the processes epochline starts itself (a worker's task metrics, the local broker).

Why ask the kernel: a port fixed in code collides with whatever else runs on the machine, and a port picked
at random can be taken. Binding to port 0 gets one that is free at that moment; the process it is meant for
binds it moments later, which is the usual small race of this technique and is why callers that start a
server retry or report the bind failure.
"""

from __future__ import annotations

import socket
from collections.abc import Collection


def free_port(*, besides: Collection[int] = ()) -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now and is none of ``besides``: ports handed
    out a moment ago for the same start and not bound yet, which the kernel may offer again (a broker once
    got one port for both its listeners and refused to start)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port not in besides:
            return port


__all__ = ["free_port"]
