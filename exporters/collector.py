"""A prometheus_client custom collector: the sampler's latest sample -> fresh metric families.

Families are built on every scrape from the frozen sample, so a process that exited or a GPU
field that stopped answering simply disappears; there is no label bookkeeping to go stale.
Names, types, help and label names all come from ``fsdpmon.catalog``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporters.sample import NO_POD, GpuSample, HostSample, NodeSample, PodRef, ProcessSample
from exporters.sampler import Sampler
from fsdpmon import catalog
from fsdpmon.catalog import Kind


class _Families:
    """Metric families created on first use, keyed by catalog name."""

    def __init__(self) -> None:
        self.by_name: dict[str, Metric] = {}

    def add(self, name: str, labels: Sequence[str], value: float) -> None:
        family = self.by_name.get(name)
        if family is None:
            family = self.by_name[name] = self._new(name)
        family.add_metric(list(labels), value)

    @staticmethod
    def _new(name: str) -> Metric:
        meta = catalog.get(name)
        family_cls = CounterMetricFamily if meta.kind is Kind.COUNTER else GaugeMetricFamily
        unit = meta.unit if meta.unit and meta.family.endswith("_" + meta.unit) else ""
        return family_cls(meta.family, meta.help, labels=list(meta.labels), unit=unit)


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
    out = _Families()
    node = sampler.node
    out.add("fsdpmon_exporter_sample_stale", [node], float(sampler.is_stale(sample)))
    if sample is not None:
        out.add("fsdpmon_exporter_sample_age_seconds", [node], sampler.age_s(sample))
    return list(out.by_name.values())


def sample_families(sample: NodeSample | None, node: str, version: str,
                    simulated: bool) -> list[Metric]:
    """Fresh families for everything one frozen sample holds."""
    out = _Families()
    out.add("fsdpmon_exporter_info", [node, version, str(simulated).lower()], 1.0)
    if sample is None:
        return list(out.by_name.values())
    for source, seconds in sample.durations.items():
        out.add("fsdpmon_exporter_sample_duration_seconds", [node, source], seconds)
    for source, count in sample.errors_total.items():
        out.add("fsdpmon_exporter_errors_total", [node, source], float(count))
    out.add("fsdpmon_nvml_up", [node], float(sample.gpu.nvml_up))
    pods = {p.pid: p.pod for p in sample.processes}
    for gpu in sample.gpu.gpus:
        _gpu(out, node, gpu, pods)
    if sample.host is not None:
        _host(out, node, sample.host)
    for process in sample.processes:
        _process(out, node, process)
    return list(out.by_name.values())


def _gpu(out: _Families, node: str, gpu: GpuSample, pods: Mapping[int, PodRef]) -> None:
    ident = gpu.identity
    base = [str(ident.index), ident.uuid, ident.model, node]
    out.add("fsdpmon_gpu_up", base, float(gpu.up))
    out.add("fsdpmon_gpu_info", [*base, ident.driver_version, ident.cuda_version,
                                 ident.pci_bus_id, ident.mig_mode], 1.0)
    labels = [*base, *_gpu_pod(gpu, pods).labels()]
    for name, value in gpu.values.items():
        out.add(name, labels, value)
    for name, by_label in gpu.labelled.items():
        for extra, value in by_label.items():
            out.add(name, [*labels, extra], value)
    for process in gpu.processes:
        plabels = [*base, *pods.get(process.pid, NO_POD).labels(), str(process.pid)]
        if process.memory_used_bytes is not None:
            out.add("fsdpmon_gpu_process_memory_used_bytes", plabels,
                    process.memory_used_bytes)
        if process.sm_utilization_ratio is not None:
            out.add("fsdpmon_gpu_process_sm_utilization_ratio", plabels,
                    process.sm_utilization_ratio)


def _host(out: _Families, node: str, host: HostSample) -> None:
    for mode, seconds in host.cpu_seconds.items():
        out.add("fsdpmon_host_cpu_seconds_total", [node, mode], seconds)
    for cpu, share in host.cpu_utilization.items():
        out.add("fsdpmon_host_cpu_utilization_ratio", [node, cpu], share)
    for suffix, value in zip(("1", "5", "15"), host.load, strict=False):
        out.add(f"fsdpmon_host_load{suffix}", [node], value)
    out.add("fsdpmon_host_memory_total_bytes", [node], host.memory_total_bytes)
    out.add("fsdpmon_host_memory_available_bytes", [node], host.memory_available_bytes)
    out.add("fsdpmon_host_memory_used_bytes", [node], host.memory_used_bytes)


def _process(out: _Families, node: str, p: ProcessSample) -> None:
    labels = [node, str(p.pid), *p.pod.labels()]
    out.add("fsdpmon_process_info", [*labels, p.command, p.user], 1.0)
    out.add("fsdpmon_process_cpu_seconds_total", labels, p.cpu_seconds)
    if p.cpu_utilization is not None:
        out.add("fsdpmon_process_cpu_utilization_ratio", labels, p.cpu_utilization)
    out.add("fsdpmon_process_resident_memory_bytes", labels, p.rss_bytes)
    out.add("fsdpmon_process_threads", labels, float(p.threads))
    out.add("fsdpmon_process_state", [*labels, p.state], 1.0)
    out.add("fsdpmon_process_start_time_seconds", labels, p.start_time_seconds)
