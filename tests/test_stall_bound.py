"""The stall bound drawn from the job's own history (fsdpmon.monitor.stall_bound): each position's
bound, a case on each side of each line, and the watchdog that publishes it counted from the
last step."""

from __future__ import annotations

import time

import pytest

from fsdpmon import conventions as conv
from fsdpmon.monitor.stall_bound import BoundHistory, BoundSettings, Position, stall_bound
from fsdpmon.monitor.watchdog import StallWatchdog

SHIPPED = BoundSettings(conv.DEFAULT_STALL_FACTOR, conv.DEFAULT_STALL_FLOOR_SECONDS,
                        conv.DEFAULT_STALL_WAIT_FLOOR_SECONDS, conv.STALL_HISTORY_FACTOR)
LAST = 1000.0  # the last progress, on the test's own clock


def _stepped(*seconds: float) -> BoundHistory:
    history = BoundHistory()
    for s in seconds or (0.5,):
        history.step_done(s)
    return history


def _inside(since: float, phase: str = "forward") -> Position:
    return Position(phase, True, since)


def test_the_shipped_numbers_page_within_a_minute_and_spare_a_20_s_pause():
    """The issue's figures: a rank-0-only pause of 20 s stays inside the waiting ranks' bound,
    and bound + `for` + one evaluation + group_wait stay within 60 s."""
    assert conv.DEFAULT_STALL_WAIT_FLOOR_SECONDS > 20
    chain = (conv.DEFAULT_STALL_WAIT_FLOOR_SECONDS + conv.STALL_FOR_SECONDS
             + conv.CULPRIT_RULES_INTERVAL_SECONDS + conv.CRITICAL_GROUP_WAIT_SECONDS)
    assert chain <= 60, f"the page comes up to {chain} s after the others enter the collective"


def test_warm_up_keeps_the_generous_floor_even_inside_a_collective():
    bound = stall_bound(SHIPPED, BoundHistory(), _inside(LAST + 5), LAST)
    assert (bound.kind, bound.seconds, bound.anchor) == ("warm-up", 120.0, LAST)


def test_inside_a_collective_the_wait_floor_counts_from_entering_it():
    """An evaluation of 30 s before the collective is not waiting: the anchor is the entry."""
    bound = stall_bound(SHIPPED, _stepped(0.5), _inside(LAST + 30), LAST)
    assert (bound.kind, bound.seconds, bound.anchor) == ("collective", 25.0, LAST + 30)


def test_the_wait_floor_never_exceeds_the_floor():
    low = BoundSettings(10.0, 3.0, 25.0, 3.0)  # a test's 3 s floor: the wait floor follows it
    assert stall_bound(low, _stepped(0.1), _inside(LAST), LAST).seconds == 3.0


@pytest.mark.parametrize("longest, bound", [(8.0, 25.0), (8.4, 25.2), (20.0, 60.0)])
def test_the_longest_wait_seen_times_three_raises_the_bound_above_the_floor(longest, bound):
    history = _stepped(0.5)
    history.observe(_inside(LAST), LAST + longest)  # seen inside, then out
    history.observe(Position("forward", False, LAST + longest), LAST + longest + 1)
    assert history.longest_wait == pytest.approx(longest, abs=1e-9), history.longest_wait
    got = stall_bound(SHIPPED, history, _inside(LAST + 100), LAST + 100).seconds
    assert got == pytest.approx(bound, abs=1e-9), f"{got} for a longest wait of {longest} s"


def test_a_wait_still_going_does_not_raise_its_own_bound():
    """The hang itself is a wait that never ends: counted only once it has ended."""
    history = _stepped(0.5)
    for t in (10, 100, 1000):
        history.observe(_inside(LAST), LAST + t)
    assert history.longest_wait == 0.0
    assert stall_bound(SHIPPED, history, _inside(LAST), LAST).seconds == 25.0
    history.observe(_inside(LAST + 2000), LAST + 2001)  # the next collective: that one ended
    assert history.longest_wait == 1000.0


@pytest.mark.parametrize("phase, steps", [("checkpoint", (0.5,)), ("forward", ())])
def test_waits_in_a_save_or_in_warm_up_are_not_the_jobs_ordinary_waits(phase, steps):
    history = BoundHistory()
    for s in steps:
        history.step_done(s)
    history.observe(_inside(LAST, phase), LAST + 50)
    history.observe(None, LAST + 51)
    assert history.longest_wait == 0.0


@pytest.mark.parametrize("saves, bound", [((), 120.0), ((30.0,), 120.0), ((30.0, 50.0), 150.0)])
def test_a_save_is_bounded_by_the_longest_before_it_never_under_the_floor(saves, bound):
    history = _stepped(0.5)
    for s in saves:
        history.save_done(s)
    got = stall_bound(SHIPPED, history, _inside(LAST + 1, "checkpoint"), LAST)
    assert (got.kind, got.seconds, got.anchor) == ("checkpoint", bound, LAST), got


@pytest.mark.parametrize("median, bound", [(11.9, 120.0), (12.5, 125.0)])
def test_outside_a_collective_it_is_ten_median_steps_never_under_the_floor(median, bound):
    got = stall_bound(SHIPPED, _stepped(median, median, 0.1), Position("", False, LAST), LAST)
    assert got.kind == "steps" and got.seconds == pytest.approx(bound, abs=1e-9), got
    assert stall_bound(SHIPPED, _stepped(median), None, LAST).seconds == got.seconds


class _Where:
    """A rank's position as the publication gives it (``since`` in unix time)."""

    def __init__(self) -> None:
        self.position: Position | None = None

    def enter(self, inside: bool, ago: float = 0.0) -> None:
        self.position = Position("forward", inside, time.time() - ago)

    def __call__(self) -> Position | None:
        return self.position


def test_the_watchdog_publishes_the_wait_bound_counted_from_the_last_step(tmp_path):
    """A rank that entered a collective 3 s after its last step may go 3 + 25 s without a step;
    it is stalled past 25 s in the collective, not before. The clocks' offset is read twice
    (microseconds apart), so the instants tested sit 0.1 s either side of the line."""
    changes: list[tuple[bool, float]] = []
    where = _Where()
    with open(tmp_path / "log", "w") as stream:
        wd = StallWatchdog(10.0, 120.0, lambda s, t: changes.append((s, t)), stream,
                           wait_floor_seconds=25.0, where=where)
        wd.arm()
        wd.step_done(0.5)
        stepped = time.monotonic()
        wd._last_step = wd._last_progress = stepped - 3.0  # the step ended 3 s ago ...
        where.enter(inside=True)  # ... and the rank entered a collective now
        assert wd.compute_threshold() == pytest.approx(28.0, abs=0.01)
        assert not wd.check(now=stepped + 24.9)
        assert wd.check(now=stepped + 25.1)
        assert changes[-1][0] and changes[-1][1] == pytest.approx(28.0, abs=0.01), changes
        where.enter(inside=False)  # out of it, computing: the floor again
        assert not wd.check(now=stepped + 26.0)
        assert wd.compute_threshold() == pytest.approx(120.0, abs=0.01)
