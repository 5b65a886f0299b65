"""Stopping a launched process and everything under it.

torchrun starts each worker in a session of its own, so killing torchrun's process group
leaves the workers running; the monitor's tests stop the whole tree by walking it instead.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess

import psutil


def kill_tree(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to ``proc`` and all its descendants; with SIGKILL, wait for them."""
    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for member in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.send_signal(sig)
    if sig == signal.SIGKILL:
        psutil.wait_procs(family, timeout=10)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


def resume_tree(proc: subprocess.Popen) -> None:
    """SIGCONT everything (a test may have frozen a rank) so that a kill can take effect."""
    kill_tree(proc, signal.SIGCONT)
