"""The NVML wrapper against a fake NVML that raises pynvml's real exceptions, and real pynvml."""

from __future__ import annotations

import time

import pynvml
import pytest
from support import rounded

from fsdpmon.exporters.nvml import NvmlReader
from fsdpmon.exporters.sample import GpuSample
from fsdpmon.exporters.xid import XidWatcher
from tests.fake_nvml import MIB, FakeGpu, FakeNvml


def _gpus(n: int = 2, **kwargs) -> list[FakeGpu]:
    return [FakeGpu(index=i, uuid=f"GPU-{i:08d}-aaaa-bbbb-cccc-dddddddddddd", **kwargs)
            for i in range(n)]


def _open(fake: FakeNvml) -> NvmlReader:
    reader = NvmlReader(fake)
    assert reader.open()
    return reader


def test_healthy_gpu_reads_every_signal_in_base_units() -> None:
    fake = FakeNvml(_gpus(1, processes=[(4242, 4 * 1024 * MIB), (4243, None),
                                        (4242, 1024 * MIB)],
                          process_sm={4242: 73}))
    reader = _open(fake)
    ident = reader.identities[0]
    assert (ident.model, ident.driver_version, ident.cuda_version) == (
        "NVIDIA H100 80GB HBM3", "550.54.15", "12.4")
    assert (ident.pci_bus_id, ident.mig_mode) == ("00000000:18:00.0", "disabled")
    reading = reader.read()
    assert reading.nvml_up and reading.errors == 0
    gpu = reading.gpus[0]
    v = gpu.values
    assert gpu.up
    assert v["fsdpmon_gpu_utilization_ratio"] == rounded(0.97)
    assert v["fsdpmon_gpu_memory_utilization_ratio"] == rounded(0.41)
    assert v["fsdpmon_gpu_memory_used_bytes"] == 69 * 1024 * MIB
    assert v["fsdpmon_gpu_memory_reserved_bytes"] == 512 * MIB
    assert v["fsdpmon_gpu_temperature_celsius"] == 64
    assert v["fsdpmon_gpu_memory_temperature_celsius"] == 71
    assert v["fsdpmon_gpu_power_watts"] == rounded(612.0)
    assert v["fsdpmon_gpu_power_limit_watts"] == rounded(700.0)
    assert v["fsdpmon_gpu_energy_joules_total"] == rounded(9_876_543.21)
    assert v["fsdpmon_gpu_sm_clock_hertz"] == 1755e6
    assert v["fsdpmon_gpu_memory_clock_max_hertz"] == 2619e6
    assert v["fsdpmon_gpu_pcie_replay_errors_total"] == 5
    events = gpu.labelled["fsdpmon_gpu_clock_event_active"]
    assert events["sw_power_cap"] == 1 and events["sw_thermal_slowdown"] == 1
    assert events["hw_slowdown"] == 0 and len(events) == 9
    assert gpu.labelled["fsdpmon_gpu_ecc_errors_total"] == {"corrected": 3, "uncorrected": 0}
    assert gpu.labelled["fsdpmon_gpu_remapped_rows"]["correctable"] == 2
    assert gpu.labelled["fsdpmon_gpu_pcie_bytes_per_second"] == {"tx": 1024000, "rx": 3072000}
    # Rates from counters (NVLink) and GPM need two reads: absent first, never a fake 0.
    assert "fsdpmon_gpu_nvlink_bytes_per_second" not in gpu.labelled
    assert "fsdpmon_gpu_sm_activity_ratio" not in v
    assert len(gpu.processes) == 2  # PID 4242 holds two contexts: one entry, memory summed
    by_pid = {p.pid: p for p in gpu.processes}
    assert by_pid[4242].memory_used_bytes == 5 * 1024 * MIB
    assert by_pid[4242].sm_utilization_ratio == rounded(0.73)
    assert by_pid[4243].memory_used_bytes is None and by_pid[4243].sm_utilization_ratio is None


def test_rates_and_gpm_appear_on_the_second_read() -> None:
    fake = FakeNvml(_gpus(1))
    reader = _open(fake)
    first_begun = time.monotonic()
    reader.read()
    first_done = time.monotonic()
    time.sleep(0.05)  # a gap between the reads; its length is measured, not assumed
    fake.gpus[0].nvlink_kib[:] = [1024 * 1024, 2 * 1024 * 1024]  # +1 GiB tx, +2 GiB rx
    second_begun = time.monotonic()
    gpu = reader.read().gpus[0]
    second_done = time.monotonic()
    # The reader stamps each read inside the brackets taken here, so the time it divides by
    # lies between the shortest and the longest span those brackets allow.
    shortest, longest = second_begun - first_done, second_done - first_begun
    nvlink = gpu.labelled["fsdpmon_gpu_nvlink_bytes_per_second"]
    for direction, moved in (("tx", 1024**3), ("rx", 2 * 1024**3)):
        low, high = moved / longest, moved / shortest
        assert low <= nvlink[direction] <= high, (
            f"{direction}: {nvlink[direction]:.4g} B/s, {moved} bytes over {shortest:.4f}.."
            f"{longest:.4f} s allow {low:.4g}..{high:.4g} B/s")
    assert gpu.values["fsdpmon_gpu_sm_activity_ratio"] == rounded(0.88)
    assert gpu.values["fsdpmon_gpu_tensor_activity_ratio"] == rounded(0.61)


def test_nvlink_rates_are_the_kib_counters_over_the_elapsed_time_exactly(monkeypatch) -> None:
    """On a clock of the test's own: 2 s between reads, 1 GiB and 2 GiB more in NVML's KiB
    counters (summed over every link: the scope NVML reads as all links)."""
    import fsdpmon.exporters.nvml_fields as fields

    now = [100.0]
    monkeypatch.setattr(fields, "time", type("Clock", (), {"monotonic": lambda: now[0]}))
    fake = FakeNvml(_gpus(1))
    start = 5 * 1024 * 1024  # 5 GiB already moved since the driver loaded
    fake.gpus[0].nvlink_kib[:] = [start, start]
    reader = _open(fake)
    reader.read()
    now[0] += 2.0
    fake.gpus[0].nvlink_kib[:] = [start + 1024 * 1024, start + 2 * 1024 * 1024]
    rates = reader.read().gpus[0].labelled["fsdpmon_gpu_nvlink_bytes_per_second"]
    assert rates == {"tx": 2**30 / 2.0, "rx": 2**31 / 2.0}, rates
    now[0] += 2.0
    idle = reader.read().gpus[0].labelled["fsdpmon_gpu_nvlink_bytes_per_second"]
    assert idle == {"tx": 0.0, "rx": 0.0}, "no traffic is a rate of 0"
    same_instant = reader.read().gpus[0].labelled  # no time passed: no rate to tell
    assert "fsdpmon_gpu_nvlink_bytes_per_second" not in same_instant, same_instant
    assert fake.calls["nvmlGpmQueryDeviceSupport"] == 1, "GPM support is asked once"


def test_a_field_value_is_read_as_the_type_nvml_says_it_is() -> None:
    """nvmlFieldValue_t holds a union; the other bytes may hold anything (set here to ones),
    so only the member of the declared type gives the value."""
    from fsdpmon.exporters.nvml_fields import _field_number

    cases = [(pynvml.NVML_VALUE_TYPE_DOUBLE, "dVal", 2.5),
             (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", 7),
             (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG, "ulVal", 2**40 + 9),
             (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal", 2**50 + 3),
             (pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, "sllVal", -5),
             (pynvml.NVML_VALUE_TYPE_SIGNED_INT, "siVal", -6),
             (pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT, "usVal", 11)]
    for kind, member, value in cases:
        entry = pynvml.c_nvmlFieldValue_t()
        entry.value.ullVal = 2**64 - 1  # every byte set
        setattr(entry.value, member, value)
        entry.valueType = kind
        assert _field_number(entry) == value, (member, _field_number(entry))


def test_not_supported_fields_are_absent_and_not_asked_again() -> None:
    gpus = _gpus(2)
    gpus[1].unsupported |= {"nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetPowerUsage",
                            "memory_temp", "nvmlGpmQueryDeviceSupport"}
    gpus[1].gpm_supported = False
    fake = FakeNvml(gpus)
    reader = _open(fake)
    for _ in range(3):
        reading = reader.read()
    full, partial = reading.gpus
    assert partial.up and reading.errors == 0
    assert "fsdpmon_gpu_power_watts" not in partial.values
    assert "fsdpmon_gpu_memory_temperature_celsius" not in partial.values
    assert "fsdpmon_gpu_ecc_errors_total" not in partial.labelled
    assert "fsdpmon_gpu_power_watts" in full.values
    assert partial.values["fsdpmon_gpu_temperature_celsius"] == 64  # the rest still served
    # NotSupported is permanent: asked once on GPU 1, three times on GPU 0.
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 4


def test_function_not_found_degrades_to_older_calls_or_drops_the_field() -> None:
    fake = FakeNvml(_gpus(2), missing_functions={
        "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetPcieReplayCounter",
    })
    reader = _open(fake)
    reader.read()
    gpu = reader.read().gpus[0]
    assert gpu.values["fsdpmon_gpu_memory_used_bytes"] == 69 * 1024 * MIB  # v1 memory info
    assert "fsdpmon_gpu_memory_reserved_bytes" not in gpu.values  # only v2 has it
    assert gpu.labelled["fsdpmon_gpu_clock_event_active"]["sw_power_cap"] == 1  # old name
    assert "fsdpmon_gpu_pcie_replay_errors_total" not in gpu.values
    assert fake.calls["nvmlDeviceGetPcieReplayCounter"] == 1  # disabled on every GPU after one


def test_a_driver_older_than_pynvml_still_lists_the_processes() -> None:
    """pynvml asks for nvmlDeviceGetComputeRunningProcesses_v3; a driver without it makes the
    unversioned call raise NVMLLibraryMismatchError, which is no NVMLError: the reader asks
    for _v2 instead, and without that too the process field is dropped, never the GPU."""
    gpus = _gpus(1, processes=[(4242, 1024 * MIB)])
    older = FakeNvml(gpus, missing_functions={"nvmlDeviceGetComputeRunningProcesses_v3"})
    reading = _open(older).read()
    assert reading.gpus[0].up and [p.pid for p in reading.gpus[0].processes] == [4242]
    oldest = FakeNvml(_gpus(1, processes=[(4242, 1024 * MIB)]), missing_functions={
        "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"})
    reading = _open(oldest).read()
    assert reading.gpus[0].up and reading.gpus[0].processes == () and reading.errors == 0
    assert reading.gpus[0].values["fsdpmon_gpu_temperature_celsius"] == 64


def test_lost_gpu_reads_down_and_the_others_go_on() -> None:
    fake = FakeNvml(_gpus(3))
    reader = _open(fake)
    fake.gpus[1].lost = True
    reading = reader.read()
    up = [g.up for g in reading.gpus]
    assert up == [True, False, True]
    lost: GpuSample = reading.gpus[1]
    assert lost.values == {} and lost.identity.uuid.startswith("GPU-00000001")
    fake.gpus[1].lost = False  # a lost GPU needs a reset; the reader does not flap back
    assert [g.up for g in reader.read().gpus] == [True, False, True]


def test_gpu_lost_at_start_is_reported_down() -> None:
    gpus = _gpus(2)
    gpus[0].lost = True
    reader = _open(FakeNvml(gpus))
    reading = reader.read()
    assert [g.up for g in reading.gpus] == [False, True]


def test_nvml_library_missing_means_nvml_down_not_a_crash() -> None:
    reader = NvmlReader(FakeNvml(_gpus(1), library_missing=True))
    assert reader.open() is False
    reading = reader.read()
    assert reading.nvml_up is False and reading.gpus == ()


def test_nvml_that_comes_up_later_is_picked_up(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(_gpus(2), library_missing=True)
    reader = NvmlReader(fake)
    watcher = XidWatcher(reader)
    reader.on_open = watcher.start
    assert reader.open() is False
    assert reader.read().nvml_up is False
    inits = fake.calls["nvmlInit"]
    assert reader.read().nvml_up is False and fake.calls["nvmlInit"] == inits  # not every read
    fake.library_missing = False  # the driver container finished installing
    monkeypatch.setattr("fsdpmon.exporters.nvml.REOPEN_S", 0.0)
    try:
        reading = reader.read()
        assert reading.nvml_up and [g.up for g in reading.gpus] == [True, True]
        fake.emit_xid(1, 31)  # XID events are watched from then on too
        deadline = time.monotonic() + 5
        while not reader.xid_counts(1) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert reader.xid_counts(1) == {"31": 1.0}
    finally:
        watcher.stop()


def test_real_pynvml_without_a_driver_reports_nvml_down() -> None:
    """This machine has no NVIDIA driver: the real library load fails and NVML reads down."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover - only on GPU machines
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present")
    reader = NvmlReader()
    assert reader.open() is False
    assert reader.read().nvml_up is False


def test_unexpected_nvml_errors_are_counted_not_raised() -> None:
    gpus = _gpus(1)
    fake = FakeNvml(gpus)
    reader = _open(fake)

    def broken(gpu: FakeGpu) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_IRQ_ISSUE)

    fake.nvmlDeviceGetPowerUsage = broken  # type: ignore[method-assign]
    reading = reader.read()
    assert reading.errors == 1 and reading.gpus[0].up
    assert "fsdpmon_gpu_power_watts" not in reading.gpus[0].values


def test_xid_events_are_counted_per_gpu_and_code() -> None:
    fake = FakeNvml(_gpus(2))
    reader = _open(fake)
    watcher = XidWatcher(reader)
    assert watcher.start()
    try:
        fake.emit_xid(1, 79)
        fake.emit_xid(1, 79)
        fake.emit_xid(0, 48)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and sum(
            sum(reader.xid_counts(i).values()) for i in (0, 1)) < 3:
            time.sleep(0.02)
    finally:
        watcher.stop()
    reading = reader.read()
    assert reading.gpus[1].labelled["fsdpmon_gpu_xid_errors_total"] == {"79": 2.0}
    assert reading.gpus[0].labelled["fsdpmon_gpu_xid_errors_total"] == {"48": 1.0}


def test_accumulated_clock_event_time_is_read_in_seconds() -> None:
    fake = FakeNvml(_gpus(1))
    gpu = _open(fake).read().gpus[0]
    seconds = gpu.labelled["fsdpmon_gpu_clock_event_seconds_total"]
    ns = fake.gpus[0].clock_event_ns
    assert seconds["sw_power_cap"] == ns[pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP] / 1e9
    assert seconds["sw_thermal_slowdown"] == 2.0 and seconds["hw_thermal_slowdown"] == 0.0
    assert set(seconds) == {"sw_power_cap", "sync_boost", "sw_thermal_slowdown",
                            "hw_thermal_slowdown", "hw_power_brake_slowdown"}


def test_a_driver_without_clock_event_time_leaves_it_out() -> None:
    gpus = _gpus(1)
    gpus[0].clock_event_ns = {}  # before 535 every such field answers NotSupported
    reader = _open(FakeNvml(gpus))
    assert "fsdpmon_gpu_clock_event_seconds_total" not in reader.read().gpus[0].labelled
    assert reader.read().gpus[0].up


def test_a_lost_gpu_keeps_its_xid_counts() -> None:
    """The XID 79 that comes with a GPU falling off the bus is why it reads down."""
    fake = FakeNvml(_gpus(2))
    reader = _open(fake)
    reader.count_xid(1, 79)
    fake.gpus[1].lost = True
    for _ in range(2):  # when it is found lost, and on every read after
        lost = reader.read().gpus[1]
        assert not lost.up and lost.values == {}
        assert lost.labelled == {"fsdpmon_gpu_xid_errors_total": {"79": 1.0}}
