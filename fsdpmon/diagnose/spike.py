"""A loss spike: the job's loss, throughout the evidence window, above LOSS_SPIKE_FACTOR x its
recent level, and the rank it began on.

The recent level is the median job loss over the LOSS_SPIKE_BASELINE_SECONDS before the window
(as much of them as the judge's history holds: the evidence says how far it reached), not over
the whole run: on a falling loss curve the run's first, high losses would raise the baseline
and hide a spike (issue 51: 1.8 -> 8.3 unnamed). A median over that length stays at
the level before the spike while the spike has lasted under about half of it.

The origin: each rank's own loss is compared with the job's recent level at each refresh since
the baseline began; the rank whose loss rose above LOSS_SPIKE_FACTOR x that level first is where
the spike began (at the step that rank reported then), the way a NaN's first rank is named.
Ranks that crossed at the same refresh rose together, and then no one rank is the origin.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

from fsdpmon.conventions import LOSS_SPIKE_BASELINE_SECONDS, LOSS_SPIKE_FACTOR
from fsdpmon.diagnose.window import Window
from fsdpmon.job.snapshot import JobSnapshot


@dataclass(frozen=True)
class Spike:
    base: float  # the job loss's recent level (median before the window)
    low: float  # the lowest job loss within the window
    first: tuple[int, ...] = ()  # the ranks whose own loss crossed first (empty: none known)
    step: int | None = None  # the step the (single) first rank reported when it crossed
    ranks: int = 0  # how many ranks reported a loss
    seconds: float = 0.0  # how far before the window the recent level reaches (as held)


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


Value = Callable[[JobSnapshot], float | None]


@dataclass(frozen=True)
class Level:
    base: float  # the median of the values before the window
    low: float  # the lowest value within the window
    seconds: float  # how far before the window the values of the median reach
    snaps: list[JobSnapshot]  # from the first of those on, to now


def recent_level(window: Window, value: Value) -> Level | None:
    """``value``'s recent level: the median over the LOSS_SPIKE_BASELINE_SECONDS before the
    window (or as much of them as the history holds) and the lowest within it, or None with
    fewer than 3 finite values before the window, none within it or a non-finite one within it
    (the NaN rules' evidence). The one "recent level" of the loss spike and of
    training_unstable."""
    start = window.recent[0].time
    earlier = [s for s in window.history[:-len(window.recent)]
               if s.time >= start - LOSS_SPIKE_BASELINE_SECONDS]
    before = [v for s in earlier if _finite(v := value(s))]
    during = [v for s in window.recent[1:] if (v := value(s)) is not None]
    if len(before) < 3 or not during or not all(math.isfinite(v) for v in during):
        return None
    return Level(statistics.median(before), min(during), start - earlier[0].time,
                 earlier + window.recent[1:])


def loss_spike(window: Window) -> Spike | None:
    """The spike when every job loss of the window is above LOSS_SPIKE_FACTOR x the median of
    the job losses in the LOSS_SPIKE_BASELINE_SECONDS before it (at least 3 of them)."""
    level = recent_level(window, lambda s: s.loss)
    if level is None or level.base <= 0 or level.low <= LOSS_SPIKE_FACTOR * level.base:
        return None
    return _origin(level)


def _origin(level: Level) -> Spike:
    """The spike with the ranks whose own loss first rose above the line (seen at or below it
    before: a rank that was above it all along did not rise), oldest first."""
    line = LOSS_SPIKE_FACTOR * level.base
    spike = Spike(level.base, level.low, seconds=level.seconds)
    reporting = {r.rank for s in level.snaps for r in s.ranks if not r.down and _finite(r.loss)}
    calm: set[int] = set()  # ranks seen at or below the line so far
    for snap in level.snaps:
        rows = [r for r in snap.ranks if not r.down and _finite(r.loss)]
        high = [r for r in rows if r.loss > line and r.rank in calm]
        if high:
            first = tuple(sorted(r.rank for r in high))
            step = high[0].step if len(high) == 1 else None
            return replace(spike, first=first, step=step, ranks=len(reporting))
        calm |= {r.rank for r in rows if r.loss <= line}
    return replace(spike, ranks=len(reporting))
