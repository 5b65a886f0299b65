"""The one NVML wrapper: the only module in fsdpmon that imports pynvml.

``NvmlReader`` reads every GPU signal through per-field methods and applies one error policy:

- NotSupported / NoPermission / NoData / NotFound -> that field is missing (series absent), never 0;
  NotSupported is remembered per GPU so the call is not repeated every sample.
- FunctionNotFound (driver older than the bindings) -> the field degrades: skipped from then on
  on every GPU, or an older call is used where one exists.
- GpuIsLost / GpuNotFound / Unknown -> that GPU reads ``up`` 0 and the others go on.
- NVML missing (no library, no driver) -> ``nvml_up`` False; host and process metrics go on.

The reader takes the NVML module as a parameter so tests pass a fake module that raises pynvml's
real exception classes; production passes nothing and gets pynvml itself.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pynvml

from exporters.sample import GpuIdentity, GpuProcess, GpuReading, GpuSample
from fsdpmon import catalog

log = logging.getLogger(__name__)

MIB = 1024
REOPEN_S = 60.0  # while NVML is down, how often to try it again
_UINT_MAX = 0xFFFFFFFF  # NVLink field scope meaning "summed over all links"

# Errors that mean "this value is not available": the series is left out.
MISSING_ERRORS = (
    pynvml.NVMLError_NotSupported,
    pynvml.NVMLError_NoPermission,
    pynvml.NVMLError_NoData,
    pynvml.NVMLError_NotFound,
)
LOST_ERRORS = (pynvml.NVMLError_GpuIsLost, pynvml.NVMLError_GpuNotFound, pynvml.NVMLError_Unknown)

# Clock-event (throttle) reason bits -> the `reason` label.
CLOCK_EVENT_REASONS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}

# Reasons NVML accumulates time for (field values, nanoseconds since the driver loaded; drivers
# 535+) -> the field's name in pynvml. hw_slowdown has no counter of its own.
CLOCK_EVENT_TIME_REASONS = {
    "sw_power_cap": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP",
    "sync_boost": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST",
    "sw_thermal_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
    "hw_thermal_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
    "hw_power_brake_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
}


class GpuLost(Exception):
    """Raised inside the reader when a GPU stops answering."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _field_number(entry: Any) -> float:
    """The numeric value of one nvmlFieldValue_t, whatever its declared type."""
    kinds = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
    return float(getattr(entry.value, kinds.get(int(entry.valueType), "ullVal")))


class NvmlReader:
    """Reads all GPUs of this node through NVML (or a module that behaves like it)."""

    def __init__(self, nvml: ModuleType | Any | None = None) -> None:
        self.nvml = pynvml if nvml is None else nvml
        self.up = False
        self.handles: list[Any] = []
        self.identities: list[GpuIdentity] = []
        self._lost: set[int] = set()
        self._unsupported: set[tuple[int, str]] = set()
        self._no_function: set[str] = set()
        self._errors = 0
        self._previous: dict[tuple[int, str], Any] = {}  # counters and GPM samples between reads
        self._xid_counts: dict[tuple[int, int], int] = {}
        self._xid_lock = threading.Lock()
        self._last_open = 0.0
        self.on_open: Callable[[], Any] | None = None  # e.g. start the XID event thread

    # -- lifecycle -------------------------------------------------------------------------
    def open(self, quiet: bool = False) -> bool:
        """Initialise NVML and enumerate the GPUs; False (and nvml_up 0) when NVML is absent."""
        self._last_open = time.monotonic()
        try:
            self.nvml.nvmlInit()
            count = int(self.nvml.nvmlDeviceGetCount())
        except self.nvml.NVMLError as exc:
            if not quiet:
                log.warning("NVML unavailable (%s): serving host and process metrics only; "
                            "trying again every %.0fs", exc, REOPEN_S)
            self.up = False
            return False
        self.up = True
        self.handles, self.identities = [], []
        for index in range(count):
            self._add_device(index)
        if self.on_open is not None:
            self.on_open()
        return True

    def _retry_open(self) -> None:
        """The driver may come up after the exporter (GPU operator): try again now and then."""
        if time.monotonic() - self._last_open >= REOPEN_S and self.open(quiet=True):
            log.info("NVML available now: %d GPUs", len(self.identities))

    def close(self) -> None:
        if self.up:
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlShutdown()
            self.up = False

    def _add_device(self, index: int) -> None:
        nv = self.nvml
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nv.nvmlDeviceGetUUID(handle))
            model = _text(nv.nvmlDeviceGetName(handle))
        except nv.NVMLError as exc:
            log.warning("GPU %d unusable at start: %s", index, exc)
            self.handles.append(None)
            self.identities.append(GpuIdentity(index=index, uuid="", model=""))
            self._lost.add(index)
            return
        self.handles.append(handle)
        self.identities.append(
            GpuIdentity(
                index=index,
                uuid=uuid,
                model=model,
                driver_version=self._static(nv.nvmlSystemGetDriverVersion),
                cuda_version=self._cuda_version(),
                pci_bus_id=self._static(lambda: nv.nvmlDeviceGetPciInfo(handle).busId),
                mig_mode=self._static(lambda: self._mig_mode(handle)),
            )
        )

    def _static(self, fn: Callable[[], Any]) -> str:
        try:
            return _text(fn())
        except self.nvml.NVMLError:
            return ""

    def _cuda_version(self) -> str:
        raw = self._static(self.nvml.nvmlSystemGetCudaDriverVersion)
        if not raw.isdigit():
            return ""
        return f"{int(raw) // 1000}.{int(raw) % 1000 // 10}"

    def _mig_mode(self, handle: Any) -> str:
        current = self.nvml.nvmlDeviceGetMigMode(handle)[0]
        return "enabled" if current == self.nvml.NVML_DEVICE_MIG_ENABLE else "disabled"

    # -- reading ---------------------------------------------------------------------------
    def read(self) -> GpuReading:
        """One pass over every GPU; a lost GPU reads up 0, the others go on."""
        if not self.up:
            self._retry_open()
        if not self.up:
            return GpuReading(nvml_up=False)
        errors_before = self._errors
        gpus = tuple(self._read_gpu(i) for i in range(len(self.identities)))
        return GpuReading(nvml_up=True, gpus=gpus, errors=self._errors - errors_before)

    def _read_gpu(self, index: int) -> GpuSample:
        identity = self.identities[index]
        if index in self._lost:
            return self._lost_sample(identity)
        handle = self.handles[index]
        values: dict[str, float] = {}
        labelled: dict[str, dict[str, float]] = {}
        try:
            for name, reader in self._value_fields():
                result = self._field(index, name, lambda r=reader: r(handle, index))
                if result is not None:
                    values.update(result)
            for name, reader in self._labelled_fields():
                result = self._field(index, name, lambda r=reader: r(handle, index))
                if result:
                    labelled[name] = result
            processes = self._field(index, "processes", lambda: self.processes(handle, index))
        except GpuLost as exc:
            log.error("GPU %d (%s) lost: %s", index, identity.uuid, exc)
            self._lost.add(index)
            return self._lost_sample(identity)
        xids = self.xid_counts(index)
        if xids:
            labelled[catalog.GPU_XID_ERRORS_TOTAL.name] = xids
        return GpuSample(identity, True, values, labelled, tuple(processes or ()))

    def _lost_sample(self, identity: GpuIdentity) -> GpuSample:
        """A lost GPU reads up 0 and keeps its XID counts: the XID 79 that came with its loss
        is the evidence of why."""
        xids = self.xid_counts(identity.index)
        labelled = {catalog.GPU_XID_ERRORS_TOTAL.name: xids} if xids else {}
        return GpuSample(identity=identity, up=False, labelled=labelled)

    def _value_fields(self) -> tuple[tuple[str, Callable[[Any, int], dict[str, float]]], ...]:
        return (
            ("utilization", self.utilization),
            ("memory", self.memory),
            ("temperature", self.temperature),
            ("memory_temperature", self.memory_temperature),
            ("power", self.power),
            ("power_limit", self.power_limit),
            ("energy", self.energy),
            ("sm_clock", lambda h, i: self.clock(h, "SM", catalog.GPU_SM_CLOCK_HERTZ.name)),
            ("mem_clock", lambda h, i: self.clock(h, "MEM", catalog.GPU_MEMORY_CLOCK_HERTZ.name)),
            ("sm_clock_max",
             lambda h, i: self.max_clock(h, "SM", catalog.GPU_SM_CLOCK_MAX_HERTZ.name)),
            ("mem_clock_max",
             lambda h, i: self.max_clock(h, "MEM", catalog.GPU_MEMORY_CLOCK_MAX_HERTZ.name)),
            ("pcie_replay", self.pcie_replay),
            ("gpm", self.gpm),
        )

    def _labelled_fields(self) -> tuple[tuple[str, Callable[[Any, int], dict[str, float]]], ...]:
        return (
            (catalog.GPU_CLOCK_EVENT_ACTIVE.name, self.clock_events),
            (catalog.GPU_CLOCK_EVENT_SECONDS_TOTAL.name, self.clock_event_time),
            (catalog.GPU_ECC_ERRORS_TOTAL.name, self.ecc_errors),
            (catalog.GPU_REMAPPED_ROWS.name, self.remapped_rows),
            (catalog.GPU_PCIE_BYTES_PER_SECOND.name, self.pcie_throughput),
            (catalog.GPU_NVLINK_BYTES_PER_SECOND.name, self.nvlink_throughput),
        )

    def _field(self, index: int, name: str, read: Callable[[], Any]) -> Any:
        """Apply the error policy to one field read; None when the value is missing."""
        if name in self._no_function or (index, name) in self._unsupported:
            return None
        nv = self.nvml
        try:
            return read()
        except nv.NVMLError_FunctionNotFound:
            log.info("NVML function for %s missing in this driver: field disabled", name)
            self._no_function.add(name)
        except nv.NVMLError_NotSupported:
            self._unsupported.add((index, name))
        except MISSING_ERRORS:
            pass
        except LOST_ERRORS as exc:
            raise GpuLost(str(exc)) from exc
        except nv.NVMLError as exc:
            self._errors += 1
            log.debug("NVML error reading %s on GPU %d: %s", name, index, exc)
        return None

    # -- per-field methods (each returns catalog name -> value) -----------------------------
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
        memory: dict[int, float | None] = {}
        for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(handle):
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

    # -- XID events (fed by exporters.xid.XidWatcher) ---------------------------------------
    def count_xid(self, index: int, xid: int) -> None:
        with self._xid_lock:
            self._xid_counts[(index, xid)] = self._xid_counts.get((index, xid), 0) + 1

    def xid_counts(self, index: int) -> dict[str, float]:
        with self._xid_lock:
            return {str(x): float(n) for (i, x), n in self._xid_counts.items() if i == index}
