"""The flight recorder: what a run's files must hold for its story to be told after the job is
gone (``fsdpmon incidents``, ``fsdpmon goodput``), written to the rank's JSONL and, for a stall,
to its log (``kubectl logs --previous`` keeps it after torchrun aborts and restarts the job).

Records (one JSON line each, beside the ``run`` and ``step`` records):

- ``{"kind": "stall", "state": "start", "time", "rank", "step", "since", "threshold",
  "phase", "last_collective", "call", "frames"}``: once per stall, when the watchdog sees it;
  ``since`` is the unix time of the last progress; ``call`` the last collective's ``op``,
  ``elements``, ``dtype`` and ``off_pattern`` (it differs from the previous step's call at its
  place), or null: ranks stalled at one number in different calls are a collective desync;
  ``frames`` the training thread's stack, innermost ``MAX_FRAMES`` frames, each text cut to
  ``stacks.MAX_TEXT`` (at most ~20 KB a record).
- ``{"kind": "stall", "state": "end", "time", "rank", "step", "since", "seconds",
  "during"}``: when progress resumes; ``seconds`` is the time lost beyond one ordinary step,
  ``during`` is "step", or "checkpoint" when the progress that ended it was a save (then the
  time is the save's, not a stall's).
- ``{"kind": "checkpoint", "time", "rank", "step", "seconds", "own_seconds"}``: a save ended.
- ``{"kind": "restore", "time", "rank", "step", "seconds"}``: a checkpoint was loaded.
- ``{"kind": "exit", "time", "rank", "restart", "how", "step", "ended"}``: how this rank's
  previous incarnation ended (written by the restarted process; see ``exit_record``).
- ``{"kind": "end", "time", "rank", "how", "step", "detail"}``: how this process ends (at
  close, an error, or SIGTERM); a rank killed outright writes none.

The ``run`` record carries ``process_start`` (unix time the process started) and ``restarts``;
each ``step`` record ``window_seconds``, ``steps``, ``step_seconds``, ``data_seconds`` and
``wait_seconds`` of its log window.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from fsdpmon.conventions import (
    DTYPE_NAMES,
    EXIT_ERROR,
    EXIT_NORMAL,
    EXIT_SIGTERM,
    OPS,
    decoded,
)
from fsdpmon.monitor import collectives, exit_cleanup
from fsdpmon.monitor.stacks import MAX_TEXT, last_collective, thread_frames

log = logging.getLogger("fsdpmon.monitor")

MAX_FRAMES = 32  # the flight recorder keeps the innermost frames: where the rank is stuck
Writer = Callable[[dict[str, Any]], None]


def process_start_unix() -> float:
    """When this process started (Linux: /proc/self/stat against the boot time)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat", encoding="ascii") as fh:
            boot = next(int(line.split()[1]) for line in fh if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


def entered_call() -> dict[str, Any] | None:
    """The last collective entered, decoded from the wrapper's codes (None: none yet)."""
    code, elements, dtype, off = collectives.entered_call()
    op = decoded(OPS, code)
    if op is None:
        return None
    return {"op": op, "elements": int(elements), "dtype": decoded(DTYPE_NAMES, dtype),
            "off_pattern": bool(off)}


class FlightRecorder:
    """One rank's recorder. ``write`` appends a record to the JSONL (or drops it)."""

    def __init__(self, rank: int, write: Writer, thread_id: int) -> None:
        self.rank, self.write, self.thread_id = rank, write, thread_id
        self.open_since: float | None = None  # unix time of the last progress before a stall

    def stall_started(self, since: float, threshold: float, step: float, phase: str,
                      entered: tuple[str, int] | None) -> None:
        """The watchdog thread's call: write the evidence once, to the JSONL and the log."""
        if self.open_since is not None:
            return
        self.open_since = since
        frames = thread_frames(self.thread_id, MAX_FRAMES)
        record = {"kind": "stall", "state": "start", "time": time.time(), "rank": self.rank,
                  "step": int(step), "since": since, "threshold": threshold,
                  "phase": phase[:MAX_TEXT] if phase else None,
                  "last_collective": last_collective(entered), "call": entered_call(),
                  "frames": frames}
        self.write(record)
        where = "; ".join(f"{f['file']}:{f['line']} {f['function']}" for f in frames[-3:])
        log.warning("fsdpmon flight recorder: rank %d stalled at step %d in phase %s, last "
                    "collective %s; innermost frames: %s", self.rank, int(step),
                    record["phase"] or "-",
                    record["last_collective"], where or "-")

    def stall_ended(self, step: int, during: str, durations: list[float]) -> float:
        """Progress resumed (training thread): the time lost beyond one ordinary step."""
        since, self.open_since = self.open_since, None
        if since is None:
            return 0.0
        now = time.time()
        typical = statistics.median(durations) if durations and during == "step" else 0.0
        lost = max(0.0, now - since - typical) if during == "step" else 0.0
        self.write({"kind": "stall", "state": "end", "time": now, "rank": self.rank,
                    "step": step, "since": since, "seconds": lost, "during": during})
        return lost

    def checkpoint(self, step: int, seconds: float, own_seconds: float) -> None:
        self.write({"kind": "checkpoint", "time": time.time(), "rank": self.rank, "step": step,
                    "seconds": seconds, "own_seconds": own_seconds})

    def restored(self, step: int, seconds: float) -> None:
        self.write({"kind": "restore", "time": time.time(), "rank": self.rank, "step": step,
                    "seconds": seconds})

    def ended(self, step: int, error: BaseException | None) -> None:
        """The JSONL's last word: how this process ends (at close, or SIGTERM's clean-up). A
        rank killed outright (SIGKILL, the OOM killer) writes none, which is how the run's
        files name it."""
        how = (EXIT_SIGTERM if exit_cleanup.ending() is not None
               else EXIT_ERROR if error is not None else EXIT_NORMAL)
        self.write({"kind": "end", "time": time.time(), "rank": self.rank, "how": how,
                    "step": step, "detail": type(error).__name__ if error is not None else ""})

    def previous_exit(self, restart: int, how: str, step: float, ended: float) -> None:
        self.write({"kind": "exit", "time": time.time(), "rank": self.rank, "restart": restart,
                    "how": how, "step": step, "ended": ended})
