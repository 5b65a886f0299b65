"""The stall watchdog: a thread that notices when no step has completed for too long.

Threshold = max(factor x median recent step time, floor). On entering a stall it sets the stalled
flag, logs a warning and dumps every thread's Python stack once (faulthandler, which works even
when the main thread is stuck inside C code such as a collective); it clears when steps resume.
"""

from __future__ import annotations

import faulthandler
import logging
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TextIO

log = logging.getLogger(__name__)


class StallWatchdog:
    def __init__(self, factor: float, floor_seconds: float,
                 on_change: Callable[[bool, float], None],
                 stack_stream: TextIO | None = None, history: int = 200,
                 on_tick: Callable[[], None] | None = None) -> None:
        self.factor = factor
        self.on_tick = on_tick  # every tick: proof that this process still runs Python
        self.floor = floor_seconds
        self.on_change = on_change  # (stalled, threshold) whenever either changes
        self.stack_stream = stack_stream
        self._durations: deque[float] = deque(maxlen=history)
        self._last_progress = time.monotonic()
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
        # Called from the training thread: an append and a store, no locking needed.
        if seconds is not None:
            self._durations.append(seconds)
        self._last_progress = time.monotonic()

    def recent_durations(self) -> list[float]:
        return list(self._durations)

    def progress_unix(self) -> float:
        """Unix time of the last progress (a step or a phase between steps)."""
        return time.time() - (time.monotonic() - self._last_progress)

    def compute_threshold(self) -> float:
        durations = list(self._durations)
        if not durations:
            return self.floor
        return max(self.factor * statistics.median(durations), self.floor)

    def check(self, now: float | None = None) -> bool:
        """One watchdog tick; returns whether the job is stalled now."""
        now = time.monotonic() if now is None else now
        threshold = self.compute_threshold()
        stalled = self._armed and now - self._last_progress > threshold
        if stalled and not self._stalled:
            self._report(now - self._last_progress, threshold)
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
