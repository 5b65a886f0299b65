"""A run's incidents from its files: each a span of time, a cause in diagnose's names
(``fsdpmon.diagnose.findings.CAUSES``), the culprit's place, the evidence and what it cost.

The verdicts are the diagnosis' own where it has one for the evidence: a straggling window is
named by ``straggler_rules.straggler_cause`` over rank rows built from the window, the rank that
brought a restart down by ``exits.died`` with ``exits.exit_evidence``. A stall's culprit is the
rank that did not see it when the others did (its Python was not running: stopped, or holding
the GIL), else the rank whose flight-recorder stack is outside the phase the others wait in.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from fsdpmon.conventions import (
    CHECKPOINT_SHARE_LIMIT,
    CRASH_LOOP_RESTARTS,
    STRAGGLER_SCORE_THRESHOLD,
)
from fsdpmon.diagnose.exits import died, exit_evidence
from fsdpmon.diagnose.straggler_rules import straggler_cause
from fsdpmon.job.run_goodput import Goodput, endings, restore_of, saves, window_of
from fsdpmon.job.runlog import Incarnation, RunLog, number
from fsdpmon.job.snapshot import RankRow

MERGE_GAP_STEPS = 2  # windows of one cause and rank this many steps apart are one incident
MIN_WINDOWS = 3  # fewer straggling windows in a row are noise (a warm-up step, a GC pause)
MIN_LOST_SECONDS = 1.0  # a straggling stretch or slow saves that cost less: noise, no incident
MAX_EVIDENCE_FRAMES = 3
# A rank that saw a stall this much later than its threshold past the last progress was not
# running Python meanwhile (the watchdog ticks at least once a second; one more for a loaded
# host): stopped, or holding the GIL.
LATE_AFTER_S = 2.0
SLOW_SAVE_FACTOR = 2.0


@dataclass(frozen=True)
class Incident:
    start: float
    end: float
    cause: str
    rank: int | None
    pod: str
    node: str
    gpu: str
    evidence: tuple[str, ...]
    lost_gpu_seconds: float
    run: str = ""

    def as_json(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "cause": self.cause, "rank": self.rank,
                "pod": self.pod, "node": self.node, "gpu": self.gpu,
                "evidence": list(self.evidence), "lost_gpu_seconds": self.lost_gpu_seconds}


def _place(run: RunLog, rank: int | None) -> dict[str, str]:
    if rank is None:
        return {"pod": "", "node": "", "gpu": ""}
    place = run.ranks.get(rank, {})
    gpu = ""
    for inc in run.incarnations:
        rec = inc.runs.get(rank)
        if rec is not None and str(rec.get("device", "cpu")) != "cpu":
            gpu = str(rec.get("local_rank", ""))
    return {"pod": place.get("pod", ""), "node": place.get("node", ""), "gpu": gpu}


def _incident(run: RunLog, start: float, end: float, cause: str, rank: int | None,
              evidence: list[str], lost_seconds: float) -> Incident:
    return Incident(start, end, cause, rank, evidence=tuple(evidence),
                    lost_gpu_seconds=max(0.0, lost_seconds) * run.world_size, run=run.name,
                    **_place(run, rank))


# ---- stragglers: windows where the others waited for one rank ----------------------------

def _row(record: dict[str, Any], rank: int) -> RankRow | None:
    window = window_of(record, rank)
    if window is None or window.steps <= 0 or window.step_seconds <= 0:
        return None
    per = window.steps
    step = window.step_seconds / per
    return RankRow(rank=rank, step_time_s=step, busy_s=(window.step_seconds
                                                         - window.wait_seconds) / per,
                   data_wait_ratio=window.data_seconds / window.step_seconds)


def straggling(rows: dict[float, list[tuple[RankRow, float]]]) -> list[tuple[float, float, str,
                                                                            int, str]]:
    """(key, time, cause, rank, why) of each window with a straggler: the rank the others wait
    for, whose busy time the others' median is below STRAGGLER_SCORE_THRESHOLD of (the
    monitor's score), named data or compute by the diagnosis' ``straggler_cause``. ``rows``:
    per window key (a step, a sample time), each rank's row and when it was seen."""
    out = []
    for key, entries in sorted(rows.items()):
        live = [r for r, _ in entries if r.busy_s]
        if len(live) < 2:
            continue
        slow = max(live, key=lambda r: (r.busy_s or 0.0, -r.rank))
        others = statistics.median(r.busy_s or 0.0 for r in live if r.rank != slow.rank)
        if not slow.busy_s or others / slow.busy_s >= STRAGGLER_SCORE_THRESHOLD:
            continue
        cause, why = straggler_cause(slow, live)
        out.append((key, max(t for _, t in entries), cause, slow.rank, why))
    return out


def straggler_spans(found: list[tuple[float, float, str, int, str]], lost: dict[float, float],
                    gap: float) -> list[tuple[float, float, float, float, str, int, str, float]]:
    """Windows of one cause and rank no more than ``gap`` keys apart merged, at least
    MIN_WINDOWS of them: (first key, last key, start, end, cause, rank, why, lost seconds)."""
    spans: list[list[Any]] = []
    for key, at, cause, rank, why in found:
        last = spans[-1] if spans else None
        if last and last[4] == cause and last[5] == rank and key - last[1] <= gap:
            last[1], last[3], last[7] = key, at, last[7] + lost.get(key, 0.0)
            last[8] += 1
        else:
            spans.append([key, key, at, at, cause, rank, why, lost.get(key, 0.0), 1])
    return [tuple(s[:8]) for s in spans if s[8] >= MIN_WINDOWS]  # type: ignore[misc]


def costly(spans: list[tuple[float, float, float, float, str, int, str, float]]) -> list[
        tuple[float, float, float, float, str, int, str, float]]:
    return [s for s in spans if s[7] >= MIN_LOST_SECONDS]


def _straggler_incidents(run: RunLog, inc: Incarnation, gp: Goodput) -> list[Incident]:
    rows: dict[float, list[tuple[RankRow, float]]] = {}
    for rank, records in inc.steps.items():
        for rec in records:
            row = _row(rec, rank)
            if row is not None:
                rows.setdefault(int(rec["step"]), []).append((row, rec["time"]))
    lost = {step: s.data_wait + s.straggler_wait for i, step, s in gp.windows if i == inc.index}
    return [_incident(run, start, end, cause, rank, [f"steps {first:.0f}–{last:.0f}: {why}"],
                      seconds)
            for first, last, start, end, cause, rank, why, seconds in costly(straggler_spans(
                straggling(rows), lost, MERGE_GAP_STEPS))]


# ---- stalls ---------------------------------------------------------------------------------

def _stall_groups(inc: Incarnation) -> list[list[dict[str, Any]]]:
    """Every rank's stall records, grouped by the stall they belong to (the same last
    progress, within one threshold)."""
    groups: list[list[dict[str, Any]]] = []
    timed = [r for r in inc.of_kind("stall") if number(r.get("since")) is not None]
    for rec in sorted(timed, key=lambda r: r["since"]):
        for group in groups:
            if abs(group[0]["since"] - rec["since"]) <= _threshold(group):
                group.append(rec)
                break
        else:
            groups.append([rec])
    return groups


def _threshold(group: list[dict[str, Any]]) -> float:
    return max((number(r.get("threshold")) or 0.0 for r in group), default=0.0) or 1.0


def _innermost(rec: dict[str, Any]) -> str:
    frames = [f for f in rec.get("frames") or [] if isinstance(f, dict)]
    return " < ".join(f"{f.get('function')} ({f.get('file')}:{f.get('line')})"
                      for f in reversed(frames[-MAX_EVIDENCE_FRAMES:]))


def _stall_culprit(starts: list[dict[str, Any]], ranks: list[int]) -> tuple[int | None, str]:
    on_time = {int(r["rank"]) for r in starts
               if r["time"] - (number(r.get("since")) or r["time"])
               <= (number(r.get("threshold")) or 0.0) + LATE_AFTER_S}
    late = [r for r in ranks if r not in on_time]
    if len(late) == 1 and on_time:
        return late[0], "rank_unresponsive"
    phases = [r.get("phase") for r in starts]
    common = statistics.mode(phases) if phases else None
    odd = [int(r["rank"]) for r in starts if r.get("phase") != common]
    return (odd[0], "hang") if len(odd) == 1 else (None, "hang")


def _stall_incidents(run: RunLog, inc: Incarnation) -> list[Incident]:
    out = []
    for group in _stall_groups(inc):
        starts = [r for r in group if r.get("state") == "start"]
        ends = [r for r in group if r.get("state") == "end"]
        if not starts or any(r.get("during") != "step" for r in ends):
            continue  # a save or an evaluation held the steps: the checkpoint's incident
        since = min(number(r.get("since")) or r["time"] for r in group)
        threshold = _threshold(group)
        culprit, cause = _stall_culprit(starts, sorted(inc.runs))
        end = max(r["time"] for r in ends) if ends else max(r["time"] for r in group)
        lost = max((number(r.get("seconds")) or 0.0 for r in ends), default=end - since)
        evidence = [f"no step completed for {end - since:.1f} s (threshold {threshold:.1f} s)"
                    + ("" if ends else "; it never ended")]
        if cause == "rank_unresponsive":
            evidence.append(f"rank {culprit} recorded nothing while the others waited (its "
                            f"Python did not run: stopped, or holding the GIL)")
        for rec in sorted(starts, key=lambda r: r["rank"]):
            evidence.append(f"rank {rec['rank']} at step {rec.get('step')} in phase "
                            f"{rec.get('phase') or '-'}, last collective "
                            f"{(rec.get('last_collective') or {}).get('op', '-')}: "
                            f"{_innermost(rec) or 'no frames'}")
        out.append(_incident(run, since, end, cause, culprit, evidence, lost))
    return out


# ---- checkpoints and restarts ---------------------------------------------------------------

def slow_save_groups(found: list[tuple[dict[str, Any], float]]) -> list[list[tuple[dict[
        str, Any], float]]]:
    """Saves (with their share of the time) in order -> runs of slow ones with one culprit:
    a save is slow when its share is over CHECKPOINT_SHARE_LIMIT (the diagnosis' rule), or,
    right after a slow one, when it still takes SLOW_SAVE_FACTOR x the run's fastest save (its
    share can drop when a stall or a restart lengthened the time since the previous)."""
    fastest = min((s["seconds"] for s, _ in found), default=0.0)
    groups: list[list[tuple[dict[str, Any], float]]] = []
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


def _checkpoint_incidents(run: RunLog, until: float) -> list[Incident]:
    """Slow saves of the whole run (a fault outlives a restart). Lost: beyond the fastest."""
    found: list[tuple[dict[str, Any], float]] = []
    for inc in run.incarnations:
        previous_end = inc.first_begin()
        for save in saves(inc, until):
            span = save["time"] - (previous_end or save["time"])
            found.append((save, save["seconds"] / span if span > 0 else 0.0))
            previous_end = save["time"]
    if not found:
        return []
    usual = min(s["seconds"] for s, _ in found)
    out = []
    for group in slow_save_groups(found):
        lost = sum(s["seconds"] - usual for s, _ in group)
        if lost < MIN_LOST_SECONDS:
            continue  # a healthy save that happened to follow a short stretch of steps
        first, last = group[0][0], group[-1][0]
        evidence = [f"the save of step {s['step']} took {s['seconds']:.1f} s, {share:.0%} of "
                    f"the time since the previous save (limit {CHECKPOINT_SHARE_LIMIT:.0%}); "
                    f"rank {s['rank']} spent {s['own_seconds'] or 0:.1f} s of it on its own "
                    f"work (the others waited for it)" for s, share in group]
        evidence.append(f"the run's fastest save took {usual:.2f} s")
        out.append(_incident(run, first["time"] - first["seconds"], last["time"],
                             "checkpoint_slow", first["rank"], evidence, lost))
    return out


def _restart_incident(run: RunLog, prev: Incarnation, inc: Incarnation,
                      gp: Goodput) -> Incident | None:
    exits = endings(prev, inc)
    culprits, _how = died(exits)
    last = prev.last_step
    begin = inc.first_begin()
    if last is None or begin is None:
        return None
    restarts = max((int(number(r.get("restarts")) or 0) for r in inc.runs.values()), default=0)
    cause = "crash_loop" if restarts >= CRASH_LOOP_RESTARTS else "rank_missing"
    evidence = exit_evidence(exits) or ["how the ranks ended is not known"]
    evidence.append(f"restarted (restart {restarts}) after step {last[1]}; resumed at step "
                    f"{restore_of(inc)[0]}")
    rank = culprits[0] if len(culprits) == 1 else None
    lost = sum(gp.by_rank.get(c, {}).get(rank, 0.0) for c in ("restart", "recompute")
               ) if rank is not None else 0.0
    return _incident(run, last[0], begin, cause, rank, evidence, lost or begin - last[0])


def _nonfinite_incidents(run: RunLog, inc: Incarnation) -> list[Incident]:
    firsts: dict[int, dict[str, Any]] = {}
    for rec in inc.of_kind("nonfinite"):
        firsts.setdefault(int(rec["rank"]), rec)
    if not firsts:
        return []
    first = min(firsts.values(), key=lambda r: (number(r.get("step")) or 0, r["rank"]))
    evidence = [f"rank {r['rank']}: first non-finite {r.get('what', 'value')} at step "
                f"{r.get('step')}, batch {r.get('batch')}" for r in firsts.values()]
    return [_incident(run, first["time"], first["time"], "loss_nonfinite", int(first["rank"]),
                      evidence, 0.0)]


def incidents(run: RunLog, gp: Goodput) -> list[Incident]:
    """Every incident of the run, oldest first (``gp``: the run's goodput, for what each
    cost)."""
    out: list[Incident] = []
    end = max((i.last_step[0] for i in run.incarnations if i.last_step), default=0.0)
    previous: Incarnation | None = None
    for inc in run.incarnations:
        if previous is not None:
            restart = _restart_incident(run, previous, inc, gp)
            out += [restart] if restart else []
        out += _straggler_incidents(run, inc, gp)
        out += _stall_incidents(run, inc)
        out += _nonfinite_incidents(run, inc)
        if inc.last_step is not None:
            previous = inc
    out += _checkpoint_incidents(run, end)
    return sorted(out, key=lambda i: (i.start, i.cause))


def lemon_nodes(found: list[Incident], min_runs: int = 2) -> list[tuple[str, int, float]]:
    """Nodes named as culprits in at least ``min_runs`` runs: (node, runs, lost GPU-seconds),
    most runs first."""
    runs: dict[str, set[str]] = {}
    lost: dict[str, float] = {}
    for inc in found:
        if inc.node:
            runs.setdefault(inc.node, set()).add(inc.run)
            lost[inc.node] = lost.get(inc.node, 0.0) + inc.lost_gpu_seconds
    return sorted(((n, len(r), lost[n]) for n, r in runs.items() if len(r) >= min_runs),
                  key=lambda x: (-x[1], -x[2], x[0]))
