"""Memory figures for one log window: CUDA allocator statistics, or process RSS on CPU.

All of these are host-side calls (the allocator keeps its statistics on the host), so reading
them never synchronises the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class MemoryStats:
    peak_bytes: float  # peak active CUDA bytes in the window, or RSS on CPU
    values: dict[str, float]  # catalog metric name -> value


class MemoryReader:
    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self._process = psutil.Process()
        self.capacity: float | None = None
        if cuda:
            import torch

            self._torch = torch
            self.capacity = float(torch.cuda.get_device_properties(
                torch.cuda.current_device()).total_memory)

    def read(self) -> MemoryStats:
        rss = float(self._process.memory_info().rss)
        if not self.cuda:
            return MemoryStats(rss, {"fsdpmon_train_process_rss_bytes": rss})
        stats = self._torch.cuda.memory_stats()
        # Peaks are per window: reset after reading.
        self._torch.cuda.reset_peak_memory_stats()
        peak_active = float(stats.get("active_bytes.all.peak", 0))
        values = {
            "fsdpmon_train_process_rss_bytes": rss,
            "fsdpmon_train_memory_allocated_bytes": float(
                stats.get("allocated_bytes.all.current", 0)),
            "fsdpmon_train_memory_reserved_bytes": float(
                stats.get("reserved_bytes.all.current", 0)),
            "fsdpmon_train_memory_peak_active_bytes": peak_active,
            "fsdpmon_train_memory_peak_reserved_bytes": float(
                stats.get("reserved_bytes.all.peak", 0)),
            "fsdpmon_train_alloc_retries_total": float(stats.get("num_alloc_retries", 0)),
            "fsdpmon_train_ooms_total": float(stats.get("num_ooms", 0)),
        }
        if self.capacity is not None:
            values["fsdpmon_train_device_memory_capacity_bytes"] = self.capacity
        return MemoryStats(peak_active, values)
