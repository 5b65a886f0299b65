"""Stopping a launched process and everything under it.

torchrun starts each worker in a session of its own, so killing torchrun's process group
leaves the workers running; tests stop the whole tree by walking it instead. The process
group is signalled as well, so that a child the tree no longer shows (its parent gone) is
reached too when the launched process leads its own session.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

import psutil


def kill_tree(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to ``proc``, its process group and all its descendants; with SIGKILL,
    wait for them."""
    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    # No group of that id unless ``proc`` was started with start_new_session; once ``proc`` is
    # reaped its id may belong to someone else, so leave the group alone then.
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
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
