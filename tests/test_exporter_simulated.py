"""Simulated GPUs: plausible, moving, and impossible to mistake for real ones."""

from __future__ import annotations

import itertools

import pytest
from support import rounded

from fsdpmon import catalog, faultspec
from fsdpmon.conventions import GPU_THROTTLE_REASONS
from fsdpmon.errors import ConfigError
from fsdpmon.exporters.simfaults import GpuFaults, exporter_faults
from fsdpmon.exporters.simulated import SM_CLOCK_MAX_HZ, SimulatedReader


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_values_are_plausible_and_move() -> None:
    clock = Clock()
    reader = SimulatedReader(8, clock=clock)
    assert reader.open()
    readings = []
    for _ in range(30):
        clock.now += 1.0
        readings.append(reader.read())
    for reading in readings:
        assert reading.nvml_up and len(reading.gpus) == 8
        for gpu in reading.gpus:
            v = gpu.values
            assert gpu.up
            assert 0 <= v["fsdpmon_gpu_utilization_ratio"] <= 1
            assert v["fsdpmon_gpu_memory_used_bytes"] + v["fsdpmon_gpu_memory_free_bytes"] == \
                v["fsdpmon_gpu_memory_total_bytes"]
            assert 0 < v["fsdpmon_gpu_power_watts"] <= v["fsdpmon_gpu_power_limit_watts"]
            assert 30 < v["fsdpmon_gpu_temperature_celsius"] < 90
            assert v["fsdpmon_gpu_sm_clock_hertz"] <= v["fsdpmon_gpu_sm_clock_max_hertz"]
            for name in [*v, *gpu.labelled]:
                catalog.get(name)  # every simulated series is a catalogued one
    power = [r.gpus[0].values["fsdpmon_gpu_power_watts"] for r in readings]
    assert max(power) - min(power) > 50  # moves
    energy = [r.gpus[0].values["fsdpmon_gpu_energy_joules_total"] for r in readings]
    assert all(b > a for a, b in itertools.pairwise(energy))  # a counter
    assert energy[-1] - energy[0] >= 29 * min(power)


def test_every_gpu_says_it_is_simulated() -> None:
    reader = SimulatedReader(3)
    reader.open()
    for gpu in reader.read().gpus:
        assert gpu.identity.model == "SIMULATED"
        assert "SIMULATED" in gpu.identity.uuid
        assert gpu.identity.driver_version == "simulated"
    assert len({g.identity.uuid for g in reader.read().gpus}) == 3


def test_each_gpu_is_used_by_the_worker_with_its_local_rank() -> None:
    """As NVML lists a torchrun worker on the GPU it was given; the launcher holds none."""
    reader = SimulatedReader(2)
    reader.open()
    reader.use_processes({30: 1, 10: 0, 20: None, 40: 2})  # 20: torchrun itself
    gpus = reader.read().gpus
    assert [[p.pid for p in g.processes] for g in gpus] == [[10, 40], [30]]
    one = gpus[0]
    total = sum(p.memory_used_bytes for p in one.processes)
    used = one.values["fsdpmon_gpu_memory_used_bytes"]
    assert abs(total - used) <= 1e-9 * used, f"processes hold {total - used:+.0f} B vs the GPU"
    reader.use_processes({})
    assert all(g.processes == () for g in reader.read().gpus)


def _faulty(spec: str, count: int = 2) -> tuple[SimulatedReader, Clock]:
    clock = Clock()
    reader = SimulatedReader(count, clock=clock,
                             faults=GpuFaults(faultspec.parse(spec), count))
    reader.open()
    return reader, clock


def _series(gpu, name: str) -> dict[str, float]:
    return dict(gpu.labelled.get(name, {}))


@pytest.mark.parametrize(("reason", "bits"), [
    ("thermal", {"hw_slowdown", "hw_thermal_slowdown"}),
    ("power", {"hw_slowdown", "hw_power_brake_slowdown"}),
    ("hw_slowdown", {"hw_slowdown"}),
])
def test_throttled_gpu_clocks_down_stays_busy_and_counts_throttle_time(reason, bits) -> None:
    reader, clock = _faulty(f"gpu-throttle:gpu=1,after=10,reason={reason}")
    before = reader.read().gpus[1]
    assert not {r for r, on in _series(before, "fsdpmon_gpu_clock_event_active").items()
                if on} & bits
    clock.now += 10.0  # the fault starts
    first = reader.read().gpus
    clock.now += 4.0
    throttled, healthy = reader.read().gpus[1], reader.read().gpus[0]
    active = {r for r, on in _series(throttled, "fsdpmon_gpu_clock_event_active").items() if on}
    assert active == bits, f"active reasons {active}, want {bits}"
    v = throttled.values
    ratio = v["fsdpmon_gpu_sm_clock_hertz"] / v["fsdpmon_gpu_sm_clock_max_hertz"]
    assert ratio <= 0.5, f"hw slowdown halves the clocks or more; clock ratio {ratio:.2f}"
    assert v["fsdpmon_gpu_utilization_ratio"] >= 0.95  # busy: its kernels just take longer
    assert v["fsdpmon_gpu_power_watts"] < healthy.values["fsdpmon_gpu_power_watts"] or \
        v["fsdpmon_gpu_power_watts"] <= 0.5 * v["fsdpmon_gpu_power_limit_watts"]
    if reason == "thermal":
        assert v["fsdpmon_gpu_temperature_celsius"] >= 90
    counted = [b for b in bits if b != "hw_slowdown"]  # NVML keeps no time for hw_slowdown
    seconds = _series(throttled, "fsdpmon_gpu_clock_event_seconds_total")
    for b in counted:
        assert seconds[b] == rounded(4.0), f"{b}: {seconds[b]} s throttled, 4 s passed"
    assert first[0].values["fsdpmon_gpu_sm_clock_hertz"] > 0.8 * SM_CLOCK_MAX_HZ  # GPU 0 is fine


def test_xid_comes_once_at_its_time() -> None:
    reader, clock = _faulty("xid:gpu=0,code=79,after=5")
    assert "fsdpmon_gpu_xid_errors_total" not in reader.read().gpus[0].labelled
    clock.now += 5.0
    for _ in range(3):  # once: the count stays 1
        gpu = reader.read().gpus[0]
        assert _series(gpu, "fsdpmon_gpu_xid_errors_total") == {"79": 1.0}
        clock.now += 1.0
    assert "fsdpmon_gpu_xid_errors_total" not in reader.read().gpus[1].labelled


def test_lost_gpu_reads_down_with_xid_79_and_the_others_go_on(caplog) -> None:
    reader, clock = _faulty("gpu-lost:gpu=1,after=3")
    reader.use_processes({10: 0, 11: 1})
    assert all(g.up for g in reader.read().gpus)
    clock.now += 3.0
    for _ in range(2):
        reading = reader.read()
        assert reading.nvml_up and [g.up for g in reading.gpus] == [True, False]
        lost = reading.gpus[1]
        assert lost.values == {} and lost.processes == ()
        assert lost.labelled == {"fsdpmon_gpu_xid_errors_total": {"79": 1.0}}
        assert [p.pid for p in reading.gpus[0].processes] == [10]
    assert sum("lost" in r.getMessage() for r in caplog.records) == 1  # logged once


def test_uncorrected_ecc_error_pends_a_row_remap() -> None:
    reader, clock = _faulty("ecc-uncorrected:gpu=0,after=1")
    gpu = reader.read().gpus[0]
    assert _series(gpu, "fsdpmon_gpu_ecc_errors_total")["uncorrected"] == 0
    clock.now += 1.0
    gpu = reader.read().gpus[0]
    assert _series(gpu, "fsdpmon_gpu_ecc_errors_total")["uncorrected"] == 1
    rows = _series(gpu, "fsdpmon_gpu_remapped_rows")
    assert rows["uncorrectable"] == 1 and rows["pending"] == 1 and rows["failure"] == 0
    assert _series(gpu, "fsdpmon_gpu_xid_errors_total") == {"94": 1.0}


def test_healthy_simulation_flags_nothing_over_ten_minutes() -> None:
    reader, clock = _faulty("", count=4)
    for _ in range(600):
        clock.now += 1.0
        for gpu in reader.read().gpus:
            events = _series(gpu, "fsdpmon_gpu_clock_event_active")
            hot = {r for r in GPU_THROTTLE_REASONS if events.get(r)}
            assert gpu.up and not hot, f"GPU {gpu.identity.index} throttled: {hot}"
            assert "fsdpmon_gpu_xid_errors_total" not in gpu.labelled
            assert _series(gpu, "fsdpmon_gpu_ecc_errors_total")["uncorrected"] == 0


@pytest.mark.parametrize(("spec", "names"), [
    ("xid:gpu=2,code=79", ["--fault", "gpu=2", "2 GPUs"]),
    ("hang:rank=0", ["--fault", "trainer fault"]),
    ("gpu-throttle:gpu=0,reason=cold", ["--fault", "reason"]),
])
def test_bad_gpu_fault_specs_fail_at_start_naming_the_problem(spec, names) -> None:
    with pytest.raises(ConfigError) as err:
        exporter_faults(spec, 2)
    for part in names:
        assert part in str(err.value), f"{part!r} not in {err.value}"


def test_gpu_faults_need_simulated_gpus_and_trainer_kinds_in_the_env_are_ignored(
        monkeypatch) -> None:
    monkeypatch.setenv("FSDPMON_FAULT", "hang:rank=1;xid:gpu=0,code=13")
    assert [f.code for f in exporter_faults(None, 1).faults] == [13]
    with pytest.raises(ConfigError, match="--simulate-gpus"):
        exporter_faults(None, 0)


def test_a_bad_gpu_fault_in_the_environment_is_named_as_such(monkeypatch) -> None:
    monkeypatch.setenv("FSDPMON_FAULT", "gpu-lost:gpu=5")
    with pytest.raises(ConfigError) as err:
        exporter_faults("xid:gpu=0", 2)
    assert err.value.field == "FSDPMON_FAULT" and "GPU 5" in str(err.value), str(err.value)
