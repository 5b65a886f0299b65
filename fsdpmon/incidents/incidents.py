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
from fsdpmon.job.run_goodput import Goodput, killed_ranks, saves, window_of
from fsdpmon.job.runlog import Incarnation, RunLog, number
from fsdpmon.job.snapshot import RankRow

MERGE_GAP_STEPS = 2  # windows of one cause and rank this many steps apart are one incident
MIN_WINDOWS = 3  # fewer straggling windows in a row are noise (a warm-up step, a GC pause)
MAX_EVIDENCE_FRAMES = 3


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


def _straggling(inc: Incarnation) -> list[tuple[int, float, str, int, str]]:
    """(step, time, cause, rank, why) of each window with a straggler."""
    rows: dict[int, list[tuple[RankRow, float]]] = {}
    for rank, records in inc.steps.items():
        for rec in records:
            row = _row(rec, rank)
            if row is not None:
                rows.setdefault(int(rec["step"]), []).append((row, rec["time"]))
    out = []
    for step, entries in sorted(rows.items()):
        live = [r for r, _ in entries]
        if len(live) < 2:
            continue
        slow = max(live, key=lambda r: (r.busy_s or 0.0, -r.rank))
        others = statistics.median(r.busy_s or 0.0 for r in live if r.rank != slow.rank)
        if not slow.busy_s or others / slow.busy_s >= STRAGGLER_SCORE_THRESHOLD:
            continue
        cause, why = straggler_cause(slow, live)
        out.append((step, max(t for _, t in entries), cause, slow.rank, why))
    return out


def _straggler_incidents(run: RunLog, inc: Incarnation, gp: Goodput) -> list[Incident]:
    lost = {step: s.data_wait + s.straggler_wait for i, step, s in gp.windows if i == inc.index}
    spans: list[list[Any]] = []  # first step, last step, start, end, cause, rank, why, lost, n
    for step, at, cause, rank, why in _straggling(inc):
        last = spans[-1] if spans else None
        if last and last[4] == cause and last[5] == rank and step - last[1] <= MERGE_GAP_STEPS:
            last[1], last[3], last[7] = step, at, last[7] + lost.get(step, 0.0)
            last[8] += 1
        else:
            spans.append([step, step, at, at, cause, rank, why, lost.get(step, 0.0), 1])
    return [_incident(run, start, end, cause, rank,
                      [f"steps {first}–{last}: {why}"], seconds)
            for first, last, start, end, cause, rank, why, seconds, windows in spans
            if windows >= MIN_WINDOWS]


# ---- stalls ---------------------------------------------------------------------------------

def _stall_groups(inc: Incarnation) -> list[list[dict[str, Any]]]:
    """Every rank's stall records, grouped by the stall they belong to (the same last
    progress, within one threshold)."""
    groups: list[list[dict[str, Any]]] = []
    for rec in sorted(inc.of_kind("stall"), key=lambda r: number(r.get("since")) or 0.0):
        since = number(rec.get("since"))
        if since is None:
            continue
        for group in groups:
            if abs((number(group[0].get("since")) or 0.0) - since) <= _threshold(group):
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


def _stall_culprit(starts: list[dict[str, Any]], ranks: list[int],
                   threshold: float) -> tuple[int | None, str]:
    first = min(r["time"] for r in starts)
    on_time = {int(r["rank"]) for r in starts if r["time"] <= first + threshold}
    late = [r for r in ranks if r not in on_time]
    if len(late) == 1:
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
        culprit, cause = _stall_culprit(starts, sorted(inc.runs), threshold)
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

def _checkpoint_incidents(run: RunLog, inc: Incarnation, until: float) -> list[Incident]:
    """Saves that took more than CHECKPOINT_SHARE_LIMIT of the time since the previous one;
    slow saves in a row with one culprit are one incident. Lost: beyond the fastest save."""
    found = saves(inc, until)
    if not found:
        return []
    usual = min(s["seconds"] for s in found)
    slow: list[tuple[dict[str, Any], float]] = []
    previous_end = inc.first_begin() or found[0]["time"]
    for save in found:
        span = save["time"] - previous_end
        share = save["seconds"] / span if span > 0 else 0.0
        previous_end = save["time"]
        if share > CHECKPOINT_SHARE_LIMIT:
            slow.append((save, share))
    groups: list[list[tuple[dict[str, Any], float]]] = []
    for save, share in slow:
        if groups and groups[-1][-1][0]["rank"] == save["rank"] and _next_save(found, groups[-1][
                -1][0]) is save:
            groups[-1].append((save, share))
        else:
            groups.append([(save, share)])
    out = []
    for group in groups:
        first, last = group[0][0], group[-1][0]
        evidence = [f"the save of step {s['step']} took {s['seconds']:.1f} s, {share:.0%} of "
                    f"the time since the previous save (limit {CHECKPOINT_SHARE_LIMIT:.0%}); "
                    f"rank {s['rank']} spent {s['own_seconds'] or 0:.1f} s of it on its own "
                    f"work (the others waited for it)" for s, share in group]
        evidence.append(f"the run's fastest save took {usual:.2f} s")
        out.append(_incident(run, first["time"] - first["seconds"], last["time"],
                             "checkpoint_slow", first["rank"], evidence,
                             sum(s["seconds"] - usual for s, _ in group)))
    return out


def _next_save(found: list[dict[str, Any]], save: dict[str, Any]) -> dict[str, Any] | None:
    index = found.index(save)
    return found[index + 1] if index + 1 < len(found) else None


def _restart_incident(run: RunLog, prev: Incarnation, inc: Incarnation,
                      gp: Goodput) -> Incident | None:
    exits = {int(r["rank"]): (str(r.get("how")), int(number(r.get("step")) or 0))
             for r in inc.of_kind("exit")}
    culprits, _how = died(exits)
    last = prev.last_step
    begin = inc.first_begin()
    if last is None or begin is None:
        return None
    restarts = max((int(number(r.get("restarts")) or 0) for r in inc.runs.values()), default=0)
    cause = "crash_loop" if restarts >= CRASH_LOOP_RESTARTS else "rank_missing"
    evidence = exit_evidence(exits) or ["the ranks' exit records were not found"]
    evidence.append(f"restarted (restart {restarts}) after step {last[1]}; resumed at step "
                    f"{_restored(inc)}")
    lost = sum(gp.by_rank.get(c, {}).get(r, 0.0) for c in ("restart", "recompute")
               for r in killed_ranks(inc)) if killed_ranks(inc) else 0.0
    lost = lost or begin - last[0]
    rank = culprits[0] if len(culprits) == 1 else None
    return _incident(run, last[0], begin, cause, rank, evidence, lost)


def _restored(inc: Incarnation) -> int:
    recs = inc.of_kind("restore")
    return int(number(recs[0].get("step")) or 0) if recs else 0


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
        out += _checkpoint_incidents(run, inc, end)
        out += _nonfinite_incidents(run, inc)
        if inc.last_step is not None:
            previous = inc
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
