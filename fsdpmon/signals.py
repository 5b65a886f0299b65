"""Signal handlers that cannot deadlock: each only records the signal and writes one byte.

A Python signal handler runs on the main thread between any two bytecodes, including inside
the handler itself when a second signal follows the first (two ranks closing at once, an
orchestrator's SIGTERM then SIGINT, a burst of SIGWINCH while a window is dragged). A handler
that takes a lock (``Event.set`` takes its ``Condition``'s) can therefore be entered again
while that same thread holds the lock, and waits for itself forever. So the handlers here do
no more than:

- append the signal's number to a list (``list.append`` is one C call: a second signal cannot
  cut it in half, where ``count += 1`` could lose one);
- write one byte to a non-blocking self-pipe, so a thread waiting in ``select`` on it wakes at
  once (a full pipe already holds a wake-up: the byte is dropped);
- on the third stopping signal, end the process with ``os._exit`` (what servers such as
  Prometheus do: the first means stop, the second is harmless, the third means now).

The waiting side reacts: ``wait`` (``select`` with a timeout on the pipe) replaces
``Event.wait``. The kernel may hand a process's signal to any of its threads that does not
block it; Python then runs the handler on the main thread only when that thread next runs
Python code, which its ``select`` does not do until it times out. So ``wait`` wakes every
WAKE_S to let a pending handler run: an exporter whose SIGTERM another thread took went on
waiting in its hour-long ``select`` (a suite run at c6dcfd7). This module imports nothing of
ours, so any layer may use it.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Callable, Iterable
from types import FrameType

# The stopping signal that ends the process at once, whatever the orderly close is doing.
FORCE_AFTER = 3
# The longest a waiter sleeps in one ``select``: a signal another thread took is acted on within
# it (a bytecode of the main thread runs the pending handler).
WAKE_S = 0.5

# Tests only: called inside the handler, after the signal is recorded and before its wake-up
# byte is written, with the signal's number. A test sets it to send itself a second signal
# from inside the first handler (the pattern that deadlocked ``Event.set``).
reenter_hook: Callable[[int], None] | None = None


class Catcher:
    """Records ``signals`` while installed (``with Catcher(...) as c``); ``force_after``: the
    count at which the handler calls ``os._exit(128 + signum)`` (None: never, e.g. SIGWINCH);
    ``interrupt``: the first signal also raises KeyboardInterrupt on the main thread, as
    Ctrl-C does, for a program that waits in code it cannot poll (only once: a second signal
    must not cut its clean-up short)."""

    def __init__(self, signals: Iterable[int], force_after: int | None = FORCE_AFTER,
                 interrupt: bool = False) -> None:
        self.signals = tuple(signals)
        self.force_after = force_after
        self.interrupt = interrupt
        self.received: list[int] = []
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._previous: dict[int, object] = {}

    # ---- the handler: nothing in it blocks or takes a lock ---------------------------------

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.received.append(signum)
        hook = reenter_hook
        if hook is not None:
            hook(signum)
        if self.force_after is not None and len(self.received) >= self.force_after:
            os._exit(128 + signum)
        with contextlib.suppress(OSError):  # full: a wake-up is already there; closed: gone
            os.write(self._write, b"\0")
        if self.interrupt and len(self.received) == 1:
            raise KeyboardInterrupt(f"signal {signum}")

    # ---- the waiting side ------------------------------------------------------------------

    def install(self) -> Catcher:
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        """Put the previous handlers back and close the pipe (main thread)."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]
        self._previous.clear()
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._read = self._write = -1

    def __enter__(self) -> Catcher:
        return self.install()

    def __exit__(self, *_exc: object) -> None:
        self.restore()

    @property
    def caught(self) -> bool:
        return bool(self.received)

    def fileno(self) -> int:
        """The pipe's read end: readable once a signal came (for a caller's own ``select``)."""
        return self._read

    def wait(self, timeout: float | None) -> bool:
        """Whether a signal came, waiting up to ``timeout`` seconds for one (None: forever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.received:
            left = WAKE_S if deadline is None else min(WAKE_S, deadline - time.monotonic())
            if left <= 0:
                break
            with contextlib.suppress(OSError, ValueError):
                select.select([self._read], [], [], left)
            # a handler pending since another thread took the signal runs here, on this thread
        self._drain()
        return self.caught

    def take(self) -> int:
        """How many signals came since the last take (and forget them): SIGWINCH's use."""
        n = len(self.received)
        del self.received[:n]  # one C call: a signal arriving meanwhile stays for the next take
        self._drain()
        return n

    def _drain(self) -> None:
        with contextlib.suppress(OSError):
            while os.read(self._read, 64):
                pass
