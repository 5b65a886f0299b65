"""How long a rank's checkpoint saves take, and how much of that is its own work.

A save is collective: every rank writes its shard, then the ranks meet (DCP's gather of the
write results, the trainer's barriers) before the checkpoint is committed. So every rank's save
lasts as long as the slowest rank's, as every rank's step lasts as long as the slowest rank's,
and the rank the others wait for is the one that waits least. The clock times the save's wall
time and, while the save runs, the time spent inside the ``torch.distributed`` collectives
(the same wrappers that time a step's waits, fed by a timer of its own, armed only during the
save): own time = wall - that wait.

Host time on both CPU and CUDA, like the checkpoint phase itself: DCP's object collectives
(``gather_object``, ``broadcast_object_list``) and barriers block the host until every rank has
joined, which is the wait that matters here.

Also the share of time the save took: its wall time over the time from the end of the previous
save (or the first step, for the first save) to the end of this one. A checkpoint every few
hundred steps costs a few percent; a slow filesystem shows as a large share.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from fsdpmon.monitor import collectives
from fsdpmon.monitor.collectives import CollectiveTimer


@dataclass(frozen=True)
class SaveTimes:
    seconds: float  # wall time of the save
    own_seconds: float  # of which not waiting in collectives for other ranks
    time_ratio: float | None  # seconds / (previous save's end, or first step -> this end)


class CheckpointClock:
    """``begin`` and ``end`` around one save (outside any step); ``training_started`` at the
    first step, so that the first save has a share too."""

    def __init__(self, distributed: bool) -> None:
        # A timer of its own (host clock): the step's timer is neither armed nor drained here,
        # nor is a save a step of the collectives' fingerprint.
        self._waits = (CollectiveTimer(cuda=False, run_queue=False, fingerprint=False)
                       if distributed else None)
        self._outer: CollectiveTimer | None = None
        self._start: float | None = None
        self._since: float | None = None  # the previous save's end, or the first step

    def training_started(self) -> None:
        if self._since is None:
            self._since = time.perf_counter()

    def begin(self) -> None:
        self._start = time.perf_counter()
        if self._waits is not None:
            self._outer = collectives.active()
            self._waits.arm()
            collectives.activate(self._waits)

    def end(self) -> SaveTimes | None:
        """The save's times (None without a ``begin``); puts the step's timer back."""
        if self._start is None:
            return None
        now = time.perf_counter()
        waited = 0.0
        if self._waits is not None:
            self._waits.step_done()
            waited = sum(self._waits.drain().collective)
            self._waits.calls = 0
            if collectives.active() is self._waits:
                collectives.activate(self._outer)
        wall = now - self._start
        span = now - self._since if self._since is not None else 0.0
        self._start, self._since = None, now
        return SaveTimes(wall, max(0.0, wall - waited), wall / span if span > 0 else None)
