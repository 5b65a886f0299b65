"""NVML's per-field reads, one method per signal, each returning catalog name -> value.

Mixed into ``fsdpmon.exporters.nvml.NvmlReader``, which owns the NVML module (``self.nvml``), the
error policy around every call and the state kept between reads (``self._previous``). This
module never imports pynvml: every NVML name is reached through ``self.nvml``, so tests' fake
module stands in for it here too.
"""

from __future__ import annotations

import time
from typing import Any

from fsdpmon import catalog
from fsdpmon.conventions import GPU_CLOCK_EVENT_BITS
from fsdpmon.exporters.sample import GpuProcess

MIB = 1024
_UINT_MAX = 0xFFFFFFFF  # NVLink field scope meaning "summed over all links"

# Clock-event (throttle) reason bits -> the `reason` label.
CLOCK_EVENT_REASONS = GPU_CLOCK_EVENT_BITS

# Reasons NVML accumulates time for (field values, nanoseconds since the driver loaded; drivers
# 535+) -> the field's name in pynvml. hw_slowdown has no counter of its own.
CLOCK_EVENT_TIME_REASONS = {
    "sw_power_cap": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP",
    "sync_boost": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST",
    "sw_thermal_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
    "hw_thermal_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
    "hw_power_brake_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
}


def _field_number(entry: Any) -> float:
    """The numeric value of one nvmlFieldValue_t, whatever its declared type."""
    kinds = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
    return float(getattr(entry.value, kinds.get(int(entry.valueType), "ullVal")))


class FieldReaders:
    """The per-field reads; ``NvmlReader`` supplies ``nvml`` and ``_previous``."""

    nvml: Any
    _previous: dict[tuple[int, str], Any]

    def utilization(self, handle: Any, index: int) -> dict[str, float]:
        rates = self.nvml.nvmlDeviceGetUtilizationRates(handle)
        return {
            catalog.GPU_UTILIZATION_RATIO.name: rates.gpu / 100.0,
            catalog.GPU_MEMORY_UTILIZATION_RATIO.name: rates.memory / 100.0,
        }

    def memory(self, handle: Any, index: int) -> dict[str, float]:
        nv = self.nvml
        try:  # v2 adds the driver-reserved share; older drivers only have v1
            info = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
            reserved: float | None = float(info.reserved)
        except (nv.NVMLError_FunctionNotFound, nv.NVMLError_ArgumentVersionMismatch):
            info = nv.nvmlDeviceGetMemoryInfo(handle)
            reserved = None
        out = {
            catalog.GPU_MEMORY_USED_BYTES.name: float(info.used),
            catalog.GPU_MEMORY_FREE_BYTES.name: float(info.free),
            catalog.GPU_MEMORY_TOTAL_BYTES.name: float(info.total),
        }
        if reserved is not None:
            out[catalog.GPU_MEMORY_RESERVED_BYTES.name] = reserved
        return out

    def temperature(self, handle: Any, index: int) -> dict[str, float]:
        celsius = self.nvml.nvmlDeviceGetTemperature(handle, self.nvml.NVML_TEMPERATURE_GPU)
        return {catalog.GPU_TEMPERATURE_CELSIUS.name: float(celsius)}

    def memory_temperature(self, handle: Any, index: int) -> dict[str, float]:
        value = self._field_value(handle, self.nvml.NVML_FI_DEV_MEMORY_TEMP)
        return {catalog.GPU_MEMORY_TEMPERATURE_CELSIUS.name: value}

    def power(self, handle: Any, index: int) -> dict[str, float]:
        milliwatts = self.nvml.nvmlDeviceGetPowerUsage(handle)
        return {catalog.GPU_POWER_WATTS.name: milliwatts / 1000.0}

    def power_limit(self, handle: Any, index: int) -> dict[str, float]:
        milliwatts = self.nvml.nvmlDeviceGetEnforcedPowerLimit(handle)
        return {catalog.GPU_POWER_LIMIT_WATTS.name: milliwatts / 1000.0}

    def energy(self, handle: Any, index: int) -> dict[str, float]:
        millijoules = self.nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        return {catalog.GPU_ENERGY_JOULES_TOTAL.name: millijoules / 1000.0}

    def clock(self, handle: Any, kind: str, name: str) -> dict[str, float]:
        mhz = self.nvml.nvmlDeviceGetClockInfo(handle, getattr(self.nvml, f"NVML_CLOCK_{kind}"))
        return {name: mhz * 1e6}

    def max_clock(self, handle: Any, kind: str, name: str) -> dict[str, float]:
        mhz = self.nvml.nvmlDeviceGetMaxClockInfo(handle, getattr(self.nvml, f"NVML_CLOCK_{kind}"))
        return {name: mhz * 1e6}

    def pcie_replay(self, handle: Any, index: int) -> dict[str, float]:
        count = self.nvml.nvmlDeviceGetPcieReplayCounter(handle)
        return {catalog.GPU_PCIE_REPLAY_ERRORS_TOTAL.name: float(count)}

    def clock_events(self, handle: Any, index: int) -> dict[str, float]:
        nv = self.nvml
        try:
            mask = nv.nvmlDeviceGetCurrentClocksEventReasons(handle)
        except nv.NVMLError_FunctionNotFound:  # drivers before 535 only have the old name
            mask = nv.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
        return {reason: float(bool(mask & bit)) for reason, bit in CLOCK_EVENT_REASONS.items()}

    def clock_event_time(self, handle: Any, index: int) -> dict[str, float]:
        """Accumulated clock-event time per reason, in seconds (NVML counts nanoseconds)."""
        nv = self.nvml
        reasons = [(r, getattr(nv, f)) for r, f in CLOCK_EVENT_TIME_REASONS.items()
                   if hasattr(nv, f)]
        if not reasons:
            raise nv.NVMLError_NotSupported()
        entries = nv.nvmlDeviceGetFieldValues(handle, [field_id for _, field_id in reasons])
        out = {reason: _field_number(entry) / 1e9 for (reason, _), entry
               in zip(reasons, entries, strict=True) if entry.nvmlReturn == nv.NVML_SUCCESS}
        if not out:  # a driver before 535 answers each field NotSupported
            raise nv.NVMLError_NotSupported()
        return out

    def ecc_errors(self, handle: Any, index: int) -> dict[str, float]:
        nv = self.nvml
        return {
            kind: float(nv.nvmlDeviceGetTotalEccErrors(handle, error_type, nv.NVML_VOLATILE_ECC))
            for kind, error_type in (
                ("corrected", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                ("uncorrected", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
            )
        }

    def remapped_rows(self, handle: Any, index: int) -> dict[str, float]:
        corrected, uncorrected, pending, failure = self.nvml.nvmlDeviceGetRemappedRows(handle)
        return {
            "correctable": float(corrected),
            "uncorrectable": float(uncorrected),
            "pending": float(bool(pending)),
            "failure": float(bool(failure)),
        }

    def pcie_throughput(self, handle: Any, index: int) -> dict[str, float]:
        nv = self.nvml  # NVML reports KB/s over a 20 ms window
        return {
            "tx": nv.nvmlDeviceGetPcieThroughput(handle, nv.NVML_PCIE_UTIL_TX_BYTES) * 1024.0,
            "rx": nv.nvmlDeviceGetPcieThroughput(handle, nv.NVML_PCIE_UTIL_RX_BYTES) * 1024.0,
        }

    def nvlink_throughput(self, handle: Any, index: int) -> dict[str, float]:
        """Rate from NVML's cumulative KiB counters summed over links; absent on the first read."""
        nv = self.nvml
        fields = [
            (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _UINT_MAX),
            (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, _UINT_MAX),
        ]
        entries = nv.nvmlDeviceGetFieldValues(handle, fields)
        for entry in entries:
            if entry.nvmlReturn != nv.NVML_SUCCESS:
                raise nv.NVMLError(entry.nvmlReturn)
        now = time.monotonic()
        totals = {"tx": _field_number(entries[0]) * MIB, "rx": _field_number(entries[1]) * MIB}
        previous = self._previous.get((index, "nvlink"))
        self._previous[(index, "nvlink")] = (now, totals)
        if previous is None or now <= previous[0]:
            return {}
        elapsed = now - previous[0]
        return {d: max(0.0, (totals[d] - previous[1][d]) / elapsed) for d in totals}

    def gpm(self, handle: Any, index: int) -> dict[str, float]:
        """Hopper+ GPM SM and tensor activity between this read and the previous one."""
        nv = self.nvml
        if (index, "gpm_checked") not in self._previous:
            if not nv.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                raise nv.NVMLError_NotSupported()
            self._previous[(index, "gpm_checked")] = True
        sample = nv.nvmlGpmSampleGet(handle, nv.nvmlGpmSampleAlloc())
        earlier = self._previous.get((index, "gpm"))
        self._previous[(index, "gpm")] = sample
        if earlier is None:
            return {}
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 2
        request.sample1, request.sample2 = earlier, sample
        request.metrics[0].metricId = nv.NVML_GPM_METRIC_SM_UTIL
        request.metrics[1].metricId = nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL
        nv.nvmlGpmMetricsGet(request)
        nv.nvmlGpmSampleFree(earlier)
        out = {}
        for slot, name in enumerate(
            (catalog.GPU_SM_ACTIVITY_RATIO.name, catalog.GPU_TENSOR_ACTIVITY_RATIO.name)
        ):
            metric = request.metrics[slot]
            if metric.nvmlReturn == nv.NVML_SUCCESS:
                out[name] = metric.value / 100.0
        return out

    def processes(self, handle: Any, index: int) -> tuple[GpuProcess, ...]:
        """Compute processes with their GPU memory and, where NVML has samples, SM share."""
        nv = self.nvml
        try:
            listed = nv.nvmlDeviceGetComputeRunningProcesses(handle)
        except nv.NVMLLibraryMismatchError:  # a driver without pynvml's newest (_v3) call
            listed = nv.nvmlDeviceGetComputeRunningProcesses_v2(handle)
        memory: dict[int, float | None] = {}
        for p in listed:
            # One PID can be listed more than once (several contexts, MIG instances): one
            # series per PID, memory summed, or None when NVML cannot tell any of it.
            pid, used = int(p.pid), p.usedGpuMemory
            known = memory.get(pid)
            memory[pid] = known if used is None else (known or 0.0) + float(used)
        sm_share = self._process_sm_share(handle, index)
        return tuple(GpuProcess(pid, used, sm_share.get(pid)) for pid, used in memory.items())

    def _process_sm_share(self, handle: Any, index: int) -> dict[int, float]:
        nv = self.nvml
        since = self._previous.get((index, "proc_ts"), 0)
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(handle, since)
        except (nv.NVMLError_NotFound, nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound):
            return {}  # no samples since `since`, or not available: memory still reported
        latest: dict[int, Any] = {}
        for s in samples:
            if s.pid not in latest or s.timeStamp > latest[s.pid].timeStamp:
                latest[int(s.pid)] = s
        if latest:
            self._previous[(index, "proc_ts")] = max(s.timeStamp for s in latest.values())
        return {pid: s.smUtil / 100.0 for pid, s in latest.items()}

    def _field_value(self, handle: Any, field_id: int) -> float:
        entry = self.nvml.nvmlDeviceGetFieldValues(handle, [field_id])[0]
        if entry.nvmlReturn != self.nvml.NVML_SUCCESS:
            raise self.nvml.NVMLError(entry.nvmlReturn)
        return _field_number(entry)

    # -- XID events (fed by fsdpmon.exporters.xid.XidWatcher) -------------------------------
