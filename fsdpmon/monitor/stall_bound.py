"""The stall bound: how long a rank may stay where it is before it counts as stalled, drawn from
the job's own history at the rank's position (issue 49).

A fixed floor (120 s) keeps a first step, a long save or an evaluation from paging, but it makes
every hang page minutes late. The progress evidence says where the rank is, so each position
gets the bound its own history allows:

- warm-up (no step time known yet: compile, restore, the first steps): the generous floor;
- a checkpoint save: the longest previous save times ``history_factor``, never under the floor
  (the first save has no history: the floor);
- inside a collective: the others' side of a hang. The longest wait inside one collective this
  rank has seen since warm-up times ``history_factor``, with the small ``wait_floor`` (never above
  the generous floor). Measured from entering the collective, not from the last step, so an
  evaluation or a save before it does not count as waiting;
- anywhere else (computing, loading data, an evaluation pass that calls no collective, a
  rank-0-only export between steps): ``factor`` x the median step time, never under the floor.

A rank that hangs outside a collective is found by the ranks that wait for it inside one: their
bound is the short one. The bound is returned with its anchor (when the rank's clock for it
started), so the watchdog, `top`, `diagnose` and the rules all measure from the same instant.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from fsdpmon.conventions import CHECKPOINT_PHASE


@dataclass(frozen=True)
class BoundSettings:
    factor: float  # x the median step time, outside collectives
    floor: float  # the generous floor: warm-up, saves, outside collectives
    wait_floor: float  # the small floor inside a collective
    history_factor: float  # x the longest wait or save seen


@dataclass(frozen=True)
class Position:
    """Where the rank is: its phase ("" between phases), whether it is inside a collective, and
    since when (the same clock as the anchors the watchdog passes in)."""

    phase: str
    inside: bool
    since: float


@dataclass(frozen=True)
class Bound:
    seconds: float  # allowed at this position ...
    anchor: float  # ... from this instant (the last progress, or entering the collective)
    kind: str  # "warm-up", "checkpoint", "collective" or "steps": which history drew it


class BoundHistory:
    """What the bounds are drawn from: recent step times, the longest collective wait and the
    longest save seen. Fed by the training thread (steps, saves) and the watchdog thread
    (waits); each field is one store."""

    def __init__(self, steps: int = 200) -> None:
        self.steps: deque[float] = deque(maxlen=steps)
        self.longest_wait = 0.0
        self.longest_save = 0.0
        self._waiting: tuple[float, float] | None = None  # (since, seconds seen) of a wait

    def step_done(self, seconds: float) -> None:
        self.steps.append(seconds)

    def save_done(self, seconds: float) -> None:
        self.longest_save = max(self.longest_save, seconds)

    def observe(self, position: Position | None, now: float) -> None:
        """One look at the rank (each watchdog tick): a wait is counted once it has ended, so a
        hang never raises its own bound. Waits in warm-up and in saves are not the job's
        ordinary waits and are not counted."""
        current = self._waiting
        if current is not None and (position is None or position.since != current[0]
                                    or not position.inside):
            self.longest_wait = max(self.longest_wait, current[1])
            current = self._waiting = None
        if (position is not None and position.inside and self.steps
                and position.phase != CHECKPOINT_PHASE):
            self._waiting = (position.since, max(0.0, now - position.since))


def stall_bound(settings: BoundSettings, history: BoundHistory, position: Position | None,
                last_progress: float) -> Bound:
    """The bound at ``position`` (None: unknown, as outside a collective)."""
    if not history.steps:
        return Bound(settings.floor, last_progress, "warm-up")
    if position is not None and position.phase == CHECKPOINT_PHASE:
        seconds = max(settings.floor, settings.history_factor * history.longest_save)
        return Bound(seconds, last_progress, "checkpoint")
    if position is not None and position.inside:
        wait_floor = min(settings.wait_floor, settings.floor)
        seconds = max(wait_floor, settings.history_factor * history.longest_wait)
        return Bound(seconds, max(position.since, last_progress), "collective")
    # a copy first: the training thread appends while the watchdog thread reads
    steps = list(history.steps)
    seconds = max(settings.factor * statistics.median(steps), settings.floor)
    return Bound(seconds, last_progress, "steps")
