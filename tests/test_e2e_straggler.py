"""The straggler is named for real: the trainer under torchrun (CPU, gloo), a fault injected on
one rank part-way through, the monitor's windows read back from each rank's JSONL.

Each run is healthy first: with nothing beside the job no rank may be flagged (score below
STRAGGLER_SCORE_THRESHOLD), and before the busy median spans BUSY_MIN_STEPS steps there is no
score at all. Then one rank is slowed from a step on; once the busy-time median is past the
fault, that rank must be named slowest, with the lowest score, in every window. Windows overlap
in the steps their median spans, so they are not independent trials: the proof against luck
(independent repeated runs of every case, both ranks, 15% and 50%, data and compute, with and
without a CPU-bound neighbour) and the 5-minute healthy runs are in benchmarks/bench_faults.py.
This is the compact subset the suite can afford.
"""

from __future__ import annotations

import math

import pytest
from straggler_runs import JobRun, run_job

from fsdpmon.conventions import DIAGNOSIS_EVIDENCE_SECONDS
from fsdpmon.monitor.stats import BUSY_MIN_STEPS

pytestmark = pytest.mark.slow

LOG_EVERY = 2
HEALTHY_STEPS = BUSY_MIN_STEPS + 5  # scored (full median) healthy windows: 12, 14, 16
SETTLE = BUSY_MIN_STEPS // 2 + 1  # steps after the fault before the median is past it
CHECKED_WINDOWS = 2


def windows(run: JobRun) -> tuple[list, list]:
    healthy = [w for w in run.windows if BUSY_MIN_STEPS <= w.step <= HEALTHY_STEPS]
    faulty = [w for w in run.windows if w.step >= HEALTHY_STEPS + SETTLE]
    return healthy, faulty


STEPS = HEALTHY_STEPS + SETTLE + LOG_EVERY * CHECKED_WINDOWS
# The monitor's flag needs a second median over disjoint steps to agree (BUSY_MIN_STEPS more)
# and DIAGNOSIS_EVIDENCE_SECONDS to pass: the data-slow rank's steps take DATA_SLOW_S or more.
DATA_SLOW_S = 0.25
FLAG_BY = (HEALTHY_STEPS + SETTLE + LOG_EVERY
           + max(BUSY_MIN_STEPS, math.ceil(DIAGNOSIS_EVIDENCE_SECONDS / DATA_SLOW_S)))


@pytest.fixture(scope="module")
def two_ranks_compute_slow_with_neighbour(tmp_path_factory) -> JobRun:
    # Rank 1's forward and backward 1.5x as long, a CPU-bound process running beside the job.
    fault = f"compute-slow:rank=1,factor=1.5,from_step={HEALTHY_STEPS + 1}"
    return run_job(tmp_path_factory.mktemp("cs2"), 2, fault, STEPS, LOG_EVERY,
                   busy_neighbour=True)


@pytest.fixture(scope="module")
def two_ranks_data_slow(tmp_path_factory) -> JobRun:
    # Rank 0 this time (the lowest rank, which no default favours); 4 ranks and every other
    # placement are benchmarks/bench_faults.py's matrix.
    fault = f"data-slow:rank=0,seconds={DATA_SLOW_S},from_step={HEALTHY_STEPS + 1}"
    return run_job(tmp_path_factory.mktemp("ds2"), 2, fault, FLAG_BY + LOG_EVERY, LOG_EVERY)


@pytest.mark.parametrize("job, ranks, slowed", [
    ("two_ranks_compute_slow_with_neighbour", 2, 1),
    ("two_ranks_data_slow", 2, 0),
])
def test_slowed_rank_is_named_in_every_window_after_the_fault(job, ranks, slowed, request):
    del ranks  # (the parameter id says how many)
    run: JobRun = request.getfixturevalue(job)
    _, faulty = windows(run)
    named = [w.slowest_rank for w in faulty]
    assert len(named) >= CHECKED_WINDOWS, f"{len(named)} windows after the fault settled"
    assert named == [slowed] * len(named), (
        f"named {named}, expected rank {slowed} in all {len(named)} windows; scores "
        f"{[w.scores for w in faulty]}")
    for w in faulty:  # the slowed rank also has the lowest score of all
        assert min(w.scores, key=lambda r: w.scores[r]) == slowed, w.scores


def test_healthy_windows_flag_nobody(two_ranks_data_slow):
    # (Not the run with a CPU-bound neighbour: a process taking a core from a rank for a while
    # makes that rank a real straggler, which is then rightly flagged.)
    run = two_ranks_data_slow
    healthy, _ = windows(run)
    assert len(healthy) >= 3, f"{len(healthy)} healthy windows"
    # before the busy median spans BUSY_MIN_STEPS steps there is no score at all
    early = [w.scores for w in run.windows if w.step < BUSY_MIN_STEPS]
    assert early and all(s is None for w in early for s in w.values()), early
    low = {w.step: (w.low, w.scores) for w in healthy if w.low}
    assert not low, f"healthy windows scored a rank below the line: {low}"


def test_monitor_flags_the_straggler_once_two_disjoint_medians_agree(two_ranks_data_slow):
    run = two_ranks_data_slow
    wrong = {w.step: w.flagged for w in run.windows if set(w.flagged) - {0}}
    assert not wrong, f"flagged a rank that was not slowed: {wrong}"
    early = [w.step for w in run.windows if w.flagged and w.step <= HEALTHY_STEPS]
    assert not early, f"flagged before the fault (steps {early})"
    late = [(w.step, w.flagged, w.scores[0]) for w in run.windows if w.step >= FLAG_BY]
    assert late and all(f == [0] for _, f, _ in late), (
        f"rank 0 not flagged {FLAG_BY - HEALTHY_STEPS - SETTLE} steps after its score fell: "
        f"{late}")
