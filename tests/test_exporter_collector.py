"""The collector: catalog names and labels, pod labels on GPU series, absent fields, promtool."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from fsdpmon import catalog
from fsdpmon.exporters.collector import ExporterCollector, sample_families
from fsdpmon.exporters.host import HostReader
from fsdpmon.exporters.nvml import NvmlReader
from fsdpmon.exporters.procs import ProcessScanner
from fsdpmon.exporters.sample import GpuReading, HostSample, NodeSample, PodRef
from fsdpmon.exporters.sampler import Sampler
from fsdpmon.exporters.simulated import SimulatedReader
from tests.fake_nvml import FakeGpu, FakeNvml

FIXTURE = Path(__file__).parent / "fixtures" / "proc"
POD_UID = "5b9c2e3f-1d2a-4c6b-9e8f-0a1b2c3d4e5f"


def lookup(pod_uid: str, container_id: str) -> PodRef | None:
    if pod_uid == POD_UID:
        return PodRef("ml", "llama-worker-0", "trainer", training=True)
    return None


def _registry(gpus, pod_lookup=None, simulated: bool = False) -> CollectorRegistry:
    sampler = Sampler("node-a", 5.0, gpus, HostReader(str(FIXTURE)),
                      ProcessScanner(str(FIXTURE), pod_lookup=pod_lookup), gpu_timeout_s=2.0)
    sampler.sample_once()
    registry = CollectorRegistry()
    registry.register(ExporterCollector(sampler, "0.1.0", simulated=simulated))
    return registry


def promtool_check(text: bytes) -> None:
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                            timeout=30)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


def test_every_family_is_catalogued_with_the_catalog_labels() -> None:
    gpus = SimulatedReader(2)
    gpus.open()
    registry = _registry(gpus, simulated=True)
    families = list(registry.collect())
    assert families
    for family in families:
        meta = catalog.get(family.name + ("_total" if family.type == "counter" else ""))
        assert family.type == meta.kind.value
        for sample in family.samples:
            assert tuple(sorted(sample.labels)) == tuple(sorted(meta.labels)), family.name
    names = {f.name for f in families}
    assert {"fsdpmon_gpu_utilization_ratio", "fsdpmon_host_load1", "fsdpmon_process_info",
            "fsdpmon_gpu_process_memory_used_bytes", "fsdpmon_exporter_info"} <= names
    assert registry.get_sample_value("fsdpmon_exporter_info", {
        "node": "node-a", "version": "0.1.0", "simulated": "true"}) == 1.0
    promtool_check(generate_latest(registry))


def test_gpu_series_carry_the_pod_of_the_process_on_them() -> None:
    gpus = [FakeGpu(index=0, uuid="GPU-0", processes=[(1001, 60 * 2**30), (2000, 2**30)]),
            FakeGpu(index=1, uuid="GPU-1")]
    reader = NvmlReader(FakeNvml(gpus))
    reader.open()
    registry = _registry(reader, pod_lookup=lookup)
    model = "NVIDIA H100 80GB HBM3"
    attributed = {"gpu": "0", "uuid": "GPU-0", "model": model, "node": "node-a",
                  "namespace": "ml", "pod": "llama-worker-0", "container": "trainer"}
    assert registry.get_sample_value("fsdpmon_gpu_utilization_ratio", attributed) == 0.97
    idle = {"gpu": "1", "uuid": "GPU-1", "model": model, "node": "node-a",
            "namespace": "", "pod": "", "container": ""}
    assert registry.get_sample_value("fsdpmon_gpu_utilization_ratio", idle) == 0.97
    assert registry.get_sample_value("fsdpmon_gpu_process_memory_used_bytes",
                                     {**attributed, "pid": "1001"}) == 60 * 2**30
    # PID 2000 (sshd) holds a GPU context: it gets process series although it is not training.
    assert registry.get_sample_value("fsdpmon_process_threads", {
        "node": "node-a", "pid": "2000", "namespace": "", "pod": "", "container": ""}) == 12
    assert registry.get_sample_value("fsdpmon_process_info", {
        "node": "node-a", "pid": "1001", "namespace": "ml", "pod": "llama-worker-0",
        "container": "trainer",
        "command": "/usr/bin/python -u -m fsdpmon.trainer.train --model tiny",
        "user": "root", "rank": "0", "local_rank": "0"}) == 1.0
    promtool_check(generate_latest(registry))


def test_unsupported_fields_and_lost_gpus_leave_series_out() -> None:
    gpus = [FakeGpu(index=0, uuid="GPU-0", unsupported={"nvmlDeviceGetPowerUsage"}),
            FakeGpu(index=1, uuid="GPU-1")]
    fake = FakeNvml(gpus)
    reader = NvmlReader(fake)
    reader.open()
    gpus[1].lost = True
    text = generate_latest(_registry(reader)).decode()
    power = [line for line in text.splitlines() if line.startswith("fsdpmon_gpu_power_watts")]
    assert power == []  # GPU 0 does not support it, GPU 1 is lost: absent, never 0
    assert 'fsdpmon_gpu_up{gpu="1",model="NVIDIA H100 80GB HBM3",node="node-a",uuid="GPU-1"} 0.0' \
        in text
    assert 'fsdpmon_gpu_temperature_celsius{container="",gpu="0"' in text
    assert 'fsdpmon_gpu_temperature_celsius{container="",gpu="1"' not in text
    assert 'fsdpmon_gpu_info{cuda_version="12.4",driver_version="550.54.15",gpu="1"' in text
    promtool_check(text.encode())


@pytest.mark.parametrize("missing", [True, False])
def test_without_nvml_host_and_processes_are_still_served(missing: bool) -> None:
    reader = NvmlReader(FakeNvml([FakeGpu(index=0, uuid="GPU-0")], library_missing=missing))
    reader.open()
    registry = _registry(reader)
    assert registry.get_sample_value("fsdpmon_nvml_up", {"node": "node-a"}) == float(not missing)
    assert registry.get_sample_value("fsdpmon_host_memory_total_bytes",
                                     {"node": "node-a"}) == 2 * 2**30
    assert registry.get_sample_value("fsdpmon_host_cpu_seconds_total",
                                     {"node": "node-a", "mode": "idle"}) > 0
    assert registry.get_sample_value("fsdpmon_process_resident_memory_bytes", {
        "node": "node-a", "pid": "3000", "namespace": "", "pod": "", "container": ""}) > 0
    gpu_lines = [f for f in registry.collect() if f.name.startswith("fsdpmon_gpu_")]
    assert bool(gpu_lines) is not missing


def test_clock_events_also_as_one_bitmask_and_host_cores_under_their_own_name() -> None:
    """A GPU's active clock-event reasons are served per reason and as NVML's bitmask (what
    top reads: one series per GPU); the host's CPU total keeps its name, its cores get theirs
    (a reader asking for the total by name gets nothing per core)."""
    gpu = FakeGpu(index=0, uuid="GPU-0", clock_event_mask=0x8 | 0x40)
    reader = NvmlReader(FakeNvml([gpu]))
    reader.open()
    registry = _registry(reader)
    labels = {"gpu": "0", "uuid": "GPU-0", "model": "NVIDIA H100 80GB HBM3", "node": "node-a",
              "namespace": "", "pod": "", "container": ""}
    assert registry.get_sample_value("fsdpmon_gpu_clock_event_reasons", labels) == 0x48
    active = {r for r in ("hw_slowdown", "hw_thermal_slowdown", "sw_power_cap") if
              registry.get_sample_value("fsdpmon_gpu_clock_event_active",
                                        {**labels, "reason": r})}
    assert active == {"hw_slowdown", "hw_thermal_slowdown"}, active
    promtool_check(generate_latest(registry))
    host = HostSample(cpu_seconds={"idle": 1.0}, cpu_utilization={"all": 0.5, "0": 0.25,
                                                                    "1": 0.75},
                      load=(1.0, 1.0, 1.0), memory_total_bytes=2.0, memory_available_bytes=1.0)
    sample = NodeSample(node="node-a", taken_at=0.0, gpu=GpuReading(nvml_up=False), host=host,
                        processes=(), durations={}, errors_total={})
    series = {(f.name, s.labels.get("cpu")): s.value
              for f in sample_families(sample, "node-a", "0.1.0", False) for s in f.samples
              if f.name.startswith("fsdpmon_host_cpu_") and "utilization" in f.name}
    assert series == {("fsdpmon_host_cpu_utilization_ratio", "all"): 0.5,
                      ("fsdpmon_host_cpu_core_utilization_ratio", "0"): 0.25,
                      ("fsdpmon_host_cpu_core_utilization_ratio", "1"): 0.75}, series
