"""Remove a rank's state files however the process ends: normal exit, Ctrl-C, or SIGTERM.

A normal exit and SIGINT (KeyboardInterrupt unwinds the stack) run ``atexit``. SIGTERM — what
torchrun, kubelet and ``kill`` send — ends a Python process without running anything, so, when
nobody else has claimed it, we handle SIGTERM: clean up, then die of the same signal with the
default action, so the exit status stays what the parent expects.

The clean-ups never run inside the signal handler. A handler runs on the main thread between
any two bytecodes, perhaps inside a lock a clean-up needs (the exit record's, being written),
and a second SIGTERM can enter it again while it runs (what deadlocked a handler that waited
on an ``Event``). So the handler only records the signal and writes a byte; the signal also
reaches ``signal.set_wakeup_fd``, written by the C-level handler even while the main thread is
inside a collective and runs no Python for minutes. A small watcher thread wakes on that byte,
runs the clean-ups (taking their locks as any thread does: the main thread, never blocked by
us, lets go of them; each one bounded, for a lock held in a write that hangs), then signals
the process again: the handler, seeing the clean-ups done, restores the default action and
dies of SIGTERM. A main thread stuck in C never runs it, so
after ``MAIN_THREAD_GRACE_SECONDS`` the watcher ends the process with 128 + SIGTERM. A second
SIGTERM meanwhile is harmless; a third ends the process at once (``signals.FORCE_AFTER``).
What a SIGKILL leaves behind is removed by the next job to start (``statedir.remove_stale``).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

from fsdpmon.signals import FORCE_AFTER

log = logging.getLogger(__name__)

_lock = threading.RLock()  # never taken in a signal handler: register, covering, run_all
_cleanups: list[Callable[[], None]] = []
_installed = False
_received: list[int] = []  # SIGTERMs seen by the handler (list.append: whole under re-entry)
_cleaned = False  # plain flag: the watcher ran the clean-ups, the handler may now end us
_ending: str | None = None  # "sigterm" once the signal arrived (what the clean-ups report)
# How long the watcher thread, its clean-ups done, leaves the main thread to run the handler
# (which ends the process with the signal's own exit status) before it ends the process with
# 128 + SIGTERM itself. Kubelet and torchrun wait 30 s before SIGKILL.
MAIN_THREAD_GRACE_SECONDS = 2.0
# How long the watcher waits for one SIGTERM clean-up before it goes on to the next (the pod
# server's stop, the longest, takes well under a second; a server not stopped in time leaves
# by itself once no rank is alive).
CLEANUP_STEP_SECONDS = 2.0


def register(fn: Callable[[], None]) -> None:
    with _lock:
        _install()
        _cleanups.append(fn)


@contextlib.contextmanager
def covering() -> Iterator[None]:
    """Make files and register their clean-ups inside this block: a SIGTERM that arrives
    meanwhile is handled (the handler is installed first) and its clean-ups wait for the block
    to end, so they find every file made in it. Without it, a SIGTERM between a file's creation
    and its clean-up's registration left the file (a rank stopped during start-up)."""
    with _lock:  # the watcher takes the clean-ups under this lock, after the block
        _install()
        yield


def _install() -> None:
    global _installed
    if not _installed:
        _installed = True
        atexit.register(run_all)
        _install_sigterm()


def unregister(fn: Callable[[], None]) -> None:
    with _lock, contextlib.suppress(ValueError):
        _cleanups.remove(fn)


def run_all() -> None:
    for fn in _take_all():
        _run_one(fn)


def _take_all() -> list[Callable[[], None]]:
    with _lock:
        todo = list(_cleanups)
        _cleanups.clear()
    return todo


def _run_one(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:  # exiting anyway: one failure must not stop the rest
        log.debug("fsdpmon: clean-up failed", exc_info=True)


def _run_all_bounded() -> None:
    """The SIGTERM clean-ups, each given CLEANUP_STEP_SECONDS before the next starts without
    it: one may wait for a lock the main thread holds in a write that hangs (a hung disk), and
    the process must end anyway (that one's work is lost; a restart reads the rank as killed)."""
    for fn in _take_all():
        worker = threading.Thread(target=_run_one, args=(fn,), name="fsdpmon-cleanup",
                                  daemon=True)
        worker.start()
        worker.join(CLEANUP_STEP_SECONDS)


def ending() -> str | None:
    """Why the clean-ups ran: "sigterm" once SIGTERM arrived, else None (the process exits)."""
    return _ending


def _handler(signum: int, frame: FrameType | None) -> None:
    """Main thread: nothing that blocks or locks. Dies of SIGTERM once the watcher has cleaned
    up; before that, records the signal (the wake-up byte is already written) and returns."""
    global _ending
    if _cleaned:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    _ending = "sigterm"
    _received.append(signum)
    if len(_received) >= FORCE_AFTER:
        os._exit(128 + signum)
    with contextlib.suppress(OSError):  # when another owns the wake-up fd (an event loop)
        os.write(_wake_write, bytes([signum]))


_wake_write = -1


def _install_sigterm() -> None:
    global _wake_write
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return  # the program handles SIGTERM itself (and will exit through atexit, or not)
    read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    os.set_blocking(read_fd, True)
    _wake_write = write_fd
    try:
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:
        previous = -1
    if previous != -1:  # someone else (an event loop) listens: leave theirs, we write our own
        signal.set_wakeup_fd(previous)
    threading.Thread(target=_watch, args=(read_fd,), name="fsdpmon-sigterm",
                     daemon=True).start()
    signal.signal(signal.SIGTERM, _handler)


def _watch(read_fd: int) -> None:
    global _cleaned, _ending
    while True:
        try:
            data = os.read(read_fd, 64)
        except OSError:
            return
        if not data:
            return
        if signal.SIGTERM in data:
            break
    _ending = "sigterm"
    _run_all_bounded()
    _cleaned = True
    # The main thread's handler ends the process with the signal's own status; a main thread
    # stuck in C never runs it, so this thread ends it after the grace.
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(MAIN_THREAD_GRACE_SECONDS)
    os._exit(128 + signal.SIGTERM)
