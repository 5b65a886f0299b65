"""A process that runs the Monitor around a loop of tiny steps until killed (or --seconds pass).

Settings come from FSDPMON_* variables. It prints ``ready`` once its first step is published,
so a test knows its state files exist; a start the monitor refuses exits 2 with one line.

With ``MONITOR_IDLE_GIL_TRIGGER`` set to a path, the loop calls into C while holding the GIL
(``ctypes.PyDLL``: ``pause()``, which never returns) as soon as that file exists: a rank hung in
a C extension that does not release the GIL, so none of its Python threads runs again.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

from fsdpmon.errors import guarded
from fsdpmon.monitor import Monitor, MonitorConfig

GIL_TRIGGER = "MONITOR_IDLE_GIL_TRIGGER"


def hang_holding_the_gil() -> None:
    ctypes.PyDLL(None).pause()  # PyDLL: the GIL stays held for the whole call


def run(seconds: float) -> int:
    mon = Monitor(MonitorConfig.from_env(), tokens_per_step=1, total_steps=10**9)
    trigger = os.environ.get(GIL_TRIGGER)
    deadline = time.monotonic() + seconds
    ready = False
    while time.monotonic() < deadline:
        with mon.step():
            time.sleep(0.01)
        if not ready:
            print("ready", flush=True)
            ready = True
        if trigger and os.path.exists(trigger):
            hang_holding_the_gil()
    mon.close()
    return 0


if __name__ == "__main__":
    sys.exit(guarded(lambda: run(float(sys.argv[1]) if len(sys.argv) > 1 else 60.0),
                     prog="monitor_idle"))
