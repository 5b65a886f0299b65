"""A stall's culprit from the flight recorder's start records (fsdpmon/diagnose/after.py), the
way `incidents` from files judges it, against the live judge's order: unresponsive, then behind
in collectives, then the one odd phase of a majority.

Found by tests/test_doors_agree.py on the recorded `hang (data)`: rank 1 hung in its data
loader (phase data, last collective #492) while rank 0 waited in the next all-gather (phase
forward, #493). With two ranks in two phases the "odd phase" was whichever rank recorded the
stall second, so the files named rank 0 where every other door named rank 1.
"""

from __future__ import annotations

import pytest

from fsdpmon.conventions import STALL_SEEN_LATE_SECONDS
from fsdpmon.diagnose.after import stall_from_records

SINCE, THRESHOLD = 1000.0, 8.0


def start(rank: int, phase: str, seq: int | None, late_s: float = 0.0) -> dict:
    record = {"kind": "stall", "state": "start", "rank": rank, "phase": phase,
              "since": SINCE, "threshold": THRESHOLD,
              "time": SINCE + THRESHOLD + late_s + 0.1 * rank}
    if seq is not None:
        record["last_collective"] = {"op": "all_gather", "seq": seq}
    return record


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_the_rank_behind_in_collectives_whichever_recorded_first(order):
    records = {0: start(0, "forward", 493), 1: start(1, "data", 492)}
    judged = stall_from_records([records[r] for r in order], [0, 1])
    assert (judged.cause, judged.rank) == ("hang", 1)


def test_two_ranks_in_two_phases_at_one_collective_name_nobody():
    records = [start(1, "data", 492), start(0, "forward", 492)]
    judged = stall_from_records(records, [0, 1])
    assert (judged.cause, judged.rank) == ("hang", None)


def test_the_odd_phase_of_a_majority_without_sequence_numbers():
    records = [start(2, "data", None), start(0, "forward", None), start(1, "forward", None)]
    assert stall_from_records(records, [0, 1, 2]).rank == 2


@pytest.mark.parametrize("late_s, unresponsive", [
    (STALL_SEEN_LATE_SECONDS + 1.0, True), (STALL_SEEN_LATE_SECONDS - 1.0, False)])
def test_a_rank_that_saw_the_stall_late_is_unresponsive_before_it_is_behind(late_s,
                                                                           unresponsive):
    records = [start(0, "forward", 493), start(1, "backward", 492, late_s)]
    judged = stall_from_records(records, [0, 1])
    assert (judged.cause, judged.rank) == (
        ("rank_unresponsive", 1) if unresponsive else ("hang", 1))


def waiting(rank: int, seq: int, op: str, elements: int, off: bool) -> dict:
    """A stall record of the flight recorder at stall time, with the call it waits in."""
    record = start(rank, "forward", seq)
    record["call"] = {"op": op, "elements": elements, "dtype": "float32", "off_pattern": off}
    return record


@pytest.mark.parametrize("off_rank", [0, 1])
def test_one_number_two_calls_is_a_desync_on_the_rank_off_its_pattern(off_rank):
    starts = [waiting(0, 238, "all_gather_single", 65600, off_rank == 0),
              waiting(1, 238, "all_reduce", 1, off_rank == 1)]
    judged = stall_from_records(starts, [0, 1])
    assert (judged.cause, judged.rank) == ("collective_desync", off_rank), judged
    assert judged.evidence == ("rank 0 all_gather_single 65,600 float32 vs rank 1 all_reduce 1 "
                               "float32 at collective #238",), judged.evidence


def test_two_calls_and_no_pattern_broken_name_no_culprit_at_two_ranks():
    starts = [waiting(0, 238, "all_gather_single", 65600, False),
              waiting(1, 238, "all_reduce", 1, False)]
    judged = stall_from_records(starts, [0, 1])
    assert (judged.cause, judged.rank) == ("collective_desync", None), judged


def test_the_rank_alone_in_its_call_among_three_is_the_culprit():
    starts = [waiting(0, 90, "all_gather_single", 64, False),
              waiting(1, 90, "all_gather_single", 64, False),
              waiting(2, 90, "all_gather_single", 128, False)]  # a size apart is a call apart
    judged = stall_from_records(starts, [0, 1, 2])
    assert (judged.cause, judged.rank) == ("collective_desync", 2), judged


@pytest.mark.parametrize("second", [(238, "all_gather_single", 65600), (239, "all_reduce", 1)])
def test_one_call_at_one_number_or_calls_at_two_numbers_are_no_desync(second):
    seq, op, elements = second
    starts = [waiting(0, 238, "all_gather_single", 65600, False),
              waiting(1, seq, op, elements, True)]
    judged = stall_from_records(starts, [0, 1])
    assert judged.cause == "hang", judged  # one call: the same wait; two numbers: one is behind


def test_records_without_the_call_are_judged_as_before():
    starts = [start(0, "forward", 238), start(1, "forward", 238)]
    assert stall_from_records(starts, [0, 1]).cause == "hang"


def test_an_all_to_all_whose_sizes_differ_by_rank_is_no_desync():
    # MoE token routing sends uneven splits: the live rule leaves an all-to-all's size out, and
    # the files judge by that same comparison (it once compared the sizes and named a desync)
    starts = [waiting(0, 77, "all_to_all_single", 4096, False),
              waiting(1, 77, "all_to_all_single", 1536, True)]
    assert stall_from_records(starts, [0, 1]).cause == "hang"
