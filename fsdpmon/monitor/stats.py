"""Pure arithmetic over one log window and over the ranks' gathered figures."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from fsdpmon import catalog
from fsdpmon.monitor.flops import mfu
from fsdpmon.monitor.timing import WindowTimes

# Phases that run before a step's first collective: time there is a rank's own, so the rank
# with the most of it is the one the others wait for (with synchronous FSDP every rank's step
# time is about equal, so step time alone cannot name the straggler).
LOCAL_PHASES = ("data",)


@dataclass(frozen=True)
class WindowStats:
    steps: int
    tokens: int
    wall_seconds: float
    tokens_per_second: float
    step_time_s: float  # mean
    data_wait_ratio: float | None
    local_seconds_per_step: float
    phase_means: dict[str, float]
    mfu: float | None


def window_stats(times: WindowTimes, tokens: int, wall_seconds: float,
                 flops_per_token: float, peak_flops: float | None) -> WindowStats:
    steps = len(times.step_seconds)
    mean_step = statistics.fmean(times.step_seconds) if steps else 0.0
    tps = tokens / wall_seconds if wall_seconds > 0 else 0.0
    step_total = sum(times.step_seconds)
    data = times.phase_seconds.get("data")
    per_step = {k: v / steps for k, v in times.phase_seconds.items()} if steps else {}
    local = sum(times.phase_seconds.get(p, 0.0) for p in LOCAL_PHASES)
    return WindowStats(
        steps=steps,
        tokens=tokens,
        wall_seconds=wall_seconds,
        tokens_per_second=tps,
        step_time_s=mean_step,
        data_wait_ratio=min(1.0, (data or 0.0) / step_total) if step_total > 0 else None,
        local_seconds_per_step=local / steps if steps else 0.0,
        phase_means=per_step,
        mfu=mfu(tps, flops_per_token, peak_flops),
    )


# The per-rank vector each rank contributes to the one gather per log interval.
GATHER_FIELDS = ("step_time_s", "local_seconds_per_step", "peak_memory_bytes", "loss")


@dataclass(frozen=True)
class JobFigures:
    step_time_min_s: float
    step_time_median_s: float
    step_time_max_s: float
    slowest_rank: int
    slowest_rank_step_time_s: float
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
    """Aggregate the gathered rows (one per rank, GATHER_FIELDS order)."""
    step = [r[0] for r in rows]
    local = [r[1] for r in rows]
    memory = [r[2] for r in rows]
    loss = [r[3] for r in rows]
    # The straggler: most time of its own before the collectives; when nobody marks such
    # phases, fall back to the longest step.
    slowest = _argmax(local) if max(local) > 0 else _argmax(step)
    peak_rank = _argmax(memory)
    return JobFigures(
        step_time_min_s=min(step),
        step_time_median_s=statistics.median(step),
        step_time_max_s=max(step),
        slowest_rank=slowest,
        slowest_rank_step_time_s=step[slowest],
        peak_memory_max_bytes=memory[peak_rank],
        peak_memory_max_rank=peak_rank,
        # fsum refuses -inf + inf: with a non-finite loss the mean is what IEEE says it is
        loss_mean=(math.fsum(loss) if all(map(math.isfinite, loss)) else sum(loss)) / len(loss),
        loss_max=math.nan if any(math.isnan(x) for x in loss) else max(loss),
        world_size=len(rows),
    )


def _argmax(values: Sequence[float]) -> int:
    return max(range(len(values)), key=lambda i: (values[i], -i))
