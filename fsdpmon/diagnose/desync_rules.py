"""collective_desync: ranks that made different collectives, named live (issue 51).

Every rank of a group must make the same collectives in the same order. A collective inside
``if rank == ...`` or a data-dependent branch breaks that: the ranks then wait in different
calls at the same sequence number (a hang the NCCL watchdog reports minutes later, and
PyTorch's flight recorder only once every rank has dumped), or, where the calls happen to
pair up, go on with their counts apart. Two pieces of evidence, both published by the
collective wrapper (fsdpmon.monitor.collectives) with each heartbeat:

- waiting: ranks inside collectives at the same number, but in different calls (op, elements,
  dtype), stalled or in that one call through the whole evidence window (so it is named
  before the stall bound, 120 s by default, passes). The stack evidence's last collective says
  the op too, where rows lack it.
- fingerprints: ranks at the same step whose step made different calls (count and rolling
  hash), or whose sequence number at the step's end differs from some step on to the newest
  (one made more calls before it and never caught up).

The culprit: the rank whose own call breaks the pattern of its step before (the wrapper
compares each call with the previous step's call at the same position), else the minority
when one group of ranks is larger than every other. A rank that only waits in the call its
steps always made is never named; when the sides cannot be told apart, none is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from fsdpmon.conventions import (
    DESYNC_PATTERN_STEPS,
    DTYPE_NAMES,
    OP_CODES,
    OPS,
    UNEVEN,
    Severity,
    decoded,
)
from fsdpmon.diagnose.findings import Finding, ranks_text, waiters, where_all
from fsdpmon.diagnose.observe import Observations, Places
from fsdpmon.diagnose.stacks import RankStack, merge
from fsdpmon.diagnose.window import Window
from fsdpmon.families import printable
from fsdpmon.job.snapshot import JobSnapshot, RankRow

Groups = dict[tuple[int, ...], list[int]]  # what a group of ranks did → its ranks


@dataclass(frozen=True)
class Desync:
    culprits: tuple[int, ...]
    why: str  # how the culprits were told from the others ("" when they were not)
    sides: tuple[str, ...]  # "rank 1 all_reduce 1 float32", the culprits' side first
    where: str  # "at collective #4862 (step 812)" / "at step 812"
    ranks: tuple[int, ...] = ()  # every rank of the differing groups
    calls: tuple[str, ...] = ()  # the culprits' own first calls off their pattern, with site


def call_text(op: int | None, elements: int | None, dtype: int | None) -> str:
    """'all_reduce 1,024 float32' from the published codes (fsdpmon.conventions)."""
    name = decoded(OPS, op) or f"op {op}"
    if not elements and not dtype:
        return name
    return f"{name} {elements or 0:,} {decoded(DTYPE_NAMES, dtype) or ''}".rstrip()


def desync(window: Window, obs: Observations, places: Places,
           stacks: Sequence[RankStack] = ()) -> list[Finding]:
    """The desync finding, if any; it takes the stalled ranks it explains out of ``obs`` (a
    hang caused by a desync is one, not a hang)."""
    found = (waiting_mismatch(window.now, stacks, held(window))
             or fingerprint_mismatch(window.history))
    if found is None:
        return []
    culprits = list(found.culprits)
    evidence = [" vs ".join(found.sides) + f" {found.where}"]
    evidence.append(f"culprit: {ranks_text(culprits)} ({found.why})" if culprits else
                    "which side is wrong cannot be told: no side alone broke the pattern of "
                    "its steps before, and none is a minority")
    evidence += found.calls
    classes = [c for c in merge(stacks) if set(c.ranks) & set(culprits)] if stacks else []
    evidence += [f"call site: {c.describe()}" for c in classes]
    evidence += waiters(obs, set(culprits)) if culprits else _stalled(obs)
    obs.stalled.clear()
    rank = culprits[0] if len(culprits) == 1 else None
    who = ranks_text(culprits) if culprits else "ranks"
    return [Finding("collective_desync", Severity.CRITICAL,
                    f"collective desync: {who} made other collectives than the rest "
                    f"{found.where}", evidence=tuple(evidence), stacks=tuple(classes),
                    **where_all(places, culprits, rank))]


def _stalled(obs: Observations) -> list[str]:
    stalled = sorted(obs.stalled)
    return [f"{ranks_text(stalled)} stalled in it"] if stalled else []


def held(window: Window) -> set[int]:
    """Ranks inside one collective call through the whole evidence window: stuck in it, known
    before their stall bound (max(10 x median step, floor)) says so."""
    return {key[0] for key in window.lasting(lambda snap: {
        (r.rank, r.collective_entered, r.entered_op, r.entered_elements, r.entered_dtype)
        for r in snap.ranks if not r.down and r.in_collective and r.entered_op})}


def waiting_mismatch(now: JobSnapshot, stacks: Sequence[RankStack] = (),
                     stuck: Collection[int] = ()) -> Desync | None:
    """Ranks stalled, or ``stuck`` in one call, that wait in different calls at the same
    collective number."""
    rows = {r.rank: r for r in now.ranks if not r.down and (r.stalled or r.rank in stuck)
            and r.in_collective and r.collective_entered is not None and r.entered_op}
    waiting = {rank: (r.collective_entered, _call(r)) for rank, r in rows.items()}
    told = {s.rank: (s.seq, (OP_CODES[s.op], 0, 0)) for s in stacks  # the stacks' op alone
            if s.stalled and s.seq is not None and s.rank not in waiting and s.op in OP_CODES}
    if told:  # some ranks say their op only: compare every rank's op only
        waiting = {r: (seq, (call[0], 0, 0)) for r, (seq, call) in waiting.items()} | told
    breakers = {r for r, row in rows.items() if row.entered_off_pattern}
    found = calls_apart(waiting, breakers.__contains__)
    if found is None:
        return None
    seq, groups, culprits, why = found
    steps = sorted({rows[r].step for r in rows if rows[r].step is not None})
    step = f" (step {steps[0] + 1})" if len(steps) == 1 else ""
    return Desync(culprits, why, _sides(groups, culprits, call_text),
                  f"at collective #{seq}{step}",
                  tuple(sorted(r for ranks in groups.values() for r in ranks)))


Waiting = dict[int, tuple[int, tuple[int, int, int]]]  # rank → (collective number, its call)


def calls_apart(waiting: Waiting, breaks: Callable[[int], bool]
                ) -> tuple[int, Groups, tuple[int, ...], str] | None:
    """The lowest collective number at which ranks wait in different calls: (that number, its
    calls' groups of ranks, the odd ranks, why them); None where every number has one call.
    Shared by the live rule and the flight recorder's (diagnose/after.py)."""
    by_seq: dict[int, Groups] = {}
    for rank, (seq, call) in sorted(waiting.items()):
        by_seq.setdefault(seq, {}).setdefault(call, []).append(rank)
    for seq, groups in sorted(by_seq.items()):
        if len(groups) > 1:
            return (seq, groups, *odd_ranks(groups, breaks))
    return None


def call_key(op: int | None, elements: int | None, dtype: int | None) -> tuple[int, int, int]:
    """A call as compared across ranks; an all-to-all's size differs by rank where nothing is
    wrong, so it is left out."""
    op = op or 0
    uneven = 0 < op <= len(OPS) and OPS[op - 1] in UNEVEN
    return op, 0 if uneven else elements or 0, dtype or 0


def _call(r: RankRow) -> tuple[int, int, int]:
    return call_key(r.entered_op, r.entered_elements, r.entered_dtype)


def odd_ranks(groups: Groups, breaks: Callable[[int], bool]) -> tuple[tuple[int, ...], str]:
    """The ranks that did otherwise: the one group whose every rank broke its own pattern
    while no other rank did, else the ranks outside the one largest group; () when neither
    tells (two ranks, each or neither breaking its pattern)."""
    breaking = [ranks for ranks in groups.values() if any(breaks(r) for r in ranks)]
    if len(breaking) == 1 and all(breaks(r) for r in breaking[0]):
        return tuple(breaking[0]), "its call breaks the pattern of its steps before"
    sizes = sorted((len(ranks) for ranks in groups.values()), reverse=True)
    if sizes[0] > sizes[1]:
        largest = max(groups.values(), key=len)
        odd = sorted(r for ranks in groups.values() if ranks is not largest for r in ranks)
        return tuple(odd), f"the minority: {len(largest)} of {sum(sizes)} ranks did otherwise"
    return (), ""


def _sides(groups: Groups, culprits: tuple[int, ...],
           text: Callable[..., str]) -> tuple[str, ...]:
    ordered = sorted(groups.items(), key=lambda kv: (not set(kv[1]) & set(culprits), kv[1]))
    return tuple(f"{ranks_text(ranks)} {text(*key)}" for key, ranks in ordered)


Print = tuple[int, int, int]  # a step's (calls, fingerprint, sequence number at its end)
Step = tuple[int, int]  # (the job's restarts, step): a restarted job makes its steps again


def fingerprints(history: Sequence[JobSnapshot]) -> dict[int, dict[Step, Print]]:
    """rank → step → its fingerprint, from every snapshot of the history."""
    out: dict[int, dict[Step, Print]] = {}
    for snap in history:
        for r in snap.ranks:
            if _printed(r):
                out.setdefault(r.rank, {})[(r.restarts or 0, r.step)] = (  # type: ignore[index]
                    r.step_collectives, r.step_fingerprint, r.step_end_seq)  # type: ignore[assignment]
    return out


def _printed(r: RankRow) -> bool:
    return not r.down and None not in (r.step, r.step_collectives, r.step_fingerprint,
                                      r.step_end_seq)


def fingerprint_mismatch(history: Sequence[JobSnapshot]) -> Desync | None:
    """The first step two ranks both published whose calls differ (count and hash); else the
    first step of a difference in the sequence numbers at the steps' ends that lasts to the
    newest step they share (one rank made other calls between steps, and never caught up: a
    call another thread made at another moment on each rank is caught up within a step)."""
    prints = fingerprints(history)
    seen = Counter(step for per_rank in prints.values() for step in per_rank)
    steps = sorted(s for s, count in seen.items() if count > 1)
    for step in steps:
        groups = _groups(prints, step, slice(0, 2))
        if len(groups) > 1:
            return _with_calls(_step_desync(prints, step, groups, "made other collectives"),
                               history, prints, step)
    first = None
    for step in reversed(steps):
        groups = _groups(prints, step, slice(2, 3))
        if len(groups) < 2:
            break
        first = step, groups
    if first is None:
        return None
    return _with_calls(_step_desync(prints, *first, "numbered its collectives otherwise"),
                       history, prints, first[0])


def _groups(prints: dict[int, dict[Step, Print]], step: Step, part: slice) -> Groups:
    groups: Groups = {}
    for rank, per_rank in sorted(prints.items()):
        if step in per_rank:
            groups.setdefault(per_rank[step][part], []).append(rank)
    return groups


def _step_desync(prints: dict[int, dict[Step, Print]], step: Step, groups: Groups,
                 label: str) -> Desync:
    culprits, why = odd_ranks(groups, lambda r: _off_pattern(prints[r], step))

    def text(*key: int) -> str:
        if len(key) == 1:
            return f"at collective #{key[0]} when step {step[1]} ended"
        return f"{key[0]} collectives (fingerprint {key[1]:x})"

    return Desync(culprits, why, _sides(groups, culprits, text), f"at step {step[1]} ({label})")


def _with_calls(found: Desync, history: Sequence[JobSnapshot],
                prints: dict[int, dict[Step, Print]], step: Step) -> Desync:
    """``found`` with each culprit's own pattern break (the first call of a step off its steps
    before, as the rank published it) at ``step``, or its newest before it among the steps
    compared: the call and its site, where the flight recorder would say the call."""
    lines = []
    for rank in found.culprits:
        compared = [s[1] for s in prints.get(rank, {}) if s[0] == step[0] and s <= step]
        row = _break_row(history, rank, step[0], min(compared), step[1]) if compared else None
        if row is not None:
            lines.append(break_text(row))
    return replace(found, calls=tuple(lines)) if lines else found


def _break_row(history: Sequence[JobSnapshot], rank: int, restarts: int, first: int,
               last: int) -> RankRow | None:
    """The rank's row with its newest break in steps [first, last] of that incarnation."""
    best = None
    for snap in history:
        for r in snap.ranks:
            if r.rank == rank and (r.restarts or 0) == restarts and r.break_index and \
                    r.break_step is not None and first <= r.break_step <= last and \
                    (best is None or r.break_step >= best.break_step):  # type: ignore[operator]
                best = r
    return best


def break_text(r: RankRow) -> str:
    """"rank 1's collective #5 of step 30: all_reduce 1 float32 where its steps before made
    all_gather 65,600 float32, at train.py:123 in train_step" (the site as served: printable
    text only, the label is anyone's)."""
    index = r.break_index or 0
    before = call_text(r.break_expected_op, r.break_expected_elements, r.break_expected_dtype)
    if r.break_op is None:
        return (f"rank {r.rank}'s step {r.break_step} ended after {index - 1} collectives, "
                f"where its steps before made one more: {before}")
    site = printable(r.break_site)
    call = call_text(r.break_op, r.break_elements, r.break_dtype)
    made = (f", an extra call past the step before's {index - 1}" if r.break_expected_op is None
            else f" where its steps before made {before}")
    return (f"rank {r.rank}'s collective #{index} of step {r.break_step}: {call}{made}"
            + (f", at {site}" if site else ""))


def _off_pattern(per_step: dict[Step, Print], step: Step) -> bool:
    """The rank's step differs from the steps it made before (DESYNC_PATTERN_STEPS of them, or
    more, all alike): its own pattern broke there."""
    before = [fp[:2] for s, fp in per_step.items() if s < step]
    usual = Counter(before).most_common(1)
    return bool(usual) and usual[0][1] >= DESYNC_PATTERN_STEPS and \
        per_step[step][:2] != usual[0][0]
