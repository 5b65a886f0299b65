"""A second signal forced inside the first one's handler, at every point of it in turn.

``python tests/signal_reentry.py MODE``: for k = 1, 2, ... the process sends itself SIGTERM;
a profile hook, at the k-th call made inside that handler (Python or C), sends SIGTERM again,
so the handler is entered a second time right there, as when two ranks close at once. It
prints ``ok k`` each time the waiting side saw the signal and got on, and ``done N`` once k has
passed the last call the handler makes. A handler that deadlocks under re-entry (the old
``lambda *_: event.set()``: the second ``Event.set`` waits for the ``Condition`` lock the first
one holds) leaves the process hanging at its k: the caller's timeout tells.

Modes: ``catcher`` (fsdpmon.signals.Catcher, waited on with ``wait``), ``event`` (the old
pattern, kept here to show the harness catches it), ``podserver DIR PORT`` (the pod server's
own ``main``, in the foreground, stopped by the signal each round; the hook finds the handler
the server installed, whatever it is).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import CodeType, FrameType

from fsdpmon.signals import Catcher

ROUNDS = 60  # more calls than any of these handlers makes


class Reenter:
    """The profile hook: counts calls made under ``code`` (None: whatever SIGTERM's handler is
    when the call is made) and re-sends at the k-th one."""

    def __init__(self, code: CodeType | None, k: int) -> None:
        self.code, self.k, self.calls, self.fired = code, k, 0, False

    def __call__(self, frame: FrameType, event: str, _arg: object) -> None:
        if self.fired or event not in ("call", "c_call"):
            return
        if self.code is None:
            handler = signal.getsignal(signal.SIGTERM)
            code = getattr(getattr(handler, "__func__", handler), "__code__", None)
        else:
            code = self.code
        if code is None or not self._inside(frame, code):
            return
        self.calls += 1
        if self.calls == self.k:
            self.fired = True
            os.kill(os.getpid(), signal.SIGTERM)

    @staticmethod
    def _inside(frame: FrameType | None, code: CodeType) -> bool:
        while frame is not None:
            if frame.f_code is code:
                return True
            frame = frame.f_back
        return False


def _round(k: int, code: CodeType, waiter) -> bool:
    """One round: whether the k-th call inside the handler existed (and the signal came)."""
    hook = Reenter(code, k)
    sys.setprofile(hook)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        waiter()
    finally:
        sys.setprofile(None)
    return hook.fired


def _catcher_round(k: int) -> bool:
    with Catcher((signal.SIGTERM,), force_after=None) as catcher:
        fired = _round(k, Catcher._handle.__code__, lambda: catcher.wait(5))
        assert catcher.caught
    return fired


def _event_round(k: int) -> bool:
    event = threading.Event()
    handler = lambda *_: event.set()  # noqa: E731 - the old pattern, as it was written
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        return _round(k, handler.__code__, lambda: event.wait(5))
    finally:
        signal.signal(signal.SIGTERM, previous)


def _podserver_round(k: int, base: Path, port: int) -> bool:
    from fsdpmon.monitor import podserver
    from fsdpmon.monitor.state import RankStateWriter

    directory = base / f"round{k}"
    os.mkdir(directory, 0o700)
    writer = RankStateWriter(directory, 0)  # a live rank: this process
    # The signal comes once the server serves; the hook is already on (the profile is
    # per thread: only the main thread's calls, the handler's among them, are counted).
    hook = Reenter(None, k)  # the server's own handler, whatever it is
    sys.setprofile(hook)
    try:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
        code = podserver.main(["--dir", str(directory), "--job-name", "reentry", "--address",
                               "127.0.0.1", "--port", str(port), "--foreground"])
    finally:
        sys.setprofile(None)
        writer.close(remove=False)
    assert code == 0, code
    assert not (directory / podserver.LOCK_NAME).exists()
    return hook.fired


def main(argv: list[str]) -> int:
    mode = argv[0]
    if mode == "podserver":
        base, port = Path(argv[1]), int(argv[2])
        one = lambda k: _podserver_round(k, base, port)  # noqa: E731
    else:
        one = {"catcher": _catcher_round, "event": _event_round}[mode]
    for k in range(1, ROUNDS + 1):
        began = time.monotonic()
        fired = one(k)
        print(f"ok {k} {time.monotonic() - began:.2f}", flush=True)
        if not fired:
            print(f"done {k - 1}", flush=True)
            return 0
    print(f"more than {ROUNDS} calls inside the handler", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
