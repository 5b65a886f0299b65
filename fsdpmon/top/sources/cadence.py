"""How often a refresh asks for each family: what changes every step on every refresh, the
rest (process tables, static ``*_info`` series, per-rank constants) every few refreshes,
carried in between.

Process families feed only the Processes view and the GPU-rank ties (which change when a
process starts or ends); ``*_info`` series are static facts. Asking for them every
``SLOW_EVERY`` refreshes, and on every refresh while the Processes view is open, trims the
bytes each target sends; a target's last answer for them is carried into the refreshes between,
so the views see the same rows. A target that ignores ``name[]`` sends them anyway: its fresh
ones are used.
"""

from __future__ import annotations

from dataclasses import replace

from fsdpmon import catalog
from fsdpmon.top.aggregate import ScrapeResult
from fsdpmon.top.expfmt import Sample
from fsdpmon.top.wanted import (
    EXPORTER_INFO,
    GPU_PROCESS_MEMORY,
    PROCESS_INFO,
    PROCESS_METRICS,
    PROCESS_STATE,
    TRAIN_INFO,
    WANTED,
)

# Per-rank figures fixed for a run's life: the planned steps, the device's memory, the stall
# threshold (static facts served as gauges).
STATIC_RANK_NAMES = frozenset([catalog.TRAIN_TOTAL_STEPS.name,
                               catalog.TRAIN_DEVICE_MEMORY_CAPACITY_BYTES.name,
                               catalog.TRAIN_STALL_THRESHOLD_SECONDS.name])
SLOW_NAMES = frozenset([PROCESS_INFO, PROCESS_STATE, *PROCESS_METRICS, GPU_PROCESS_MEMORY,
                        TRAIN_INFO, EXPORTER_INFO, *STATIC_RANK_NAMES])
SLOW_EVERY = 5  # refreshes: 10 s at top's default 2 s interval


class Cadence:
    """Per refresh: ``names()`` to ask for, then ``complete()`` on each target's result."""

    def __init__(self, every: int = SLOW_EVERY) -> None:
        self.every = max(1, every)
        self.processes_open = False
        self._refreshes = 0
        self._full = True
        self._lacking = False  # a target has none of its slow samples yet: ask again at once
        self._kept: dict[str, list[Sample]] = {}  # target URL → its last slow samples

    def names(self) -> frozenset[str]:
        """The names this refresh asks for (call once per refresh)."""
        self.begin(self.processes_open or self._lacking or self._refreshes % self.every == 0)
        self._refreshes += 1
        return WANTED if self._full else WANTED - SLOW_NAMES

    @property
    def full(self) -> bool:
        """Whether this refresh asks for the slow families too."""
        return self._full

    def begin(self, full: bool) -> None:
        """A refresh that asks for the slow families (``full``) or not: what ``names()`` does,
        and all a helper process's cadence is told (its targets' carry lives with it)."""
        self._full, self._lacking = full, False

    @property
    def lacking(self) -> bool:
        """A target was down or had no slow samples this refresh: the next asks for all."""
        return self._lacking

    def note_lacking(self) -> None:
        """A helper process's target lacked its slow samples: the next refresh asks for all."""
        self._lacking = True

    def complete(self, result: ScrapeResult) -> ScrapeResult:
        """``result`` with its target's carried slow samples, or keeps its fresh ones."""
        if result.samples is None:
            self._lacking = True  # down now: when it answers, the next refresh has it all
            return result
        slow = [s for s in result.samples if s.name in SLOW_NAMES]
        if self._full or slow:
            self._kept[result.target.url] = slow
            # A job that had not published its static facts yet (ranks still starting) would
            # otherwise show rows without a node or pod for SLOW_EVERY refreshes.
            self._lacking = self._lacking or not slow
            return result
        kept = self._kept.get(result.target.url)
        if not kept:
            self._lacking = True
            return result
        return replace(result, samples=[*result.samples, *kept])
