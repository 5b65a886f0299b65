"""A fake NVML module that behaves like pynvml, errors included.

There is no GPU here, so the exporter's NVML wrapper is tested against this stand-in. It answers
the same calls with the same shapes (real ctypes structs where the reader reads them), and fails
the way real NVML fails: with pynvml's own exception classes (NotSupported, FunctionNotFound,
GpuIsLost, LibraryNotFound, Timeout ...). Constants and exception classes come from pynvml.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

MIB = 1024 * 1024
NVLINKS = 18  # an H100's
HANG_S = 30.0  # a hung GPU's calls return (NotFound-free) after this long, never sooner


@dataclass
class FakeGpu:
    index: int
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    util: tuple[int, int] = (97, 41)  # percent: gpu, memory
    memory: tuple[int, int, int, int] = (80 * 1024 * MIB, 10 * 1024 * MIB, 69 * 1024 * MIB,
                                         512 * MIB)  # total, free, used, reserved
    temperature: int = 64
    memory_temperature: int = 71
    power_mw: int = 612_000
    power_limit_mw: int = 700_000
    energy_mj: int = 9_876_543_210
    clocks_mhz: dict[int, int] = field(default_factory=lambda: {pynvml.NVML_CLOCK_SM: 1755,
                                                                pynvml.NVML_CLOCK_MEM: 2619})
    max_clocks_mhz: dict[int, int] = field(default_factory=lambda: {pynvml.NVML_CLOCK_SM: 1980,
                                                                    pynvml.NVML_CLOCK_MEM: 2619})
    clock_event_mask: int = 0x4 | 0x20  # sw_power_cap + sw_thermal_slowdown
    # accumulated clock-event nanoseconds by NVML field id (drivers 535+); empty: unsupported
    clock_event_ns: dict[int, int] = field(default_factory=lambda: {
        pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP: 7_500_000_000,
        pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST: 0,
        pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN: 2_000_000_000,
        pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN: 0,
        pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN: 0})
    ecc: tuple[int, int] = (3, 0)  # corrected, uncorrected (volatile)
    remapped: tuple[int, int, bool, bool] = (2, 0, False, False)
    pcie_kbps: tuple[int, int] = (1000, 3000)  # tx, rx
    pcie_replays: int = 5
    nvlink_kib: list[int] = field(default_factory=lambda: [0, 0])  # tx, rx cumulative
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, bytes|None)
    process_sm: dict[int, int] = field(default_factory=dict)  # pid -> smUtil percent
    gpm_supported: bool = True
    pci_bus_id: str = "00000000:18:00.0"
    unsupported: set[str] = field(default_factory=set)  # function names raising NotSupported
    lost: bool = False
    hang: threading.Event | None = None  # while set-able and unset, every call blocks on it


class FakeNvml:
    """Stand-in for the pynvml module. Unknown attributes fall through to pynvml itself."""

    def __init__(self, gpus: list[FakeGpu], missing_functions: set[str] | None = None,
                 library_missing: bool = False, driver: str = "550.54.15") -> None:
        self.gpus = gpus
        self.missing_functions = set(missing_functions or ())
        self.library_missing = library_missing
        self.driver = driver
        self.calls: dict[str, int] = {}
        self._events: queue.Queue[Any] = queue.Queue()
        self._gpm_ticks = 0
        self.initialised = False

    def __getattr__(self, name: str) -> Any:
        return getattr(pynvml, name)

    # -- plumbing --------------------------------------------------------------------------
    def _enter(self, function: str, gpu: FakeGpu | None = None) -> None:
        self.calls[function] = self.calls.get(function, 0) + 1
        if not self.initialised:
            raise pynvml.NVMLError_Uninitialized()
        if function in self.missing_functions:
            raise pynvml.NVMLError_FunctionNotFound()
        if gpu is None:
            return
        if gpu.hang is not None:
            gpu.hang.wait(HANG_S)
        if gpu.lost:
            raise pynvml.NVMLError_GpuIsLost()
        if function in gpu.unsupported:
            raise pynvml.NVMLError_NotSupported()

    def emit_xid(self, index: int, xid: int) -> None:
        self._events.put(SimpleNamespace(device=self.gpus[index],
                                         eventType=pynvml.nvmlEventTypeXidCriticalError,
                                         eventData=xid))

    # -- system ----------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] = self.calls.get("nvmlInit", 0) + 1
        if self.library_missing:
            raise pynvml.NVMLError_LibraryNotFound()
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        return 12040

    # -- device identity -------------------------------------------------------------------
    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        gpu = self.gpus[index]
        self._enter("nvmlDeviceGetHandleByIndex", gpu)
        return gpu

    def nvmlDeviceGetUUID(self, gpu: FakeGpu) -> str:
        self._enter("nvmlDeviceGetUUID", gpu)
        return gpu.uuid

    def nvmlDeviceGetName(self, gpu: FakeGpu) -> str:
        self._enter("nvmlDeviceGetName", gpu)
        return gpu.name

    def nvmlDeviceGetPciInfo(self, gpu: FakeGpu) -> Any:
        self._enter("nvmlDeviceGetPciInfo", gpu)
        return SimpleNamespace(busId=gpu.pci_bus_id)

    def nvmlDeviceGetMigMode(self, gpu: FakeGpu) -> list[int]:
        self._enter("nvmlDeviceGetMigMode", gpu)
        return [pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_DISABLE]

    # -- values ----------------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates", gpu)
        return SimpleNamespace(gpu=gpu.util[0], memory=gpu.util[1])

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu, version: int | None = None) -> Any:
        name = "nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo"
        self._enter(name, gpu)
        total, free, used, reserved = gpu.memory
        if version:
            info = pynvml.c_nvmlMemory_v2_t()
            info.reserved = reserved
        else:
            info = pynvml.c_nvmlMemory_t()
        info.total, info.free, info.used = total, free, used
        return info

    def nvmlDeviceGetTemperature(self, gpu: FakeGpu, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature", gpu)
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return gpu.temperature

    def nvmlDeviceGetFieldValues(self, gpu: FakeGpu, field_ids: list[Any]) -> Any:
        self._enter("nvmlDeviceGetFieldValues", gpu)
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for slot, requested in zip(values, field_ids, strict=True):
            field_id, scope = requested if isinstance(requested, tuple) else (requested, 0)
            slot.fieldId, slot.scopeId = field_id, scope
            slot.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            number = self._field(gpu, field_id, scope)
            if number is None:
                slot.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            else:
                slot.nvmlReturn = pynvml.NVML_SUCCESS
                slot.value.ullVal = number
        return values

    @staticmethod
    def _field(gpu: FakeGpu, field_id: int, scope: int = 0) -> int | None:
        if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP and "memory_temp" not in gpu.unsupported:
            return gpu.memory_temperature
        if field_id in gpu.clock_event_ns:
            return gpu.clock_event_ns[field_id]
        if "nvlink" in gpu.unsupported:
            return None
        direction = {pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: 0,
                     pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: 1}.get(field_id)
        if direction is None:
            return None
        # the scope is the link: one of NVLINKS, or 0xFFFFFFFF for all of them summed
        if scope == 0xFFFFFFFF:
            return gpu.nvlink_kib[direction]
        return gpu.nvlink_kib[direction] // NVLINKS if 0 <= scope < NVLINKS else None

    def nvmlDeviceGetPowerUsage(self, gpu: FakeGpu) -> int:
        self._enter("nvmlDeviceGetPowerUsage", gpu)
        return gpu.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, gpu: FakeGpu) -> int:
        self._enter("nvmlDeviceGetEnforcedPowerLimit", gpu)
        return gpu.power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, gpu: FakeGpu) -> int:
        self._enter("nvmlDeviceGetTotalEnergyConsumption", gpu)
        return gpu.energy_mj

    def nvmlDeviceGetClockInfo(self, gpu: FakeGpu, kind: int) -> int:
        self._enter("nvmlDeviceGetClockInfo", gpu)
        return gpu.clocks_mhz[kind]

    def nvmlDeviceGetMaxClockInfo(self, gpu: FakeGpu, kind: int) -> int:
        self._enter("nvmlDeviceGetMaxClockInfo", gpu)
        return gpu.max_clocks_mhz[kind]

    def nvmlDeviceGetCurrentClocksEventReasons(self, gpu: FakeGpu) -> int:
        self._enter("nvmlDeviceGetCurrentClocksEventReasons", gpu)
        return gpu.clock_event_mask

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, gpu: FakeGpu) -> int:
        self._enter("nvmlDeviceGetCurrentClocksThrottleReasons", gpu)
        return gpu.clock_event_mask

    def nvmlDeviceGetTotalEccErrors(self, gpu: FakeGpu, error_type: int, counter: int) -> int:
        self._enter("nvmlDeviceGetTotalEccErrors", gpu)
        assert counter == pynvml.NVML_VOLATILE_ECC
        return gpu.ecc[error_type]

    def nvmlDeviceGetRemappedRows(self, gpu: FakeGpu) -> tuple[int, int, bool, bool]:
        self._enter("nvmlDeviceGetRemappedRows", gpu)
        return gpu.remapped

    def nvmlDeviceGetPcieThroughput(self, gpu: FakeGpu, counter: int) -> int:
        self._enter("nvmlDeviceGetPcieThroughput", gpu)
        return gpu.pcie_kbps[0 if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else 1]

    def nvmlDeviceGetPcieReplayCounter(self, gpu: FakeGpu) -> int:
        self._enter("nvmlDeviceGetPcieReplayCounter", gpu)
        return gpu.pcie_replays

    # -- processes -------------------------------------------------------------------------
    def nvmlDeviceGetComputeRunningProcesses(self, gpu: FakeGpu) -> list[Any]:
        """pynvml's unversioned call asks the library for _v3 and, where a driver lacks it,
        raises NVMLLibraryMismatchError (no NVMLError)."""
        try:
            return self.nvmlDeviceGetComputeRunningProcesses_v3(gpu)
        except pynvml.NVMLError_FunctionNotFound:
            raise pynvml.NVMLLibraryMismatchError("Unversioned function called") from None

    def nvmlDeviceGetComputeRunningProcesses_v3(self, gpu: FakeGpu) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses_v3", gpu)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpu.processes]

    def nvmlDeviceGetComputeRunningProcesses_v2(self, gpu: FakeGpu) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses_v2", gpu)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpu.processes]

    def nvmlDeviceGetProcessUtilization(self, gpu: FakeGpu, since: int) -> list[Any]:
        self._enter("nvmlDeviceGetProcessUtilization", gpu)
        stamp = since + 1_000_000
        if not gpu.process_sm:
            raise pynvml.NVMLError_NotFound()  # what NVML says when it has no samples
        out = []
        for pid, sm in gpu.process_sm.items():  # every sample since `since`: an older one too
            for at, util in ((stamp, sm), (stamp - 500_000, max(0, sm - 10))):
                s = pynvml.c_nvmlProcessUtilizationSample_t()
                s.pid, s.smUtil, s.timeStamp = pid, util, at
                out.append(s)
        return out

    # -- GPM -------------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, gpu: FakeGpu) -> Any:
        self._enter("nvmlGpmQueryDeviceSupport", gpu)
        return SimpleNamespace(version=1, isSupportedDevice=int(gpu.gpm_supported))

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        return SimpleNamespace(tick=None, freed=False)

    def nvmlGpmSampleGet(self, gpu: FakeGpu, sample: Any) -> Any:
        self._enter("nvmlGpmSampleGet", gpu)
        self._gpm_ticks += 1
        sample.tick = self._gpm_ticks
        return sample

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        sample.freed = True

    def c_nvmlGpmMetricsGet_t(self) -> Any:  # the real one is a ctypes struct of pointers
        return SimpleNamespace(
            version=0, numMetrics=0, sample1=None, sample2=None,
            metrics=[SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(4)],
        )

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        assert request.sample1.tick < request.sample2.tick
        answers = {pynvml.NVML_GPM_METRIC_SM_UTIL: 88.0,
                   pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 61.0}
        for metric in request.metrics[: request.numMetrics]:
            metric.value = answers[metric.metricId]
            metric.nvmlReturn = pynvml.NVML_SUCCESS
        return request

    # -- events ----------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> Any:
        self._enter("nvmlEventSetCreate")
        return SimpleNamespace(registered=[])

    def nvmlDeviceRegisterEvents(self, gpu: FakeGpu, types: int, event_set: Any) -> None:
        self._enter("nvmlDeviceRegisterEvents", gpu)
        event_set.registered.append(gpu.index)

    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any:
        self._enter("nvmlEventSetWait")
        try:
            return self._events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise pynvml.NVMLError_Timeout() from None

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._enter("nvmlEventSetFree")
