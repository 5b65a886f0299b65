"""The background sampler: fresh samples on its interval, a hung NVML call never blocks a scrape."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

from prometheus_client.registry import CollectorRegistry

from fsdpmon.exporters.collector import ExporterCollector
from fsdpmon.exporters.host import HostReader
from fsdpmon.exporters.nvml import NvmlReader
from fsdpmon.exporters.procs import ProcessScanner
from fsdpmon.exporters.sampler import Sampler
from fsdpmon.exporters.simulated import SimulatedReader
from tests.fake_nvml import HANG_S, FakeGpu, FakeNvml

FIXTURE = Path(__file__).parent / "fixtures" / "proc"


def _sampler(gpus, proc_root: Path = FIXTURE, interval: float = 0.2,
             gpu_timeout: float = 0.3) -> Sampler:
    return Sampler("node-a", interval, gpus, HostReader(str(proc_root)),
                   ProcessScanner(str(proc_root)), gpu_timeout_s=gpu_timeout)


def test_one_sample_has_gpus_host_and_training_processes() -> None:
    gpus = SimulatedReader(4)
    gpus.open()
    sample = _sampler(gpus).sample_once()
    assert sample.node == "node-a" and sample.gpu.nvml_up and len(sample.gpu.gpus) == 4
    assert sample.host is not None and sample.host.load == (3.5, 2.25, 1.0)
    assert sorted(p.pid for p in sample.processes) == [1001, 3000, 3001]
    # simulated GPU i is used by the worker with LOCAL_RANK=i; torchrun (3000) uses none
    assert [[p.pid for p in g.processes] for g in sample.gpu.gpus] == [[1001], [3001], [], []]
    ranks = {p.pid: (p.rank, p.local_rank) for p in sample.processes}
    assert ranks == {1001: (0, 0), 3000: (None, None), 3001: (1, 1)}
    assert set(sample.durations) >= {"processes", "nvml", "host", "total"}
    assert not sample.gpu_stale


def test_hung_nvml_call_marks_the_sample_stale_and_host_data_stays_fresh() -> None:
    hang = threading.Event()
    hang.set()
    gpu = FakeGpu(index=0, uuid="GPU-hang", hang=hang)
    reader = NvmlReader(FakeNvml([gpu]))
    assert reader.open()
    sampler = _sampler(reader, gpu_timeout=0.2)
    first = sampler.sample_once()
    assert not first.gpu_stale and not sampler.is_stale(first)
    hang.clear()  # the next NVML call blocks inside the "driver"
    try:
        t0 = time.monotonic()
        second = sampler.sample_once()
        assert time.monotonic() - t0 < 2.0
        assert second.gpu_stale and sampler.is_stale(second)
        assert second.gpu is first.gpu  # the previous GPU reading, not a made-up one
        assert second.taken_at >= first.taken_at and second.host is not None
        t0 = time.monotonic()
        third = sampler.sample_once()  # still hung: no second reader thread, no waiting
        assert time.monotonic() - t0 < 0.15 and third.gpu_stale
    finally:
        hang.set()
    deadline = time.monotonic() + 5
    while sampler.sample_once().gpu_stale and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not sampler.latest().gpu_stale


def test_scrape_is_served_from_the_last_sample_while_nvml_hangs() -> None:
    hang = threading.Event()
    hang.set()
    reader = NvmlReader(FakeNvml([FakeGpu(index=0, uuid="GPU-hang", hang=hang)]))
    reader.open()
    sampler = _sampler(reader, interval=0.1, gpu_timeout=0.1)
    registry = CollectorRegistry()
    registry.register(ExporterCollector(sampler, "test", simulated=False))
    sampler.start()
    try:
        hang.clear()
        deadline = time.monotonic() + 20  # the sampler's interval is 0.1 s: generous
        while True:
            t0 = time.monotonic()
            stale = registry.get_sample_value("fsdpmon_exporter_sample_stale",
                                              {"node": "node-a"})
            elapsed = time.monotonic() - t0
            # A scrape that waited on the hung GPU would return no sooner than the fake's hang
            # lasts (HANG_S), so any scrape shorter than that did not wait.
            assert elapsed < HANG_S, f"scrape took {elapsed:.3f}s while the GPU hung"
            if stale == 1.0:
                break
            assert time.monotonic() < deadline, f"stale gauge {stale} after 20 s, want 1.0"
            time.sleep(0.05)
        assert registry.get_sample_value("fsdpmon_gpu_power_watts", {
            "gpu": "0", "uuid": "GPU-hang", "model": "NVIDIA H100 80GB HBM3", "node": "node-a",
            "namespace": "", "pod": "", "container": ""}) == 612.0
        ok, _ = sampler.health()
        assert ok  # the sampler itself is alive; only the GPU part is stale
    finally:
        hang.set()
        sampler.stop()
    assert not sampler.alive()


def test_background_loop_keeps_sampling_on_its_interval() -> None:
    gpus = SimulatedReader(1)
    gpus.open()
    sampler = _sampler(gpus, interval=0.1)
    sampler.start()
    try:
        first = later = sampler.latest()
        deadline = time.monotonic() + 20  # the interval is 0.1 s: generous
        while first is not None and later is not None and later.taken_at <= first.taken_at:
            assert time.monotonic() < deadline, "no new sample in 20 s"
            time.sleep(0.05)
            later = sampler.latest()
    finally:
        sampler.stop()
    assert first is not None and later is not None and later.taken_at > first.taken_at
    energy = [s.gpu.gpus[0].values["fsdpmon_gpu_energy_joules_total"] for s in (first, later)]
    assert energy[1] > energy[0]  # simulated values move


def test_a_failing_source_costs_only_itself(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    shutil.copytree(FIXTURE, root)
    (root / "loadavg").unlink()
    gpus = SimulatedReader(1)
    gpus.open()
    sample = _sampler(gpus, proc_root=root).sample_once()
    assert sample.host is None and sample.errors_total["host"] == 1
    assert sample.gpu.gpus and sample.processes


def test_no_sample_yet_is_stale_and_unhealthy() -> None:
    gpus = SimulatedReader(1)
    sampler = _sampler(gpus)
    assert sampler.is_stale(None)
    assert sampler.health() == (False, "sampler not running")
