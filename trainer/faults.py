"""Test-only fault injection, switched on by environment variables and inert otherwise.

The fault tests use these to make real failures happen at a known point: a rank that dies
with SIGKILL in the middle of a checkpoint save, and a job that holds still at a given step
so that a test can ``kill -9`` one of its ranks from outside. Both act only on the first
attempt (TORCHELASTIC_RESTART_COUNT 0), so the restarted job runs through.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

CRASH_IN_SAVE = "FSDPMON_TEST_CRASH_IN_SAVE_STEP"  # step whose save the last rank dies in
PAUSE_AT_STEP = "FSDPMON_TEST_PAUSE_AT_STEP"  # step after which every rank holds still
PAUSE_DIR = "FSDPMON_TEST_PAUSE_DIR"  # where each paused rank writes pause.rank{r} (its pid)


def _first_attempt() -> bool:
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"


def _armed(variable: str, step: int) -> bool:
    return os.environ.get(variable) == str(step) and _first_attempt()


def maybe_crash_in_save(step: int, rank: int) -> None:
    """Die like an OOM-killed process after this rank's files are written, before the commit."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if rank == world - 1 and _armed(CRASH_IN_SAVE, step):
        os.kill(os.getpid(), signal.SIGKILL)


def maybe_pause(step: int, rank: int, max_seconds: float = 120.0) -> None:
    if not _armed(PAUSE_AT_STEP, step):
        return
    folder = Path(os.environ.get(PAUSE_DIR, "."))
    (folder / f"pause.rank{rank}").write_text(str(os.getpid()))
    deadline = time.monotonic() + max_seconds
    while time.monotonic() < deadline:
        time.sleep(0.1)
