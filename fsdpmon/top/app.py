"""The live loop: a background thread refreshes the snapshot, the main thread reads keys and
redraws. The terminal goes into cbreak mode for single-key input and is always restored, on `q`,
Ctrl-C, an exception or a resize-in-progress; rich's alternate screen keeps the shell tidy.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import termios
import threading
import time
import tty
from collections.abc import Iterator
from dataclasses import dataclass

from rich.console import Console, RenderableType
from rich.live import Live

from fsdpmon.diagnose import Verdict
from fsdpmon.diagnose.evidence import Diagnoser
from fsdpmon.errors import FsdpmonError
from fsdpmon.job.snapshot import JobSnapshot
from fsdpmon.scrape.gcpause import top_owns_this_process
from fsdpmon.scrape.options import Source
from fsdpmon.signals import Catcher
from fsdpmon.top.ui_state import ViewState, handle_key
from fsdpmon.top.views import frame, nav, shows_processes, waiting_frame

MAX_BACKOFF_S = 30.0


@contextlib.contextmanager
def cbreak(fd: int) -> Iterator[None]:
    """Single keys without Enter; Ctrl-C still interrupts. The old mode always comes back."""
    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSAFLUSH, saved)


def split_keys(data: str) -> list[str]:
    """Typed-ahead input → keys; escape sequences (arrows, F-keys) stay whole."""
    keys, i = [], 0
    while i < len(data):
        if data[i] == "\x1b" and i + 1 < len(data) and data[i + 1] in "[O":
            end = i + 2
            while end < len(data) and not (data[end].isalpha() or data[end] == "~"):
                end += 1
            keys.append(data[i:end + 1])
            i = end + 1
        else:
            keys.append(data[i])
            i += 1
    return keys


def read_keys(fd: int, timeout_s: float) -> list[str]:
    """The keys pressed since the last call ([] when none came within the timeout)."""
    ready, _, _ = select.select([fd], [], [], timeout_s)
    if not ready:
        return []
    data = os.read(fd, 256)
    if not data:  # stdin at EOF (not a terminal): no keys will come; don't spin
        time.sleep(timeout_s)
    return split_keys(data.decode("utf-8", errors="replace"))


@dataclass
class _Latest:
    snapshot: JobSnapshot | None = None
    notice: str = ""
    version: int = 0
    verdict: Verdict | None = None


class Refresher(threading.Thread):
    """Fetches a snapshot every interval and diagnoses the history; on errors keeps the last
    one and backs off."""

    def __init__(self, source: Source, interval_s: float) -> None:
        super().__init__(name="fsdpmon-top-refresh", daemon=True)
        self.source, self.interval_s = source, interval_s
        self.diagnoser = Diagnoser(source, float(getattr(source, "timeout_s", 3.0)))
        self.latest = _Latest()
        self.stop = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        failures = 0
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                snap = self.source.fetch()
                notice = getattr(self.source, "notice", "")
                verdict = self.diagnoser.update(snap)
                failures = 0
            except Exception as exc:  # the view must outlive any refresh failure, bugs included
                if self.stop.is_set():
                    return
                failures += 1
                snap, verdict = None, self.latest.verdict
                wait = min(MAX_BACKOFF_S, self.interval_s * 2**failures)
                reason = str(exc) if isinstance(exc, FsdpmonError) else f"internal error: {exc!r}"
                notice = f"{reason} (retrying in {wait:.0f}s)"
            with self._lock:
                self.latest = _Latest(snap or self.latest.snapshot, notice,
                                      self.latest.version + 1, verdict)
            pause = min(MAX_BACKOFF_S, self.interval_s * 2**failures) if failures else (
                self.interval_s)
            self.stop.wait(max(0.0, pause - (time.monotonic() - started)))

    def current(self) -> _Latest:
        with self._lock:
            return self.latest


def _render(console: Console, latest: _Latest, state: ViewState, what: str) -> RenderableType:
    if latest.snapshot is None:
        return waiting_frame(what, latest.notice)
    return frame(latest.snapshot, state, console.size.height, latest.notice, latest.verdict)


def _show(source: Source, state: ViewState, latest: _Latest, height: int) -> None:
    """Sources that fetch some families less often (cadence) fetch those on screen every
    refresh: the process families wherever process figures are shown."""
    showing = getattr(source, "showing", None)
    if showing is not None:
        snap = latest.snapshot
        showing(state.view, snap is not None and shows_processes(
            snap, state, height, latest.notice, latest.verdict))


def _follow_logs(source: Source, state: ViewState, snap: JobSnapshot | None) -> None:
    """Sources that can tail logs (Kubernetes, the demo's files) do so only while the logs view
    or a rank's screen is open; a rank's screen follows its own pod."""
    follow = getattr(source, "follow_logs", None)
    if follow is None:
        return
    if state.view == "logs":
        follow(state.log_pod)
    elif state.view == "rank" and snap is not None:
        pod = next((r.pod for r in snap.ranks if str(r.rank) == state.subject), "")
        follow(pod or 0)
    else:
        follow(None)


def _press(state: ViewState, keys: list[str], latest: _Latest, height: int) -> ViewState:
    for key in keys:
        where = (nav(latest.snapshot, state, height, latest.notice, latest.verdict)
                 if latest.snapshot else None)
        state = handle_key(state, key, where)
    return state


def run_live(source: Source, interval_s: float, console: Console | None = None) -> int:
    """Runs until `q` or Ctrl-C; returns the exit status (0)."""
    console = console or Console()
    fd = sys.stdin.fileno()
    top_owns_this_process()  # what each refresh leaves is frozen (gcpause)
    refresher = Refresher(source, interval_s)
    # A dragged window edge sends a burst of SIGWINCH: the handler only counts them
    # (fsdpmon.signals; never a forced exit), and this loop redraws at its next turn.
    resized = Catcher((signal.SIGWINCH,), force_after=None).install()
    refresher.start()
    state, shown = ViewState(), (-1, ViewState())
    try:
        with cbreak(fd), Live(console=console, screen=True, auto_refresh=False,
                              redirect_stdout=False, redirect_stderr=False) as live:
            while not state.quit:
                keys = read_keys(fd, 0.2)
                latest = refresher.current()
                state = _press(state, keys, latest, console.size.height)
                if keys:
                    _follow_logs(source, state, latest.snapshot)
                if resized.take() or (latest.version, state) != shown:
                    live.update(_render(console, latest, state, source.description),
                                refresh=True)
                    shown = (latest.version, state)
                    _show(source, state, latest, console.size.height)
    finally:
        refresher.stop.set()
        resized.restore()
        refresher.join(timeout=5.0)  # let an in-flight refresh finish before closing its pool
        source.close()
    return 0
