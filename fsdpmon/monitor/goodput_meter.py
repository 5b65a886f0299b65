"""The job's goodput, live: counters of productive seconds and badput seconds by cause, kept by
rank 0 (the one rank that sees every rank's window at a log step) and served as
``fsdpmon_train_productive_seconds_total`` and ``fsdpmon_train_badput_seconds_total{cause}``.

Each incarnation counts from zero (counters reset with the process; Prometheus' ``increase``
takes care of that). A restarted rank 0 adds the restart (from its previous incarnation's last
log step to its first step, less the restore) and the recomputed steps (from the previous
incarnation's last step back to the restored checkpoint, at the current step time). Those steps
were counted productive when first made and counters never go down, so goodput over a range is
(productive - recompute) / (productive + the other badput): see docs/goodput.md.
"""

from __future__ import annotations

import math
import statistics
import time

from fsdpmon.job.goodput import CATEGORIES, WindowSplit, rank_window, split_window
from fsdpmon.monitor.stats import WindowStats


class GoodputMeter:
    def __init__(self, process_start: float) -> None:
        self.process_start = process_start
        self.productive = 0.0
        self.badput = dict.fromkeys(CATEGORIES, 0.0)
        self.started = False
        self.previous: tuple[float, float] | None = None  # (step, unix of its last log step)
        self.restored: tuple[int, float] | None = None  # (step, seconds)
        self._first_begin: float | None = None

    def restart_from(self, step: float, last_progress: float | None) -> None:
        """The previous incarnation's last step and when it made it (a restarted rank)."""
        if last_progress is not None:
            self.previous = (step, last_progress)

    def restore(self, step: int, seconds: float) -> None:
        self.restored = (step, seconds)
        self.badput["checkpoint_restore"] += seconds

    def first_step(self, now: float | None = None) -> None:
        """At the first step's begin: set-up before it is startup, or restart after a failure."""
        if self.started:
            return
        self.started = True
        now = time.time() if now is None else now
        self._first_begin = now
        restore = self.restored[1] if self.restored else 0.0
        if self.previous is None:
            self.badput["startup"] += max(0.0, now - self.process_start - restore)
        else:
            self.badput["restart"] += max(0.0, now - self.previous[1] - restore)

    def window(self, split: WindowSplit, step_seconds: list[float]) -> None:
        self.productive += split.productive
        self.badput["data_wait"] += split.data_wait
        self.badput["straggler_wait"] += split.straggler_wait
        self.badput["stall"] += split.stall
        if self.previous is not None and self.restored is not None and step_seconds:
            lost_steps = max(0.0, self.previous[0] - self.restored[0])
            self.badput["recompute"] += lost_steps * statistics.median(step_seconds)
            self.previous = None  # counted once, at the first window after the restart

    def rows(self, rows: list[list[float]], at: int, stall: float, stats: WindowStats) -> None:
        """Every rank's gathered row (its ``window_row`` from index ``at``): the job's split."""
        steps = list(stats.step_seconds)
        split = split_window([rank_window(r, row[at:at + 4]) for r, row in enumerate(rows)
                              if len(row) >= at + 4], stall, stats.wall_seconds)
        if split is not None:
            self.window(split, steps)

    def checkpoint(self, seconds: float) -> None:
        self.badput["checkpoint_save"] += seconds

    def ratio(self) -> float | None:
        """Kept step time over all time counted so far (None before the first window)."""
        redone = self.badput["recompute"]
        wall = self.productive + sum(self.served().values()) - redone
        if self.productive <= 0 or wall <= 0:
            return None
        return max(0.0, self.productive - redone) / wall

    def served(self) -> dict[str, float]:
        """The badput counters by cause (unaccounted has no live counter: it is the rest)."""
        return {k: v for k, v in self.badput.items() if k != "unaccounted"}


def window_row(stats: WindowStats | None) -> list[float]:
    """[step seconds, data seconds, collective wait seconds, steps] of this rank's window."""
    if stats is None:
        return [0.0] * 4
    total = math.fsum(stats.step_seconds)
    data = stats.phase_means.get("data", 0.0) * stats.steps
    return [total, data, (stats.collective_wait_ratio or 0.0) * total, float(stats.steps)]
