"""The two collective wrappers as they stood before they were merged (commit 14f1e39: ``_timed``
in fsdpmon/monitor/collectives.py and ``_counted`` in fsdpmon/monitor/collective_seq.py), each
patching every collective on its own. Kept only so that the benchmarks can measure, in one run
on one machine, what the merged wrapper (``fsdpmon.monitor.collectives.wrap``) costs beside
what the two stacked ones cost. Nothing in fsdpmon imports this.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from fsdpmon.monitor.collectives import CollectiveTimer


class _Last:
    op: str | None = None
    seq = 0
    depth = 0


_last = _Last()
_active: CollectiveTimer | None = None


def activate(timer: CollectiveTimer | None) -> None:
    global _active
    if timer is not None:
        timer._depth = 0  # type: ignore[attr-defined]  # the merged timer keeps no depth
    _active = timer


def counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """collective_seq._counted, verbatim."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        last = _last
        if last.depth:
            return fn(*args, **kwargs)
        last.op, last.seq, last.depth = name, last.seq + 1, 1
        try:
            return fn(*args, **kwargs)
        finally:
            last.depth = 0

    return wrapper


def timed(fn: Callable[..., Any]) -> Callable[..., Any]:
    """collectives._timed, verbatim."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        timer = _active
        if timer is None or not timer.armed or timer._depth or kwargs.get("async_op"):
            return fn(*args, **kwargs)
        timer._depth += 1  # only the outermost call: all_gather_object calls all_gather
        start = timer.enter()
        try:
            return fn(*args, **kwargs)
        finally:
            timer._depth -= 1
            timer.leave(start)

    return wrapper


def stacked(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """What each collective was before the merge: counted around timed (collective_seq was
    installed by the publication, after the monitor's timer had wrapped)."""
    return counted(name, timed(fn))
