"""The stall watchdog: threshold, one stack dump per stall, recovery."""

from __future__ import annotations

import time

import pytest

from fsdpmon.monitor.watchdog import StallWatchdog


@pytest.fixture
def changes():
    return []


def _watchdog(changes, stream) -> StallWatchdog:
    return StallWatchdog(factor=5.0, floor_seconds=2.0,
                         on_change=lambda s, t: changes.append((s, t)), stack_stream=stream)


def test_threshold_is_factor_times_median_or_the_floor(changes, tmp_path):
    with open(tmp_path / "log", "w") as stream:
        wd = _watchdog(changes, stream)
        assert wd.compute_threshold() == 2.0
        for seconds in (0.1, 0.1, 0.2, 5.0):  # one outlier does not move the median much
            wd.step_done(seconds)
        assert wd.compute_threshold() == 2.0  # 5 x 0.15 < floor
        for _ in range(10):
            wd.step_done(1.0)
        assert wd.compute_threshold() == pytest.approx(5.0)


def test_not_armed_before_the_first_step(changes, tmp_path):
    with open(tmp_path / "log", "w") as stream:
        wd = _watchdog(changes, stream)
        assert not wd.check(now=time.monotonic() + 1000)


def test_a_stall_dumps_stacks_once_and_clears_when_steps_resume(changes, tmp_path):
    log = tmp_path / "log"
    with open(log, "w") as stream:
        wd = _watchdog(changes, stream)
        wd.arm()
        wd.step_done(0.1)
        start = time.monotonic()
        assert not wd.check(now=start + 1.0)
        assert wd.check(now=start + 3.0)
        assert wd.check(now=start + 9.0)  # still the same stall: no second dump
        assert changes == [(True, 2.0)]
        wd.step_done(0.1)
        assert not wd.check()
        assert changes[-1] == (False, 2.0)
        assert wd.check(now=time.monotonic() + 3.0)  # a new stall dumps again
    dump = log.read_text()
    assert dump.count("most recent call first") >= 2  # every thread, each stall
    assert dump.count("Current thread") == 2
    assert "test_monitor_watchdog.py" in dump


def test_the_thread_notices_a_stall_and_stops_on_close(changes, tmp_path):
    with open(tmp_path / "log", "w") as stream:
        wd = StallWatchdog(factor=1.0, floor_seconds=0.2,
                           on_change=lambda s, t: changes.append((s, t)), stack_stream=stream)
        wd.start()
        wd.arm()
        wd.step_done(0.01)
        deadline = time.monotonic() + 10
        while not wd.stalled and time.monotonic() < deadline:
            time.sleep(0.02)
        assert wd.stalled
        wd.close()
        assert not wd._thread.is_alive()
