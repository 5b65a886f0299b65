"""Evidence over a window: a condition counts only when it held in every snapshot of the last
``span_s`` seconds (never one sample), and counters count only when they rose inside the history.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TypeVar

from fsdpmon.job.snapshot import JobSnapshot

K = TypeVar("K", bound=Hashable)


class Window:
    """The history a verdict is drawn from (oldest first; the last snapshot is "now")."""

    def __init__(self, history: Sequence[JobSnapshot], span_s: float) -> None:
        self.history = list(history)
        self.now = self.history[-1]
        self.span_s = span_s
        # From the newest snapshot at or before now - span, up to now: the evidence span.
        start = next((i for i in range(len(self.history) - 1, -1, -1)
                      if self.history[i].time <= self.now.time - span_s), None)
        self.recent = self.history[start:] if start is not None else []

    @property
    def covered(self) -> bool:
        """Whether the history is long enough for any verdict."""
        return len(self.recent) >= 2

    @property
    def seconds(self) -> float:
        return self.now.time - self.recent[0].time if self.recent else 0.0

    def lasting(self, keys: Callable[[JobSnapshot], Iterable[K]]) -> set[K]:
        """The keys (ranks, GPUs, nodes) ``keys`` yields for every snapshot of the span."""
        if not self.covered:
            return set()
        out: set[K] | None = None
        for snap in reversed(self.recent):
            found = set(keys(snap))
            out = found if out is None else out & found
            if not out:
                return set()
        return out or set()

    def first_seen(self, keys: Callable[[JobSnapshot], Iterable[K]]) -> dict[K, float]:
        """When each key of the newest snapshot started to be yielded without a break."""
        since: dict[K, float] = {}
        gone: set[K] = set()
        for snap in reversed(self.history):
            present = set(keys(snap))
            for k in present - gone:
                since[k] = snap.time
            gone |= set(since) - present
        return {k: t for k, t in since.items() if k in set(keys(self.now))}

    def rise(self, value: Callable[[JobSnapshot], dict[K, float]],
             absent: float | None = 0.0) -> dict[K, tuple[float, float]]:
        """Counters that rose inside the history: key → (lowest before, now). A key absent from
        an older snapshot counts as ``absent``: 0 for a series born at its first count (a new
        XID code's); None for one served whenever it is known (a snapshot without it, such as
        one while every rank was gone, says nothing)."""
        if len(self.history) < 2:
            return {}
        now = {k: v for k, v in value(self.now).items() if v > 0}  # 0 cannot have risen
        if not now:
            return {}
        low: dict[K, float] = {}
        for snap in self.history[:-1]:
            then = value(snap)
            for k in now:
                v = then.get(k, absent)
                if v is not None:
                    low[k] = min(low.get(k, v), v)
        return {k: (low[k], v) for k, v in now.items() if k in low and v > low[k]}
