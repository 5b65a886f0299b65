"""Step and phase timing; on CUDA, no device synchronisation outside log steps."""

from __future__ import annotations

import time

import pytest
import torch

from fsdpmon.monitor import Monitor, MonitorConfig
from fsdpmon.monitor.timing import HostClock, StepTimer


def test_host_timer_measures_steps_and_phases():
    """Each phase's time lies between what it slept and what a clock around it saw.

    sleep() never returns early, so the sleeps bound the phase from below; a perf_counter read
    just outside the timer's own bounds it from above. No constant that holds only on a quiet
    machine: a loaded one oversleeps, and both bounds move with it.
    """
    timer = StepTimer(HostClock())
    outside = {"data": 0.0, "forward": 0.0}
    slept = {"data": 0.01, "forward": 0.02}
    for _ in range(3):
        timer.begin_step()
        for phase, seconds in slept.items():
            t0 = time.perf_counter()
            timer.begin_phase(phase)
            time.sleep(seconds)
            timer.end_phase(phase)
            outside[phase] += time.perf_counter() - t0
        assert timer.end_step() >= sum(slept.values())
    timer.end_phase("never-opened")  # ignored
    times = timer.drain()
    assert len(times.step_seconds) == 3
    assert all(s >= 0.03 for s in times.step_seconds), times.step_seconds
    for phase, seconds in slept.items():
        got = times.phase_seconds[phase]
        assert 3 * seconds <= got <= outside[phase], \
            f"{phase}: {got:.6f}s not within [{3 * seconds:.6f}, {outside[phase]:.6f}]"
    assert timer.drain().step_seconds == []  # a new window


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_no_device_sync_outside_log_steps(tmp_path):
    """50 steps with logging every 10 under sync debug mode "error": any sync the monitor
    made on a non-log step would raise. (An MLP with an MSE loss: the model itself must not
    sync either, which embedding backward can.)"""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                                torch.nn.Linear(1024, 256)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    records: list[dict] = []
    mon = Monitor(MonitorConfig(port=0, log_interval=10, jsonl_path=str(tmp_path / "g.jsonl")),
                  model=model, seq_len=128, tokens_per_step=8 * 128, total_steps=50)
    mon.add_log_listener(records.append)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(50):
            with mon.step():
                with mon.phase("data"):
                    x = torch.randn(8, 128, 256, device="cuda")
                with mon.phase("forward"):
                    loss = (model(x) - x).pow(2).mean()
                with mon.phase("backward"):
                    loss.backward()
                with mon.phase("optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                mon.record(loss=loss.detach(), lr=1e-3)
    finally:
        torch.cuda.set_sync_debug_mode(0)
        mon.close()
    assert mon.internal_errors == 0
    assert [r["step"] for r in records] == [10, 20, 30, 40, 50]
    assert all(r["step_time_s"] > 0 and r["loss"] > 0 for r in records)
    assert all(r["peak_memory_bytes"] > 0 for r in records)
    assert records[-1]["phase_seconds"]["forward"] > 0


class FakeCudaEvent:
    """Stands in for torch.cuda.Event on this GPU-less machine: records host time, and like
    the real one refuses elapsed_time() unless both events were recorded."""

    created = 0

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        FakeCudaEvent.created += 1
        self.at: float | None = None

    def record(self) -> None:
        self.at = time.perf_counter()

    def synchronize(self) -> None:
        pass  # host time: already "reached"

    def elapsed_time(self, end: FakeCudaEvent) -> float:
        if self.at is None or end.at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end.at - self.at) * 1000.0


def test_cuda_marks_are_pooled_and_read_once_per_window(monkeypatch):
    from fsdpmon.monitor.timing import CudaClock

    monkeypatch.setattr(torch.cuda, "Event", FakeCudaEvent)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    FakeCudaEvent.created = 0
    timer = StepTimer(CudaClock())
    for window in range(3):
        for _ in range(5):
            timer.begin_step()
            timer.begin_phase("data")  # host-timed
            timer.end_phase("data")
            timer.begin_phase("forward")  # device-timed
            time.sleep(0.002)
            timer.end_phase("forward")
            timer.end_step()
        times = timer.drain()
        assert len(times.step_seconds) == 5 and all(s >= 0.002 for s in times.step_seconds)
        assert times.phase_seconds["forward"] >= 0.01
        assert "data" in times.phase_seconds
        if window == 0:
            first_window_events = FakeCudaEvent.created
    assert first_window_events == 5 * 4  # 2 per step, 2 per device phase
    assert FakeCudaEvent.created == first_window_events  # later windows reuse the pool
