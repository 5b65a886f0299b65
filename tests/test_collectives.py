"""The collective wrapper: each call numbered (stack evidence) and, while a step is open, the time
inside it counted as wait (straggler attribution); one wrapper per collective."""

from __future__ import annotations

import time

import pytest
import torch.distributed as dist

from fsdpmon.monitor import collectives
from fsdpmon.monitor.collectives import CollectiveTimer

NAP = 0.02


@pytest.fixture
def timer():
    t = CollectiveTimer()
    collectives.activate(t)
    yield t
    collectives.activate(None)


def napping(*args, async_op: bool = False, **kwargs):
    time.sleep(NAP)


def test_counts_the_time_inside_calls_made_during_a_step(timer):
    wrapped = collectives.wrap("all_reduce", napping)
    wrapped()  # between steps: not counted
    timer.armed = True
    wrapped()
    wrapped(async_op=True)  # returns a Work waited on elsewhere: not counted here
    timer.armed = False
    timer.step_done()
    timer.armed = True
    wrapped()
    timer.armed = False
    timer.step_done(completed=False)  # an aborted step is forgotten
    (wait,) = timer.drain()
    # one nap counted; the sleep may overrun by scheduling, never undercut
    assert NAP <= wait < 2 * NAP + 0.05, f"wait {wait:.4f} s for one {NAP} s call"
    assert timer.calls == 2 and timer.drain() == []


def test_a_collective_calling_another_is_counted_once(timer):
    inner = collectives.wrap("all_gather", napping)
    outer = collectives.wrap("all_gather_object", lambda: (inner(), inner()))
    seq = collectives._calls.seq
    timer.armed = True
    outer()
    timer.step_done()
    (wait,) = timer.drain()
    assert 2 * NAP <= wait < 4 * NAP + 0.05 and timer.calls == 1, (wait, timer.calls)
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
        timer.armed = True
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
