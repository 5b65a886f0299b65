"""Failures inside the monitor: each kind logged once, every one counted, none raised into the
training loop (a monitor that fails must cost a run nothing but its own figures). The count is
what ``fsdpmon_monitor_internal_errors_total`` serves."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("fsdpmon.monitor")


class Failures:
    def __init__(self, counted: Callable[[int], None]) -> None:
        self.count = 0
        self._logged: set[str] = set()
        self._counted = counted  # told each new count (the served counter)

    def fail(self, where: str, exc: BaseException) -> None:
        """Log a failure kind once, count every occurrence, never re-raise."""
        self.count += 1
        if where not in self._logged:
            self._logged.add(where)
            log.warning("fsdpmon monitor: internal error in %s (training continues; further "
                        "errors of this kind are only counted): %r", where, exc, exc_info=exc)
        self._counted(self.count)

    def guarded(self, where: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, or None when it raised (the failure counted under ``where``)."""
        try:
            return fn()
        except Exception as exc:
            self.fail(where, exc)
            return None
