"""Child processes of the demo: each in its own session, logged to a file, stopped as a tree.

Each child gets its own session (and so its own process group, with no controlling terminal),
so a Ctrl-C in the terminal reaches only the demo, which then stops the children in order.
torchrun starts its workers in sessions of their own too, so a child is stopped by signalling
its group and then every descendant recorded before the signal that is still alive.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: SIGTERM this child if the demo dies without cleaning up (e.g. SIGKILL)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes]
    known: dict[int, psutil.Process] = field(default_factory=dict)  # pid -> process, tree

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exit_code(self) -> int | None:
        return self.popen.poll()

    def remember_tree(self) -> None:
        """Record the child's current descendants (torchrun's workers live in other groups)."""
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.pid)
            self.known.setdefault(root.pid, root)
            for proc in root.children(recursive=True):
                self.known.setdefault(proc.pid, proc)

    def log_tail(self, lines: int = 5) -> str:
        with contextlib.suppress(OSError):
            text = self.log_path.read_text(errors="replace").strip().splitlines()
            return " | ".join(line.strip() for line in text[-lines:])
        return ""


def spawn(name: str, argv: Sequence[str], log_path: Path, env: dict[str, str]) -> Child:
    """Start ``argv`` in a new session with stdout and stderr going to ``log_path``."""
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
    child = Child(name, list(argv), log_path, popen)
    child.remember_tree()
    return child


def _signal_group(child: Child, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, sig)


def _alive(procs: Iterator[psutil.Process]) -> list[psutil.Process]:
    out = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
    return out


def stop_all(children: Sequence[Child], grace_s: float = 15.0) -> list[str]:
    """SIGTERM every child's group, wait, then SIGKILL what is left; returns what was killed.

    Children are stopped in reverse start order. Signals are ignored meanwhile, so a second
    Ctrl-C cannot cut the clean-up short and leave orphans.
    """
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for child in reversed(children):
            child.remember_tree()
            _signal_group(child, signal.SIGTERM)
        everything = [p for c in children for p in c.known.values()]
        _, survivors = psutil.wait_procs(_alive(iter(everything)), timeout=grace_s)
        killed = []
        for proc in _alive(iter(survivors)):
            with contextlib.suppress(psutil.Error):
                killed.append(f"{proc.pid} ({' '.join(proc.cmdline()[:4])})")
                proc.kill()
        psutil.wait_procs(survivors, timeout=5)
        for child in children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.popen.wait(timeout=5)  # reap our direct children
        return killed
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
