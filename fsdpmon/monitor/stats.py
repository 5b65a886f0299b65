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

# The "waited for" view (see WaitHistory) also spans at least this much wall time: the time a
# loaded host makes a rank wait for a CPU comes in stretches of seconds, which a median over
# BUSY_MIN_STEPS tiny steps follows, so healthy ranks would score below the line now and then;
# over 10 s they do not, while a rank given a fraction of a core still does
# (benchmarks/bench_blind.py prints both). Capped in steps, so a job of millisecond steps spans
# less.
WAIT_SPAN_SECONDS = 10.0
WAIT_SPAN_MAX_STEPS = 4096
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
    descheduled_ratio: float | None  # share of step time waiting for a CPU (run-queue delay)
    phase_means: dict[str, float]
    mfu: float | None
    step_seconds: tuple[float, ...] = ()
    # per step: its time not waiting for the other ranks: busy plus waiting for a CPU
    held_steps: tuple[float, ...] = ()
    # per step: the share of it spent waiting for a CPU (empty: not measured)
    descheduled_steps: tuple[float, ...] = ()


def window_stats(times: WindowTimes, tokens: int, wall_seconds: float,
                 flops_per_token: float, peak_flops: float | None,
                 collective_waits: Sequence[float] = (),
                 busy_history: Sequence[float] = (),
                 descheduled: Sequence[float] = (),
                 descheduled_inside: Sequence[float] = ()) -> WindowStats:
    """``collective_waits``: each step's time inside collectives (empty: none measured);
    ``busy_history``: earlier steps' busy times, oldest first; ``descheduled``: each step's
    time waiting for a CPU outside the collectives (CPU hosts; empty: none measured);
    ``descheduled_inside``: the same inside them (part of the collective wait).

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
    measured = len(descheduled) == steps
    off_cpu = list(descheduled) if measured else [0.0] * steps
    off_in = list(descheduled_inside) if len(descheduled_inside) == steps else [0.0] * steps
    busy = [max(0.0, t - w - d)
            for t, w, d in zip(times.step_seconds, waits, off_cpu, strict=True)]
    # A rank starved of CPU is starved inside the collectives too (gloo's copies and reductions
    # wait for a CPU): that part of the "wait" is not waiting for the other ranks.
    held = [max(0.0, t - w + d) for t, w, d in zip(times.step_seconds, waits, off_in, strict=True)]
    off_total = [a + b for a, b in zip(off_cpu, off_in, strict=True)]
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
        descheduled_ratio=(min(step_total, math.fsum(off_total)) / step_total
                           if step_total > 0 and measured else None),
        phase_means=per_step,
        mfu=mfu(tps, flops_per_token, peak_flops),
        step_seconds=tuple(times.step_seconds),
        held_steps=tuple(held),
        descheduled_steps=tuple(min(1.0, d / t) if t > 0 else 0.0
                                for t, d in zip(times.step_seconds, off_total, strict=True))
        if measured else (),
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


class WaitHistory:
    """Who the others wait for, whatever slows it: each step's time not waiting for the other
    ranks (held: busy, or waiting for a CPU) and its share waiting for a CPU, as medians over
    the recent steps spanning BUSY_MIN_STEPS steps and WAIT_SPAN_SECONDS of step time.

    Busy time leaves the run-queue delay out (so a rank the OS time-sliced more in a window is
    not a compute straggler), which makes a rank starved of CPU look idle; held time puts it
    back. A starved rank is waited for (held high) but not busy: that pair is its signature."""

    def __init__(self) -> None:
        self._steps: deque[tuple[float, float, float]] = deque(maxlen=WAIT_SPAN_MAX_STEPS)

    def add(self, window: WindowStats) -> None:
        shares = window.descheduled_steps or [math.nan] * len(window.held_steps)
        self._steps.extend(zip(window.step_seconds, window.held_steps, shares, strict=True))

    def _spanned(self) -> list[tuple[float, float, float]] | None:
        out, seconds = [], 0.0
        for entry in reversed(self._steps):
            out.append(entry)
            seconds += entry[0]
            if len(out) >= BUSY_MIN_STEPS and seconds >= WAIT_SPAN_SECONDS:
                return out
        full = len(self._steps) == self._steps.maxlen
        return out if full else None  # too few steps yet: no figure rather than a noisy one

    def figures(self) -> tuple[float | None, float | None]:
        """(median held seconds, median share waiting for a CPU); None until the span is
        covered (the share also where it is not measured)."""
        spanned = self._spanned()
        if not spanned:
            return None, None
        shares = [d for _, _, d in spanned]
        return (statistics.median(h for _, h, _ in spanned),
                None if any(math.isnan(d) for d in shares) else statistics.median(shares))


# The per-rank vector each rank contributes to the one gather per log interval.
GATHER_FIELDS = ("step_time_s", "busy_s", "peak_memory_bytes", "loss", "held_s")


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
