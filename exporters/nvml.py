"""The one NVML wrapper: the only module in fsdpmon that imports pynvml.

``NvmlReader`` reads every GPU signal through per-field methods
(``fsdpmon.exporters.nvml_fields``, which reach NVML only through the reader) and applies one
error policy:

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

from fsdpmon import catalog
from fsdpmon.exporters.nvml_fields import FieldReaders
from fsdpmon.exporters.sample import GpuIdentity, GpuReading, GpuSample

log = logging.getLogger(__name__)

REOPEN_S = 60.0  # while NVML is down, how often to try it again

# Errors that mean "this value is not available": the series is left out.
MISSING_ERRORS = (
    pynvml.NVMLError_NotSupported,
    pynvml.NVMLError_NoPermission,
    pynvml.NVMLError_NoData,
    pynvml.NVMLError_NotFound,
)
LOST_ERRORS = (pynvml.NVMLError_GpuIsLost, pynvml.NVMLError_GpuNotFound, pynvml.NVMLError_Unknown)

class GpuLost(Exception):
    """Raised inside the reader when a GPU stops answering."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlReader(FieldReaders):
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

    # -- XID counts (from the event thread) ----------------------------------------------
    def count_xid(self, index: int, xid: int) -> None:
        with self._xid_lock:
            self._xid_counts[(index, xid)] = self._xid_counts.get((index, xid), 0) + 1

    def xid_counts(self, index: int) -> dict[str, float]:
        with self._xid_lock:
            return {str(x): float(n) for (i, x), n in self._xid_counts.items() if i == index}
