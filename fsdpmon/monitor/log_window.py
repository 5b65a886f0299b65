"""One log interval on this rank: what it measured (the step timer's and the collectives' drained
times, the tokens, the busy and waited-for histories) and the one small all-gather that brings
every rank's row to every rank."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from fsdpmon.distenv import DistEnv
from fsdpmon.monitor.collectives import CollectiveTimer
from fsdpmon.monitor.gather import gather_rows
from fsdpmon.monitor.stats import BusyHistory, WaitHistory, WindowStats, window_stats
from fsdpmon.monitor.straggling import straggler_scores
from fsdpmon.monitor.timing import StepTimer, WindowTimes

# A rank's gathered row: step time, busy time, peak memory, loss, time waited for (held), then
# the goodput window's four figures (monitor/goodput_meter.window_row). NaN: not known.
BUSY_AT, HELD_AT, ROW_AT = 1, 4, 5


class LogWindow:
    def __init__(self) -> None:
        self.start: float | None = None  # perf_counter at the window's start; None: not yet
        self.tokens = 0
        self.calls = 0  # collective calls in the last measured window
        self.times: WindowTimes | None = None  # the last measured window's step times
        self.busy = BusyHistory()
        self.waits = WaitHistory()
        self._gather_ok = True  # a collective that failed once stays off

    def measure(self, timer: StepTimer, collectives: CollectiveTimer | None,
                flops_per_token: float, peak_flops: float | None) -> WindowStats:
        times = timer.drain()  # on CUDA: the window's one sync, so the collective events
        waits = collectives.drain() if collectives is not None else None  # recorded before
        self.calls = collectives.take_calls() if collectives else 0  # the timer's last event
        now = time.perf_counter()  # are complete here
        start = self.start if self.start is not None else now
        self.start = now
        tokens, self.tokens = self.tokens, 0
        self.times = times
        stats = window_stats(times, tokens, now - start, flops_per_token, peak_flops,
                             waits.collective if waits else (), self.busy.steps,
                             waits.descheduled if waits else (),
                             waits.descheduled_inside if waits else ())
        self.busy.add(stats)
        if collectives is not None:
            self.waits.add(stats)
        return stats

    def gather(self, local: list[float], topo: DistEnv,
               fail: Callable[[str, BaseException], None]) -> list[list[float]] | None:
        """Every rank's row (every rank must call it at each log step), or None once it failed:
        a broken collective is never retried per step."""
        if not self._gather_ok:
            return None
        try:
            return gather_rows(local, topo)
        except Exception as exc:
            self._gather_ok = False
            fail("gather", exc)
            return None


def local_row(stats: WindowStats | None, busy_known: bool, peak_memory: float,
              loss: float | None, held: float | None, window: list[float] | None) -> list[float]:
    """This rank's row for the gather (every rank sends one, whatever failed before it)."""
    return [stats.step_time_s if stats else math.nan,
            stats.busy_s if stats and busy_known else math.nan,
            peak_memory, math.nan if loss is None else loss,
            math.nan if held is None else held, *(window or [0.0] * 4)]


def own_scores(rows: list[list[float]], rank: int) -> tuple[float | None, float | None]:
    """This rank's straggler score (from the busy times) and waited-for score (from the times
    held): by rank, unless only our row came back (RANK set but no process group)."""
    own = rank if len(rows) > 1 else 0
    return (straggler_scores([r[BUSY_AT] for r in rows])[own],
            straggler_scores([r[HELD_AT] for r in rows])[own])
