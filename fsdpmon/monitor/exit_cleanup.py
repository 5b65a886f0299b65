"""Remove a rank's state files however the process ends: normal exit, Ctrl-C, or SIGTERM.

A normal exit and SIGINT (KeyboardInterrupt unwinds the stack) run ``atexit``. SIGTERM — what
torchrun, kubelet and ``kill`` send — ends a Python process without running anything, so, when
nobody else has claimed it, we handle SIGTERM: clean up, then die of the same signal with the
default action, so the exit status stays what the parent expects. A Python handler only runs
when the main thread returns to the interpreter, and a rank blocked inside a collective may not
for many minutes, so the signal is also delivered through ``signal.set_wakeup_fd`` to a small
thread that cleans up when the main thread has not begun to within a grace period. Never both
at once: the handler interrupts the main thread between any two bytecodes, perhaps inside a
lock a clean-up needs (the exit record's, being written), so a thread cleaning up alongside it
would wait for that lock while the handler waited for the thread. Our locks are reentrant for
the same reason. What a SIGKILL leaves behind is removed by the next job to start
(``statedir.remove_stale``).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

log = logging.getLogger(__name__)

_lock = threading.RLock()  # reentrant: the handler may interrupt register() in this thread
_cleanups: list[Callable[[], None]] = []
_installed = False
_claim = threading.Lock()  # taken by whoever runs the SIGTERM clean-ups: handler or watcher
_watcher_done = threading.Event()
_ending: str | None = None  # "sigterm" once the signal arrived (what the clean-ups report)
# How long the watcher thread leaves the main thread to run the handler (clean up, then end
# the process with the signal's own exit status) before it cleans up itself and ends the
# process with 128 + SIGTERM. Kubelet and torchrun wait 30 s before SIGKILL.
MAIN_THREAD_GRACE_SECONDS = 2.0


def register(fn: Callable[[], None]) -> None:
    global _installed
    with _lock:
        _cleanups.append(fn)
        if not _installed:
            _installed = True
            atexit.register(run_all)
            _install_sigterm()


def unregister(fn: Callable[[], None]) -> None:
    with _lock, contextlib.suppress(ValueError):
        _cleanups.remove(fn)


def run_all() -> None:
    with _lock:
        todo = list(_cleanups)
        _cleanups.clear()
    for fn in todo:
        try:
            fn()
        except Exception:  # exiting anyway: one failure must not stop the rest
            log.debug("fsdpmon: clean-up failed", exc_info=True)


def ending() -> str | None:
    """Why the clean-ups ran: "sigterm" once SIGTERM arrived, else None (the process exits)."""
    return _ending


def _cleanup_sigterm() -> None:
    global _ending
    _ending = "sigterm"
    run_all()


def _handler(signum: int, frame: FrameType | None) -> None:
    """Main thread: clean up, then die of SIGTERM as if we had never handled it."""
    if _claim.acquire(blocking=False):
        _cleanup_sigterm()
    else:
        # The watcher took over while this thread was stuck. Bounded: its clean-up may wait for
        # a lock held by the frame this handler interrupted.
        _watcher_done.wait(MAIN_THREAD_GRACE_SECONDS)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _install_sigterm() -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return  # the program handles SIGTERM itself (and will exit through atexit, or not)
    signal.signal(signal.SIGTERM, _handler)
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:
        previous = -1
    if previous != -1:  # someone else (an event loop) listens: leave theirs in place
        signal.set_wakeup_fd(previous)
        os.close(read_fd)
        os.close(write_fd)
        return
    threading.Thread(target=_watch, args=(read_fd,), name="fsdpmon-sigterm",
                     daemon=True).start()


def _watch(read_fd: int) -> None:
    while True:
        try:
            data = os.read(read_fd, 64)
        except OSError:
            return
        if not data:
            return
        if signal.SIGTERM in data:
            # Only the main thread may reset a handler; if it is stuck in C (a collective),
            # it never will, so this thread cleans up and ends the process after the grace.
            time.sleep(MAIN_THREAD_GRACE_SECONDS)
            if not _claim.acquire(blocking=False):
                return  # the handler runs the clean-ups and ends the process
            _cleanup_sigterm()
            _watcher_done.set()
            os._exit(128 + signal.SIGTERM)
