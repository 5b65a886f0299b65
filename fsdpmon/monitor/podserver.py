"""The pod's endpoint as a process of its own, serving every local rank from the state directory.

Why not a thread inside a rank: a rank stopped by SIGSTOP, or hung in a C call that holds the
GIL, runs no Python at all, so a thread of it cannot answer a scrape; the pod went dark and every
other local rank vanished with it. This process runs no training: it reads the files the ranks
publish (``state``), judges from them and from the kernel which ranks are alive, stopped or
silent (``collector``), and serves ``/metrics`` and ``/stacks`` through the same bounded server
as before (``server.PortKeeper``: TLS and basic auth from the web-config file, a render at most
once a second, a small worker pool, a request-rate cap).

Its life:
- A rank starts it (``spawn.ServerKeeper``) when none holds the directory's lock:
  ``python -m fsdpmon.monitor.podserver --dir D --job-name J --address A --port P ...``. It forks
  once at start, so it is no rank's child (no zombie when it ends before them, none of their
  signals) and lives in a session of its own.
- It holds an exclusive ``flock`` on ``D/server.lock`` (its pid written inside) as long as it
  runs: the kernel drops the lock however the process ends, SIGKILL included, so the ranks know
  at their next check (every ``server_retry_seconds``) that they must start another one. A
  second server started by a race finds the lock taken and leaves at once.
- It ends when no live rank is left in the directory (checked every ``WATCH_SECONDS``), or on
  SIGTERM (the last rank to close sends it, so a normal end is not kept waiting): it tidies what
  the gone ranks left (as the last rank would), removes its lock, and the directory when that
  leaves it empty. Exit records of killed ranks stay for a restart to read (``exit_record``).
- It cannot be orphaned: it also ends when its directory or its lock file is gone (removed by
  someone else: nothing left to serve), or when no rank has published for
  ``POD_SERVER_SILENCE_SECONDS`` (their pids taken by other processes). An orderly close that
  takes longer than ``CLOSE_SECONDS`` ends in ``os._exit``: the port goes with the process.
- Signals only set a flag and write a byte (``fsdpmon.signals``): the serving loop waits on
  that pipe. Further SIGTERMs or SIGINTs change nothing, however many: every local rank that
  finds itself the last one out sends one (eight at once on an 8-GPU node), and the close is
  bounded anyway. A forced end (the bound) removes the lock file first, as the close would.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from fsdpmon.conventions import POD_SERVER_SILENCE_SECONDS
from fsdpmon.errors import FsdpmonError
from fsdpmon.monitor import state, statedir
from fsdpmon.monitor.heartbeat import pid_alive, read_heartbeat
from fsdpmon.monitor.server import PortKeeper
from fsdpmon.monitor.stacks import stacks_app
from fsdpmon.signals import Catcher
from fsdpmon.webconfig import load_web_config

log = logging.getLogger("fsdpmon.podserver")

LOCK_NAME = statedir.SERVER_LOCK
MODULE = "fsdpmon.monitor.podserver"
# How often the server looks for live ranks: how long it outlives the last one at most.
WATCH_SECONDS = 0.5
# How long a new server waits for the lock (ranks hold it shared for an instant to check it).
LOCK_WAIT_SECONDS = 2.0
# How long the orderly close (stop serving, tidy, unlock) may take before the process ends with
# os._exit regardless: a close stuck on a worker thread must not keep the port.
CLOSE_SECONDS = 5.0


# ---- the lock: who serves this directory ---------------------------------------------------

def running(directory: Path) -> bool:
    """Whether a server holds the directory's lock (a shared lock cannot be had)."""
    try:
        fd = os.open(directory / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False  # no lock file: nobody ever served, or the last server removed it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # and with it the shared lock, if we got it
    return False


def server_pid(directory: Path) -> int | None:
    """The pid of the server holding the lock, if one does and it is ours to signal."""
    if not running(directory):
        return None
    try:
        pid = int((directory / LOCK_NAME).read_text().strip() or "0")
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if pid > 0 and MODULE.encode() in cmdline else None


def stop(directory: Path, timeout_s: float = 5.0) -> bool:
    """Ask the directory's server to end now (SIGTERM) and wait until its lock is free. A lock
    held with no server to signal is waited for too: a server SIGKILLed a moment ago holds it
    until the kernel has ended it (its command line already gone), one that has just taken it
    has not written its pid yet (and leaves by itself once no rank is alive)."""
    pid = server_pid(directory)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while running(directory) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not running(directory)


def take_lock(directory: Path, wait_s: float = LOCK_WAIT_SECONDS) -> int | None:
    """The lock's descriptor, held exclusively with our pid inside; None when another server
    holds it past ``wait_s``."""
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.05)
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


# ---- the process ---------------------------------------------------------------------------

def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    p.add_argument("--dir", required=True, type=Path, help="the job's state directory")
    p.add_argument("--job-name", required=True)
    p.add_argument("--address", required=True)
    p.add_argument("--port", required=True, type=int)
    p.add_argument("--web-config", default=None, help="exporter-toolkit web config (TLS, auth)")
    p.add_argument("--max-per-second", type=float, default=None)
    p.add_argument("--retry-seconds", type=float, default=2.0, help="port bind retry period")
    p.add_argument("--foreground", action="store_true", help="do not fork (tests, debugging)")
    return p.parse_args(argv)


def serve(args: argparse.Namespace, stop: Catcher) -> int:
    """Serve the directory until nothing is left to serve (``orphaned``) or a signal came."""
    directory = args.dir
    try:
        statedir.check_private(directory)
        web = load_web_config(args.web_config, "FSDPMON_WEB_CONFIG_FILE")
    except (FsdpmonError, OSError) as exc:
        log.error("fsdpmon pod server: %s", exc)
        return 2
    fd = take_lock(directory)
    if fd is None:
        return 0  # another server holds the directory
    keeper = PortKeeper(directory, args.address, args.port, 0.0, args.retry_seconds, web=web,
                        max_per_second=args.max_per_second,
                        routes={"/stacks": stacks_app(directory, args.job_name)})
    keeper.start()
    started = time.time()
    try:
        while not stop.wait(WATCH_SECONDS):
            why = orphaned(directory, fd, started)
            if why:
                log.info("fsdpmon pod server for %s: ending, %s", directory.name, why)
                break
    finally:
        _close_within(CLOSE_SECONDS, keeper, directory, fd)
    return 0


def orphaned(directory: Path, fd: int, started: float, now: float | None = None) -> str:
    """Why the server has nothing left to serve ("" while it has): its directory or lock file
    gone or replaced, no live rank, or no rank publishing for POD_SERVER_SILENCE_SECONDS
    (counted from ``started`` at the earliest: a rank may not have ticked yet)."""
    try:
        if os.stat(directory / LOCK_NAME).st_ino != os.fstat(fd).st_ino:
            return "its lock file was replaced"
    except OSError:
        return "its state directory or lock file is gone"
    beats = [hb for hb in map(read_heartbeat, directory.glob("rank*.hb")) if hb is not None]
    if not any(pid_alive(hb.pid) for hb in beats):  # statedir.live_pids, on the beats read once
        return "no rank is left"
    last = max([started, *(max(hb.watchdog_unix, hb.last_step_unix) for hb in beats)])
    silent = (time.time() if now is None else now) - last
    if silent > POD_SERVER_SILENCE_SECONDS:
        return f"no rank has published for {silent:.0f} s"
    return ""


def _close_within(bound_s: float, keeper: PortKeeper, directory: Path, fd: int) -> None:
    """Close in order, or end the process when that takes longer than ``bound_s``: the kernel
    then frees the port and drops the lock whatever the stuck thread holds."""
    def force() -> None:
        if not closed.wait(bound_s):
            _drop_lock(directory, fd)  # the kernel drops the lock, not the file
            os._exit(3)

    closed = threading.Event()  # set by this thread, never by a signal handler
    threading.Thread(target=force, name="fsdpmon-close-bound", daemon=True).start()
    try:
        keeper.close()
        _leave(directory, fd)
    finally:
        closed.set()


def _leave(directory: Path, fd: int) -> None:
    """What the last rank out would do, then the lock (unlinked before it is released, so a
    rank that finds the file finds it held or finds none) and the directory if empty. Only
    our own lock file: after a replaced one, the name may be another server's now."""
    with contextlib.suppress(OSError):
        state.tidy(directory)
    _drop_lock(directory, fd)
    os.close(fd)
    with contextlib.suppress(OSError):
        directory.rmdir()


def _drop_lock(directory: Path, fd: int) -> None:
    """Unlink the lock file if it is still ours (held through ``fd``)."""
    with contextlib.suppress(OSError):
        if os.stat(directory / LOCK_NAME).st_ino == os.fstat(fd).st_ino:
            (directory / LOCK_NAME).unlink()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if not args.foreground and os.fork() > 0:
        os._exit(0)  # the rank that started us reaps this parent at once; we are nobody's child
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the terminal the job started from may go
    # no forced end on the third signal: the ranks' own stops would trip it (see above)
    with Catcher((signal.SIGTERM, signal.SIGINT), force_after=None) as stop:
        return serve(args, stop)


if __name__ == "__main__":
    sys.exit(main())
