"""Small helpers that many test files share."""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Outgoing connections (scrapes, HTTP clients, gloo) take their local ports from the kernel's
# ephemeral range; a port picked from that range and bound seconds later (a trainer that
# imports torch first) can be taken by one of them meanwhile. Ports below it are only ever
# taken by an explicit bind.
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10000


def _ephemeral_start() -> int:
    try:
        return int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A free loopback TCP port below the ephemeral range, picked at random (tests of others
    run side by side, so never a fixed one)."""
    top = _ephemeral_start()
    for _ in range(200):
        port = random.randrange(_LOWEST, top) if top > _LOWEST + 1000 else 0
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use: try another
            return int(sock.getsockname()[1])
    raise RuntimeError(f"no free port found in {_LOWEST}..{top}")
