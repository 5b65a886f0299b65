"""The judge's rules for what a run tells after the fact, in records a live view never holds
at once: a stall's start records (the flight recorder's), how a restart's ranks ended, each
save's time, the first non-finite value. The incident doors (the run's files, Prometheus
history) read their source into this evidence and ask here; the causes and culprits are the
live rules' own (a rank unresponsive while the others stalled, a hang's one odd rank, a
restart counted against CRASH_LOOP_RESTARTS, a save over CHECKPOINT_SHARE_LIMIT, the earliest
non-finite step).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fsdpmon.conventions import (
    CHECKPOINT_SHARE_LIMIT,
    CRASH_LOOP_RESTARTS,
    DTYPE_CODES,
    INCIDENT_MIN_LOST_SECONDS,
    OP_CODES,
    SLOW_SAVE_FACTOR,
    STALL_SEEN_LATE_SECONDS,
)
from fsdpmon.diagnose.desync_rules import Waiting, call_key, call_text, calls_apart
from fsdpmon.diagnose.exits import died
from fsdpmon.diagnose.findings import ranks_text

Save = tuple[dict[str, Any], float]  # a save ({"seconds", "rank", ...}) and its share of time


@dataclass(frozen=True)
class Judged:
    """A cause and its culprit (None: not one rank), and what the rule adds as evidence."""

    cause: str
    rank: int | None
    evidence: tuple[str, ...] = ()


def restart_cause(restarts: float) -> str:
    """crash_loop once the job restarted CRASH_LOOP_RESTARTS times, else rank_missing (one
    restart is a recovered crash)."""
    return "crash_loop" if restarts >= CRASH_LOOP_RESTARTS else "rank_missing"


def restart(exits: dict[int, tuple[str, int | None]], restarts: float) -> Judged:
    """A restart's verdict from how each rank ended (exits.died names who brought the group
    down) and the restarts so far."""
    culprits, _how = died(exits)
    return Judged(restart_cause(restarts), culprits[0] if len(culprits) == 1 else None)


def stall(unresponsive: Sequence[int], culprits: Sequence[int]) -> Judged:
    """A stall's verdict: the one rank that was unresponsive meanwhile (stopped, or holding
    the GIL), else a hang, its culprit the one rank the evidence singles out."""
    if len(unresponsive) == 1:
        return Judged("rank_unresponsive", unresponsive[0], (
            f"rank {unresponsive[0]} was unresponsive meanwhile (stopped, or holding the GIL)",))
    return Judged("hang", culprits[0] if len(culprits) == 1 else None)


def stall_from_records(starts: Sequence[dict[str, Any]], ranks: Sequence[int]) -> Judged:
    """A stall from the flight recorder's start records: a collective desync where ranks
    stopped at one collective number in different calls (desync_from_records); else a rank
    that recorded it more than STALL_SEEN_LATE_SECONDS after its threshold, while others did
    in time, ran no Python meanwhile (unresponsive); else, as the live judge's progress
    evidence, the ranks behind the others in collectives (their last one's sequence number
    lower), else the one rank whose phase differs from the others' (a majority's: two ranks
    in two phases tell nothing, whichever recorded first)."""
    desync = desync_from_records(starts)
    if desync is not None:
        return desync
    on_time = {int(r["rank"]) for r in starts
               if r["time"] - (_num(r.get("since")) or r["time"])
               <= (_num(r.get("threshold")) or 0.0) + STALL_SEEN_LATE_SECONDS}
    late = [r for r in ranks if r not in on_time]
    seqs = {int(r["rank"]): s for r in starts
            if (s := _num((r.get("last_collective") or {}).get("seq"))) is not None}
    behind = sorted(k for k, s in seqs.items() if s < max(seqs.values()))
    phases = [r.get("phase") for r in starts]
    common = statistics.mode(phases) if phases else None
    odd = [int(r["rank"]) for r in starts if r.get("phase") != common] \
        if phases.count(common) > len(phases) / 2 else []
    return stall(late if len(late) == 1 and on_time else [], behind or odd)


def desync_from_records(starts: Sequence[dict[str, Any]]) -> Judged | None:
    """Ranks whose stall records name one collective number but different calls (op,
    elements, dtype): a collective desync, judged by the live rule's own comparison
    (desync_rules.calls_apart: the side off its own pattern, else the minority)."""
    waiting: Waiting = {}
    breakers = set()
    for r in starts:
        seq = _num((r.get("last_collective") or {}).get("seq"))
        call = r.get("call")
        if seq is None or not isinstance(call, dict) or call.get("op") not in OP_CODES:
            continue
        elements = _num(call.get("elements"))
        waiting[int(r["rank"])] = (int(seq), call_key(
            OP_CODES[call["op"]], int(elements or 0), DTYPE_CODES.get(call.get("dtype"), 0)))
        if call.get("off_pattern") is True:
            breakers.add(int(r["rank"]))
    found = calls_apart(waiting, breakers.__contains__)
    if found is None:
        return None
    seq, groups, culprits, _why = found
    said = " vs ".join(f"{ranks_text(ranks)} {call_text(*key)}"
                       for key, ranks in sorted(groups.items(), key=lambda kv: kv[1]))
    return Judged("collective_desync", culprits[0] if len(culprits) == 1 else None,
                  (f"{said} at collective #{seq}",))


def _num(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok else None


def slow_save_groups(found: Sequence[Save]) -> list[list[Save]]:
    """Saves (with their share of the time) in order -> runs of slow ones with one culprit:
    a save is slow when its share is over CHECKPOINT_SHARE_LIMIT (the live rule), or, right
    after a slow one, when it still takes SLOW_SAVE_FACTOR x the run's fastest save (its share
    can drop when a stall or a restart lengthened the time since the previous)."""
    fastest = min((s["seconds"] for s, _ in found), default=0.0)
    groups: list[list[Save]] = []
    after_slow = False
    for save, share in found:
        continuing = (after_slow and groups and groups[-1][-1][0]["rank"] == save["rank"]
                      and save["seconds"] >= SLOW_SAVE_FACTOR * fastest)
        if continuing:
            groups[-1].append((save, share))
        elif share > CHECKPOINT_SHARE_LIMIT:
            groups.append([(save, share)])
        after_slow = continuing or share > CHECKPOINT_SHARE_LIMIT
    return groups


def slow_saves(found: Sequence[Save]) -> list[tuple[Judged, list[Save], float]]:
    """Each run of slow saves that cost INCIDENT_MIN_LOST_SECONDS or more beyond the fastest
    healthy save (within CHECKPOINT_SHARE_LIMIT; none: every save was slow from the first, and
    all its time is lost): (its verdict, named by its first save's slowest writer; the saves;
    the seconds lost). Cheaper ones are a healthy save that followed a short stretch of
    steps."""
    usual = min((s["seconds"] for s, share in found if share <= CHECKPOINT_SHARE_LIMIT),
                default=0.0)
    out = []
    for group in slow_save_groups(found):
        lost = sum(s["seconds"] - usual for s, _ in group)
        if lost >= INCIDENT_MIN_LOST_SECONDS:
            out.append((Judged("checkpoint_slow", group[0][0]["rank"]), group, lost))
    return out


def first_nonfinite(firsts: dict[int, float | None],
                    gradient_first: frozenset[int] = frozenset()) -> Judged | None:
    """The rank whose loss (or gradient) went non-finite first: the earliest step (unknown
    counts as 0); within a step a loss before a gradient (``gradient_first``: the ranks whose
    first non-finite value in that step was their gradient norm; the live judge's order, as a
    NaN loss on one rank reaches every rank's gradients in the same step); then the lowest
    rank."""
    if not firsts:
        return None
    return Judged("loss_nonfinite", min(firsts, key=lambda r: (firsts[r] or 0,
                                                               r in gradient_first, r)))
