"""Simulated GPUs: plausible, moving, and impossible to mistake for real ones."""

from __future__ import annotations

import itertools

from exporters.simulated import SimulatedReader
from fsdpmon import catalog


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


def test_training_processes_are_shared_out_round_robin() -> None:
    reader = SimulatedReader(2)
    reader.open()
    reader.use_processes([30, 10, 20])
    gpus = reader.read().gpus
    assert [[p.pid for p in g.processes] for g in gpus] == [[10, 30], [20]]
    one = gpus[0]
    total = sum(p.memory_used_bytes for p in one.processes)
    assert total <= one.values["fsdpmon_gpu_memory_used_bytes"]
    reader.use_processes([])
    assert all(g.processes == () for g in reader.read().gpus)
