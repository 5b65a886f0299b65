"""Memory figures for one log window: CUDA allocator statistics, or process RSS on CPU.

All of these are host-side calls (the allocator keeps its statistics on the host), so reading
them never synchronises the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from fsdpmon import catalog


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
            return MemoryStats(rss, {catalog.TRAIN_PROCESS_RSS_BYTES.name: rss})
        stats = self._torch.cuda.memory_stats()
        # Peaks are per window: reset after reading.
        self._torch.cuda.reset_peak_memory_stats()
        peak_active = float(stats.get("active_bytes.all.peak", 0))
        values = {
            catalog.TRAIN_PROCESS_RSS_BYTES.name: rss,
            catalog.TRAIN_MEMORY_ALLOCATED_BYTES.name: float(
                stats.get("allocated_bytes.all.current", 0)),
            catalog.TRAIN_MEMORY_RESERVED_BYTES.name: float(
                stats.get("reserved_bytes.all.current", 0)),
            catalog.TRAIN_MEMORY_PEAK_ACTIVE_BYTES.name: peak_active,
            catalog.TRAIN_MEMORY_PEAK_RESERVED_BYTES.name: float(
                stats.get("reserved_bytes.all.peak", 0)),
            catalog.TRAIN_ALLOC_RETRIES_TOTAL.name: float(stats.get("num_alloc_retries", 0)),
            catalog.TRAIN_OOMS_TOTAL.name: float(stats.get("num_ooms", 0)),
        }
        if self.capacity is not None:
            values[catalog.TRAIN_DEVICE_MEMORY_CAPACITY_BYTES.name] = self.capacity
        return MemoryStats(peak_active, values)
