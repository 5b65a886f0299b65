"""DDP's gradient all-reduce and buffer broadcast, which run from C++, seen by the collective
wrapper (fsdpmon.monitor.ddp): the blocked tail of each backward is wait; the calls are numbered."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from fsdpmon.monitor import collectives
from fsdpmon.monitor.collectives import CollectiveTimer
from fsdpmon.monitor.ddp import blocked_tails


def test_a_backward_blocks_from_its_last_launch_to_its_last_completion():
    # buckets launched at 1, 2 and (the last) 3; done at 1.5, 3.5 and 5 (the first two while
    # the backward still computed)
    assert blocked_tails([3.0], [(0, 1.5), (0, 3.5), (0, 5.0)]) == pytest.approx(2.0)
    # a bucket done just before or just after the compute's end: 0 vs a little
    assert blocked_tails([3.0], [(0, 2.9)]) == 0.0
    assert blocked_tails([3.0], [(0, 3.1)]) == pytest.approx(0.1)


def test_backwards_add_and_only_their_tails_count():
    # two backwards in a step (accumulation without no_sync): 0.5 after the first, 0.25 after
    # the second; the first bucket of each (done before the compute ended) adds nothing
    done = [(0, 1.5), (0, 2.5), (1, 9.0), (1, 10.25)]
    assert blocked_tails([2.0, 10.0], done) == pytest.approx(0.75)


def test_a_backward_still_pending_counts_nothing():
    assert blocked_tails([], [(0, 1.5)]) == 0.0  # its last bucket not launched yet
    assert blocked_tails([2.0, 5.0], [(0, 2.5)]) == pytest.approx(0.5)  # the second pending
    assert blocked_tails([], []) == 0.0


class _Buffered(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.register_buffer("scale", torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


@pytest.fixture
def group(tmp_path):
    timer = CollectiveTimer()
    collectives.activate(timer)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        yield timer
    finally:
        dist.destroy_process_group()
        collectives.activate(None)


def test_ddp_gets_the_hook_at_its_first_forward_and_its_calls_are_numbered_and_timed(group):
    model = DDP(_Buffered())  # constructed after install: its state broadcast is numbered
    assert collectives.last_entered()[0] == "broadcast_coalesced"
    assert not model._comm_hooks
    seq = collectives.last_entered()[1]
    group.arm()
    model(torch.randn(4, 8)).sum().backward()
    assert [h.__name__ for h, _ in model._comm_hooks] == ["fsdpmon_allreduce_hook"]
    # the buffers' broadcast before the forward, then one all-reduce for the one bucket
    assert collectives.last_entered() == ("all_reduce", seq + 2)
    assert group.calls == 2, f"{group.calls} calls counted in the step, 2 made"
    assert len(group._backward_ends) == len(group._completed) == 1
    group.step_done()
    (wait,) = group.drain().collective
    assert wait > 0.0, "the all-reduce's blocked tail and the broadcast count as wait"
    grads = [p.grad for p in model.parameters()]
    plain = _Buffered()
    plain.load_state_dict(model.module.state_dict())
    plain(torch.randn(4, 8))  # (grads of a world of one: the hook's average changes nothing)
    assert all(g is not None for g in grads)


def test_a_ddp_with_its_own_hook_keeps_it(group):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    model = DDP(_Buffered())
    model.register_comm_hook(None, allreduce_hook)
    group.arm()
    model(torch.randn(4, 8)).sum().backward()
    assert [h for h, _ in model._comm_hooks] == [allreduce_hook]
    assert group._completed == [], "a user's hook is not timed (documented limit)"
    group.step_done()
