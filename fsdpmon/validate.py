"""Small checks used by the typed config dataclasses; each raises ConfigError naming the field."""

from __future__ import annotations

import math
import re
import socket
from collections.abc import Iterable

from fsdpmon.errors import ConfigError

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def positive(field: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(field, f"must be > 0, got {value!r}")


def non_negative(field: str, value: float) -> None:
    if not value >= 0:
        raise ConfigError(field, f"must be >= 0, got {value!r}")


def one_of(field: str, value: str, choices: Iterable[str]) -> None:
    options = sorted(choices)
    if value not in options:
        raise ConfigError(field, f"unknown value {value!r}; choose one of {', '.join(options)}")


def port(field: str, value: int) -> None:
    if not 0 <= value <= 65535:
        raise ConfigError(field, f"must be a TCP port in 0..65535, got {value!r}")


def dns1123_label(field: str, value: str) -> None:
    if len(value) > 63 or not _DNS1123_LABEL.match(value):
        raise ConfigError(
            field,
            f"{value!r} is not a DNS-1123 label (lowercase letters, digits and '-', "
            "starting and ending with a letter or digit, at most 63 characters)",
        )


def between(field: str, value: float, low: float, high: float) -> None:
    """A finite number in [low, high]: an interval of inf or 1e-9 s fails here, not at run time."""
    if not (math.isfinite(value) and low <= value <= high):
        raise ConfigError(field, f"must be between {low:g} and {high:g}, got {value!r}")


def listen_address(field: str, value: str) -> None:
    """An address this machine can listen on: it resolves and is one of ours (port 0 trial)."""
    if not value:
        raise ConfigError(field, "must not be empty")
    family = socket.AF_INET6 if ":" in value else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((value, 0))
    except socket.gaierror as exc:
        raise ConfigError(field, f"cannot listen on {value!r}: it does not resolve "
                                 f"({exc.strerror})") from None
    except OSError as exc:
        raise ConfigError(field, f"cannot listen on {value!r}: {exc.strerror or exc}") from None
