"""A one-rank job that runs the Monitor around tiny steps, then hangs in Python (the watchdog
still ticks: a hang, not an unresponsive rank) once the file named by its argument exists.

Settings come from FSDPMON_* variables (FSDPMON_STALL_FLOOR_SECONDS among them), so the bound
it publishes is its monitor's own. Used by tests/test_e2e_stall_floor.py.
"""

from __future__ import annotations

import os
import sys
import time

from fsdpmon.monitor import Monitor, MonitorConfig


def main(trigger: str) -> int:
    mon = Monitor(MonitorConfig.from_env(), tokens_per_step=1, total_steps=10**9)
    while not os.path.exists(trigger):
        with mon.step():
            time.sleep(0.01)
    while True:  # hung: no step completes again; the test kills the process
        time.sleep(1.0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
