"""Small helpers that many test files share."""

from __future__ import annotations

import random
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

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


EPS = sys.float_info.epsilon


def rounded(expected: Any, ops: int = 4) -> Any:
    """``expected`` (a number, or a sequence or dict of them) up to the rounding of ``ops``
    floating-point operations: each rounds to nearest, off by at most half an ulp (EPS / 2
    relative), so ``ops`` of them without cancellation stay within ops x EPS of the exact
    result. For figures that are arithmetic on exact inputs, where nothing else can differ."""
    return pytest.approx(expected, rel=ops * EPS, abs=0)


def printed(expected: float, decimals: int) -> Any:
    """A figure printed with ``decimals`` decimals, read back: within half a unit of the last
    place printed, plus the float rounding of the two sides (a few EPS of the value)."""
    return pytest.approx(expected, abs=0.5 * 10.0**-decimals + 8 * EPS * abs(expected), rel=0)
