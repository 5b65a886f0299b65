"""The stall watchdog: a thread that notices when a rank has stayed where it is for too long.

The bound depends on where the rank is (stall_bound: warm-up, a save, inside a collective, or
stepping) and is drawn from the job's own history. The threshold it reports is that bound
counted from the last step (the heartbeat's timestamp, which `top`, `diagnose` and the rules
compare with), so every reader draws the same line. On entering a stall it sets the stalled
flag, logs a warning and dumps every thread's Python stack once (faulthandler, which works even
when the main thread is stuck inside C code such as a collective); it clears when steps resume.
"""

from __future__ import annotations

import faulthandler
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from fsdpmon.conventions import STALL_HISTORY_FACTOR
from fsdpmon.monitor.stall_bound import Bound, BoundHistory, BoundSettings, Position, stall_bound

log = logging.getLogger(__name__)


class StallWatchdog:
    def __init__(self, factor: float, floor_seconds: float,
                 on_change: Callable[[bool, float], None],
                 stack_stream: TextIO | None = None, history: int = 200,
                 on_tick: Callable[[], None] | None = None,
                 wait_floor_seconds: float | None = None,
                 where: Callable[[], Position | None] | None = None) -> None:
        self.settings = BoundSettings(
            factor, floor_seconds,
            floor_seconds if wait_floor_seconds is None else wait_floor_seconds,
            STALL_HISTORY_FACTOR)
        self.on_tick = on_tick  # every tick: proof that this process still runs Python
        self.on_change = on_change  # (stalled, threshold) whenever either changes
        self.stack_stream = stack_stream
        self.where = where  # the rank's position, its ``since`` in unix time
        self.history = BoundHistory(history)
        self._last_progress = time.monotonic()
        self._last_step: float | None = None  # monotonic, of the last completed step
        self._stalled = False
        self._threshold = floor_seconds
        self._armed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fsdpmon-watchdog", daemon=True)

    @property
    def stalled(self) -> bool:
        return self._stalled

    @property
    def threshold(self) -> float:
        return self._threshold

    def start(self) -> None:
        self._thread.start()

    def arm(self) -> None:
        """Start watching (at the first step: set-up time before it is not a stall)."""
        if not self._armed:
            self._last_progress = time.monotonic()
            self._armed = True

    def step_done(self, seconds: float | None) -> None:
        """Progress: a step of ``seconds`` completed (None: progress that is not a step)."""
        # Called from the training thread: an append and stores, no locking needed.
        now = time.monotonic()
        if seconds is not None:
            self.history.step_done(seconds)
            self._last_step = now
        self._last_progress = now

    def save_done(self, seconds: float) -> None:
        """A checkpoint save took ``seconds``: the next saves are bounded by it."""
        self.history.save_done(seconds)

    def recent_durations(self) -> list[float]:
        return list(self.history.steps)

    def progress_unix(self) -> float:
        """Unix time of the last progress (a step or a phase between steps)."""
        return time.time() - (time.monotonic() - self._last_progress)

    def bound(self, now: float | None = None) -> Bound:
        """The bound at the rank's position now, anchored on the monotonic clock."""
        now = time.monotonic() if now is None else now
        position = self.where() if self.where is not None else None
        offset = time.time() - time.monotonic()  # unix - monotonic, read once here
        # the history keys a wait by its unix ``since``, which stays put while the rank does
        self.history.observe(position, now + offset)
        if position is not None:
            position = Position(position.phase, position.inside, position.since - offset)
        return stall_bound(self.settings, self.history, position, self._last_progress)

    def compute_threshold(self, now: float | None = None) -> float:
        return self._threshold_of(self.bound(now))

    def _origin(self) -> float:
        """What the published threshold counts from: the last step (the heartbeat's timestamp),
        or the last progress before the first step."""
        return self._last_progress if self._last_step is None else self._last_step

    def _threshold_of(self, bound: Bound) -> float:
        """The bound counted from the origin: the seconds without a step that it allows."""
        # to the millisecond: the clocks' offset moves by microseconds between ticks, which
        # would tell every tick a change
        return round(bound.anchor - self._origin() + bound.seconds, 3)

    def check(self, now: float | None = None) -> bool:
        """One watchdog tick; returns whether the job is stalled now."""
        now = time.monotonic() if now is None else now
        bound = self.bound(now)
        threshold = self._threshold_of(bound)
        stalled = self._armed and now - bound.anchor > bound.seconds
        if stalled and not self._stalled:
            self._report(now - self._origin(), threshold)
        elif self._stalled and not stalled:
            log.warning("fsdpmon: steps resumed after a stall")
        if stalled != self._stalled or abs(threshold - self._threshold) > 1e-9:
            self._stalled, self._threshold = stalled, threshold
            self.on_change(stalled, threshold)
        return stalled

    def _report(self, age: float, threshold: float) -> None:
        log.warning("fsdpmon: no step completed for %.1fs (threshold %.1fs): stalled; "
                    "stacks of all threads follow", age, threshold)
        stream = self.stack_stream or sys.stderr
        try:
            stream.flush()
            faulthandler.dump_traceback(file=stream, all_threads=True)
            stream.flush()
        except (OSError, ValueError, AttributeError) as exc:  # no usable file descriptor
            log.warning("fsdpmon: could not dump stacks: %s", exc)

    def _run(self) -> None:
        while not self._stop.wait(self._tick()):
            try:
                if self.on_tick is not None:
                    self.on_tick()
                self.check()
            except Exception:  # the watchdog must never die or raise
                log.exception("fsdpmon: watchdog check failed")

    def _tick(self) -> float:
        return min(1.0, max(0.05, self._threshold / 10))

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
