"""How each incarnation of a rank ended, kept for the next one: the evidence that names the rank
that died when torchrun's elastic agent restarts the whole worker group.

When one rank dies, the agent stops the others (SIGTERM, then SIGKILL after a grace period) and
restarts them all, so from outside every rank vanishes at once. Only the ranks can tell who went
first. Each incarnation of a rank owns ``rank<R>.exit`` in the job's state directory: written
"running" at start (with its restart count), its step refreshed on log steps, and rewritten once
with how it ended: ``sigterm`` (stopped by the signal: the agent stopping the group, kubelet),
``error`` (a Python exception left the training loop, e.g. gloo's "connection closed" when a peer
died first) or ``exit`` (closed normally: the record is removed, nothing to explain). A process
killed by SIGKILL, the OOM killer or a segfault writes nothing, so its record still says
"running". The restarted process (TORCHELASTIC_RESTART_COUNT above the record's) reads it before
writing its own and publishes how its previous incarnation ended; "running" reads as ``killed``.

The last rank out of a node removes every record unless one still says "running" (a death to
explain), so a job that finished or was stopped leaves nothing behind. A missing record says
nothing (a first start, a stop with nobody killed, or a state directory cleaned away because the
restart came more than ``statedir.STALE_AFTER_SECONDS`` late): never "killed".
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsdpmon.conventions import EXIT_ERROR, EXIT_KILLED, EXIT_NORMAL, EXIT_SIGTERM
from fsdpmon.monitor import statedir

_RUNNING = "running"
_DETAIL_MAX = 80  # characters of an exception's type name kept


@dataclass(frozen=True)
class PreviousExit:
    """How this rank's previous incarnation ended."""

    how: str  # one of conventions.EXIT_HOWS
    step: float  # its step then (killed: its last log step)
    unix: float  # when it ended (killed: when the restarted process found it out)
    detail: str = ""  # the exception's type, for "error"
    last_progress: float | None = None  # unix time of its last log step (None: not known)


def record_path(directory: Path, rank: int) -> Path:
    return directory / f"rank{rank}.exit"


def read_previous(directory: Path, rank: int, restart_count: int,
                  now: float) -> PreviousExit | None:
    """The previous incarnation's ending, for a restarted rank (restart_count > 0) whose record
    is from an earlier restart of the same launcher; None on a first start or without one."""
    if restart_count <= 0:
        return None
    try:
        doc = json.loads(record_path(directory, rank).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    restart, step, when = (_number(doc.get(k)) for k in ("restart", "step", "time"))
    if restart is None or not 0 <= restart < restart_count:
        return None  # a later launcher's, or another job's: not this rank's previous life
    how = doc.get("how")
    progressed = _number(doc.get("progress_time"))
    if how == _RUNNING:
        return PreviousExit(EXIT_KILLED, step or 0.0, now, last_progress=progressed)
    if how not in (EXIT_SIGTERM, EXIT_ERROR, EXIT_NORMAL):
        return None
    return PreviousExit(str(how), step or 0.0, when if when is not None else now,
                        str(doc.get("detail", ""))[:_DETAIL_MAX], progressed)


class ExitRecord:
    """This incarnation's record: "running" from its creation until ``end``."""

    def __init__(self, directory: Path, rank: int, restart_count: int) -> None:
        self.path = record_path(directory, rank)
        self.restart = restart_count
        self.pid = os.getpid()
        self.step = 0.0
        self.progress_time: float | None = None  # unix time of the last log step
        self.ended = False
        # The training thread's progress vs a SIGTERM's end; reentrant because the SIGTERM
        # handler may interrupt progress() on the same thread (end() then writes over it).
        self._lock = threading.RLock()
        self._write(_RUNNING)

    def progress(self, step: float) -> None:
        """The step reached (log steps only): what a killed incarnation's record says."""
        with self._lock:
            if not self.ended and step != self.step:
                self.step = step
                self.progress_time = time.time()
                self._write(_RUNNING)

    def end(self, how: str, step: float | None = None, detail: str = "") -> None:
        """Record how this incarnation ends; the first call wins (a SIGTERM's clean-up, then
        the exception it causes in the training loop, are one ending)."""
        with self._lock:
            if self.ended:
                return
            self.ended = True
            self.step = max(self.step, step or 0.0)
            if how == EXIT_NORMAL:
                with contextlib.suppress(OSError):
                    self.path.unlink()  # done: a later restart has nothing to explain
            else:
                self._write(how, detail[:_DETAIL_MAX])

    def _write(self, how: str, detail: str = "") -> None:
        doc: dict[str, Any] = {"pid": self.pid, "restart": self.restart, "how": how,
                               "step": self.step, "time": time.time(), "detail": detail,
                               "progress_time": self.progress_time}
        tmp = self.path.with_name(f".{self.path.name}.{self.pid}")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # a write that failed half-way
        statedir.write_new(tmp, json.dumps(doc).encode())
        os.replace(tmp, self.path)


def sweep(directory: Path) -> None:
    """The last rank out of a directory removes every record, unless one tells of a death (a
    "running" record whose process is gone): then all stay, for the restarted ranks to read.
    A record of a live process means this is not the last rank out: nothing is touched."""
    paths = sorted(directory.glob("rank*.exit"))
    for path in paths:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # unreadable: says nothing either way
        if isinstance(doc, dict) and doc.get("how") == _RUNNING:
            return  # a live rank: not the last out; a dead one: killed, keep the evidence
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink()


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
