"""A monitored process that SIGTERM reaches at an awkward moment; the test sends the signal once
this prints where it is.

- ``in-record``: the training thread is inside the exit record's lock, writing its step to a
  disk that hangs (the write sleeps), when the signal comes: the handler must not wait for a
  lock its own thread holds, nor for a watcher thread waiting on that lock;
- ``stuck``: the main thread never returns to the interpreter (SIGTERM blocked there, then a
  read of a pipe nobody writes: what a rank waiting in a collective looks like to Python), so
  only the watcher thread can clean up and end the process. It prints the pipe's descriptor;
  the test waits until /proc shows the main thread blocked reading it.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from fsdpmon.errors import guarded
from fsdpmon.monitor import Monitor, MonitorConfig
from fsdpmon.monitor.exit_record import ExitRecord

_write = ExitRecord._write


def _hanging_write(record: ExitRecord, how: str, detail: str = "") -> None:
    if how == "running" and record.step > 0:  # a step written, not the start
        print("writing", flush=True)
        time.sleep(60)
    _write(record, how, detail)


def run(mode: str) -> int:
    if mode == "in-record":
        ExitRecord._write = _hanging_write  # type: ignore[method-assign]
    mon = Monitor(MonitorConfig.from_env(), tokens_per_step=1, total_steps=10**9)
    with mon.step():
        pass
    if mode == "stuck":
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        never, _writer = os.pipe()
        print("stuck", never, flush=True)
        os.read(never, 1)
    while True:  # in-record: until a log step writes the record
        with mon.step():
            time.sleep(0.01)


if __name__ == "__main__":
    sys.exit(guarded(lambda: run(sys.argv[1]), prog="monitor_sigterm"))
