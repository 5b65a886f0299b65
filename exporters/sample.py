"""The frozen snapshot the background sampler produces and every scrape serves.

Readers (NVML, simulated GPUs, /proc) fill these plain dataclasses; the collector turns them into
metric families. Nothing here does I/O. A field a device does not support is simply absent from
``GpuSample.values`` (never a fake 0), so its series is absent from the exposition.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PodRef:
    """Where a process runs in Kubernetes; empty strings when unattributed or outside it."""

    namespace: str = ""
    pod: str = ""
    container: str = ""
    training: bool = False  # the pod belongs to a training job (PyTorchJob / TrainJob / port)

    def labels(self) -> tuple[str, str, str]:
        return (self.namespace, self.pod, self.container)


NO_POD = PodRef()


@dataclass(frozen=True)
class GpuIdentity:
    index: int
    uuid: str
    model: str
    driver_version: str = ""
    cuda_version: str = ""
    pci_bus_id: str = ""
    mig_mode: str = ""


@dataclass(frozen=True)
class GpuProcess:
    """One process holding a context on a GPU."""

    pid: int
    memory_used_bytes: float | None = None
    sm_utilization_ratio: float | None = None


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one instant.

    ``values``: catalog metric name -> value, for series labelled only by the GPU (and its pod).
    ``labelled``: catalog metric name -> {value of the metric's one extra label -> value}, e.g.
    ``fsdpmon_gpu_clock_event_active`` -> {"sw_power_cap": 1.0, ...}.
    """

    identity: GpuIdentity
    up: bool
    values: Mapping[str, float] = field(default_factory=dict)
    labelled: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True)
class GpuReading:
    """Everything the GPU reader saw in one pass."""

    nvml_up: bool
    gpus: tuple[GpuSample, ...] = ()
    errors: int = 0  # unexpected NVML errors during this pass (NotSupported is not one)


@dataclass(frozen=True)
class ProcessSample:
    pid: int
    command: str
    user: str
    state: str
    cpu_seconds: float
    rss_bytes: float
    threads: int
    start_time_seconds: float
    cpu_utilization: float | None = None  # cores, over the last sample interval
    pod: PodRef = NO_POD
    rank: int | None = None  # RANK / LOCAL_RANK of a torchrun worker (from its environment)
    local_rank: int | None = None


@dataclass(frozen=True)
class HostSample:
    cpu_seconds: Mapping[str, float]  # mode -> seconds, summed over cores
    cpu_utilization: Mapping[str, float]  # "all" and each core index -> busy share 0..1
    load: tuple[float, float, float]
    memory_total_bytes: float
    memory_available_bytes: float

    @property
    def memory_used_bytes(self) -> float:
        return self.memory_total_bytes - self.memory_available_bytes


@dataclass(frozen=True)
class NodeSample:
    """One complete background sample of a node."""

    node: str
    taken_at: float  # unix time the sample finished
    gpu: GpuReading
    host: HostSample | None
    processes: tuple[ProcessSample, ...]
    durations: Mapping[str, float]  # source -> seconds the last read took
    errors_total: Mapping[str, int]  # source -> errors since start
    gpu_stale: bool = False  # the GPU part is a previous reading: the NVML call has not returned
