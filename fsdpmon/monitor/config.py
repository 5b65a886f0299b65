"""Monitor configuration: explicit arguments first, then ``FSDPMON_*`` variables, then defaults.

Bad values fail at setup with a ConfigError naming the variable (or argument) — the only place
the monitor is allowed to raise, because it runs before training starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from fsdpmon import validate
from fsdpmon.conventions import (
    DEFAULT_STALL_FACTOR,
    DEFAULT_STALL_FLOOR_SECONDS,
    DEFAULT_STALL_WAIT_FLOOR_SECONDS,
    ENV_PREFIX,
    TRAINING_PORT,
)
from fsdpmon.errors import ConfigError

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class MonitorConfig:
    port: int = TRAINING_PORT  # 0: serve no HTTP endpoint (JSONL and listeners still work)
    job_name: str = "fsdpmon"
    log_interval: int = 10  # log (sync, gather, publish) every this many optimiser steps
    disabled: bool = False  # serve nothing; listeners and JSONL still run
    jsonl_path: str | None = None  # runs/x.jsonl -> runs/x.rank0.jsonl, runs/x.rank1.jsonl, ...
    # the stall bound (monitor.stall_bound): no step for max(factor x median step, floor);
    # inside a collective, no exit for max(3 x the longest wait seen, wait floor)
    stall_factor: float = DEFAULT_STALL_FACTOR
    stall_floor_seconds: float = DEFAULT_STALL_FLOOR_SECONDS
    stall_wait_floor_seconds: float = DEFAULT_STALL_WAIT_FLOOR_SECONDS
    listen_address: str = "0.0.0.0"  # pods must be scrapeable; tests and local runs use loopback
    state_dir: str | None = None  # where ranks of one pod share state; default /dev/shm or tmp
    server_retry_seconds: float = 2.0  # how often a non-serving rank tries to take the port over
    # exporter-toolkit web config (TLS, basic auth) for the endpoint, as the exporter's
    web_config_file: str | None = None
    # what scrapers may take from training: requests served per second, all clients together
    max_scrapes_per_second: float = 10.0

    def __post_init__(self) -> None:
        validate.port("port", self.port)
        validate.between("log_interval", self.log_interval, 1, 1_000_000)
        validate.between("stall_factor", self.stall_factor, 1.0, 1000.0)
        validate.between("stall_floor_seconds", self.stall_floor_seconds, 1.0, 7 * 86400.0)
        validate.between("stall_wait_floor_seconds", self.stall_wait_floor_seconds, 1.0,
                         7 * 86400.0)
        validate.between("server_retry_seconds", self.server_retry_seconds, 0.05, 600.0)
        validate.between("max_scrapes_per_second", self.max_scrapes_per_second, 0.1, 1000.0)
        if not self.job_name or not self.job_name.strip():
            raise ConfigError("job_name", "must not be empty")
        if self.serves:  # a name that does not resolve fails here, not in a retry loop
            validate.listen_address("listen_address", self.listen_address)

    @property
    def serves(self) -> bool:
        return self.port != 0 and not self.disabled

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **explicit: Any) -> MonitorConfig:
        """Build from keyword arguments (``None`` = unset), then ``FSDPMON_<FIELD>``, then defaults.

        ``FSDPMON_JSONL`` names the JSONL path and ``FSDPMON_STALL_FLOOR_SECONDS`` the floor.
        """
        env = os.environ if env is None else env
        known = {f.name: f for f in fields(cls)}
        unknown = set(explicit) - set(known)
        if unknown:
            raise ConfigError(sorted(unknown)[0], "not a MonitorConfig field")
        values: dict[str, Any] = {}
        for name in known:
            if explicit.get(name) is not None:
                values[name] = explicit[name]
                continue
            var = ENV_PREFIX + _ENV_NAMES.get(name, name.upper())
            raw = env.get(var)
            if raw is not None and (raw.strip() or name not in _OPTIONAL):
                values[name] = _PARSERS[name](var, raw.strip())
        try:
            return cls(**values)
        except ConfigError as exc:
            var = ENV_PREFIX + _ENV_NAMES.get(exc.field, exc.field.upper())
            from_env = exc.field not in explicit or explicit[exc.field] is None
            raise ConfigError(var if from_env else exc.field, exc.problem) from None


def _number(kind: Callable[[str], T]) -> Callable[[str, str], T]:
    def parse(var: str, raw: str) -> T:
        try:
            return kind(raw)
        except ValueError:
            raise ConfigError(var, f"expected {kind.__name__}, got {raw!r}") from None

    return parse


def _flag(var: str, raw: str) -> bool:
    low = raw.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ConfigError(var, f"expected 1/0/true/false, got {raw!r}")


def _text(var: str, raw: str) -> str:
    return raw


_ENV_NAMES = {"jsonl_path": "JSONL"}
_OPTIONAL = {"jsonl_path", "state_dir", "web_config_file"}
_PARSERS: dict[str, Callable[[str, str], Any]] = {
    "port": _number(int),
    "job_name": _text,
    "log_interval": _number(int),
    "disabled": _flag,
    "jsonl_path": _text,
    "stall_factor": _number(float),
    "stall_floor_seconds": _number(float),
    "stall_wait_floor_seconds": _number(float),
    "listen_address": _text,
    "state_dir": _text,
    "server_retry_seconds": _number(float),
    "web_config_file": _text,
    "max_scrapes_per_second": _number(float),
}
