"""How often a refresh asks for each family: what changes every step on every refresh, the
rest every few refreshes, carried in between.

Two slow tiers. Process families feed only the Processes view and the GPU-rank ties (which
change when a process starts or ends): asked for every ``SLOW_EVERY`` refreshes, and on every
refresh while the Processes view is open. Static facts (``*_info`` series, a rank's planned
steps and device memory, a GPU's memory and power limit, the host's memory) are asked for every
``SLOW_EVERY`` refreshes whatever the view. A target's last answer of static facts is carried
into the refreshes that do not ask for them, so the views see the same rows; a target that
ignores ``name[]`` sends them anyway, and its fresh ones are used. Processes are carried as
rows instead (aggregate's ``processes_asked``): a refresh that does not ask for them takes the
last snapshot's process rows of each node whose exporter answered without any, which are what
filing its last answer again would give, for none of their figures can have changed (refiling
them cost ~10% of a refresh of a 2048-GPU job).
"""

from __future__ import annotations

from fsdpmon import catalog
from fsdpmon.job.snapshot import JobSnapshot
from fsdpmon.scrape.aggregate import ScrapeResult
from fsdpmon.scrape.expfmt import Sample
from fsdpmon.scrape.filing import new_result
from fsdpmon.scrape.wanted import (
    EXPORTER_INFO,
    GPU_PROCESS_MEMORY,
    PROCESS_INFO,
    PROCESS_METRICS,
    PROCESS_STATE,
    TRAIN_INFO,
    WANTED,
)

# Per-rank figures fixed for a run's life: the planned steps, the device's memory (static facts
# served as gauges). Not the stall threshold: it moves with the rank's position (stall_bound).
STATIC_RANK_NAMES = frozenset([catalog.TRAIN_TOTAL_STEPS.name,
                               catalog.TRAIN_DEVICE_MEMORY_CAPACITY_BYTES.name])
# Per-node figures fixed for the node's life (or an operator's rare change): a GPU's memory and
# power limit, the host's memory. A fifth of a GPU's series a refresh asks for.
STATIC_NODE_NAMES = frozenset([catalog.GPU_MEMORY_TOTAL_BYTES.name,
                               catalog.GPU_POWER_LIMIT_WATTS.name,
                               catalog.HOST_MEMORY_TOTAL_BYTES.name])
PROCESS_NAMES = frozenset([PROCESS_INFO, PROCESS_STATE, *PROCESS_METRICS, GPU_PROCESS_MEMORY])
STATIC_NAMES = frozenset([TRAIN_INFO, EXPORTER_INFO, *STATIC_RANK_NAMES, *STATIC_NODE_NAMES])
SLOW_NAMES = PROCESS_NAMES | STATIC_NAMES
SLOW_EVERY = 5  # refreshes: 10 s at top's default 2 s interval


class Cadence:
    """Per refresh: ``names()`` to ask for, then ``complete()`` on each target's result."""

    def __init__(self, every: int = SLOW_EVERY) -> None:
        self.every = max(1, every)
        self.processes_open = False
        self._refreshes = 0
        self._asked: frozenset[str] = WANTED
        self._lacking = False  # a target has none of its static facts yet: ask again at once
        # target URL → its last samples of static facts
        self._kept: dict[str, list[Sample]] = {}

    def names(self) -> frozenset[str]:
        """The names this refresh asks for (call once per refresh)."""
        if self._lacking or self._refreshes % self.every == 0:
            asked = WANTED
        else:
            asked = WANTED - STATIC_NAMES if self.processes_open else WANTED - SLOW_NAMES
        self._refreshes += 1
        self._asked, self._lacking = asked, False
        return asked

    @property
    def full(self) -> bool:
        """Whether this refresh asks for every family."""
        return self._asked >= SLOW_NAMES

    @property
    def processes_asked(self) -> bool:
        """Whether this refresh asks for the process families (else the last snapshot's
        process rows stand: aggregate's ``processes_asked``)."""
        return self._asked >= PROCESS_NAMES

    @property
    def lacking(self) -> bool:
        """A target was down or had no static facts this refresh: the next asks for all."""
        return self._lacking

    def check(self, snap: JobSnapshot) -> None:
        """After a refresh: a live rank without a node had no ``*_info`` series at the last
        full refresh (it started after its pod's first rank), so the next refresh asks for
        everything rather than show it without a node for ``every`` refreshes."""
        if any(not r.node and not r.down for r in snap.ranks):
            self._lacking = True

    def complete(self, result: ScrapeResult) -> ScrapeResult:
        """``result`` with its target's carried static facts when they were not asked for
        (fresh ones, from a target that ignores ``name[]``, are kept instead)."""
        if result.samples is None:
            self._lacking = True  # down now: when it answers, the next refresh has it all
            return result
        url = result.target.url
        fresh = [s for s in result.samples if s.name in STATIC_NAMES]
        carried: list[Sample] = []
        if fresh or self._asked >= STATIC_NAMES:
            self._kept[url] = fresh
        else:
            carried = self._kept.get(url, [])
        # A job that had not published its static facts yet (ranks still starting) would
        # otherwise show rows without a node or pod for SLOW_EVERY refreshes.
        self._lacking = self._lacking or not (fresh or carried)
        if not carried:
            return result
        return new_result(target=result.target, samples=[*result.samples, *carried],
                          error=result.error, duration_s=result.duration_s, filed=result.filed)
