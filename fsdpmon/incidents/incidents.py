"""A run's incidents from its files: each a span of time, a cause in diagnose's names
(``fsdpmon.diagnose.findings.CAUSES``), the culprit's place, the evidence and what it cost.

The verdicts are the diagnosis' own where it has one for the evidence: a straggler is the live
judge replayed over the figures each log step recorded (fsdpmon.diagnose.replay over
fsdpmon.job.run_snapshots), the rank that brought a restart down is ``exits.died``'s with
``exits.exit_evidence``, a loss spike (with the rank it began on) or a grad norm held high
is the judge replayed over the loss and grad norm each step logged. A stall's culprit is the
rank that did not see it when the others did (its Python was not running: stopped, or holding
the GIL), else the rank whose flight-recorder stack is outside the phase the others wait in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fsdpmon.conventions import CHECKPOINT_SHARE_LIMIT, INCIDENT_MIN_LOST_SECONDS
from fsdpmon.diagnose.after import first_nonfinite, restart, slow_saves, stall_from_records
from fsdpmon.diagnose.exits import exit_evidence
from fsdpmon.diagnose.replay import merge_gap, quality_evidence, quality_spans, run_slowdowns
from fsdpmon.job.run_goodput import Goodput, endings, restore_of, saves
from fsdpmon.job.run_snapshots import step_snapshots
from fsdpmon.job.runlog import Incarnation, RunLog, number

MAX_EVIDENCE_FRAMES = 3  # the innermost frames of a stack an incident quotes


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


# ---- stragglers: where the judge named the rank the others wait for ------------------------

def _straggler_incidents(run: RunLog, inc: Incarnation, gp: Goodput) -> list[Incident]:
    """The live judge replayed over the incarnation's log steps (job.run_snapshots); lost: the data
    and straggler badput of the steps inside each span."""
    step_time, found = run_slowdowns(run, inc)
    lost = {step: s.data_wait + s.straggler_wait for i, step, s in gp.windows if i == inc.index}
    out = []
    for span in found:
        inside = [k for k, t in step_time.items() if span.start <= t <= span.end]
        seconds = sum(lost.get(k, 0.0) for k in inside)
        if inside and seconds >= INCIDENT_MIN_LOST_SECONDS:
            f = span.finding
            out.append(_incident(run, span.start, span.end, f.cause, f.rank,
                                 [f"steps {min(inside)}–{max(inside)}: {f.summary}",
                                  *f.evidence], seconds))
    return out


# ---- the loss and the gradients: spikes and instability, over or not --------------------

def _quality_incidents(run: RunLog, inc: Incarnation) -> list[Incident]:
    """The live judge replayed over the loss and grad norm the incarnation's log steps
    recorded: each stretch it named a loss spike (with the rank and step it began on) or
    training unstable, even one over within the window. Nothing lost: the steps were made."""
    snaps = step_snapshots(run, inc)
    return [_incident(run, span.start, span.end, span.finding.cause, span.finding.rank,
                      quality_evidence(span, snaps), 0.0)
            for span in quality_spans(snaps, merge_gap([s.time for s in snaps]))]


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


def _stall_incidents(run: RunLog, inc: Incarnation) -> list[Incident]:
    out = []
    for group in _stall_groups(inc):
        starts = [r for r in group if r.get("state") == "start"]
        ends = [r for r in group if r.get("state") == "end"]
        if not starts or any(r.get("during") != "step" for r in ends):
            continue  # a save or an evaluation held the steps: the checkpoint's incident
        since = min(number(r.get("since")) or r["time"] for r in group)
        threshold = _threshold(group)
        judged = stall_from_records(starts, sorted(inc.runs))
        end = max(r["time"] for r in ends) if ends else max(r["time"] for r in group)
        lost = max((number(r.get("seconds")) or 0.0 for r in ends), default=end - since)
        evidence = [f"no step completed for {end - since:.1f} s (threshold {threshold:.1f} s)"
                    + ("" if ends else "; it never ended")]
        evidence += judged.evidence
        for rec in sorted(starts, key=lambda r: r["rank"]):
            evidence.append(f"rank {rec['rank']} at step {rec.get('step')} in phase "
                            f"{rec.get('phase') or '-'}, last collective "
                            f"{(rec.get('last_collective') or {}).get('op', '-')}: "
                            f"{_innermost(rec) or 'no frames'}")
        out.append(_incident(run, since, end, judged.cause, judged.rank, evidence, lost))
    return out


# ---- checkpoints and restarts ---------------------------------------------------------------

def _checkpoint_incidents(run: RunLog, until: float) -> list[Incident]:
    """Slow saves of the whole run (a fault outlives a restart). Lost: beyond the fastest."""
    found: list[tuple[dict[str, Any], float]] = []
    for inc in run.incarnations:
        previous_end = inc.first_begin()
        for save in saves(inc, until):
            span = save["time"] - (previous_end or save["time"])
            found.append((save, save["seconds"] / span if span > 0 else 0.0))
            previous_end = save["time"]
    usual = min((s["seconds"] for s, _ in found), default=0.0)
    out = []
    for judged, group, lost in slow_saves(found):
        first, last = group[0][0], group[-1][0]
        evidence = [f"the save of step {s['step']} took {s['seconds']:.1f} s, {share:.0%} of "
                    f"the time since the previous save (limit {CHECKPOINT_SHARE_LIMIT:.0%}); "
                    f"rank {s['rank']} spent {s['own_seconds'] or 0:.1f} s of it on its own "
                    f"work (the others waited for it)" for s, share in group]
        evidence.append(f"the run's fastest save took {usual:.2f} s")
        out.append(_incident(run, first["time"] - first["seconds"], last["time"],
                             judged.cause, judged.rank, evidence, lost))
    return out


def _restart_incident(run: RunLog, prev: Incarnation, inc: Incarnation,
                      gp: Goodput) -> Incident | None:
    exits = endings(prev, inc)
    last = prev.last_step
    begin = inc.first_begin()
    if last is None or begin is None:
        return None
    restarts = max((int(number(r.get("restarts")) or 0) for r in inc.runs.values()), default=0)
    judged = restart(exits, restarts)
    rank = judged.rank
    evidence = exit_evidence(exits) or ["how the ranks ended is not known"]
    evidence.append(f"restarted (restart {restarts}) after step {last[1]}; resumed at step "
                    f"{restore_of(inc)[0]}")
    lost = sum(gp.by_rank.get(c, {}).get(rank, 0.0) for c in ("restart", "recompute")
               ) if rank is not None else 0.0
    return _incident(run, last[0], begin, judged.cause, rank, evidence, lost or begin - last[0])


def _nonfinite_order(rec: dict[str, Any]) -> tuple[float, bool]:
    return number(rec.get("step")) or 0.0, rec.get("what") != "loss"


def _nonfinite_incidents(run: RunLog, inc: Incarnation) -> list[Incident]:
    firsts: dict[int, dict[str, Any]] = {}
    for rec in inc.of_kind("nonfinite"):  # each rank's first: earliest step, its loss first
        rank, known = int(rec["rank"]), firsts.get(int(rec["rank"]))
        if known is None or _nonfinite_order(rec) < _nonfinite_order(known):
            firsts[rank] = rec
    judged = first_nonfinite({r: number(rec.get("step")) for r, rec in firsts.items()},
                             frozenset(r for r, rec in firsts.items() if rec.get("what") != "loss"))
    if judged is None or judged.rank is None:
        return []
    first = firsts[judged.rank]
    evidence = [f"rank {r['rank']}: first non-finite {r.get('what', 'value')} at step "
                f"{r.get('step')}, batch {r.get('batch')}" for r in firsts.values()]
    return [_incident(run, first["time"], first["time"], judged.cause, judged.rank,
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
        out += _quality_incidents(run, inc)
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
