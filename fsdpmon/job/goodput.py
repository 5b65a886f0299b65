"""Where a job's time goes: one log window split into productive time and badput by cause.

The same arithmetic runs live in the monitor (rank 0, over the rows every rank gathers at a log
step) and after the fact in ``fsdpmon goodput`` (over the ranks' JSONL step records), so the
live counters and the report agree by construction.

In synchronous training every rank's step lasts as long as the slowest rank's: the others wait
for it in their collectives. So the job's window is the critical rank's (the one that waited
least), and what that rank did with it is what the job did:

- ``data_wait``: the critical rank's time in the data phase;
- ``straggler_wait``: its own work beyond the other ranks' median own work (the time they
  waited for it, beyond what a median rank takes), when the judge names it a straggler (in
  ``fsdpmon goodput``: the judge replayed over the run's records; live: the judge's score line,
  conventions.below_straggler_line, over the window);
- ``stall``: a stall's time beyond one ordinary step (from the stall records), taken out of the
  rank's own figures first, so that a rank stopped in its data phase is not also data-slow;
- ``productive``: the rest of the step time.

Checkpoint saves, restores, restarts and recomputed steps are not in a step window: they come
from their own records (``fsdpmon.job.run_goodput``).
"""

from __future__ import annotations

import statistics
from collections.abc import Collection
from dataclasses import dataclass

from fsdpmon.conventions import below_straggler_line

CATEGORIES = ("startup", "data_wait", "checkpoint_save", "checkpoint_restore", "restart",
              "recompute", "stall", "straggler_wait", "unaccounted")


@dataclass(frozen=True)
class RankWindow:
    """One rank's log window: ``steps`` steps lasting ``step_seconds`` in all, of which
    ``data_seconds`` in the data phase and ``wait_seconds`` inside collectives."""

    rank: int
    steps: int
    step_seconds: float
    data_seconds: float
    wait_seconds: float

    @property
    def own_seconds(self) -> float:
        """Its own work (not data, not waiting for the others)."""
        return max(0.0, self.step_seconds - self.data_seconds - self.wait_seconds)


def rank_window(rank: int, row: list[float]) -> RankWindow:
    """From a rank's ``window_row``: [step seconds, data seconds, wait seconds, steps]."""
    step, data, wait, steps = row
    return RankWindow(rank, int(steps), step, data, wait)


@dataclass(frozen=True)
class WindowSplit:
    step_seconds: float  # the job's step time in the window (the critical rank's)
    productive: float
    data_wait: float
    straggler_wait: float
    stall: float  # in the steps and between them
    critical_rank: int
    stall_between: float  # of which between the steps (not in step_seconds)


def _without_stall(window: RankWindow, stall: float) -> RankWindow:
    """The rank's figures less the stall: a rank that waited at least that long waited it out
    in a collective; the rank that held everyone up spent it in its data phase when that was
    long enough to hold it, else in its own work."""
    if window.wait_seconds >= stall:
        return RankWindow(window.rank, window.steps, window.step_seconds - stall,
                          window.data_seconds, window.wait_seconds - stall)
    data = window.data_seconds - stall if window.data_seconds >= stall else window.data_seconds
    return RankWindow(window.rank, window.steps, window.step_seconds - stall, data,
                      window.wait_seconds)


def holds_stall(window: RankWindow, stall: float) -> bool:
    """Whether the rank's own work in the window (its steps less their waits) holds a stall of
    ``stall`` seconds: it was stopped in it."""
    return stall > 0 and window.step_seconds - window.wait_seconds >= stall


def split_window(windows: list[RankWindow], stall: float = 0.0, wall: float = 0.0,
                 named: Collection[int] | None = None) -> WindowSplit | None:
    """The job's window from every rank's (None: no rank measured a step). ``wall``: the log
    window's wall seconds, from log step to log step (the same on every rank). ``named``: the ranks
    the judge, replayed over the run (``fsdpmon goodput``), named stragglers then; None where no
    replay is at hand (the monitor's live meter), which asks the judge's line
    (conventions.below_straggler_line) of this window's own work instead."""
    live = [w for w in windows if w.steps > 0]
    if not live:
        return None
    stall = max(0.0, stall)
    # The rank that held everyone up waited least; but a rank stopped in its own work after
    # its step's last collective holds the stall in its step while the others wait it out
    # after theirs (the monitor's log gather), each with a few ms of waits inside: the rank
    # whose own work holds the stall is the critical one.
    holding = [w for w in live if holds_stall(w, stall)]
    critical = min(holding or live, key=lambda w: (w.wait_seconds, w.rank))
    step_seconds = critical.step_seconds
    # A stall longer than the critical rank's steps happened between them (it was stopped in
    # its log step, or after it; the others waited in the gather or in their next step): it is
    # taken from the critical rank's time between steps, which is the job's.
    between = max(0.0, wall - step_seconds)
    outside = min(stall, between) if step_seconds < stall else 0.0
    stall = min(stall - outside, step_seconds)
    # a rank whose step is shorter than the stall waited it out after its step: nothing to take
    trimmed = [_without_stall(w, stall) if w.step_seconds >= stall else w for w in live]
    core = next(w for w in trimmed if w.rank == critical.rank)
    others = [w.own_seconds for w in trimmed if w.rank != critical.rank]
    usual = statistics.median(others) if others else core.own_seconds
    # Only a straggler in the judge's word costs straggler time; a smaller lead is the jitter
    # of who arrives last at each collective, part of every synchronous step. (A rank without
    # own work is never a straggler.)
    if named is None:
        straggling = core.own_seconds > 0 and below_straggler_line(usual / core.own_seconds)
    else:
        straggling = critical.rank in named and core.own_seconds > usual
    straggler = core.own_seconds - usual if straggling else 0.0
    # a data phase longer than the step (clocks read apart) is capped; own work, and so the
    # straggler's excess, is never more than what is left of the step
    data = min(core.data_seconds, step_seconds - stall)
    return WindowSplit(step_seconds, step_seconds - stall - data - straggler, data, straggler,
                       stall + outside, critical.rank, outside)
