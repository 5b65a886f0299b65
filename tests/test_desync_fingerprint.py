"""The collective wrapper's per-step fingerprint and the waiting call's identity (issue 51):
equal call sequences give equal fingerprints, one extra or different call does not, and the
call that breaks the previous step's pattern at its position says so."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fsdpmon.conventions import DTYPE_NAMES, OPS  # noqa: E402
from fsdpmon.monitor import collectives, fingerprint  # noqa: E402


@pytest.fixture(name="ops")
def ops_fixture(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """Fresh wrapper state, a timer (no run-queue reads) and wrapped no-op collectives."""
    monkeypatch.setattr(collectives, "_calls", fingerprint.Calls())
    fingerprint.know_tensors()
    timer = collectives.CollectiveTimer(run_queue=False)
    collectives._calls.timer = timer
    wrapped = {name: collectives.wrap(name, lambda *a, **k: None)
               for name in ("all_reduce", "all_gather_into_tensor", "all_gather", "barrier",
                            "all_to_all_single", "send")}
    return {"timer": timer, **wrapped}


def step(ops: dict[str, object], calls: list[tuple[str, tuple[object, ...]]]) -> tuple[int, ...]:
    timer = ops["timer"]
    timer.arm()  # type: ignore[attr-defined]
    for name, args in calls:
        ops[name](*args)  # type: ignore[operator]
    timer.step_done()  # type: ignore[attr-defined]
    timer.drain()  # type: ignore[attr-defined]
    last = collectives.last_step()
    assert last is not None
    return last


def normal() -> list[tuple[str, tuple[object, ...]]]:
    out_ = torch.zeros(8)
    return [("all_gather_into_tensor", (out_, torch.zeros(4))),
            ("all_reduce", (torch.zeros(1024),)), ("barrier", ())]


def test_equal_steps_equal_fingerprints(ops: dict[str, object]) -> None:
    first, second = step(ops, normal()), step(ops, normal())
    assert first[:2] == second[:2] and first[0] == 3
    assert second[2] - first[2] == 3  # the sequence number at the step's end moved by 3


def test_one_extra_call_changes_count_and_fingerprint(ops: dict[str, object]) -> None:
    base = step(ops, normal())
    extra = step(ops, [*normal(), ("all_reduce", (torch.zeros(1),))])
    assert extra[0] == base[0] + 1 and extra[1] != base[1]


@pytest.mark.parametrize("args", [(torch.zeros(1025),), (torch.zeros(1024, dtype=torch.bfloat16),)])
def test_size_or_dtype_changes_fingerprint(ops: dict[str, object], args: tuple[object]) -> None:
    base = step(ops, normal())
    calls = normal()
    calls[1] = ("all_reduce", args)
    changed = step(ops, calls)
    assert changed[0] == base[0] and changed[1] != base[1]


def test_op_changes_fingerprint_same_size(ops: dict[str, object]) -> None:
    a = step(ops, [("all_reduce", (torch.zeros(4),))])
    b = step(ops, [("all_gather_into_tensor", (torch.zeros(4), torch.zeros(2)))])
    assert a[0] == b[0] and a[1] != b[1]


def test_waiting_call_identity(ops: dict[str, object]) -> None:
    ops["all_gather"]([torch.zeros(3)], torch.zeros(6, dtype=torch.float16))  # type: ignore[operator]
    code, elems, dtype, _ = collectives.entered_call()
    assert OPS[code - 1] == "all_gather"
    assert (elems, DTYPE_NAMES[dtype - 1]) == (6, "float16")


def test_off_pattern_only_where_the_step_differs(ops: dict[str, object]) -> None:
    step(ops, normal())
    timer = ops["timer"]
    timer.arm()  # type: ignore[attr-defined]
    seen = []
    for name, args in normal():
        ops[name](*args)  # type: ignore[operator]
        seen.append(collectives.entered_call()[3])
    ops["all_reduce"](torch.zeros(1))  # type: ignore[operator]
    seen.append(collectives.entered_call()[3])  # beyond the previous step's calls
    assert seen == [0, 0, 0, 1]


def test_other_op_at_a_position_is_off_pattern(ops: dict[str, object]) -> None:
    step(ops, normal())
    ops["timer"].arm()  # type: ignore[attr-defined]
    ops["all_reduce"](torch.zeros(8))  # type: ignore[operator]  # where all_gather_into_tensor was
    assert collectives.entered_call()[3] == 1


def test_calls_between_steps_are_not_in_the_fingerprint(ops: dict[str, object]) -> None:
    base = step(ops, normal())
    ops["all_reduce"](torch.zeros(2))  # type: ignore[operator]  # a log step's gather: not armed
    again = step(ops, normal())
    assert again[:2] == base[:2] and again[2] == base[2] + 4


def test_a_call_beyond_the_previous_steps_calls_is_off_pattern_whatever_was_there(
        ops: dict[str, object]) -> None:
    """After steps of 4, 4 and 3 calls, the spare slot still holds the 4th call's key from two
    steps before: a 4th call is still beyond the step before, so off its pattern."""
    four = [*normal(), ("all_reduce", (torch.zeros(1),))]
    for calls in (four, four, normal()):
        step(ops, calls)
    ops["timer"].arm()  # type: ignore[attr-defined]
    flags = []
    for name, args in four:
        ops[name](*args)  # type: ignore[operator]
        flags.append(collectives.entered_call()[3])
    assert flags == [0, 0, 0, 1]


def test_a_step_armed_again_starts_its_fingerprint_over(ops: dict[str, object]) -> None:
    base = step(ops, normal())
    ops["timer"].arm()  # type: ignore[attr-defined]
    ops["all_reduce"](torch.zeros(2))  # type: ignore[operator]  # a step neither done nor aborted
    assert step(ops, normal())[:2] == base[:2]



def test_another_threads_call_in_the_step_is_not_in_its_fingerprint(ops: dict[str, object]) -> None:
    import threading

    base = step(ops, normal())
    timer = ops["timer"]
    timer.arm()  # type: ignore[attr-defined]
    side = threading.Thread(target=ops["all_reduce"], args=(torch.zeros(3),))  # async save's
    side.start()
    side.join()
    for name, args in normal():
        ops[name](*args)  # type: ignore[operator]
    timer.step_done()  # type: ignore[attr-defined]
    last = collectives.last_step()
    assert last is not None and last[:2] == base[:2] and last[2] == base[2] + 4


def test_an_all_to_all_keys_its_op_not_its_uneven_size(ops: dict[str, object]) -> None:
    """MoE routing sends each rank another count of tokens: not a desync; another op is."""
    base = step(ops, [("all_to_all_single", (torch.zeros(96), torch.zeros(64)))])
    other = step(ops, [("all_to_all_single", (torch.zeros(32), torch.zeros(64)))])
    assert other[:2] == base[:2]
    reduce = step(ops, [("all_reduce", (torch.zeros(96),))])
    assert reduce[1] != base[1]


def test_point_to_point_calls_are_numbered_not_fingerprinted(ops: dict[str, object]) -> None:
    base = step(ops, normal())
    piped = step(ops, [*normal(), ("send", (torch.zeros(8), 1))])  # a pipeline stage's send
    assert piped[:2] == base[:2] and piped[2] == base[2] + 4
