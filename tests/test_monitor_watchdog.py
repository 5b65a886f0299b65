"""The stall watchdog: threshold, one stack dump per stall, recovery."""

from __future__ import annotations

import time

import pytest
from support import rounded

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
        assert wd.compute_threshold() == rounded(5.0)


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


def test_a_stall_is_a_heartbeat_older_than_the_threshold_and_logged_with_its_age(
        changes, tmp_path, caplog):
    """Older than the threshold, not as old (the same line top and the rules draw); the warning
    gives the heartbeat's age, and the recovery is logged once, only after a stall."""
    caplog.set_level("WARNING", logger="fsdpmon.monitor.watchdog")
    with open(tmp_path / "log", "w") as stream:
        wd = _watchdog(changes, stream)  # no steps yet: the threshold is the 2 s floor
        wd.arm()
        wd._last_progress = 1000.0  # a clock of our own: 2.0 s later is exactly 1002.0
        assert not wd.check(now=1002.0) and changes == []
        assert not wd.check(now=1001.0)
        assert not [r for r in caplog.records if "resumed" in r.getMessage()]
        assert wd.check(now=1003.0) and changes == [(True, 2.0)]
        assert "no step completed for 3.0s (threshold 2.0s)" in caplog.text, caplog.text
        wd.step_done(None)  # progress
        assert not wd.check() and changes[-1] == (False, 2.0)
        assert not wd.check()
    resumed = [r for r in caplog.records if "steps resumed" in r.getMessage()]
    assert len(resumed) == 1, caplog.text


def test_the_threshold_follows_the_last_200_steps_and_every_change_is_told(changes, tmp_path):
    """The median spans the last 200 step times: 101 slow steps then 100 fast ones leave
    100 + 100 in it (median 3 s, threshold 15 s); a change of the threshold, however small,
    reaches on_change (the published threshold)."""
    with open(tmp_path / "log", "w") as stream:
        wd = _watchdog(changes, stream)
        for seconds in [5.0] * 101 + [1.0] * 100:
            wd.step_done(seconds)
        assert wd.compute_threshold() == 5.0 * 3.0
        wd.arm()
        wd.check()
        assert changes == [(False, 15.0)], changes
        wd.step_done(4.8)  # a 5.0 leaves: the middle two are 1.0 and 4.8, 0.5 s less in all
        wd.check()
        assert changes[-1] == (False, 5.0 * (1.0 + 4.8) / 2), changes


def test_the_watchdog_thread_does_not_keep_a_finished_process_alive(tmp_path):
    """A training script that ends without closing its monitor still exits."""
    import subprocess
    import sys

    script = ("from fsdpmon.monitor.watchdog import StallWatchdog\n"
              "wd = StallWatchdog(1.0, 60.0, lambda s, t: None)\n"
              "wd.start()\nprint('started', flush=True)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout == "started\n", done


@pytest.mark.parametrize("threshold, tick", [(0.2, 0.05), (0.3, 0.05), (5.0, 0.5), (30.0, 1.0),
                                             (120.0, 1.0)])
def test_the_watchdog_looks_ten_times_a_threshold_between_a_twentieth_and_one_second(
        changes, tmp_path, threshold, tick):
    """A stall is seen at most a tenth of its threshold late (0.05 s at least, 1 s at most)."""
    with open(tmp_path / "log", "w") as stream:
        wd = _watchdog(changes, stream)
        wd._threshold = threshold
        assert wd._tick() == tick
