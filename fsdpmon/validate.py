"""Small checks used by the typed config dataclasses; each raises ConfigError naming the field."""

from __future__ import annotations

import re
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
