"""The report's data: what a run's logs hold (RunData) and what the report computes (RunStats).

Both sources (JSONL logs and Prometheus range queries) produce the same RunData, so the figures
in a report never depend on where they came from.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal


@dataclass(frozen=True, slots=True)  # slots: a long run at many ranks holds millions
class Sample:
    """One observation of one rank: a JSONL log record, or one Prometheus evaluation time."""

    time: float  # unix seconds
    step: int
    tokens_total: float | None  # tokens this rank has processed so far
    tokens_per_second: float  # this rank, over the monitor's last log window
    step_time_s: float  # mean step time over that window
    mfu: float | None = None
    peak_memory_bytes: float | None = None
    loss: float | None = None
    data_wait_ratio: float | None = None  # share of step time spent waiting for data


@dataclass(frozen=True)
class RunData:
    name: str  # short label for tables and charts
    source: str  # the log path or "PROMETHEUS_URL job=NAME"
    world_size: int
    nodes: int
    model: str
    device: str
    flops_per_token: float | None
    peak_flops: float | None
    memory_source: Literal["device", "rss"]  # peak CUDA memory, or process RSS on CPU
    ranks: dict[int, tuple[Sample, ...]]  # rank -> samples in time order
    goodput_ratio: float | None = None  # kept step time over the wall clock (JSONL runs)
    badput_seconds: dict[str, float] | None = None  # by cause (fsdpmon.job.run_goodput)


@dataclass(frozen=True)
class RunStats:
    name: str
    source: str
    world_size: int
    nodes: int
    model: str
    device: str
    ranks_seen: int  # ranks whose records the report read (may be < world_size)
    last_step: int
    measured_steps: int  # steps inside the measured window (after warm-up)
    tokens_per_second: float  # whole job
    tokens_per_second_per_gpu: float
    step_time_median_s: float
    step_time_p90_s: float
    mfu: float | None
    data_wait_ratio: float | None  # mean over ranks and measured windows
    peak_memory_bytes_per_gpu: float | None  # highest over ranks
    memory_source: str
    final_loss: float | None
    goodput_ratio: float | None = None
    badput_seconds: dict[str, float] | None = None
    scaling_efficiency: float | None = None  # against the smallest run; None until compared

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
