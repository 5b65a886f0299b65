"""Simulated GPUs for demos and tests (`fsdpmon exporter --simulate-gpus N`).

Values move plausibly (utilisation, power and temperature follow a slow wave per GPU, energy
integrates power), but every GPU reports the model name ``SIMULATED`` and a UUID that says so,
so simulated data can never pass for real data on a dashboard.

Given the node's training processes with their LOCAL_RANK (``use_processes``), simulated GPU
``i`` is used by the process with ``LOCAL_RANK=i`` (modulo the GPU count), as NVML lists a
torchrun worker among the compute processes of the GPU it was given; a launcher (no LOCAL_RANK)
uses none. So per-process GPU memory, pod labels on GPU series and a GPU fault's rank can be
traced end to end without a GPU. GPU faults (:mod:`fsdpmon.exporters.simfaults`) change what a GPU
reports from their start time on.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping

from fsdpmon import catalog
from fsdpmon.conventions import SIMULATED_GPU_MODEL
from fsdpmon.exporters.nvml_fields import CLOCK_EVENT_REASONS, CLOCK_EVENT_TIME_REASONS
from fsdpmon.exporters.sample import GpuIdentity, GpuProcess, GpuReading, GpuSample
from fsdpmon.exporters.simfaults import HEALTHY, GpuFaults, GpuFaultState

log = logging.getLogger(__name__)

GIB = 1024**3
TOTAL_MEMORY = 80 * GIB
POWER_LIMIT_WATTS = 700.0
SM_CLOCK_MAX_HZ = 1980e6
MEM_CLOCK_MAX_HZ = 2619e6


class SimulatedReader:
    """Behaves like ``NvmlReader`` (open/read/close, ``up``) for ``count`` fake GPUs."""

    def __init__(self, count: int, clock: Callable[[], float] | None = None,
                 faults: GpuFaults | None = None) -> None:
        self.count = count
        self.up = False
        self._now = clock or time.monotonic
        self._started = self._now()
        self._last = self._started
        self._energy = [0.0] * count
        # accumulated clock-event seconds per GPU and reason, as NVML's counters
        self._event_seconds = [dict.fromkeys(CLOCK_EVENT_TIME_REASONS, 0.0) for _ in range(count)]
        self._faults = faults or GpuFaults((), count)
        self._lost: set[int] = set()
        self._pids: dict[int, int | None] = {}
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

    def use_processes(self, local_ranks: Mapping[int, int | None]) -> None:
        """The node's training processes, PID -> LOCAL_RANK (None: uses no GPU)."""
        with self._lock:
            self._pids = dict(local_ranks)

    def read(self) -> GpuReading:
        now = self._now()
        elapsed, self._last = max(0.0, now - self._last), now
        t = now - self._started
        with self._lock:
            pids = self._pids
        gpus = tuple(self._gpu(i, t, elapsed, pids) for i in range(self.count))
        return GpuReading(nvml_up=True, gpus=gpus)

    def _gpu(self, i: int, t: float, elapsed: float, pids: Mapping[int, int | None]) -> GpuSample:
        fault = self._faults.state(i, t) if self._faults else HEALTHY
        if fault.lost:
            return self._lost_gpu(i, fault)
        wave = 0.5 + 0.5 * math.sin(t / 7.0 + i * 0.9)  # 0..1, one slow wave per GPU
        util = 0.82 + 0.16 * wave
        power = 320.0 + 330.0 * wave
        if fault.throttle is not None:  # busy all the time at low clocks, drawing little
            util, power = 0.99, POWER_LIMIT_WATTS * fault.throttle.power_ratio
        self._energy[i] += power * elapsed
        used = (52 + 14 * wave + i % 3) * GIB
        mine = sorted(p for p, local in pids.items() if local is not None
                      and local % self.count == i)
        # The workers hold all of the memory the GPU reports used, so top's Processes view
        # adds up to its GPUs view (no invisible share that only a real driver would explain).
        processes = tuple(
            GpuProcess(pid=p, memory_used_bytes=used / len(mine),
                       sm_utilization_ratio=util / len(mine))
            for p in mine
        )
        values = self._values(i, wave, util, power, used)
        labelled = _labelled(wave)
        _apply(fault, values, labelled)
        # a throttle that began within this interval counts from its start, not the read before
        since = t - fault.throttle_since if fault.throttle is not None else elapsed
        active = labelled[catalog.GPU_CLOCK_EVENT_ACTIVE.name]
        self._count_event_time(i, active, min(elapsed, since))
        labelled[catalog.GPU_CLOCK_EVENT_SECONDS_TOTAL.name] = dict(self._event_seconds[i])
        return GpuSample(self.identities[i], True, values, labelled, processes)

    def _lost_gpu(self, i: int, fault: GpuFaultState) -> GpuSample:
        """What NvmlReader makes of GpuIsLost: up 0, no values, its XID counts kept."""
        if i not in self._lost:
            self._lost.add(i)
            log.error("GPU %d (%s) lost: GPU is lost (simulated gpu-lost fault)", i,
                      self.identities[i].uuid)
        xids = {str(code): float(n) for code, n in fault.xids.items()}
        return GpuSample(self.identities[i], False,
                         labelled={catalog.GPU_XID_ERRORS_TOTAL.name: xids} if xids else {})

    def _count_event_time(self, i: int, active: Mapping[str, float], elapsed: float) -> None:
        seconds = self._event_seconds[i]
        for reason in seconds:
            if active.get(reason):
                seconds[reason] += elapsed

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


def _apply(fault: GpuFaultState, values: dict[str, float],
           labelled: dict[str, dict[str, float]]) -> None:
    """A fault's marks on one healthy sample (throttle, ECC, XID), in place."""
    throttle = fault.throttle
    if throttle is not None:
        values[catalog.GPU_SM_CLOCK_HERTZ.name] = SM_CLOCK_MAX_HZ * throttle.clock_ratio
        values[catalog.GPU_SM_ACTIVITY_RATIO.name] = 0.97
        if throttle.temperature_celsius is not None:
            values[catalog.GPU_TEMPERATURE_CELSIUS.name] = throttle.temperature_celsius
        events = labelled[catalog.GPU_CLOCK_EVENT_ACTIVE.name]
        events["sw_power_cap"] = 0.0  # the power draw is far below the cap
        for reason in throttle.reasons:
            events[reason] = 1.0
    if fault.ecc_uncorrected:
        labelled[catalog.GPU_ECC_ERRORS_TOTAL.name]["uncorrected"] = float(fault.ecc_uncorrected)
        rows = labelled[catalog.GPU_REMAPPED_ROWS.name]
        rows["uncorrectable"] = float(fault.ecc_uncorrected)
        rows["pending"] = 1.0  # the remapping takes effect at the next GPU reset
    if fault.xids:
        xids = {str(code): float(n) for code, n in fault.xids.items()}
        labelled[catalog.GPU_XID_ERRORS_TOTAL.name] = xids


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
