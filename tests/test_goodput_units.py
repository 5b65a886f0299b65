"""Goodput's boundaries, fast: each case pins one comparison, constant or unit of the window
split and the live meter (benchmarks/mutation.py), with a case on each side. Figures are binary
fractions, so the arithmetic is exact and so are the comparisons."""

from __future__ import annotations

from fsdpmon.job.goodput import RankWindow, rank_window, split_window
from fsdpmon.monitor.goodput_meter import GoodputMeter, window_row
from fsdpmon.monitor.stats import WindowStats


def w(rank: int, step: float, data: float, wait: float, steps: int = 1) -> RankWindow:
    return RankWindow(rank, steps, step, data, wait)


def figures(split) -> tuple[float, ...]:
    return (split.productive, split.data_wait, split.straggler_wait, split.stall,
            split.stall_between)


def test_the_straggler_threshold_is_a_share_of_the_critical_rank_s_own_work():
    # own work 2.0 s against the others' 1.0 s: a score of 0.5, a straggler by 1.0 s
    slow = split_window([w(0, 2.0, 0.0, 1.0), w(1, 2.0, 0.0, 0.0), w(2, 2.0, 0.0, 1.0)])
    assert figures(slow) == (1.0, 0.0, 1.0, 0.0, 0.0), figures(slow)
    # own work 0.5 s against 0.4375 s: a score of 0.875, jitter
    even = split_window([w(0, 0.5, 0.0, 0.0625), w(1, 0.5, 0.0, 0.0), w(2, 0.5, 0.0, 0.0625)])
    assert figures(even) == (0.5, 0.0, 0.0, 0.0, 0.0), figures(even)


def test_a_rank_that_measured_no_step_is_not_in_the_others_median():
    split = split_window([w(0, 1.0, 0.0, 0.5), w(1, 1.0, 0.0, 0.0),
                          w(2, 0.0, 0.0, 0.0, steps=0)])
    # the others' median own work is rank 0's 0.5 s alone (with rank 2's 0.0 it would be 0.25)
    assert (split.critical_rank, split.straggler_wait) == (1, 0.5), figures(split)


def test_a_stall_exactly_one_window_long_is_in_the_steps_a_longer_one_between_them():
    ranks = [w(0, 1.0, 0.0, 1.0), w(1, 1.0, 0.0, 0.0)]
    inside = split_window(ranks, stall=1.0, wall=4.0)
    assert figures(inside) == (0.0, 0.0, 0.0, 1.0, 0.0), figures(inside)
    between = split_window(ranks, stall=1.5, wall=4.0)
    assert figures(between) == (0.0, 0.0, 1.0, 1.5, 1.5), figures(between)


def test_a_stall_between_the_critical_ranks_steps_is_booked_while_the_other_waited_inside():
    # CI saw it: rank 1 stopped after its log step, rank 0 waited 5.875 s inside its next step;
    # the time is between rank 1's steps (the job's), not between rank 0's (0.125 s)
    ranks = [w(0, 6.0, 0.0, 5.875), w(1, 0.125, 0.0, 0.0)]
    split = split_window(ranks, stall=5.75, wall=6.125)
    assert figures(split) == (0.125, 0.0, 0.0, 5.75, 5.75), figures(split)


def test_a_stall_in_one_ranks_own_work_is_booked_while_the_other_waited_after_its_step():
    # A fresh clone saw it: rank 1 stopped in its own work after step 23's last collective,
    # rank 0 waited in the log gather after its step; both had a few ms of waits inside, rank 0
    # the fewer, and the stall was booked against rank 0's 0.125 s step (5.75 s unaccounted)
    ranks = [w(0, 0.125, 0.0, 0.0625), w(1, 5.875, 0.0, 0.0625)]
    split = split_window(ranks, stall=5.75, wall=0.125)
    assert split.critical_rank == 1, figures(split)
    assert figures(split) == (0.125, 0.0, 0.0, 5.75, 0.0), figures(split)
    # own work exactly the stall holds it; just short of it does not (the least wait leads)
    for step, critical in ((5.8125, 1), (5.75, 0)):
        split = split_window([w(0, 0.125, 0.0, 0.0625), w(1, step, 0.0, 0.0625)], stall=5.75,
                             wall=0.125)
        assert split.critical_rank == critical, (step, figures(split))


def test_rank_window_reads_exactly_the_four_figures_of_a_window_row():
    assert rank_window(3, [2.5, 0.5, 0.25, 4.0]) == RankWindow(3, 4, 2.5, 0.5, 0.25)


def stats(step_seconds: tuple[float, ...], wall: float, data_mean: float | None = None,
          wait_ratio: float | None = None) -> WindowStats:
    return WindowStats(steps=len(step_seconds), tokens=0, wall_seconds=wall,
                       tokens_per_second=0.0, step_time_s=0.0, data_wait_ratio=None,
                       busy_s=0.0, busy_steps=(), collective_wait_ratio=wait_ratio,
                       descheduled_ratio=None,
                       phase_means={} if data_mean is None else {"data": data_mean},
                       mfu=None, step_seconds=step_seconds)


def test_window_row_is_step_data_and_wait_seconds_and_steps():
    assert window_row(None) == [0.0, 0.0, 0.0, 0.0]
    row = window_row(stats((0.5, 0.75), wall=1.5, data_mean=0.125, wait_ratio=0.5))
    assert row == [1.25, 0.25, 0.625, 2.0], row  # data 0.125 x 2 steps, wait 0.5 x 1.25 s
    bare = window_row(stats((0.5, 0.75), wall=1.5))
    assert bare == [1.25, 0.0, 0.0, 2.0], "no data phase or waits measured: none counted"


def test_the_meter_splits_the_gathered_rows_from_their_offset():
    meter = GoodputMeter(process_start=0.0)
    # two figures before the window's four; rank 1's row is longer (more after it), rank 2's
    # too short to hold a window (a rank from an older build): left out
    rows = [[9.0, 9.0, 1.0, 0.25, 0.0, 1.0],
            [9.0, 9.0, 1.0, 0.0, 0.25, 1.0, 7.0],
            [9.0, 9.0, 1.0, 0.0, 0.0]]
    meter.rows(rows, 2, stall=0.0, stats=stats((1.0,), wall=1.0))
    # critical rank 0 (waited least): its data 0.25 s, own 0.75 s as rank 1's: no straggler
    assert meter.productive == 0.75 and meter.badput["data_wait"] == 0.25, meter.badput
    meter.rows([[9.0, 9.0, 0.0, 0.0, 0.0, 0.0]], 2, stall=0.0, stats=stats((), wall=1.0))
    assert meter.productive == 0.75, "a window without steps adds nothing"


def test_the_meter_takes_a_long_stall_from_the_time_between_the_steps():
    meter = GoodputMeter(process_start=0.0)
    rows = [[0.25, 0.0, 0.125, 1.0], [0.25, 0.0, 0.0, 1.0]]
    # 5.25 s of wall clock, 0.25 s of it the step: 5.0 s between; a 6 s stall holds all of
    # it and the whole step
    meter.rows(rows, 0, stall=6.0, stats=stats((0.25,), wall=5.25))
    assert (meter.badput["stall"], meter.productive) == (5.25, 0.0), meter.badput


def test_the_meter_s_ratio_needs_productive_time():
    meter = GoodputMeter(process_start=0.0)
    meter.first_step(now=5.0)
    assert meter.badput["startup"] == 5.0 and meter.ratio() is None, meter.ratio()
    only = GoodputMeter(process_start=0.0)
    only.window(split_window([w(0, 0.5, 0.0, 0.0)]), [0.5])
    assert only.ratio() == 1.0, "half a second, all productive"
    half = GoodputMeter(process_start=0.0)
    half.window(split_window([w(0, 0.5, 0.0, 0.0)]), [0.5])
    half.checkpoint(0.5)
    assert half.ratio() == 0.5, half.ratio()


def test_the_meter_s_restart_counts_from_the_previous_life_s_last_log_step():
    meter = GoodputMeter(process_start=300.0)
    meter.restart_from(step=37, last_progress=290.0)
    meter.restore(step=30, seconds=0.5)
    meter.first_step(now=310.0)
    assert meter.badput["restart"] == 19.5 and meter.badput["startup"] == 0.0, meter.badput
    meter.window(split_window([w(0, 0.25, 0.0, 0.0)]), [0.25, 0.5, 0.25])
    assert meter.badput["recompute"] == 7 * 0.25, meter.badput["recompute"]
    # a restart from a step before the restored one (a newer checkpoint): nothing made again
    ahead = GoodputMeter(process_start=0.0)
    ahead.restart_from(step=30, last_progress=0.0)
    ahead.restore(step=32, seconds=0.0)
    ahead.first_step(now=0.0)
    ahead.window(split_window([w(0, 0.25, 0.0, 0.0)]), [0.25])
    assert ahead.badput["recompute"] == 0.0, ahead.badput["recompute"]
    # no previous life known: no recompute, whatever was restored
    fresh = GoodputMeter(process_start=0.0)
    fresh.restore(step=30, seconds=0.25)
    fresh.first_step(now=1.0)
    fresh.window(split_window([w(0, 0.25, 0.0, 0.0)]), [0.25])
    assert (fresh.badput["recompute"], fresh.badput["startup"]) == (0.0, 0.75), fresh.badput
