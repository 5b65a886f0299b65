"""collective_desync from the published evidence (issue 51): ranks waiting in different calls
at one collective number, and ranks whose step fingerprints differ. A case on each side of
each bound; the culprit is the rank that did otherwise, never the one that only waits."""

from __future__ import annotations

import dataclasses

import pytest

from fsdpmon.conventions import DESYNC_PATTERN_STEPS, DTYPE_NAMES, OP_CODES, OPS, decoded
from fsdpmon.diagnose.desync_rules import call_text, fingerprint_mismatch, waiting_mismatch
from fsdpmon.diagnose.stacks import RankStack
from fsdpmon.job.snapshot import JobSnapshot, RankRow

REDUCE = (OPS.index("all_reduce") + 1, 1024, DTYPE_NAMES.index("float32") + 1)
GATHER = (OPS.index("all_gather_single") + 1, 4096, DTYPE_NAMES.index("bfloat16") + 1)


def waiting(rank: int, call: tuple[int, int, int], off: bool = False, seq: int = 4862,
            stalled: bool = True, inside: bool = True) -> RankRow:
    return RankRow(rank=rank, step=811, stalled=stalled, in_collective=inside,
                   collective_entered=seq, entered_op=call[0], entered_elements=call[1],
                   entered_dtype=call[2], entered_off_pattern=off)


def snap(*rows: RankRow, t: float = 100.0) -> JobSnapshot:
    return JobSnapshot(time=t, source="targets", ranks=rows)


def test_call_text_reads_the_codes():
    assert call_text(*REDUCE) == "all_reduce 1,024 float32"
    assert call_text(*GATHER) == "all_gather_single 4,096 bfloat16"
    assert call_text(OPS.index("barrier") + 1, 0, 0) == "barrier"


@pytest.mark.parametrize(("code", "name"), [
    (None, None), (0, None), (1, OPS[0]), (len(OPS), OPS[-1]), (len(OPS) + 1, None), (-1, None),
])
def test_a_code_decodes_from_1_and_an_unknown_one_to_nothing(code, name):
    assert decoded(OPS, code) == name, (code, decoded(OPS, code), name)
    if name is not None:  # and the encoding is its inverse
        assert OP_CODES[name] == code, (name, OP_CODES[name], code)


def test_two_ranks_in_different_calls_name_the_one_off_its_pattern():
    found = waiting_mismatch(snap(waiting(0, GATHER), waiting(1, REDUCE, off=True)))
    assert found is not None and found.culprits == (1,)
    assert found.sides == ("rank 1 all_reduce 1,024 float32",
                           "rank 0 all_gather_single 4,096 bfloat16")
    assert found.where == "at collective #4862 (step 812)"


def test_the_pattern_decides_not_the_rank_number():
    found = waiting_mismatch(snap(waiting(0, REDUCE, off=True), waiting(1, GATHER)))
    assert found is not None and found.culprits == (0,)


@pytest.mark.parametrize("offs", [(False, False), (True, True)])
def test_two_ranks_that_cannot_be_told_apart_name_nobody(offs):
    found = waiting_mismatch(snap(waiting(0, GATHER, off=offs[0]), waiting(1, REDUCE, off=offs[1])))
    assert found is not None and found.culprits == ()


@pytest.mark.parametrize("other", [(*GATHER[:2], 1), (GATHER[0], 4097, GATHER[2])])
def test_the_same_op_with_another_size_or_dtype_is_a_mismatch(other):
    found = waiting_mismatch(snap(waiting(0, GATHER), waiting(1, other, off=True)))
    assert found is not None and found.culprits == (1,)


@pytest.mark.parametrize("rows", [
    (waiting(0, GATHER), waiting(1, GATHER, off=True)),            # the same call: a plain hang
    (waiting(0, GATHER), waiting(1, REDUCE, off=True, seq=4861)),  # another number: behind
    (waiting(0, GATHER), waiting(1, REDUCE, off=True, stalled=False)),  # moving: no evidence
    (waiting(0, GATHER), waiting(1, REDUCE, off=True, inside=False)),   # not in a call now
])
def test_no_mismatch_without_different_calls_at_one_stalled_number(rows):
    assert waiting_mismatch(snap(*rows)) is None


def test_ranks_waiting_in_one_all_to_all_of_uneven_sizes_are_no_desync():
    a2a = OPS.index("all_to_all_single") + 1
    rows = [waiting(r, (a2a, 100 + r, 1)) for r in range(3)]
    assert waiting_mismatch(snap(*rows)) is None
    other = waiting_mismatch(snap(*rows[:2], waiting(2, REDUCE)))
    assert other is not None and other.culprits == (2,)


def test_four_ranks_name_the_minority_and_never_a_waiting_rank():
    rows = [waiting(r, GATHER) for r in range(3)] + [waiting(3, REDUCE)]
    found = waiting_mismatch(snap(*rows))
    assert found is not None and found.culprits == (3,)
    assert "the minority: 3 of 4" in found.why
    tie = waiting_mismatch(snap(waiting(0, GATHER), waiting(1, GATHER), waiting(2, REDUCE),
                                waiting(3, REDUCE)))
    assert tie is not None and tie.culprits == ()


def test_the_stacks_give_the_op_where_rows_do_not():
    rows = [RankRow(rank=r, step=811, stalled=True) for r in (0, 1)]
    stacks = [RankStack(0, stalled=True, op="all_gather_single", seq=4862),
              RankStack(1, stalled=True, op="all_reduce", seq=4862)]
    found = waiting_mismatch(snap(*rows), stacks)
    assert found is not None and set(found.sides) == {"rank 0 all_gather_single",
                                                      "rank 1 all_reduce"}
    same = [dataclasses.replace(stacks[1], op="all_gather_single")]
    assert waiting_mismatch(snap(*rows), [stacks[0], *same]) is None
    # one rank says its whole call, the other only its op (an older monitor): ops compared
    mixed = (waiting(0, GATHER), RankRow(rank=1, step=811, stalled=True))
    assert waiting_mismatch(snap(*mixed), [same[0]]) is None
    assert waiting_mismatch(snap(*mixed), [stacks[1]]) is not None


def printed(rank: int, step: int, calls: int = 24, fp: int = 0xABC, end: int | None = None,
            ) -> RankRow:
    return RankRow(rank=rank, step=step, step_collectives=calls, step_fingerprint=fp,
                   step_end_seq=step * 30 if end is None else end)


def history(per_step) -> list[JobSnapshot]:
    """One snapshot per step: per_step(step) → the rows of that step."""
    return [snap(*per_step(s), t=100.0 + s) for s in range(1, 9)]


def test_equal_fingerprints_are_no_desync():
    assert fingerprint_mismatch(history(lambda s: [printed(r, s) for r in range(4)])) is None


def test_two_ranks_name_the_rank_whose_step_broke_its_pattern():
    def rows(s):
        odd = s == 6
        return [printed(0, s), printed(1, s, calls=25 if odd else 24, fp=0xDEF if odd else 0xABC,
                                       end=s * 30 + (1 if s >= 6 else 0))]
    found = fingerprint_mismatch(history(rows))
    assert found is not None and found.culprits == (1,) and found.where.startswith("at step 6")
    assert found.sides[0].startswith("rank 1 25 collectives")


def test_four_ranks_name_the_minority_fingerprint():
    def rows(s):
        return [printed(r, s, fp=0xDEF if (r == 2 and s >= 4) else 0xABC) for r in range(4)]
    found = fingerprint_mismatch(history(rows))
    assert found is not None and found.culprits == (2,) and found.where.startswith("at step 4")


def test_counts_that_move_apart_at_equal_steps_are_a_desync():
    def rows(s):  # the odd step itself was never sampled: only the numbers tell
        return [printed(r, s, end=s * 30 + (1 if (r == 3 and s >= 5) else 0)) for r in range(4)]
    found = fingerprint_mismatch(history(rows))
    assert found is not None and found.culprits == (3,) and found.where.startswith("at step 5")
    assert "numbered its collectives otherwise" in found.where


@pytest.mark.parametrize(("before", "named"), [(DESYNC_PATTERN_STEPS - 1, ()),
                                               (DESYNC_PATTERN_STEPS, (1,))])
def test_a_pattern_needs_its_steps_before(before, named):
    odd_step = before + 1

    def rows(s):
        fp = 0xDEF if s == odd_step else 0xABC
        return [printed(0, s), printed(1, s, fp=fp)]
    snaps = [snap(*rows(s), t=100.0 + s) for s in range(1, odd_step + 1)]
    found = fingerprint_mismatch(snaps)
    assert found is not None and found.culprits == named


def _stalled_job(calls: dict[int, tuple[tuple[int, int, int], bool]]) -> list[JobSnapshot]:
    """A 4-rank job stalled over the evidence window, each rank inside collective #4862 in
    its call (op, elements, dtype) and off its pattern or not; as the judge reads it."""
    from top_snapshots import REFRESH_S, diagnosis_history

    from fsdpmon.conventions import DIAGNOSIS_EVIDENCE_SECONDS

    stalled = {f"r{r}": {"stalled": True, "heartbeat_age_s": 40.0} for r in range(4)}
    snaps = diagnosis_history(lambda i: {"specs": stalled},
                              int(DIAGNOSIS_EVIDENCE_SECONDS // REFRESH_S) + 2)
    return [dataclasses.replace(s, ranks=tuple(dataclasses.replace(
        r, collective_entered=4862, in_collective=True, entered_op=calls[r.rank][0][0],
        entered_elements=calls[r.rank][0][1], entered_dtype=calls[r.rank][0][2],
        entered_off_pattern=calls[r.rank][1]) for r in s.ranks)) for s in snaps]


def test_a_hang_from_a_desync_is_the_desync_not_a_hang():
    from fsdpmon.diagnose import diagnose

    findings = diagnose(_stalled_job({0: (GATHER, False), 1: (GATHER, False),
                                      2: (REDUCE, True), 3: (GATHER, False)}))
    assert [(f.cause, f.rank) for f in findings] == [("collective_desync", 2)], findings
    assert findings[0].evidence[0].startswith(
        "rank 2 all_reduce 1,024 float32 vs ranks 0, 1, 3 all_gather_single 4,096 bfloat16 "
        "at collective #4862 (step ")
    assert "3 other ranks 0, 1, 3 stalled waiting for it" in findings[0].evidence


def test_a_hang_in_one_call_stays_a_hang():
    from fsdpmon.diagnose import diagnose

    findings = diagnose(_stalled_job({r: (GATHER, False) for r in range(4)}))
    assert [f.cause for f in findings] == ["hang"], findings


def _moving(*rows_at, span: int = 6) -> list[JobSnapshot]:
    return [snap(*rows_at[min(i, len(rows_at) - 1)], t=100.0 + 2 * i) for i in range(span)]


def test_ranks_in_different_calls_through_the_window_are_named_before_their_stall():
    from fsdpmon.diagnose.desync_rules import desync
    from fsdpmon.diagnose.observe import Observations, Places
    from fsdpmon.diagnose.window import Window

    rows = (waiting(0, GATHER, stalled=False), waiting(1, REDUCE, off=True, stalled=False))
    snaps = _moving(rows)
    found = desync(Window(snaps, 10.0), Observations(snaps[-1], 10.0), Places(snaps))
    assert [(f.cause, f.rank) for f in found] == [("collective_desync", 1)]
    # the same two calls, but rank 1 came into its call within the window: not yet
    before = (waiting(0, GATHER, stalled=False), waiting(1, GATHER, stalled=False, seq=4861))
    late = [*_moving(before, span=3), *_moving(rows, span=3)]
    late = [dataclasses.replace(s, time=100.0 + 2 * i) for i, s in enumerate(late)]
    assert desync(Window(late, 10.0), Observations(late[-1], 10.0), Places(late)) == []


def test_counts_apart_for_a_while_then_together_again_are_no_desync():
    def rows(s):  # another thread's call counted before one rank's step ended, not the other's
        return [printed(r, s, end=s * 30 + (1 if (r == 1 and s == 5) else 0)) for r in range(2)]
    assert fingerprint_mismatch(history(rows)) is None


def test_steps_of_another_restart_are_not_compared():
    """Step 6 made twice: before the restart (rank 0 sampled there) and after it, restored
    from step 2 and numbering from scratch (rank 1 sampled there): not one step."""
    def at(rank, s, restarts):
        return dataclasses.replace(printed(rank, s, end=s * 30 - 7 * restarts), restarts=restarts)
    pre = [snap(at(0, s, 0), *([at(1, s, 0)] if s < 6 else []), t=100.0 + s) for s in range(1, 7)]
    post = [snap(*([at(0, s, 1)] if s < 6 else []), at(1, s, 1), t=200.0 + s)
            for s in range(3, 7)]
    assert fingerprint_mismatch([*pre, *post]) is None


def test_the_call_site_of_the_culprit_is_evidence_and_the_waiting_ranks_stack_is_not():
    from fsdpmon.diagnose.desync_rules import desync
    from fsdpmon.diagnose.observe import Observations, Places
    from fsdpmon.diagnose.stacks import Frame
    from fsdpmon.diagnose.window import Window

    snaps = _moving((waiting(0, GATHER), waiting(1, REDUCE, off=True)))
    stacks = [RankStack(0, stalled=True, op="all_gather_single", seq=4862,
                        frames=(Frame("/w/train.py", 170, "train_step"),)),
              RankStack(1, stalled=True, op="all_reduce", seq=4862,
                        frames=(Frame("/w/train.py", 170, "train_step"),
                                Frame("/w/patch.py", 32, "desynced")))]
    obs = Observations(snaps[-1], 10.0, stalled={0, 1})
    found, = desync(Window(snaps, 10.0), obs, Places(snaps), stacks)
    sites = [e for e in found.evidence if e.startswith("call site:")]
    assert sites == ["call site: rank 1 at patch.py:32 desynced (last collective #4862 "
                     "all_reduce)"], found.evidence
    assert "1 other rank 0 stalled waiting for it" in found.evidence and not obs.stalled


def test_one_refresh_tells_a_desync_from_a_hang():
    """`top --once` (the glance): stalled ranks in different calls at one number are the
    desync, named on its culprit, and not also a hang; in one call they are a hang."""
    from fsdpmon.diagnose.engine import judge

    desynced = judge([snap(waiting(0, GATHER), waiting(1, REDUCE, off=True))])
    assert [(f.cause, f.rank) for f in desynced.glance] == [("collective_desync", 1)]
    assert desynced.glance[0].evidence[0].startswith("rank 1 all_reduce 1,024 float32 vs rank 0")
    hung = judge([snap(waiting(0, GATHER), waiting(1, GATHER, off=True))])
    assert [f.cause for f in hung.glance] == ["hang"]


def _broke(row: RankRow, step: int, **call) -> RankRow:
    """``row`` with its published pattern break at ``step``: by default an extra all_reduce of
    1 float32 where the step before made an all_gather_single of 65,600."""
    base = dict(break_step=step, break_index=5, break_op=REDUCE[0], break_elements=1,
                break_dtype=REDUCE[2], break_expected_op=GATHER[0],
                break_expected_elements=65_600, break_expected_dtype=REDUCE[2],
                break_site="train.py:123 in train_step")
    return dataclasses.replace(row, **{**base, **call})


def _desynced(broke_at: int | None, **call) -> list[JobSnapshot]:
    """Two ranks; rank 1 makes one extra call from step 6 on and says so from ``broke_at``."""
    def rows(s):
        odd = s >= 6
        one = printed(1, s, calls=25 if odd else 24, fp=0xDEF if odd else 0xABC)
        if broke_at is not None and s >= broke_at:
            one = _broke(one, broke_at, **call)
        return [printed(0, s), one]
    return history(rows)


def _call_lines(found) -> list[str]:
    assert found is not None and found.culprits == (1,)
    return [line for line in found.calls if line.startswith("rank 1's")]


def test_the_culprits_own_break_is_evidence_with_both_calls_and_its_site():
    assert _call_lines(fingerprint_mismatch(_desynced(6))) == [
        "rank 1's collective #5 of step 6: all_reduce 1 float32 where its steps before made "
        "all_gather_single 65,600 float32, at train.py:123 in train_step"]


def test_no_break_published_no_call_line():
    assert _call_lines(fingerprint_mismatch(_desynced(None))) == []


@pytest.mark.parametrize(("broke_at", "shown"), [(6, True), (7, False)])
def test_only_a_break_at_or_before_the_step_is_quoted(broke_at, shown):
    assert bool(_call_lines(fingerprint_mismatch(_desynced(broke_at)))) == shown


@pytest.mark.parametrize(("at", "shown"), [(1, True), (0, False)])  # compared from step 1
def test_a_break_before_the_steps_compared_is_not_quoted(at, shown):
    snaps = [dataclasses.replace(s, ranks=tuple(
        dataclasses.replace(r, break_step=at) if r.break_step else r for r in s.ranks))
        for s in _desynced(1)]
    assert bool(_call_lines(fingerprint_mismatch(snaps))) == shown


@pytest.mark.parametrize(("call", "text"), [
    ({"break_expected_op": None, "break_site": ""},
     "rank 1's collective #5 of step 6: all_reduce 1 float32, an extra call past the step "
     "before's 4"),
    ({"break_op": None, "break_site": ""},
     "rank 1's step 6 ended after 4 collectives, where its steps before made one more: "
     "all_gather_single 65,600 float32"),
    ({"break_site": "x.py:1 in f\n\x1b[31mred"},
     "rank 1's collective #5 of step 6: all_reduce 1 float32 where its steps before made "
     "all_gather_single 65,600 float32, at x.py:1 in f??[31mred"),
])
def test_an_extra_call_a_missing_call_and_a_hostile_site(call, text):
    assert _call_lines(fingerprint_mismatch(_desynced(6, **call))) == [text]


def test_the_break_reaches_the_finding_after_the_culprit():
    from fsdpmon.diagnose.desync_rules import desync
    from fsdpmon.diagnose.observe import Observations, Places
    from fsdpmon.diagnose.window import Window

    snaps = _desynced(6)
    found, = desync(Window(snaps, 10.0), Observations(snaps[-1], 10.0), Places(snaps))
    culprit = next(i for i, e in enumerate(found.evidence) if e.startswith("culprit: rank 1"))
    assert found.evidence[culprit + 1].startswith("rank 1's collective #5 of step 6:")
