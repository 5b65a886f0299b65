"""A prometheus_client custom collector: the sampler's latest sample -> fresh metric families.

Families are built on every scrape from the frozen sample, so a process that exited or a GPU
field that stopped answering simply disappears; there is no label bookkeeping to go stale.
Names, types, help and label names all come from ``fsdpmon.catalog``; the encoding into
families is ``fsdpmon.families`` (shared with the in-trainer monitor).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from fsdpmon import catalog
from fsdpmon.catalog import BY_NAME
from fsdpmon.conventions import clock_event_mask
from fsdpmon.exporters.sample import (
    NO_POD,
    GpuSample,
    HostSample,
    NodeSample,
    PodRef,
    ProcessSample,
)
from fsdpmon.exporters.sampler import Sampler
from fsdpmon.families import Families


def _gpu_pod(gpu: GpuSample, pods: Mapping[int, PodRef]) -> PodRef:
    """The pod of the process holding the most memory on this GPU (pods rarely share one)."""
    users = sorted(gpu.processes, key=lambda p: (-(p.memory_used_bytes or 0.0), p.pid))
    for process in users:
        pod = pods.get(process.pid)
        if pod is not None and pod.pod:
            return pod
    return NO_POD


class ExporterCollector(Collector):
    """Everything the exporter serves, from the sampler's latest sample (used uncached)."""

    def __init__(self, sampler: Sampler, version: str, simulated: bool) -> None:
        self.sampler = sampler
        self.version = version
        self.simulated = simulated

    def collect(self) -> Iterator[Metric]:
        sample = self.sampler.latest()
        yield from live_families(self.sampler, sample)
        yield from sample_families(sample, self.sampler.node, self.version, self.simulated)


class FrozenCollector(Collector):
    """Yields families built earlier (one sample's worth, rendered once for many scrapes)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def live_families(sampler: Sampler, sample: NodeSample | None) -> list[Metric]:
    """The series that must be computed at scrape time: staleness and the sample's age."""
    out = Families()
    node = sampler.node
    out.add(catalog.EXPORTER_SAMPLE_STALE, [node], float(sampler.is_stale(sample)))
    if sample is not None:
        out.add(catalog.EXPORTER_SAMPLE_AGE_SECONDS, [node], sampler.age_s(sample))
    return out.families()


def sample_families(sample: NodeSample | None, node: str, version: str,
                    simulated: bool) -> list[Metric]:
    """Fresh families for everything one frozen sample holds."""
    out = Families()
    out.add(catalog.EXPORTER_INFO, [node, version, str(simulated).lower()], 1.0)
    if sample is None:
        return out.families()
    for source, seconds in sample.durations.items():
        out.add(catalog.EXPORTER_SAMPLE_DURATION_SECONDS, [node, source], seconds)
    for source, count in sample.errors_total.items():
        out.add(catalog.EXPORTER_ERRORS_TOTAL, [node, source], float(count))
    out.add(catalog.NVML_UP, [node], float(sample.gpu.nvml_up))
    pods = {p.pid: p.pod for p in sample.processes}
    for gpu in sample.gpu.gpus:
        _gpu(out, node, gpu, pods)
    if sample.host is not None:
        _host(out, node, sample.host)
    for process in sample.processes:
        _process(out, node, process)
    return out.families()


def _gpu(out: Families, node: str, gpu: GpuSample, pods: Mapping[int, PodRef]) -> None:
    ident = gpu.identity
    base = [str(ident.index), ident.uuid, ident.model, node]
    out.add(catalog.GPU_UP, base, float(gpu.up))
    out.add(catalog.GPU_INFO, [*base, ident.driver_version, ident.cuda_version,
                               ident.pci_bus_id, ident.mig_mode], 1.0)
    labels = [*base, *_gpu_pod(gpu, pods).labels()]
    for name, value in gpu.values.items():
        out.add(BY_NAME[name], labels, value)
    for name, by_label in gpu.labelled.items():
        metric = BY_NAME[name]
        for extra, value in by_label.items():
            out.add(metric, [*labels, extra], value)
    active = gpu.labelled.get(catalog.GPU_CLOCK_EVENT_ACTIVE.name)
    if active is not None:  # the same reasons as one bitmask, as NVML gives them
        out.add(catalog.GPU_CLOCK_EVENT_REASONS, labels,
                clock_event_mask(reason for reason, on in active.items() if on))
    for process in gpu.processes:
        plabels = [*base, *pods.get(process.pid, NO_POD).labels(), str(process.pid)]
        if process.memory_used_bytes is not None:
            out.add(catalog.GPU_PROCESS_MEMORY_USED_BYTES, plabels, process.memory_used_bytes)
        if process.sm_utilization_ratio is not None:
            out.add(catalog.GPU_PROCESS_SM_UTILIZATION_RATIO, plabels, process.sm_utilization_ratio)


def _opt(number: int | None) -> str:
    return "" if number is None else str(number)


def _host(out: Families, node: str, host: HostSample) -> None:
    for mode, seconds in host.cpu_seconds.items():
        out.add(catalog.HOST_CPU_SECONDS_TOTAL, [node, mode], seconds)
    for cpu, share in host.cpu_utilization.items():  # the total, then each core on its own
        out.add(catalog.HOST_CPU_UTILIZATION_RATIO if cpu == "all" else
                catalog.HOST_CPU_CORE_UTILIZATION_RATIO, [node, cpu], share)
    loads = (catalog.HOST_LOAD1, catalog.HOST_LOAD5, catalog.HOST_LOAD15)
    for metric, value in zip(loads, host.load, strict=False):
        out.add(metric, [node], value)
    out.add(catalog.HOST_MEMORY_TOTAL_BYTES, [node], host.memory_total_bytes)
    out.add(catalog.HOST_MEMORY_AVAILABLE_BYTES, [node], host.memory_available_bytes)
    out.add(catalog.HOST_MEMORY_USED_BYTES, [node], host.memory_used_bytes)


def _process(out: Families, node: str, p: ProcessSample) -> None:
    labels = [node, str(p.pid), *p.pod.labels()]
    out.add(catalog.PROCESS_INFO, [*labels, p.command, p.user, _opt(p.rank), _opt(p.local_rank)],
            1.0)
    out.add(catalog.PROCESS_CPU_SECONDS_TOTAL, labels, p.cpu_seconds)
    if p.cpu_utilization is not None:
        out.add(catalog.PROCESS_CPU_UTILIZATION_RATIO, labels, p.cpu_utilization)
    out.add(catalog.PROCESS_RESIDENT_MEMORY_BYTES, labels, p.rss_bytes)
    out.add(catalog.PROCESS_THREADS, labels, float(p.threads))
    out.add(catalog.PROCESS_STATE, [*labels, p.state], 1.0)
    out.add(catalog.PROCESS_START_TIME_SECONDS, labels, p.start_time_seconds)
