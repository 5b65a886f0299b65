"""Window arithmetic and the job-level figures rank 0 derives from the gathered rows."""

from __future__ import annotations

import math

import pytest

from fsdpmon.monitor.stats import job_figures, window_stats
from fsdpmon.monitor.timing import WindowTimes


def test_window_stats():
    times = WindowTimes(step_seconds=[0.1, 0.3], phase_seconds={"data": 0.08, "forward": 0.2})
    stats = window_stats(times, tokens=800, wall_seconds=0.5, flops_per_token=1e6,
                         peak_flops=4e9)
    assert stats.tokens_per_second == pytest.approx(1600)
    assert stats.step_time_s == pytest.approx(0.2)
    assert stats.data_wait_ratio == pytest.approx(0.2)
    assert stats.local_seconds_per_step == pytest.approx(0.04)
    assert stats.phase_means == pytest.approx({"data": 0.04, "forward": 0.1})
    assert stats.mfu == pytest.approx(1600 * 1e6 / 4e9)


def test_window_without_data_phase_or_peak():
    stats = window_stats(WindowTimes([0.1]), tokens=10, wall_seconds=0.1, flops_per_token=1.0,
                         peak_flops=None)
    assert stats.data_wait_ratio == 0.0
    assert stats.mfu is None
    empty = window_stats(WindowTimes(), tokens=0, wall_seconds=0.0, flops_per_token=1.0,
                         peak_flops=None)
    assert empty.data_wait_ratio is None and empty.tokens_per_second == 0.0


def test_straggler_is_the_rank_with_most_time_before_the_collectives():
    # Synchronous FSDP: step times nearly equal; rank 2 spends its time loading data.
    rows = [[0.50, 0.01, 1e9, 2.0], [0.51, 0.02, 3e9, 2.2], [0.50, 0.30, 2e9, 1.8]]
    job = job_figures(rows)
    assert job.slowest_rank == 2
    assert job.slowest_rank_step_time_s == 0.50
    assert (job.step_time_min_s, job.step_time_median_s, job.step_time_max_s) == (
        0.50, 0.50, 0.51)
    assert (job.peak_memory_max_bytes, job.peak_memory_max_rank) == (3e9, 1)
    assert job.loss_mean == pytest.approx(2.0)
    assert job.loss_max == 2.2
    assert job.world_size == 3
    assert job.as_metrics()["fsdpmon_job_slowest_rank"] == 2


def test_without_marked_phases_the_longest_step_names_the_straggler():
    assert job_figures([[0.5, 0.0, 1, 1], [0.7, 0.0, 1, 1]]).slowest_rank == 1


def test_a_nonfinite_loss_on_any_rank_shows_in_the_job_figures():
    job = job_figures([[0.5, 0.0, 1, 1.0], [0.5, 0.0, 1, math.nan]])
    assert math.isnan(job.loss_max) and math.isnan(job.loss_mean)


def test_plus_and_minus_infinite_losses_make_a_nan_mean_not_an_error():
    """math.fsum raises on -inf + inf; rank 0's job figures must still be published."""
    job = job_figures([[0.5, 0.0, 1, math.inf], [0.5, 0.0, 1, -math.inf]])
    assert math.isnan(job.loss_mean) and job.loss_max == math.inf
    assert job_figures([[0.5, 0.0, 1, math.inf], [0.5, 0.0, 1, 2.0]]).loss_mean == math.inf
