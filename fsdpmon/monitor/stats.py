"""Pure arithmetic over one log window and over the ranks' gathered figures."""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from fsdpmon import catalog
from fsdpmon.monitor.flops import mfu
from fsdpmon.monitor.straggling import straggler_scores
from fsdpmon.monitor.timing import WindowTimes

# Fewest steps the busy-time median spans (odd: a true middle), so that a few odd steps cannot
# move it: on a loaded host a healthy rank's busy time still wanders from step to step, and a
# shorter median scores healthy ranks below the line too often to flag on (the straggler flag
# then asks two disjoint medians to agree: fsdpmon.monitor.straggling). The price is latency: a
# new straggler moves the median once half its steps are slow (about BUSY_MIN_STEPS / 2 steps)
# and is flagged when a second median agrees (about 1.5 x BUSY_MIN_STEPS steps).
# benchmarks/bench_faults.py prints the healthy ranks' scores and flags at a given load.
BUSY_MIN_STEPS = 31


@dataclass(frozen=True)
class WindowStats:
    steps: int
    tokens: int
    wall_seconds: float
    tokens_per_second: float
    step_time_s: float  # mean
    data_wait_ratio: float | None
    busy_s: float  # median over recent steps: step time less the time waiting in collectives
    busy_steps: tuple[float, ...]  # this window's per-step busy times (for the next windows)
    collective_wait_ratio: float | None
    descheduled_ratio: float | None  # share of step time waiting for a CPU outside collectives
    phase_means: dict[str, float]
    mfu: float | None


def window_stats(times: WindowTimes, tokens: int, wall_seconds: float,
                 flops_per_token: float, peak_flops: float | None,
                 collective_waits: Sequence[float] = (),
                 busy_history: Sequence[float] = (),
                 descheduled: Sequence[float] = ()) -> WindowStats:
    """``collective_waits``: each step's time inside collectives (empty: none measured);
    ``busy_history``: earlier steps' busy times, oldest first; ``descheduled``: each step's
    time waiting for a CPU outside the collectives (CPU hosts; empty: none measured).

    Busy time is step time less collective wait less that run-queue delay: what the rank spent
    on its own work (computing, loading data, sleeping in its own calls), so that a rank the OS
    happened to time-slice more in a window is not taken for a straggler (fsdpmon.monitor.
    schedstat). A straggler still shows: its extra work or its own slow calls are busy time.

    Busy time is the MEDIAN over the last max(window, BUSY_MIN_STEPS) steps: a straggler is
    slow in every step, while a rank that the OS happened to deschedule (a busy neighbour)
    loses a step here and there; the median keeps the first and drops the second, where a mean
    would blur them. The cost: a new straggler is named about BUSY_MIN_STEPS / 2 steps late.
    """
    steps = len(times.step_seconds)
    mean_step = statistics.fmean(times.step_seconds) if steps else 0.0
    tps = tokens / wall_seconds if wall_seconds > 0 else 0.0
    step_total = sum(times.step_seconds)
    data = times.phase_seconds.get("data")
    per_step = {k: v / steps for k, v in times.phase_seconds.items()} if steps else {}
    waits = list(collective_waits) if len(collective_waits) == steps else [0.0] * steps
    off_cpu = list(descheduled) if len(descheduled) == steps else [0.0] * steps
    busy = [max(0.0, t - w - d)
            for t, w, d in zip(times.step_seconds, waits, off_cpu, strict=True)]
    wait = min(step_total, math.fsum(waits))
    recent = [*busy_history, *busy][-max(steps, BUSY_MIN_STEPS):]
    return WindowStats(
        steps=steps,
        tokens=tokens,
        wall_seconds=wall_seconds,
        tokens_per_second=tps,
        step_time_s=mean_step,
        data_wait_ratio=min(1.0, (data or 0.0) / step_total) if step_total > 0 else None,
        busy_s=statistics.median(recent) if recent else 0.0,
        busy_steps=tuple(busy),
        collective_wait_ratio=wait / step_total if step_total > 0 else None,
        descheduled_ratio=(min(step_total, math.fsum(off_cpu)) / step_total
                           if step_total > 0 and len(descheduled) == steps else None),
        phase_means=per_step,
        mfu=mfu(tps, flops_per_token, peak_flops),
    )


class BusyHistory:
    """The recent steps' busy times that the next window's median spans, and whether they
    are enough to score a rank by."""

    def __init__(self) -> None:
        self.steps: deque[float] = deque(maxlen=BUSY_MIN_STEPS)
        self.known = False

    def add(self, window: WindowStats) -> None:
        self.steps.extend(window.busy_steps)
        # Until the median spans BUSY_MIN_STEPS steps it is too noisy to score a rank by: no
        # score (and no straggler flag) rather than a noisy one.
        self.known = len(self.steps) >= BUSY_MIN_STEPS or window.steps >= BUSY_MIN_STEPS


@dataclass(frozen=True)
class JobFigures:
    step_time_min_s: float
    step_time_median_s: float
    step_time_max_s: float
    slowest_rank: int
    slowest_rank_step_time_s: float
    slowest_rank_score: float | None
    peak_memory_max_bytes: float
    peak_memory_max_rank: int
    loss_mean: float
    loss_max: float
    world_size: int

    def as_record(self) -> dict[str, float | int]:
        return dict(self.__dict__)

    def as_metrics(self) -> dict[str, float]:
        return {
            catalog.JOB_STEP_TIME_MIN_SECONDS.name: self.step_time_min_s,
            catalog.JOB_STEP_TIME_MEDIAN_SECONDS.name: self.step_time_median_s,
            catalog.JOB_STEP_TIME_MAX_SECONDS.name: self.step_time_max_s,
            catalog.JOB_SLOWEST_RANK.name: self.slowest_rank,
            catalog.JOB_SLOWEST_RANK_STEP_TIME_SECONDS.name: self.slowest_rank_step_time_s,
            catalog.JOB_PEAK_MEMORY_MAX_BYTES.name: self.peak_memory_max_bytes,
            catalog.JOB_PEAK_MEMORY_MAX_RANK.name: self.peak_memory_max_rank,
            catalog.JOB_LOSS_MEAN.name: self.loss_mean,
            catalog.JOB_LOSS_MAX.name: self.loss_max,
            catalog.JOB_WORLD_SIZE.name: self.world_size,
        }


def job_figures(rows: Sequence[Sequence[float]]) -> JobFigures:
    """Aggregate the gathered rows: one per rank, each (step time, busy time, peak memory,
    loss), as the monitor gathers them once per log interval."""
    step = [r[0] for r in rows]
    busy = [r[1] for r in rows]
    memory = [r[2] for r in rows]
    loss = [r[3] for r in rows]
    # The straggler waits least at the collectives: the lowest score (= the most busy time).
    # Step time cannot name it: in synchronous training every rank's step is as long as the
    # slowest rank's.
    scores = straggler_scores(busy)
    known = [i for i, s in enumerate(scores) if s is not None]
    slowest = min(known, key=lambda i: (scores[i], i)) if known else _argmax(step)
    peak_rank = _argmax(memory)
    return JobFigures(
        step_time_min_s=min(step),
        step_time_median_s=statistics.median(step),
        step_time_max_s=max(step),
        slowest_rank=slowest,
        slowest_rank_step_time_s=step[slowest],
        slowest_rank_score=scores[slowest],
        peak_memory_max_bytes=memory[peak_rank],
        peak_memory_max_rank=peak_rank,
        # fsum refuses -inf + inf: with a non-finite loss the mean is what IEEE says it is
        loss_mean=(math.fsum(loss) if all(map(math.isfinite, loss)) else sum(loss)) / len(loss),
        loss_max=math.nan if any(math.isnan(x) for x in loss) else max(loss),
        world_size=len(rows),
    )


def _argmax(values: Sequence[float]) -> int:
    return max(range(len(values)), key=lambda i: (values[i], -i))
