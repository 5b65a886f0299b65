"""Window arithmetic and the job-level figures rank 0 derives from the gathered rows."""

from __future__ import annotations

import math

import pytest
from support import rounded

from fsdpmon.conventions import STRAGGLER_SCORE_THRESHOLD
from fsdpmon.monitor.stats import (
    BUSY_MIN_STEPS,
    WAIT_SPAN_SECONDS,
    WaitHistory,
    job_figures,
    straggler_scores,
    window_stats,
)
from fsdpmon.monitor.timing import WindowTimes


def test_window_stats():
    times = WindowTimes(step_seconds=[0.1, 0.3], phase_seconds={"data": 0.08, "forward": 0.2})
    stats = window_stats(times, tokens=800, wall_seconds=0.5, flops_per_token=1e6,
                         peak_flops=4e9, collective_waits=[0.02, 0.08])
    assert stats.tokens_per_second == rounded(1600)
    assert stats.step_time_s == rounded(0.2)
    assert stats.data_wait_ratio == rounded(0.2)
    assert stats.busy_s == rounded(((0.1 - 0.02) + (0.3 - 0.08)) / 2)  # median of 2
    assert stats.busy_steps == rounded((0.08, 0.22))
    assert stats.collective_wait_ratio == rounded(0.1 / 0.4)
    assert stats.phase_means == rounded({"data": 0.04, "forward": 0.1})
    assert stats.mfu == rounded(1600 * 1e6 / 4e9)


def test_time_waiting_for_a_cpu_outside_collectives_is_not_busy():
    # two 0.3 s steps: 0.1 s in collectives each; the second also waited 0.15 s for a CPU
    times = WindowTimes(step_seconds=[0.3, 0.3])
    stats = window_stats(times, 1, 0.6, 1.0, None, [0.1, 0.1], descheduled=[0.0, 0.15])
    assert stats.busy_steps == rounded((0.2, 0.05)), stats.busy_steps
    assert stats.descheduled_ratio == rounded(0.15 / 0.6)
    assert stats.collective_wait_ratio == rounded(0.2 / 0.6)  # wait is still wait
    unknown = window_stats(times, 1, 0.6, 1.0, None, [0.1, 0.1])
    assert unknown.descheduled_ratio is None and unknown.busy_steps == rounded((0.2, 0.2))


def test_busy_time_is_a_median_that_one_descheduled_step_cannot_move():
    steady = [0.1] * (BUSY_MIN_STEPS - 3)
    times = WindowTimes(step_seconds=[0.1, 0.1, 0.9])  # the last step lost 0.8 s off-CPU
    stats = window_stats(times, 1, 1.0, 1.0, None, [0.0, 0.0, 0.0], busy_history=steady)
    assert stats.busy_s == rounded(0.1)
    # ... while a rank slow in every step moves it at once when the window is long enough
    slow = WindowTimes(step_seconds=[0.2] * BUSY_MIN_STEPS)
    assert window_stats(slow, 1, 1.0, 1.0, None, busy_history=steady).busy_s == 0.2


def test_window_without_data_phase_or_peak():
    stats = window_stats(WindowTimes([0.1]), tokens=10, wall_seconds=0.1, flops_per_token=1.0,
                         peak_flops=None)
    assert stats.data_wait_ratio == 0.0 and stats.collective_wait_ratio == 0.0
    assert stats.busy_s == rounded(0.1)
    assert stats.mfu is None
    empty = window_stats(WindowTimes(), tokens=0, wall_seconds=0.0, flops_per_token=1.0,
                         peak_flops=None)
    assert empty.data_wait_ratio is None and empty.tokens_per_second == 0.0
    assert (empty.steps, empty.step_time_s, empty.busy_s) == (0, 0.0, 0.0), empty
    # data time measured past the steps' own (a loader between steps) counts as all of it
    late = window_stats(WindowTimes([1.0, 1.0], {"data": 3.0}), 1, 2.0, 1.0, None)
    assert late.data_wait_ratio == 1.0, late


def test_a_rank_is_scored_once_the_median_spans_enough_steps_and_not_before():
    from fsdpmon.monitor.stats import BusyHistory

    def window(steps: int):
        return window_stats(WindowTimes([0.1] * steps), 1, 1.0, 1.0, None)

    history = BusyHistory()
    assert not history.known  # before any window
    for steps, known in ((10, False), (10, False), (BUSY_MIN_STEPS - 20, True), (1, True)):
        history.add(window(steps))
        assert history.known is known, (steps, len(history.steps))
    at_once = BusyHistory()
    at_once.add(window(BUSY_MIN_STEPS))
    assert at_once.known
    short = BusyHistory()
    short.add(window(BUSY_MIN_STEPS - 1))
    assert not short.known


def test_straggler_is_the_rank_that_waits_least_at_the_collectives():
    # Synchronous FSDP: step times nearly equal; rank 2 is busy 0.45 s, the others wait.
    rows = [[0.50, 0.30, 1e9, 2.0], [0.51, 0.31, 3e9, 2.2], [0.50, 0.45, 2e9, 1.8]]
    job = job_figures(rows)
    assert job.slowest_rank == 2
    assert job.slowest_rank_score == rounded(0.305 / 0.45)
    assert job.slowest_rank_step_time_s == 0.50
    assert (job.step_time_min_s, job.step_time_median_s, job.step_time_max_s) == (
        0.50, 0.50, 0.51)
    assert (job.peak_memory_max_bytes, job.peak_memory_max_rank) == (3e9, 1)
    assert job.loss_mean == rounded(2.0)
    assert job.loss_max == 2.2
    assert job.world_size == 3
    assert job.as_metrics()["fsdpmon_job_slowest_rank"] == 2


def test_without_busy_figures_the_longest_step_names_the_straggler():
    nan = math.nan
    assert job_figures([[0.5, nan, 1, 1], [0.7, nan, 1, 1]]).slowest_rank == 1


def test_straggler_score_is_the_other_ranks_median_over_own_busy():
    # Two ranks, one 1.5x busier: 1/1.5 (with itself in the median it would be 1.25/1.5).
    assert straggler_scores([0.2, 0.3]) == rounded([1.5, 0.2 / 0.3])
    scores = straggler_scores([1.0, 1.0, 2.0, 1.0])
    assert scores == rounded([1.0, 1.0, 0.5, 1.0])
    assert min(s for s in scores if s) < STRAGGLER_SCORE_THRESHOLD <= sorted(scores)[1]
    # Missing figures give no score rather than a made-up one; one rank has no peers.
    assert straggler_scores([math.nan, 1.0, 1.0]) == [None, 1.0, 1.0]
    assert straggler_scores([0.0, 1.0]) == [None, None]
    assert straggler_scores([1.0]) == [None]


def test_a_nonfinite_loss_on_any_rank_shows_in_the_job_figures():
    job = job_figures([[0.5, 0.0, 1, 1.0], [0.5, 0.0, 1, math.nan]])
    assert math.isnan(job.loss_max) and math.isnan(job.loss_mean)


def test_plus_and_minus_infinite_losses_make_a_nan_mean_not_an_error():
    """math.fsum raises on -inf + inf; rank 0's job figures must still be published."""
    job = job_figures([[0.5, 0.0, 1, math.inf], [0.5, 0.0, 1, -math.inf]])
    assert math.isnan(job.loss_mean) and job.loss_max == math.inf
    assert job_figures([[0.5, 0.0, 1, math.inf], [0.5, 0.0, 1, 2.0]]).loss_mean == math.inf


def test_a_step_record_counts_collective_calls_per_step():
    from fsdpmon.distenv import DistEnv
    from fsdpmon.monitor.records import step_record

    stats = window_stats(WindowTimes([0.1] * 5), 10, 0.5, 1.0, None)
    record = step_record(DistEnv(), 5, stats, {}, busy_known=False, peak_memory=1.0, job=None,
                         score=None, straggling=False, collective_calls=20, tokens_total=10)
    assert record["collective_calls"] == 4.0, record
    failed = step_record(DistEnv(), 5, None, {}, busy_known=False, peak_memory=1.0, job=None,
                         score=None, straggling=False, collective_calls=20, tokens_total=10)
    assert failed["collective_calls"] == 0 and failed["step_time_s"] is None, failed


def test_held_time_puts_back_the_cpu_wait_busy_time_leaves_out():
    """Step 0.3 s: 0.1 s in collectives of which 0.04 s waiting for a CPU inside them, and
    0.05 s waiting for a CPU outside: busy 0.15, held 0.24 (all but the 0.06 s waiting for
    peers), 0.09 s of the step waiting for a CPU."""
    times = WindowTimes(step_seconds=[0.3])
    stats = window_stats(times, 1, 0.3, 1.0, None, [0.1], descheduled=[0.05],
                         descheduled_inside=[0.04])
    assert stats.busy_steps == pytest.approx((0.15,))
    assert stats.held_steps == pytest.approx((0.24,))
    assert stats.descheduled_steps == pytest.approx((0.3,))
    assert stats.descheduled_ratio == pytest.approx(0.3)
    unmeasured = window_stats(times, 1, 0.3, 1.0, None, [0.1])
    assert unmeasured.held_steps == pytest.approx((0.2,)) and unmeasured.descheduled_steps == ()


def _window(step_s: float, steps: int, held: float, share: float | None) -> object:
    times = WindowTimes(step_seconds=[step_s] * steps)
    desched = [share * step_s] * steps if share is not None else ()
    return window_stats(times, 1, step_s * steps, 1.0, None, [step_s - held] * steps,
                        descheduled=desched)


def test_the_waited_for_view_spans_the_steps_and_the_seconds():
    history = WaitHistory()
    step = 0.125  # exact in binary: the span's sum of step times is exact too
    span = int(WAIT_SPAN_SECONDS / step)
    # 31 steps: enough steps, not enough seconds
    history.add(_window(step, BUSY_MIN_STEPS, held=0.05, share=0.0))
    assert history.figures() == (None, None)
    history.add(_window(step, span - BUSY_MIN_STEPS - 1, held=0.05, share=0.0))
    assert history.figures() == (None, None)  # one step short of the span
    history.add(_window(step, 1, held=0.05, share=0.0))
    assert history.figures() == pytest.approx((0.05, 0.0))
    # a rank starved from now on: the median follows once more than half the span is starved
    history.add(_window(step, span // 2, held=0.09, share=0.4))
    assert history.figures()[0] == pytest.approx((0.05 + 0.09) / 2)  # an even span: the mean
    history.add(_window(step, 1, held=0.09, share=0.4))
    held, share = history.figures()
    assert held == pytest.approx(0.09) and share == pytest.approx(0.4)


def test_long_steps_span_the_step_count_and_unmeasured_cpu_wait_stays_unknown():
    history = WaitHistory()
    history.add(_window(2.0, BUSY_MIN_STEPS - 1, held=1.0, share=None))
    assert history.figures() == (None, None)  # 60 s, but only 30 steps
    history.add(_window(2.0, 1, held=1.0, share=None))
    assert history.figures() == (pytest.approx(1.0), None)
