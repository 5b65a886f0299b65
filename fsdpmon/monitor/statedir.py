"""The state directory's safety: private to its owner, never a symlink, one job per port, no litter.

Its path (``/dev/shm/fsdpmon-<uid>-<job>-<port>``) is predictable, because every local rank of a
job must find it. So it is created 0700 and, when it already exists, used only if it is a real
directory (``lstat``: not a symlink) owned by us that nobody else can enter or write; anything
else is refused with one line. Inside a private directory no other user can plant a file or a
symlink; files are still created with ``O_EXCL | O_NOFOLLOW`` so a name that already exists is
never written through.

Two jobs of one user on one port would share or fight over the endpoint (the second one's ranks
replacing the first one's files, or never being served); the second is refused at start instead.
Directories whose processes are all gone are removed when a new job starts, and a job removes its
own on exit (``exit_cleanup`` adds SIGTERM).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import time
from pathlib import Path

from fsdpmon.errors import InputError
from fsdpmon.monitor.heartbeat import heartbeat_pid, pid_alive

PREFIX = "fsdpmon-"
# The pod server's lock file (podserver): held with flock as long as a server serves the directory.
SERVER_LOCK = "server.lock"
# A directory younger than this may belong to a job whose ranks have not written a heartbeat yet.
STALE_AFTER_SECONDS = 60.0


def prepare(directory: Path) -> None:
    """Create ``directory`` private to us, or accept it only if it already is; else InputError."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    check_private(directory)


def check_private(directory: Path) -> None:
    st = os.lstat(directory)
    why = ""
    if stat.S_ISLNK(st.st_mode):
        why = "is a symlink"
    elif not stat.S_ISDIR(st.st_mode):
        why = "is not a directory"
    elif st.st_uid != os.getuid():
        why = f"is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    elif st.st_mode & 0o077:
        why = f"is open to other users (mode {stat.S_IMODE(st.st_mode):04o}, expected 0700)"
    if why:
        raise InputError(f"fsdpmon state directory {directory} {why}: refusing to use it "
                         "(remove it, or set FSDPMON_STATE_DIR to a directory of your own)")


def open_new(path: Path) -> int:
    """A new file for writing: fails if the name exists, never follows a symlink."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)


def write_new(path: Path, data: bytes) -> None:
    fd = open_new(path)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def live_pids(directory: Path) -> dict[str, int]:
    """``rank<R>.hb`` name -> pid, for every heartbeat whose process still runs."""
    found = {}
    with contextlib.suppress(OSError):
        for hb_path in directory.glob("rank*.hb"):
            pid = heartbeat_pid(hb_path)  # torn or not: a live writer's pid is whole
            if pid is not None and pid_alive(pid):
                found[hb_path.name] = pid
    return found


def remove_unheld_lock(directory: Path) -> bool:
    """Remove the server's lock file when no server holds it: one SIGKILLed leaves it behind,
    and the last rank out would find its directory not empty. Taken before it is unlinked, so a
    server holding it is never robbed; one that opened it a moment before finds it replaced and
    leaves (podserver.orphaned), and the ranks start another."""
    try:
        fd = os.open(directory / SERVER_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        (directory / SERVER_LOCK).unlink()
        return True
    except OSError:  # held: a server serves (BlockingIOError), or already gone
        return False
    finally:
        os.close(fd)


def _ours(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()


def check_port_free(directory: Path, port: int) -> None:
    """Refuse a second job of this user on a port another live job of this user serves."""
    suffix = f"-{port}"
    for other in directory.parent.glob(f"{PREFIX}{os.getuid()}-*{suffix}"):
        if other == directory or not _ours(other):
            continue
        pids = live_pids(other)
        if pids:
            job = other.name[len(f"{PREFIX}{os.getuid()}-"):-len(suffix)]
            raise InputError(f"port {port}: already used by the running job {job!r} (pid "
                             f"{min(pids.values())}); give this job another port "
                             "(--metrics-port / FSDPMON_PORT)")


def check_rank_free(directory: Path, rank: int, pid: int) -> None:
    """Refuse a rank number that a live process of the same job name and port already holds."""
    holder = live_pids(directory).get(f"rank{rank}.hb")
    if holder is not None and holder != pid:
        raise InputError(f"rank {rank} of this job already publishes in {directory} (pid "
                         f"{holder}, still running): give this job another name "
                         "(--job-name / FSDPMON_JOB_NAME) or port (--metrics-port / FSDPMON_PORT)")


def remove_stale(base: Path, now: float | None = None) -> list[Path]:
    """Remove this user's state directories whose processes are all gone; returns them."""
    now = time.time() if now is None else now
    removed = []
    with contextlib.suppress(OSError):
        for path in base.glob(f"{PREFIX}{os.getuid()}-*"):
            try:
                if not _ours(path) or now - os.lstat(path).st_mtime < STALE_AFTER_SECONDS:
                    continue
            except OSError:
                continue
            if not live_pids(path):
                shutil.rmtree(path, ignore_errors=True)  # never follows a symlink inside
                removed.append(path)
    return removed
