"""The collective wrapper: each call numbered (stack evidence) and, while a step is open, the time
inside it counted as wait (straggler attribution); one wrapper per collective."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest
import torch.distributed as dist

from fsdpmon.monitor import collectives
from fsdpmon.monitor.collectives import CollectiveTimer
from fsdpmon.monitor.schedstat import RunQueueDelay

NAP = 0.02


@pytest.fixture
def timer():
    t = CollectiveTimer()
    collectives.activate(t)
    yield t
    collectives.activate(None)


def napping(*args, async_op: bool = False, **kwargs):
    time.sleep(NAP)


def bracketed(call) -> float:
    """Seconds ``call()`` took, read by the test around it: the most a wrapper inside it can
    have counted (its own reads are within these)."""
    begun = time.perf_counter()
    call()
    return time.perf_counter() - begun


def test_counts_the_time_inside_calls_made_during_a_step(timer):
    wrapped = collectives.wrap("all_reduce", napping)
    wrapped()  # between steps: not counted
    timer.arm()
    counted = bracketed(wrapped)
    wrapped(async_op=True)  # returns a Work waited on elsewhere: not counted here
    timer.armed = False
    timer.step_done()
    timer.arm()
    wrapped()
    timer.armed = False
    timer.step_done(completed=False)  # an aborted step is forgotten
    (wait,) = timer.drain().collective
    # one nap counted: at least the nap, at most the one call around it (another nap counted
    # too would be a nap past it)
    assert NAP <= wait <= counted, f"wait {wait:.4f} s for one {NAP} s call of {counted:.4f} s"
    assert timer.calls == 2 and timer.drain().collective == []


def test_a_collective_calling_another_is_counted_once(timer):
    inner = collectives.wrap("all_gather", napping)
    outer = collectives.wrap("all_gather_object", lambda: (inner(), inner()))
    seq = collectives._calls.seq
    timer.arm()
    took = bracketed(outer)
    timer.step_done()
    (wait,) = timer.drain().collective
    # the two inner naps, counted once: inside the outer call (twice would be two naps over)
    assert 2 * NAP <= wait <= took and timer.calls == 1, (wait, took, timer.calls)
    assert collectives.last_entered() == ("all_gather_object", seq + 1)


def test_install_wraps_the_entry_points_fsdp_and_dtensor_call_once():
    from torch.distributed import _functional_collectives as funcol

    collectives.install()
    first = dist.all_gather_single if hasattr(dist, "all_gather_single") else dist.all_reduce
    collectives.install()  # idempotent
    again = dist.all_gather_single if hasattr(dist, "all_gather_single") else dist.all_reduce
    assert first is again and getattr(first, collectives._WRAPPED)
    assert getattr(dist.distributed_c10d.reduce_scatter_tensor, collectives._WRAPPED)
    assert getattr(funcol.wait_tensor, collectives._WRAPPED)
    # one layer: what the wrapper calls is torch's own function, not another wrapper
    for fn in (first, dist.distributed_c10d.reduce_scatter_tensor, funcol.wait_tensor):
        assert not getattr(fn.__wrapped__, collectives._WRAPPED, False), fn.__name__


def test_real_collectives_are_numbered_once_each_in_order_and_timed_in_a_step(tmp_path, timer):
    import torch

    assert collectives.install() and collectives.install()  # idempotent
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        before = collectives.last_entered()
        first = before[1] if before else 0
        dist.all_reduce(torch.ones(2))  # between steps: numbered, not timed
        assert collectives.last_entered() == ("all_reduce", first + 1)
        assert timer.calls == 0, timer.calls
        timer.arm()
        dist.all_gather_object([None], {"x": 1})  # calls all_gather inside: counted once
        dist.barrier()
        timer.armed = False
        assert collectives.last_entered() == ("barrier", first + 3)
        assert timer.calls == 2, f"{timer.calls} calls timed, 2 made in the step"
    finally:
        dist.destroy_process_group()


def test_inactive_wrappers_pass_through():
    collectives.activate(None)
    wrapped = collectives.wrap("all_reduce", lambda x, **kw: x + 1)
    assert wrapped(1, async_op=False) == 2


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


@pytest.mark.skipif(not RunQueueDelay().available or not hasattr(os, "sched_setaffinity"),
                    reason="needs Linux schedstat and CPU affinity")
def test_time_waiting_for_a_cpu_outside_collectives_is_descheduled_not_wait(timer):
    """A step that computes on a CPU shared with a CPU-bound process: its wall time is its own
    CPU time plus the time the kernel ran the other process (run-queue delay); the timer
    reports that delay, outside the collectives, as descheduled; inside a call it is wait."""
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    rival = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(rival.pid, {cpu})
        os.sched_setaffinity(0, {cpu})  # this thread and the rival on one CPU
        deadline = time.monotonic() + 30
        while psutil.Process(rival.pid).cpu_times().user < 0.01:  # the rival spins
            assert time.monotonic() < deadline, "the rival never ran"
            time.sleep(0.005)
        wrapped = collectives.wrap("all_reduce", lambda: _spin(0.05))
        started, cpu_started = time.perf_counter(), time.thread_time()
        timer.arm()
        _spin(0.1)
        wrapped()
        timer.step_done()
        wall, own = time.perf_counter() - started, time.thread_time() - cpu_started
    finally:
        os.sched_setaffinity(0, before)
        rival.kill()
        rival.wait()
    waits = timer.drain()
    (wait,), (off_cpu,) = waits.collective, waits.descheduled
    # Outside the call: 0.1 s of CPU took wall time 0.1 + off_cpu; inside: 0.05 + its delay.
    # Sharing one CPU with a spinning rival, each second of our CPU costs about one of waiting.
    assert off_cpu > 0.25 * 0.1, f"descheduled {off_cpu:.3f} s for 0.1 s CPU beside a rival"
    busy = wall - wait - off_cpu
    # what is left is the CPU time outside the call, up to how stale the kernel's run-queue
    # delay can be when read: it is accounted at context switches and ticks, so each of the
    # two reads may lag by a tick (10 ms at HZ=100, the coarsest Linux runs): 2 ticks
    assert abs(busy - (own - 0.05)) < 0.02, (
        f"busy {busy:.4f} s vs CPU outside the call {own - 0.05:.4f} s (wall {wall:.3f}, wait "
        f"{wait:.3f}, descheduled {off_cpu:.3f})")
