"""Simulated GPUs for demos and tests (`fsdpmon exporter --simulate-gpus N`).

Values move plausibly (utilisation, power and temperature follow a slow wave per GPU, energy
integrates power), but every GPU reports the model name ``SIMULATED`` and a UUID that says so,
so simulated data can never pass for real data on a dashboard.

Given the PIDs of the node's training processes (``use_processes``), the simulated GPUs are
"used" by them round-robin, so per-process GPU memory and pod labels on GPU series can be seen
end to end without a GPU.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence

from exporters.nvml import CLOCK_EVENT_REASONS
from exporters.sample import GpuIdentity, GpuProcess, GpuReading, GpuSample
from fsdpmon.conventions import SIMULATED_GPU_MODEL

GIB = 1024**3
TOTAL_MEMORY = 80 * GIB
POWER_LIMIT_WATTS = 700.0
SM_CLOCK_MAX_HZ = 1980e6
MEM_CLOCK_MAX_HZ = 2619e6


class SimulatedReader:
    """Behaves like ``NvmlReader`` (open/read/close, ``up``) for ``count`` fake GPUs."""

    def __init__(self, count: int, clock: Callable[[], float] | None = None) -> None:
        self.count = count
        self.up = False
        self._now = clock or time.monotonic
        self._started = self._now()
        self._last = self._started
        self._energy = [0.0] * count
        self._pids: tuple[int, ...] = ()
        self._lock = threading.Lock()
        self.identities = [
            GpuIdentity(
                index=i,
                uuid=f"GPU-SIMULATED-{i:04d}-0000-0000-000000000000",
                model=SIMULATED_GPU_MODEL,
                driver_version="simulated",
                cuda_version="simulated",
                pci_bus_id=f"00000000:{0x10 + i:02X}:00.0",
                mig_mode="disabled",
            )
            for i in range(count)
        ]

    def open(self) -> bool:
        self.up = True
        return True

    def close(self) -> None:
        self.up = False

    def use_processes(self, pids: Sequence[int]) -> None:
        """The processes the simulated GPUs are shared out to (round-robin by PID order)."""
        with self._lock:
            self._pids = tuple(sorted(pids))

    def read(self) -> GpuReading:
        now = self._now()
        elapsed, self._last = max(0.0, now - self._last), now
        t = now - self._started
        with self._lock:
            pids = self._pids
        gpus = tuple(self._gpu(i, t, elapsed, pids) for i in range(self.count))
        return GpuReading(nvml_up=True, gpus=gpus)

    def _gpu(self, i: int, t: float, elapsed: float, pids: tuple[int, ...]) -> GpuSample:
        wave = 0.5 + 0.5 * math.sin(t / 7.0 + i * 0.9)  # 0..1, one slow wave per GPU
        util = 0.82 + 0.16 * wave
        power = 320.0 + 330.0 * wave
        self._energy[i] += power * elapsed
        used = (52 + 14 * wave + i % 3) * GIB
        mine = pids[i :: self.count] if pids else ()
        processes = tuple(
            GpuProcess(pid=p, memory_used_bytes=used * 0.95 / len(mine),
                       sm_utilization_ratio=util / len(mine))
            for p in mine
        )
        return GpuSample(self.identities[i], True, self._values(i, wave, util, power, used),
                         _labelled(wave), processes)

    def _values(self, i: int, wave: float, util: float, power: float,
                used: float) -> dict[str, float]:
        return {
            "fsdpmon_gpu_utilization_ratio": util,
            "fsdpmon_gpu_memory_utilization_ratio": 0.35 + 0.3 * wave,
            "fsdpmon_gpu_memory_used_bytes": used,
            "fsdpmon_gpu_memory_free_bytes": TOTAL_MEMORY - used,
            "fsdpmon_gpu_memory_total_bytes": float(TOTAL_MEMORY),
            "fsdpmon_gpu_memory_reserved_bytes": 0.5 * GIB,
            "fsdpmon_gpu_temperature_celsius": round(52 + 20 * wave),
            "fsdpmon_gpu_memory_temperature_celsius": round(58 + 18 * wave),
            "fsdpmon_gpu_power_watts": power,
            "fsdpmon_gpu_power_limit_watts": POWER_LIMIT_WATTS,
            "fsdpmon_gpu_energy_joules_total": self._energy[i],
            "fsdpmon_gpu_sm_clock_hertz": SM_CLOCK_MAX_HZ - 200e6 * wave,
            "fsdpmon_gpu_memory_clock_hertz": MEM_CLOCK_MAX_HZ,
            "fsdpmon_gpu_sm_clock_max_hertz": SM_CLOCK_MAX_HZ,
            "fsdpmon_gpu_memory_clock_max_hertz": MEM_CLOCK_MAX_HZ,
            "fsdpmon_gpu_pcie_replay_errors_total": 0.0,
            "fsdpmon_gpu_sm_activity_ratio": util * 0.9,
            "fsdpmon_gpu_tensor_activity_ratio": util * 0.55,
        }


def _labelled(wave: float) -> dict[str, dict[str, float]]:
    events = {r: 0.0 for r in CLOCK_EVENT_REASONS}
    events["sw_power_cap"] = float(wave > 0.9)
    return {
        "fsdpmon_gpu_clock_event_active": events,
        "fsdpmon_gpu_ecc_errors_total": {"corrected": 0.0, "uncorrected": 0.0},
        "fsdpmon_gpu_remapped_rows": {
            "correctable": 0.0, "uncorrectable": 0.0, "pending": 0.0, "failure": 0.0,
        },
        "fsdpmon_gpu_pcie_bytes_per_second": {"tx": 2.0e9 * wave, "rx": 3.5e9 * wave},
        "fsdpmon_gpu_nvlink_bytes_per_second": {"tx": 180e9 * wave, "rx": 180e9 * wave},
    }
