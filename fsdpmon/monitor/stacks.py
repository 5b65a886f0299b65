"""Stack evidence: what each rank is doing when it stalls, served as ``GET /stacks``.

When a rank's watchdog sees a stall, the rank writes ``stack<R>.json`` into the pod's state
directory: its training thread's stack as structured frames (file, line, function; outermost
first), the phase it is in, its last completed step, and the last collective it entered with a
per-rank sequence number (counted by the collective wrappers: two stores per call). It is
re-captured every ``REFRESH_SECONDS`` while the stall lasts and removed when steps resume;
nothing of it is written per step. Whichever rank serves the pod's port answers ``/stacks``
from these files, on the same listener as ``/metrics``:

    {"job": str, "ranks": [{"rank", "local_rank", "pid", "step", "phase", "stalled",
     "published_at", "last_collective": {"op", "seq"} | null, "frames": [...]}]}

Every live rank is listed; one that is not stalled has no frames. Bounded: at most
``MAX_FRAMES`` frames per rank (the innermost, where it is stuck), each text cut to
``MAX_TEXT`` characters, and a file over ``MAX_FILE_BYTES`` is ignored. A rank that runs no
Python (stopped, or hung holding the GIL) cannot publish: ``fsdpmon_train_unresponsive`` names it.

Why the stack of one thread: the training thread is the one that hangs (in ``next(loader)``, in
a collective); the monitor's own threads are noise. ``sys._current_frames`` reads it from the
watchdog thread without stopping it, as ``faulthandler`` does, so it works while the training
thread waits in C code with the GIL released.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from fsdpmon.monitor import statedir
from fsdpmon.monitor.state import read_job_states

MAX_FRAMES = 64
MAX_TEXT = 240
MAX_FILE_BYTES = 64 * 1024
REFRESH_SECONDS = 5.0  # a stall that moves (data -> collective) is seen within this


def thread_frames(thread_id: int, limit: int = MAX_FRAMES) -> list[dict[str, Any]]:
    """The thread's stack as ``{"file", "line", "function"}``, outermost first; the innermost
    ``limit`` frames when it is deeper (where a stuck thread is stuck)."""
    frame = sys._current_frames().get(thread_id)
    inner_first = []
    while frame is not None and len(inner_first) < limit:
        code = frame.f_code
        inner_first.append({"file": code.co_filename[-MAX_TEXT:], "line": int(frame.f_lineno or 0),
                            "function": code.co_name[:MAX_TEXT]})
        frame = frame.f_back
    return inner_first[::-1]


def last_collective(entered: tuple[str, int] | None) -> dict[str, Any] | None:
    if entered is None:
        return None
    op, seq = entered
    return {"op": str(op)[:MAX_TEXT], "seq": int(seq)}


class StackPublisher:
    """One rank's side: capture and write its evidence while stalled, remove it after."""

    def __init__(self, directory: Path, rank: int, local_rank: int, thread_id: int,
                 context: Callable[[], tuple[float, str, tuple[str, int] | None]],
                 clock: Callable[[], float] = time.time) -> None:
        self.path = directory / f"stack{rank}.json"
        self.rank, self.local_rank, self.thread_id = rank, local_rank, thread_id
        self.context = context  # () -> (last completed step, phase, last collective entered)
        self.clock = clock
        self.published_at = 0.0
        self.pid = os.getpid()

    def capture(self) -> dict[str, Any]:
        step, phase, entered = self.context()
        return {
            "rank": self.rank, "local_rank": self.local_rank, "pid": self.pid, "step": int(step),
            "phase": phase[:MAX_TEXT] if phase else None, "stalled": True,
            "published_at": self.clock(), "last_collective": last_collective(entered),
            "frames": thread_frames(self.thread_id),
        }

    def publish(self) -> None:
        """Write the evidence (atomically: a reader sees the old file or the new one)."""
        record = self.capture()
        tmp = self.path.with_name(f".{self.path.name}.{self.pid}")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        statedir.write_new(tmp, json.dumps(record).encode())
        os.replace(tmp, self.path)
        self.published_at = record["published_at"]

    def due(self) -> bool:
        """While stalled: time to capture again (the stall may have moved)."""
        return self.clock() - self.published_at >= REFRESH_SECONDS

    def clear(self) -> None:
        self.published_at = 0.0
        with contextlib.suppress(OSError):
            self.path.unlink()


# ---- the serving side ----------------------------------------------------------------------

def _text(value: Any) -> str | None:
    return value[:MAX_TEXT] if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _frame(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        return None
    file, function, line = _text(raw.get("file")), _text(raw.get("function")), _int(raw.get("line"))
    if file is None or function is None or line is None:
        return None
    return {"file": file, "line": line, "function": function}


def _published(directory: Path, rank: int, pid: int) -> dict[str, Any] | None:
    """A rank's stack file, if it is that (live) process's and well-formed. Untrusted input:
    the document is rebuilt from the fields it must have, each checked."""
    try:
        with open(directory / f"stack{rank}.json", "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
        record = json.loads(raw) if len(raw) <= MAX_FILE_BYTES else None
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or record.get("pid") != pid:
        return None  # an earlier incarnation's file
    frames = record.get("frames")
    at = record.get("published_at")
    entered = record.get("last_collective")
    op = _text(entered.get("op")) if isinstance(entered, dict) else None
    seq = _int(entered.get("seq")) if isinstance(entered, dict) else None
    return {
        "rank": rank, "local_rank": _int(record.get("local_rank")), "pid": pid,
        "step": _int(record.get("step")), "phase": _text(record.get("phase")), "stalled": True,
        "published_at": float(at) if isinstance(at, (int, float)) and math.isfinite(at) else None,
        "last_collective": {"op": op, "seq": seq} if op is not None and seq is not None else None,
        "frames": [f for f in map(_frame, frames[-MAX_FRAMES:] if isinstance(frames, list)
                                  else []) if f is not None],
    }


def job_stacks(directory: Path, job_name: str) -> dict[str, Any]:
    """The ``/stacks`` document of every live rank of the pod."""
    ranks = []
    for state in read_job_states(directory):
        pid = state.heartbeat.pid
        record = _published(directory, state.rank, pid) if state.heartbeat.stalled else None
        ranks.append(record or {
            "rank": state.rank, "local_rank": state.snapshot.get("local_rank"), "pid": pid,
            "step": int(state.heartbeat.step), "phase": None, "stalled": False,
            "published_at": None, "last_collective": None, "frames": [],
        })
    return {"job": job_name, "ranks": ranks}


def stacks_app(directory: Path, job_name: str) -> Callable[..., Iterable[bytes]]:
    """The WSGI app for ``/stacks`` (mounted on the pod's metrics listener)."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        body = json.dumps(job_stacks(directory, job_name), allow_nan=False).encode()
        start_response("200 OK", [("Content-Type", "application/json"),
                                  ("Content-Length", str(len(body)))])
        return [body]

    return app
