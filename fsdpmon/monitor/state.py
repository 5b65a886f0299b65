"""Per-rank state shared between the ranks of one pod, so that one endpoint can serve them all.

Each rank owns two files in a per-job directory (under /dev/shm when it exists, so nothing hits a
disk):
- ``rank<R>.hb``: a fixed-size memory-mapped record (pid, heartbeat, step counters, stall flag)
  rewritten on every step with one ``pack_into`` — no syscall on the hot path. A sequence number
  written at both ends lets a reader detect a torn read and retry.
- ``rank<R>.json``: everything else (labels, gauges, histogram, job figures), replaced atomically
  (write + rename) on log steps only.

Whichever rank holds the port reads every rank's files per scrape; a rank whose PID is gone (or a
zombie) is dropped, so a dead rank's series disappear instead of going stale.

Why not prometheus_client's multiprocess mode: it needs PROMETHEUS_MULTIPROC_DIR set before the
first import, keeps a dead process's counters and most gauges until someone calls
``mark_process_dead`` from outside (torchrun never does), writes an mmap'd file per metric and
label set, and has no notion of a heartbeat age computed at scrape time.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import re
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsdpmon.monitor import exit_record, statedir
from fsdpmon.monitor.heartbeat import (
    HB_CALLS,
    HB_CALLS_AT,
    HB_POSITION,
    HB_RECORD,
    HB_SIZE,
    Heartbeat,
    heartbeat_pid,
    pid_alive,
    read_heartbeat,
)

# No progress evidence published (yet): no collective, no phase (-1), no time.
NO_POSITION = (0.0, 0.0, 0.0, -1.0, 0.0)
# No collectives' identity: no step's calls (-1), no call entered.
NO_CALLS = (-1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class RankState:
    """What one rank last published: the JSON snapshot plus its live heartbeat."""

    rank: int
    snapshot: dict[str, Any]
    heartbeat: Heartbeat


def job_state_dir(job_name: str, port: int, base: str | None = None) -> Path:
    """The directory the ranks of one job on one machine share (same job name and port)."""
    if base is None:
        shm = Path("/dev/shm")
        base = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else tempfile.gettempdir()
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", job_name)[:100]
    return Path(base) / f"fsdpmon-{os.getuid()}-{safe}-{port}"


class RankStateWriter:
    """The writing side, owned by one rank."""

    def __init__(self, directory: Path, rank: int) -> None:
        statedir.prepare(directory)  # ours, 0700, not a symlink: or InputError
        self.directory = directory
        self.rank = rank
        self.pid = os.getpid()
        statedir.check_rank_free(directory, rank, self.pid)
        self.hb_path = directory / f"rank{rank}.hb"
        self.json_path = directory / f"rank{rank}.json"
        # A fresh file (not truncating one a reader may have mapped) of the full size.
        tmp = directory / f".rank{rank}.hb.{self.pid}"
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # left by an earlier process with our pid
        statedir.write_new(tmp, b"\0" * HB_SIZE)
        os.replace(tmp, self.hb_path)
        fd = os.open(self.hb_path, os.O_RDWR | os.O_NOFOLLOW)
        self._fh = os.fdopen(fd, "r+b")  # lives as long as the map
        self._map = mmap.mmap(self._fh.fileno(), HB_SIZE)
        self._seq = 0
        # Heartbeats come from the training and watchdog threads, close from a SIGTERM's
        # clean-up on any thread; reentrant, as the handler may interrupt a heartbeat.
        self._lock = threading.RLock()
        self._closed = False
        self._pack(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, *NO_POSITION)  # owned from the start

    def heartbeat(self, last_step_unix: float, step: float, steps_total: float,
                  tokens_total: float, stalled: float, stall_threshold: float,
                  watchdog_unix: float = 0.0,
                  position: tuple[float, float, float, float, float] = NO_POSITION,
                  calls: tuple[float, ...] = NO_CALLS) -> None:
        """``position``: the progress evidence (collective entered and completed, inside one,
        the phase's index, since when all of it is unchanged); ``calls``: the collectives'
        identity (heartbeat.HB_CALLS)."""
        self._pack(last_step_unix, step, steps_total, tokens_total, stalled, stall_threshold,
                   watchdog_unix, *position, calls=calls)

    def _pack(self, *values: float, calls: tuple[float, ...] = NO_CALLS) -> None:
        with self._lock:
            if self._closed:
                return  # a SIGTERM's clean-up got here first: nothing more to publish
            self._seq += 1
            record, position = values[:-len(NO_POSITION)], values[-len(NO_POSITION):]
            HB_RECORD.pack_into(self._map, 0, self._seq, self.pid, *record, self._seq)
            HB_POSITION.pack_into(self._map, HB_RECORD.size, *position, self._seq)
            HB_CALLS.pack_into(self._map, HB_CALLS_AT, *calls, self._seq)

    def snapshot(self, data: dict[str, Any]) -> None:
        with self._lock:
            if self._closed:
                return  # as in _pack
            tmp = self.directory / f".rank{self.rank}.json.{self.pid}"
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()  # a write that failed half-way
            statedir.write_new(tmp, json.dumps(data, allow_nan=True).encode())
            os.replace(tmp, self.json_path)

    def close(self, remove: bool = True) -> None:
        with self._lock:
            self._closed = True
            with contextlib.suppress(Exception):
                self._map.close()
                self._fh.close()
        if remove:
            for path in (self.json_path, self.hb_path):
                # Only our own files: a restarted incarnation of this rank may own them now.
                with contextlib.suppress(OSError):
                    if _owner_pid(path) in (self.pid, None):
                        path.unlink()
            tidy(self.directory)
            with contextlib.suppress(OSError):
                self.directory.rmdir()  # the last rank out removes the (then empty) directory


def tidy(directory: Path) -> None:
    """Remove what ranks that are gone left: their state and stack files (they died without
    closing), half-written files, and every exit record unless one tells of a rank killed.
    What the last rank out does, and the pod's server when it outlives them all."""
    _remove_dead_ranks(directory)
    exit_record.sweep(directory)
    _remove_dead_writes(directory)
    _remove_dead_stacks(directory)
    statedir.remove_unheld_lock(directory)  # a killed server's


def read_job_states(directory: Path) -> list[RankState]:
    """Every live rank's state, by rank; dead ranks' files are removed on the way."""
    states: list[RankState] = []
    try:
        candidates = sorted(directory.glob("rank*.json"))
    except OSError:
        return states
    for json_path in candidates:
        state = _read_rank(json_path)
        if state is None:
            continue
        if not pid_alive(state.heartbeat.pid):
            _remove_dead(json_path, state.heartbeat.pid)
            continue
        states.append(state)
    states.sort(key=lambda s: s.rank)
    return states


def _read_rank(json_path: Path) -> RankState | None:
    # Untrusted input as far as the server is concerned: anything odd is skipped.
    try:
        snapshot = json.loads(json_path.read_text())
        rank = int(snapshot["rank"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(snapshot, dict):
        return None
    heartbeat = read_heartbeat(json_path.with_suffix(".hb"))
    if heartbeat is None or heartbeat.pid != snapshot.get("pid"):
        return None
    return RankState(rank, snapshot, heartbeat)


def _owner_pid(path: Path) -> int | None:
    if path.suffix == ".hb":
        return heartbeat_pid(path)
    try:
        return int(json.loads(path.read_text()).get("pid"))
    except (OSError, ValueError, TypeError, AttributeError):
        return None


# A file being written before its rename into place: named by the writing process's pid.
_UNFINISHED = re.compile(r"\.rank\d+\.(?:hb|json|exit)\.(\d+)")


def _remove_dead_ranks(directory: Path) -> None:
    """Every state or heartbeat file whose process is gone, paired or not: a rank that died
    before its first snapshot left a heartbeat with no state file beside it, which
    ``read_job_states`` (pairs only) never looks at."""
    with contextlib.suppress(OSError):
        for path in [*directory.glob("rank*.hb"), *directory.glob("rank*.json")]:
            pid = _owner_pid(path)
            if pid is not None and not pid_alive(pid):
                with contextlib.suppress(OSError):
                    path.unlink()


def _remove_dead_writes(directory: Path) -> None:
    """Removes the half-written files of processes that are gone: a rank killed, or stopped by
    a signal whose clean-up interrupted its own write, between writing one and renaming it
    (the directory could not go otherwise). A live process's write is left alone."""
    with contextlib.suppress(OSError):
        for path in directory.iterdir():
            match = _UNFINISHED.fullmatch(path.name)
            if match and (int(match.group(1)) == os.getpid() or
                          not pid_alive(int(match.group(1)))):
                with contextlib.suppress(OSError):
                    path.unlink()


def _remove_dead_stacks(directory: Path) -> None:
    """A rank killed while stalled leaves its ``stack<R>.json`` (pid inside): removed once that
    process is gone."""
    with contextlib.suppress(OSError):
        for path in directory.glob("stack*.json"):
            try:
                pid = int(json.loads(path.read_bytes()[:1 << 20]).get("pid"))
            except (OSError, ValueError, TypeError, AttributeError):
                continue
            if not pid_alive(pid):
                with contextlib.suppress(OSError):
                    path.unlink()


def _remove_dead(json_path: Path, pid: int) -> None:
    for path in (json_path, json_path.with_suffix(".hb")):
        with contextlib.suppress(OSError):
            if _owner_pid(path) == pid:
                path.unlink()
