"""How long the calling thread has waited for a CPU: Linux's per-thread run-queue delay.

On a CPU host the straggler score compares host wall time, and wall time also grows when the
OS runs another process instead of the rank: with more runnable threads than cores each rank
is time-sliced, a slice being milliseconds, so on a loaded host two healthy ranks' busy times
can differ by several slices in a window: enough to score a healthy rank well past the
straggler line either way. That is the scheduler's choice, not the rank's work, and it moves
from rank to rank. The kernel counts it exactly:
``/proc/thread-self/schedstat`` holds the thread's time on a CPU, its time runnable but waiting
for one (run-queue delay), and its time slices, in nanoseconds since it started. One ``pread``
of a descriptor opened once costs about a microsecond. Where the file is missing (a kernel
without CONFIG_SCHED_INFO, or not Linux) the delay reads 0: wall time as before.
"""

from __future__ import annotations

import os

PATH = "/proc/thread-self/schedstat"


class RunQueueDelay:
    """Cumulative run-queue delay of the thread that created this reader."""

    def __init__(self, path: str = PATH) -> None:
        try:
            self._fd: int | None = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            self._fd = None

    @property
    def available(self) -> bool:
        return self._fd is not None

    def seconds(self) -> float:
        """Seconds runnable but not running since the thread started (0.0 if unknown)."""
        if self._fd is None:
            return 0.0
        try:
            return int(os.pread(self._fd, 96, 0).split()[1]) * 1e-9
        except (OSError, ValueError, IndexError):
            return 0.0

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
