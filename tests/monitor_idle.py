"""A process that runs the Monitor around a loop of tiny steps until killed (or --seconds pass).

Settings come from FSDPMON_* variables. It prints ``ready`` once its first step is published,
so a test knows its state files exist; a start the monitor refuses exits 2 with one line.
"""

from __future__ import annotations

import sys
import time

from fsdpmon.cli import guarded
from fsdpmon.monitor import Monitor, MonitorConfig


def run(seconds: float) -> int:
    mon = Monitor(MonitorConfig.from_env(), tokens_per_step=1, total_steps=10**9)
    deadline = time.monotonic() + seconds
    ready = False
    while time.monotonic() < deadline:
        with mon.step():
            time.sleep(0.01)
        if not ready:
            print("ready", flush=True)
            ready = True
    mon.close()
    return 0


if __name__ == "__main__":
    sys.exit(guarded(lambda: run(float(sys.argv[1]) if len(sys.argv) > 1 else 60.0),
                     prog="monitor_idle"))
