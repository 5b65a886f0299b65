"""Process groups in the collectives' fingerprint (issue 51): a call keys its group by the order
in which the process first used it, so a call moved to another group changes the step's print
and breaks its pattern, while ranks that run one program on groups of one role (HSDP's {0,1}
and {2,3}) print alike. The group counts whether passed by position or by keyword."""

from __future__ import annotations

import inspect
import multiprocessing
import threading
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from fsdpmon.conventions import OPS  # noqa: E402
from fsdpmon.monitor import collectives, fingerprint  # noqa: E402

Call = tuple[str, tuple[Any, ...], dict[str, Any]]


@pytest.fixture()
def fresh(monkeypatch: pytest.MonkeyPatch) -> collectives.CollectiveTimer:
    """A fresh process's wrapper state (no group used yet) with a timer that reads no run queue."""
    monkeypatch.setattr(collectives, "_calls", fingerprint.Calls())
    fingerprint.know_tensors()
    timer = collectives.CollectiveTimer(run_queue=False)
    collectives._calls.timer = timer
    return timer


def noop(*args: Any, **kwargs: Any) -> None:
    return None


def step(timer: collectives.CollectiveTimer, calls: list[Call]) -> tuple[int, int]:
    """(calls, fingerprint) of one step that makes ``calls`` through the wrapper."""
    timer.arm()
    for name, args, kwargs in calls:
        collectives.wrap(name, noop)(*args, **kwargs)
    timer.step_done()
    timer.drain()
    last = collectives.last_step()
    assert last is not None
    return last[0], last[1]


def hsdp(shard: object, replicate: object) -> list[Call]:
    """An HSDP step's calls: all-gathers and a reduce-scatter on the shard group, the
    gradients' all-reduce on the replicate group, a loss all-reduce on the default group."""
    full, part = torch.zeros(8), torch.zeros(4)
    return [("all_gather_into_tensor", (full, part), {"group": shard}),
            ("all_gather_into_tensor", (full, part, shard), {}),
            ("reduce_scatter_tensor", (part, full), {"group": shard}),
            ("all_reduce", (part,), {"group": replicate}),
            ("all_reduce", (torch.zeros(1),), {})]


def two_steps(timer: collectives.CollectiveTimer) -> list[tuple[int, int]]:
    """A rank's first two steps, on group objects of its own (a fresh process)."""
    collectives._calls = fingerprint.Calls()
    collectives._calls.timer = timer
    shard, replicate = object(), object()
    return [step(timer, hsdp(shard, replicate)) for _ in range(2)]


@pytest.mark.parametrize("name, args, kwargs", [
    ("reduce_scatter_tensor", (torch.zeros(4), torch.zeros(8)),
     {"output": torch.zeros(4), "input": torch.zeros(8)}),
    ("all_gather_into_tensor", (torch.zeros(8), torch.zeros(4)),
     {"output_tensor": torch.zeros(8), "input_tensor": torch.zeros(4)}),
    ("all_reduce", (torch.zeros(3, dtype=torch.float16),),
     {"tensor": torch.zeros(3, dtype=torch.float16)}),
])
def test_a_call_made_all_by_keyword_is_sized_as_by_position(
        fresh: collectives.CollectiveTimer, name: str, args: tuple, kwargs: dict) -> None:
    """FSDP2's reduce-scatter passes output= and input= only: its size and dtype still count."""
    seen = []
    for call_args, call_kwargs in ((args, {}), ((), kwargs)):
        collectives.wrap(name, noop)(*call_args, **call_kwargs)
        seen.append((collectives._calls.elems, collectives._calls.dtype))
    assert seen[0] == seen[1] and seen[0][0] > 0, seen


def test_ranks_on_other_groups_of_one_role_print_alike(fresh: collectives.CollectiveTimer) -> None:
    """Ranks 0 and 2 of a 2x2 mesh: other group objects (other ranks, names), one program."""
    rank0, rank2 = two_steps(fresh), two_steps(fresh)
    assert rank0 == rank2 and rank0[0] == rank0[1]


def test_a_call_moved_to_another_group_changes_the_print_and_breaks_the_pattern(
        fresh: collectives.CollectiveTimer) -> None:
    a, b = object(), object()
    base = step(fresh, hsdp(a, b))
    moved = hsdp(a, b)
    moved[3] = ("all_reduce", (torch.zeros(4),), {"group": a})  # the shard group, not replicate
    changed = step(fresh, moved)
    assert changed[0] == base[0] and changed[1] != base[1]
    step(fresh, hsdp(a, b))
    fresh.arm()
    flags = []
    for name, args, kwargs in moved:
        collectives.wrap(name, noop)(*args, **kwargs)
        flags.append(collectives.entered_call()[3])
    assert flags == [0, 0, 0, 1, 0]  # the moved call alone breaks the step before's pattern


def test_a_group_first_used_by_another_thread_takes_no_place_in_the_order(
        fresh: collectives.CollectiveTimer) -> None:
    """An async checkpoint's group, first used off the step's thread at a moment that differs
    by rank, must not shift the step's groups' ordinals."""
    plain = step(fresh, hsdp(object(), object()))
    collectives._calls = fingerprint.Calls()
    collectives._calls.timer = fresh
    fresh.arm()
    saver = threading.Thread(target=collectives.wrap("all_reduce", noop),
                             args=(torch.zeros(2),), kwargs={"group": object()})
    saver.start()
    saver.join()
    fresh.step_done()
    assert step(fresh, hsdp(object(), object())) == plain


def _signature_group_at(name: str) -> int | None:
    fn = getattr(dist, name, None)
    if fn is None:
        return None
    params = list(inspect.signature(fn).parameters)
    return params.index("group")


def test_each_ops_group_position_is_torchs() -> None:
    assert set(collectives.GROUP_AT) == set(OPS)
    for name in collectives.C10D_NAMES:
        at = _signature_group_at(name)
        assert at in (None, collectives.GROUP_AT[name]), name
    private = getattr(dist, "_broadcast_coalesced", None)
    if private is not None:  # a C++ binding: its signature is in its docstring
        assert private.__doc__.split("(", 1)[1].startswith("process_group:")
        assert collectives.GROUP_AT["broadcast_coalesced"] == 0


KEYED = [n for n in OPS if n not in collectives.POINT_TO_POINT]


@pytest.mark.parametrize("name", KEYED)
def test_a_group_by_position_or_keyword_is_one_group(name: str,
                                                     fresh: collectives.CollectiveTimer) -> None:
    """Each op's group counts at its own position or as ``group=``; the default is another."""
    at, group, tensor = collectives.GROUP_AT[name], object(), torch.zeros(6)
    before = (tensor, *[0] * (at - 1)) if at else ()
    default = step(fresh, [(name, before, {})])
    by_position = step(fresh, [(name, (*before, group), {})])
    assert by_position != default
    if name != "broadcast_coalesced":  # DDP passes its process_group by position only
        assert step(fresh, [(name, before, {"group": group})]) == by_position


# -- a real 2-process gloo run ------------------------------------------------------------

STEPS, MOVED_AT = 5, 3


def _rank(rank: int, store: str, out: Any) -> None:
    """Each step: a loss all-reduce on the default group (rank 1 names the world group), then
    one all-reduce on each of two groups, issued async. At MOVED_AT rank 1 issues the one
    meant for group A on group B first: every call still pairs up, at another position."""
    from fsdpmon.monitor import collectives as wrapper

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        groups = dist.new_group([0, 1]), dist.new_group([0, 1])
        timer = wrapper.CollectiveTimer(run_queue=False)
        wrapper.activate(timer)
        prints, flags = [], []
        for i in range(STEPS):
            timer.arm()
            if rank == 0:
                dist.all_reduce(torch.ones(1))
            else:
                dist.all_reduce(torch.ones(1), group=dist.group.WORLD)
            first, second = groups[::-1] if rank == 1 and i == MOVED_AT else groups
            works, off = [], []
            for group in (first, second):
                if rank == 0:
                    works.append(dist.all_reduce(torch.ones(4), group=group, async_op=True))
                else:
                    works.append(dist.all_reduce(torch.ones(4), dist.ReduceOp.SUM, group, True))
                off.append(wrapper.entered_call()[3])
            for work in works:
                work.wait()
            timer.step_done()
            prints.append(wrapper.last_step()[:2])
            flags.append(off)
        out.put((rank, prints, flags))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks_a_call_on_the_other_group_differs_healthy_steps_agree(
        tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, str(tmp_path / "store"), out)) for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        got = dict((rank, (prints, flags)) for rank, prints, flags in
                   (out.get(timeout=120) for _ in procs))
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    (p0, f0), (p1, f1) = got[0], got[1]
    assert [i for i in range(STEPS) if p0[i] != p1[i]] == [MOVED_AT]
    assert p0[MOVED_AT][0] == p1[MOVED_AT][0]  # the same count: only the group tells them apart
    assert f0[MOVED_AT] == [0, 0] and f1[MOVED_AT] == [1, 1]
    assert f1[MOVED_AT + 1] == [1, 1] and f0[MOVED_AT + 1] == [0, 0]  # back: off the step before
