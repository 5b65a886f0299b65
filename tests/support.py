"""Small helpers that many test files share."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A free loopback TCP port: tests of others run side by side, so never a fixed one."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
