"""The records the monitor writes to its JSONL (and hands its log listeners): the run's facts
once at start, then one record per log window. Plain dicts of JSON values, built here so that
the Monitor only decides when."""

from __future__ import annotations

import math
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fsdpmon.distenv import DistEnv
from fsdpmon.monitor.stats import JobFigures, WindowStats


def run_record(topo: DistEnv, job_name: str, model: nn.Module | None, run_info: dict[str, Any],
               flops_per_token: float, device: str, peak_flops: float | None) -> dict[str, Any]:
    return {
        "kind": "run", "time": time.time(), "rank": topo.rank, "local_rank": topo.local_rank,
        "world_size": topo.world_size, "nodes": topo.nodes,
        "model": str(run_info.get("model") or (type(model).__name__ if model else "")),
        "config": run_info.get("config", {}), "flops_per_token": flops_per_token,
        "device": device, "peak_flops": peak_flops,
        "job_name": job_name,
        "dtype": str(run_info.get("dtype") or param_dtype(model)),
        "torch_version": torch.__version__,
        "node": os.environ.get("NODE_NAME") or socket.gethostname(),
        "pod": os.environ.get("POD_NAME") or socket.gethostname(),
        "restarts": topo.restart_count,
    }


@dataclass(frozen=True)
class CpuFigures:
    """Who the others wait for and whether the CPU is why (None: not known yet, or not here)."""

    waited_for_score: float | None = None  # the others' median held time / this rank's
    descheduled_ratio: float | None = None  # share of the step waiting for a CPU (span median)
    cpu_throttled_ratio: float | None = None  # of the cgroup's CFS periods in the window


def step_record(topo: DistEnv, step: int, stats: WindowStats | None,
                quality: dict[str, float | None], *, busy_known: bool, peak_memory: float,
                job: JobFigures | None, score: float | None, straggling: bool,
                collective_calls: int, tokens_total: int,
                cpu: CpuFigures = CpuFigures(),
                first_nonfinite: dict[str, int | None] | None = None) -> dict[str, Any]:
    """``stats``: the window's figures (None when measuring it failed); ``busy_known``: the
    busy median spans enough steps to publish; ``collective_calls``: in the window."""
    loss = quality.get("loss")
    record: dict[str, Any] = {
        "kind": "step", "time": time.time(), "rank": topo.rank,
        "local_rank": topo.local_rank, "world_size": topo.world_size,
        "step": step, "loss": loss, "lr": quality.get("lr"),
        "grad_norm": quality.get("grad_norm"),
        "tokens_per_second": stats.tokens_per_second if stats else None,
        "step_time_s": stats.step_time_s if stats else None,
        "data_wait_ratio": stats.data_wait_ratio if stats else None,
        "busy_s": stats.busy_s if stats and busy_known else None,
        "collective_wait_ratio": stats.collective_wait_ratio if stats else None,
        # the window's share of step time waiting for a CPU; the median share over the
        # recent steps (>= 10 s) is what the endpoint serves
        "descheduled_ratio": stats.descheduled_ratio if stats else None,
        "descheduled_span_ratio": cpu.descheduled_ratio,
        "cpu_throttled_ratio": cpu.cpu_throttled_ratio,
        "straggler_score": score,
        "waited_for_score": cpu.waited_for_score,
        "straggling": straggling,
        "collective_calls": collective_calls / stats.steps if stats and stats.steps else 0,
        "mfu": stats.mfu if stats else None,
        "peak_memory_bytes": peak_memory,
        "tokens_total": tokens_total,
        "loss_nonfinite": loss is not None and not math.isfinite(loss),
        # the first step this rank's loss / grad norm was NaN or infinite (null: not yet)
        **{f"{what}_first_nonfinite_step": step
           for what, step in (first_nonfinite or {}).items()},
        "phase_seconds": dict(stats.phase_means) if stats else {},
    }
    if job is not None:
        record["job"] = job.as_record()
    return record


def param_dtype(model: nn.Module | None) -> str:
    if model is not None:
        for p in model.parameters():
            return str(p.dtype).removeprefix("torch.")
    return ""


def as_float(value: Any) -> float | None:
    """A value the loop recorded (a number, a tensor, a DTensor) as a float; None stays None."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        return float(value.detach().float().item())
    return float(value)
