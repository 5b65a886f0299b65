"""A job's incidents from Prometheus history (range queries through the one client): the one
module that knows which series tell them, so that it can be pointed at new culprit series
(per-rank collective progress) without touching the rest.

From the per-rank series the monitor serves:
- a stall: ``fsdpmon_train_stalled`` at 1 on any rank; its culprit the rank the pod's server
  found ``fsdpmon_train_unresponsive`` meanwhile (``rank_unresponsive``), else a ``hang`` whose
  culprit the progress series name (``fsdpmon_train_collective_entered_seq`` and
  ``fsdpmon_train_in_collective``, judged as diagnose --prometheus judges them);
- a restart: a rank's ``fsdpmon_train_previous_exit{how="killed"}`` (the diagnosis'
  ``exits.died`` over every rank's ending names who brought the group down);
- a straggler: the live judge (fsdpmon.diagnose.replay) over the snapshots `diagnose
  --prometheus` would have built at each query step (history_reader), as it names one live;
- a slow checkpoint: ``fsdpmon_train_checkpoint_time_ratio`` over its limit, the culprit the
  rank with the most ``fsdpmon_train_checkpoint_own_seconds``;
- a non-finite loss: ``fsdpmon_train_loss_first_nonfinite_step``, the earliest rank;
- a loss spike or training unstable: the live judge replayed over the same snapshots (their
  ranks' ``fsdpmon_train_loss`` and ``fsdpmon_train_grad_norm``), a spike with its first rank.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fsdpmon import catalog
from fsdpmon.conventions import (
    CHECKPOINT_SHARE_LIMIT,
    DIAGNOSIS_EVIDENCE_SECONDS,
    EXIT_HOWS,
    INCIDENT_MERGE_GAP_QUERY_STEPS,
    INCIDENT_MIN_LOST_SECONDS,
)
from fsdpmon.diagnose.after import first_nonfinite, restart, slow_saves, stall
from fsdpmon.diagnose.engine import progress_culprits
from fsdpmon.diagnose.exits import died, exit_evidence
from fsdpmon.diagnose.findings import Finding
from fsdpmon.diagnose.replay import (
    desync_replayed,
    may_slow,
    quality_evidence,
    quality_spans,
    replay,
    slowdowns,
)
from fsdpmon.diagnose.replay import spans as finding_spans
from fsdpmon.incidents.history_reader import snapshots
from fsdpmon.incidents.incidents import Incident
from fsdpmon.job.snapshot import JobSnapshot, RankRow
from fsdpmon.scrape.prometheus_api import PrometheusAPI

Samples = list[tuple[float, float]]
Series = dict[int, Samples]  # rank -> (time, value), oldest first


@dataclass
class History:
    job: str
    start: float
    end: float
    step: float
    api: PrometheusAPI

    def series(self, metric: catalog.Metric, where: str = "") -> Series:
        return {int(rank): samples for (rank, _), samples in self.labelled(metric, where).items()}

    def labelled(self, metric: catalog.Metric, where: str = "",
                 label: str = "") -> dict[tuple[str, str], Samples]:
        query = f'{metric.name}{{job_name="{_quoted(self.job)}"{where}}}'
        out: dict[tuple[str, str], Samples] = {}
        for s in self.api.query_range(query, self.start, self.end, self.step):
            labels = s.get("metric") or {}
            rank = str(labels.get("rank", ""))
            if not rank.isdigit():
                continue
            values = [(float(t), float(v)) for t, v in s.get("values") or []
                      if _finite(v)]
            key = (rank, str(labels.get(label, "")) if label else "")
            out[key] = sorted(out.get(key, []) + values)
        return out


def _quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def spans(samples: Samples, test: Callable[[float], bool], gap: float) -> list[tuple[float, float]]:
    """The stretches where ``test(value)`` holds (samples further apart than ``gap`` split)."""
    out: list[list[float]] = []
    open_ = False
    for t, v in samples:
        if not test(v):
            open_ = False  # a sample that says otherwise ends the stretch
            continue
        if open_ and t - out[-1][1] <= gap:
            out[-1][1] = t
        else:
            out.append([t, t])
        open_ = True
    return [(a, b) for a, b in out]


def stall_culprits(progress: tuple[Series, Series], ranks: list[int], start: float,
                   end: float) -> tuple[list[int], str]:
    """A stall's culprit from the progress series as they stood at its end, judged by the
    diagnosis' own rule (engine.progress_culprits: behind in collectives, else outside one
    while others wait inside); ([], "") where the series were not served."""
    entered, inside = progress
    rows = []
    for rank in ranks:
        seq = _at([x for x in entered.get(rank, []) if x[0] >= start], end)
        flag = _at([x for x in inside.get(rank, []) if x[0] >= start], end)
        rows.append(RankRow(rank=rank, collective_entered=None if seq is None else int(seq),
                            in_collective=None if flag is None else flag >= 1))
    return progress_culprits(rows)


def _at(samples: Samples, t: float) -> float | None:
    """The last value at or before ``t``."""
    found = [v for s, v in samples if s <= t]
    return found[-1] if found else None


class HistoryJudge:
    def __init__(self, history: History) -> None:
        self.h = history
        self.gap = INCIDENT_MERGE_GAP_QUERY_STEPS * history.step
        self.places: dict[int, dict[str, str]] = {}
        for (rank, node), _ in history.labelled(catalog.TRAIN_INFO, label="node").items():
            self.places.setdefault(int(rank), {"node": node, "pod": "", "gpu": ""})
        sizes = [v for s in history.series(catalog.TRAIN_RESTARTS).values() for _, v in s]
        self.world = max(len(self.places), 1)
        self.restarts = int(max(sizes)) if sizes else 0
        self._snaps: list[JobSnapshot] | None = None

    def _incident(self, start: float, end: float, cause: str, rank: int | None,
                  evidence: list[str], lost: float) -> Incident:
        place = self.places.get(rank, {}) if rank is not None else {}
        return Incident(start, end, cause, rank, place.get("pod", ""), place.get("node", ""),
                        place.get("gpu", ""), tuple(evidence), max(0.0, lost) * self.world,
                        run=self.h.job)

    def stalls(self) -> list[Incident]:
        stalled = self.h.series(catalog.TRAIN_STALLED)
        unresponsive = self.h.series(catalog.TRAIN_UNRESPONSIVE)
        threshold = self.h.series(catalog.TRAIN_STALL_THRESHOLD_SECONDS)
        progress = self._progress()
        found: list[tuple[float, float]] = []
        for samples in stalled.values():
            found += spans(samples, lambda v: v >= 1, self.gap)
        out = []
        for start, end in _merged(found, self.gap):
            quiet = sorted(r for r, s in unresponsive.items()
                           if spans([x for x in s if start - self.gap <= x[0] <= end],
                                    lambda v: v >= 1, self.gap))
            lead = max((_at(s, start) or 0.0 for s in threshold.values()), default=0.0)
            victims = sorted(r for r, s in stalled.items()
                             if any(start <= t <= end and v >= 1 for t, v in s))
            evidence = [f"ranks {victims} reported stalled from {start:.0f} to {end:.0f} "
                        f"(threshold {lead:.1f} s)"]
            culprits, why = ([], "") if len(quiet) == 1 else stall_culprits(
                progress, sorted(set(victims) | set(progress[0])), start, end)
            if culprits:
                evidence.insert(0, f"culprit: rank{'s' if len(culprits) > 1 else ''} "
                                   f"{', '.join(map(str, culprits))} ({why})")
            desync = self._desync_in(start - lead, end)
            if desync is not None:  # ranks wait in different calls: the stall's real cause
                out.append(self._incident(start - lead, end, desync.cause, desync.rank,
                                          [desync.summary, *desync.evidence, *evidence],
                                          end - start + lead))
                continue
            judged = stall(quiet, culprits)
            out.append(self._incident(start - lead, end, judged.cause, judged.rank,
                                      [*evidence, *judged.evidence], end - start + lead))
        return out

    def _desync_in(self, start: float, end: float) -> Finding | None:
        """The live judge replayed over a stall's snapshots (and the evidence window before
        it): the collective desync it named there. The progress series alone would call that
        stall a hang and blame the rank that went on."""
        return desync_replayed([s for s in self._snapshots()
                                if start - DIAGNOSIS_EVIDENCE_SECONDS <= s.time <= end])

    def _progress(self) -> tuple[Series, Series]:
        return (self.h.series(catalog.TRAIN_COLLECTIVE_ENTERED_SEQ),
                self.h.series(catalog.TRAIN_IN_COLLECTIVE))

    def restarts_found(self) -> list[Incident]:
        exits: dict[int, tuple[str, int | None]] = {}
        first_seen: list[float] = []
        for (rank, how), samples in self.h.labelled(catalog.TRAIN_PREVIOUS_EXIT,
                                                    label="how").items():
            if how in EXIT_HOWS and samples:
                exits[int(rank)] = (how, None)
                first_seen.append(samples[0][0])
        judged = restart(exits, self.restarts)
        if not died(exits)[0] or not first_seen:
            return []
        back = min(first_seen)
        last = self.h.series(catalog.TRAIN_LAST_STEP_TIMESTAMP_SECONDS)
        before = [v for s in last.values() for t, v in s if t < back and v < back]
        start = max(before) if before else back
        return [self._incident(start, back, judged.cause, judged.rank, exit_evidence(exits),
                               back - start)]

    def stragglers(self) -> list[Incident]:
        """The live judge replayed over the snapshots `diagnose --prometheus` would have built
        at each query step (history_reader): each stretch it named a rank the others wait for;
        lost: the goodput counters' data and straggler badput meanwhile."""
        timed = slowdowns(replay(self._snapshots(), judge_at=may_slow))
        badput = {cause: sorted(x for s in self.h.labelled(
            catalog.TRAIN_BADPUT_SECONDS_TOTAL, f',cause="{cause}"').values() for x in s)
            for cause in ("data_wait", "straggler_wait")}
        out = []
        for span in finding_spans(timed, self.gap):
            lost = sum(_increase(b, span.start - self.gap, span.end) for b in badput.values())
            if lost >= INCIDENT_MIN_LOST_SECONDS:
                f = span.finding
                out.append(self._incident(span.start, span.end, f.cause, f.rank,
                                          [f.summary, *f.evidence], lost))
        return out

    def _snapshots(self) -> list[JobSnapshot]:
        """The snapshots `diagnose --prometheus` would have built at each query step, read
        once for every replay of the judge."""
        if self._snaps is None:
            self._snaps = snapshots(self.h.api, self.h.job, self.h.start, self.h.end, self.h.step)
        return self._snaps

    def quality(self) -> list[Incident]:
        """The live judge replayed over the same snapshots: each stretch it named a loss spike
        (with the rank and step it began on) or training unstable; nothing lost."""
        snaps = self._snapshots()
        return [self._incident(span.start, span.end, span.finding.cause, span.finding.rank,
                               quality_evidence(span, snaps), 0.0)
                for span in quality_spans(snaps, self.gap)]

    def checkpoints(self) -> list[Incident]:
        """Each save as rank 0's checkpoint series change; slow ones grouped as the JSONL's."""
        ratio = self.h.series(catalog.TRAIN_CHECKPOINT_TIME_RATIO)
        seconds = self.h.series(catalog.TRAIN_CHECKPOINT_SECONDS)
        own = self.h.series(catalog.TRAIN_CHECKPOINT_OWN_SECONDS)
        found: list[tuple[dict[str, Any], float]] = []
        lead = min(seconds) if seconds else None
        previous = None
        for t, took in seconds.get(lead, []) if lead is not None else []:
            share = _at(ratio.get(lead, []), t)
            if took == previous or share is None:
                continue  # the same save, seen again by the next scrape
            previous = took
            culprit = max(own, key=lambda r: _at(own[r], t) or 0.0)
            found.append(({"time": t, "seconds": took, "rank": culprit}, share))
        out = []
        for judged, group, lost in slow_saves(found):  # as from the JSONL
            first, last = group[0][0], group[-1][0]
            evidence = [f"a save took {s['seconds']:.1f} s, {share:.0%} of the time since the "
                        f"previous (limit {CHECKPOINT_SHARE_LIMIT:.0%})" for s, share in group]
            out.append(self._incident(first["time"] - first["seconds"], last["time"],
                                      judged.cause, judged.rank, evidence, lost))
        return out

    def nonfinite(self) -> list[Incident]:
        firsts = {r: s[0] for r, s in self.h.series(
            catalog.TRAIN_LOSS_FIRST_NONFINITE_STEP).items() if s}
        judged = first_nonfinite({r: step for r, (_, step) in firsts.items()})
        if judged is None or judged.rank is None:
            return []
        t, step = firsts[judged.rank]
        return [self._incident(t, t, judged.cause, judged.rank,
                               [f"rank {judged.rank}: first non-finite loss at step {step:.0f}"],
                               0.0)]

    def incidents(self) -> list[Incident]:
        restarts = self.restarts_found()
        stalls = [s for s in self.stalls() if not restart_stall(s, restarts, self.gap)]
        found = [*stalls, *restarts, *self.stragglers(), *self.checkpoints(), *self.nonfinite(),
                 *self.quality()]
        return sorted(found, key=lambda i: (i.start, i.cause))


def restart_stall(stall: Incident, restarts: list[Incident], slack: float) -> bool:
    """Whether ``stall`` is a restart's own: while the agent restarts the group no rank steps,
    so a stall that began (give or take ``slack``, the scrape's resolution) between a
    restart's last step and its return is explained by it. One that began earlier is a fault
    of its own even when its last stalled sample comes after the restart's last step (the
    stalled gauge lags the resumed steps by up to a scrape)."""
    return any(r.start - slack <= stall.start <= r.end for r in restarts)


def _increase(samples: Samples, start: float, end: float) -> float:
    """A counter's rise between two times (resets, a restarted process, counted from 0)."""
    inside = [v for t, v in samples if start <= t <= end]
    rise = 0.0
    for a, b in itertools.pairwise(inside):
        rise += b - a if b >= a else b
    return rise


def _merged(found: list[tuple[float, float]], gap: float) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(found):
        if out and a - out[-1][1] <= gap:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def job_incidents(api: PrometheusAPI, job: str, start: float, end: float,
                  step: float) -> list[Incident]:
    return HistoryJudge(History(job, start, end, step, api)).incidents()
