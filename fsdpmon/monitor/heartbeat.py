"""A rank's heartbeat record (``rank<R>.hb``): its fixed binary layout, the torn-read-safe
reader, and whether the process that wrote it still runs. The state writer (state.py) and the
state directory's housekeeping (statedir.py) both read it."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

# seq, pid, last_step_unix, step, steps_total, tokens_total, stalled, stall_threshold,
# watchdog_unix, seq
HB_RECORD = struct.Struct("<qqddddddd q")
# Then, at HB_RECORD.size: collective_entered, collective_completed, in_collective, phase (an
# index of conventions.PROGRESS_PHASES), position_since_unix, seq. After the record rather than
# in it, so that a reader of the record alone (an older fsdpmon on the same host, tidying
# /dev/shm) still finds it whole instead of torn, and does not take a live job's files for a
# dead one's; a position whose seq is 0 was never written (an older writer).
HB_POSITION = struct.Struct("<ddddd q")
# Then, at HB_CALLS_AT: the collectives' identity (fsdpmon.monitor.collectives): the last
# completed step's calls (-1: none known), fingerprint and sequence number at its end; the
# entered call's op code, elements, dtype code and whether it breaks the previous step's
# pattern; seq. Likewise after the others, for the same reason (seq 0: not written).
HB_CALLS = struct.Struct("<ddddddd q")
HB_CALLS_AT = HB_RECORD.size + HB_POSITION.size
HB_SIZE = 192  # room to grow without changing the file size
assert HB_CALLS_AT + HB_CALLS.size <= HB_SIZE


@dataclass(frozen=True)
class Heartbeat:
    pid: int
    last_step_unix: float  # 0 until the first step completes
    step: float
    steps_total: float
    tokens_total: float
    stalled: float
    stall_threshold: float
    watchdog_unix: float = 0.0  # last tick of the rank's watchdog thread: is the process alive?
    # Progress evidence (collectives.progress and the phase), and since when it is unchanged.
    collective_entered: float = 0.0
    collective_completed: float = 0.0
    in_collective: float = 0.0
    phase: float = -1.0  # an index of conventions.PROGRESS_PHASES; -1: not published
    position_since_unix: float = 0.0
    # The collectives' identity (HB_CALLS; the defaults: not published).
    step_calls: float = -1.0
    step_fingerprint: float = 0.0
    step_end_seq: float = 0.0
    entered_op: float = 0.0
    entered_elements: float = 0.0
    entered_dtype: float = 0.0
    entered_off_pattern: float = 0.0


def read_heartbeat(path: Path) -> Heartbeat | None:
    """The heartbeat record, or None when the file is missing or keeps tearing."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    for _ in range(3):
        if len(raw) < HB_RECORD.size:
            return None
        seq, pid, *values, seq_end = HB_RECORD.unpack_from(raw)
        position: list[float] = []
        if len(raw) >= HB_RECORD.size + HB_POSITION.size:
            *position, seq_position = HB_POSITION.unpack_from(raw, HB_RECORD.size)
            if seq_position == 0:
                position = []  # an older writer: no position
            elif seq_position != seq:
                seq_end = seq - 1  # torn between the two parts: read again
        calls = _calls(raw, seq) if position else []
        if calls is None:
            seq_end = seq - 1
        if seq == seq_end:
            return Heartbeat(pid, *values, *position, *(calls or []))
        try:
            raw = path.read_bytes()
        except OSError:
            return None
    return None


def heartbeat_pid(path: Path) -> int | None:
    """The pid of the process that writes ``path``, torn record or not: it is written once,
    before the file is renamed into place, and never changes. A writer killed between the
    record's parts leaves it torn for good; whether that writer runs is still known."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    if len(raw) < HB_RECORD.size:
        return None
    pid = HB_RECORD.unpack_from(raw)[1]
    return pid if pid > 0 else None


def _calls(raw: bytes, seq: int) -> list[float] | None:
    """The collectives' section: [] when absent or never written, None when torn."""
    if len(raw) < HB_CALLS_AT + HB_CALLS.size:
        return []
    *calls, seq_calls = HB_CALLS.unpack_from(raw, HB_CALLS_AT)
    if seq_calls == 0:
        return []
    return calls if seq_calls == seq else None


def pid_alive(pid: int) -> bool:
    """True when ``pid`` runs (a zombie — exited, not yet reaped — counts as dead)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    state = process_state(pid)
    return state not in ("Z", "X")  # None: no procfs, trust kill()


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid`` (R, S, D, T stopped, t traced, Z, ...), None
    when unknown (gone, or no procfs)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state = stat.rsplit(")", 1)[-1].split()[:1]
    return state[0] if state else None


def stopped(pid: int) -> bool:
    """True while ``pid`` is stopped (SIGSTOP, a debugger): it runs no code at all."""
    return process_state(pid) in ("T", "t")
