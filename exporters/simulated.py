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
from fsdpmon import catalog
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
            catalog.GPU_UTILIZATION_RATIO.name: util,
            catalog.GPU_MEMORY_UTILIZATION_RATIO.name: 0.35 + 0.3 * wave,
            catalog.GPU_MEMORY_USED_BYTES.name: used,
            catalog.GPU_MEMORY_FREE_BYTES.name: TOTAL_MEMORY - used,
            catalog.GPU_MEMORY_TOTAL_BYTES.name: float(TOTAL_MEMORY),
            catalog.GPU_MEMORY_RESERVED_BYTES.name: 0.5 * GIB,
            catalog.GPU_TEMPERATURE_CELSIUS.name: round(52 + 20 * wave),
            catalog.GPU_MEMORY_TEMPERATURE_CELSIUS.name: round(58 + 18 * wave),
            catalog.GPU_POWER_WATTS.name: power,
            catalog.GPU_POWER_LIMIT_WATTS.name: POWER_LIMIT_WATTS,
            catalog.GPU_ENERGY_JOULES_TOTAL.name: self._energy[i],
            catalog.GPU_SM_CLOCK_HERTZ.name: SM_CLOCK_MAX_HZ - 200e6 * wave,
            catalog.GPU_MEMORY_CLOCK_HERTZ.name: MEM_CLOCK_MAX_HZ,
            catalog.GPU_SM_CLOCK_MAX_HERTZ.name: SM_CLOCK_MAX_HZ,
            catalog.GPU_MEMORY_CLOCK_MAX_HERTZ.name: MEM_CLOCK_MAX_HZ,
            catalog.GPU_PCIE_REPLAY_ERRORS_TOTAL.name: 0.0,
            catalog.GPU_SM_ACTIVITY_RATIO.name: util * 0.9,
            catalog.GPU_TENSOR_ACTIVITY_RATIO.name: util * 0.55,
        }


def _labelled(wave: float) -> dict[str, dict[str, float]]:
    events = {r: 0.0 for r in CLOCK_EVENT_REASONS}
    events["sw_power_cap"] = float(wave > 0.9)
    return {
        catalog.GPU_CLOCK_EVENT_ACTIVE.name: events,
        catalog.GPU_ECC_ERRORS_TOTAL.name: {"corrected": 0.0, "uncorrected": 0.0},
        catalog.GPU_REMAPPED_ROWS.name: {
            "correctable": 0.0, "uncorrectable": 0.0, "pending": 0.0, "failure": 0.0,
        },
        catalog.GPU_PCIE_BYTES_PER_SECOND.name: {"tx": 2.0e9 * wave, "rx": 3.5e9 * wave},
        catalog.GPU_NVLINK_BYTES_PER_SECOND.name: {"tx": 180e9 * wave, "rx": 180e9 * wave},
    }
