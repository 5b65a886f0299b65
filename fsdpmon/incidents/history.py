"""A job's incidents from Prometheus history (range queries through the one client): the one
module that knows which series tell them, so that it can be pointed at new culprit series
(per-rank collective progress) without touching the rest.

From the per-rank series the monitor serves:
- a stall: ``fsdpmon_train_stalled`` at 1 on any rank; its culprit the rank the pod's server
  found ``fsdpmon_train_unresponsive`` meanwhile (``rank_unresponsive``), else a ``hang``;
- a restart: a rank's ``fsdpmon_train_previous_exit{how="killed"}`` (the diagnosis'
  ``exits.died`` over every rank's ending names who brought the group down);
- a straggler: ``fsdpmon_train_straggling`` at 1, named compute or data by
  ``straggler_rules.straggler_cause`` over the ranks' figures then;
- a slow checkpoint: ``fsdpmon_train_checkpoint_time_ratio`` over its limit, the culprit the
  rank with the most ``fsdpmon_train_checkpoint_own_seconds``;
- a non-finite loss: ``fsdpmon_train_loss_first_nonfinite_step``, the earliest rank.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fsdpmon import catalog
from fsdpmon.conventions import CHECKPOINT_SHARE_LIMIT, CRASH_LOOP_RESTARTS, EXIT_HOWS
from fsdpmon.diagnose.exits import died, exit_evidence
from fsdpmon.diagnose.straggler_rules import straggler_cause
from fsdpmon.incidents.incidents import Incident
from fsdpmon.job.snapshot import RankRow
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
    for t, v in samples:
        if not test(v):
            continue
        if out and t - out[-1][1] <= gap:
            out[-1][1] = t
        else:
            out.append([t, t])
    return [(a, b) for a, b in out]


def _at(samples: Samples, t: float) -> float | None:
    """The last value at or before ``t``."""
    found = [v for s, v in samples if s <= t]
    return found[-1] if found else None


class HistoryJudge:
    def __init__(self, history: History) -> None:
        self.h = history
        self.gap = 3 * history.step
        self.places: dict[int, dict[str, str]] = {}
        for (rank, node), _ in history.labelled(catalog.TRAIN_INFO, label="node").items():
            self.places.setdefault(int(rank), {"node": node, "pod": "", "gpu": ""})
        sizes = [v for s in history.series(catalog.TRAIN_RESTARTS).values() for _, v in s]
        self.world = max(len(self.places), 1)
        self.restarts = int(max(sizes)) if sizes else 0

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
            if len(quiet) == 1:
                evidence.append(f"rank {quiet[0]} was unresponsive meanwhile (stopped, or "
                                f"holding the GIL)")
                out.append(self._incident(start - lead, end, "rank_unresponsive", quiet[0],
                                          evidence, end - start + lead))
            else:
                out.append(self._incident(start - lead, end, "hang", None, evidence,
                                          end - start + lead))
        return out

    def restarts_found(self) -> list[Incident]:
        exits: dict[int, tuple[str, int | None]] = {}
        first_seen: list[float] = []
        for (rank, how), samples in self.h.labelled(catalog.TRAIN_PREVIOUS_EXIT,
                                                    label="how").items():
            if how in EXIT_HOWS and samples:
                exits[int(rank)] = (how, None)
                first_seen.append(samples[0][0])
        culprits, _how = died(exits)
        if not culprits or not first_seen:
            return []
        back = min(first_seen)
        last = self.h.series(catalog.TRAIN_LAST_STEP_TIMESTAMP_SECONDS)
        before = [v for s in last.values() for t, v in s if t < back and v < back]
        start = max(before) if before else back
        cause = "crash_loop" if self.restarts >= CRASH_LOOP_RESTARTS else "rank_missing"
        rank = culprits[0] if len(culprits) == 1 else None
        return [self._incident(start, back, cause, rank, exit_evidence(exits), back - start)]

    def stragglers(self) -> list[Incident]:
        flagged = self.h.series(catalog.TRAIN_STRAGGLING)
        figures = {m: self.h.series(m) for m in (catalog.TRAIN_BUSY_SECONDS,
                                                 catalog.TRAIN_STEP_TIME_SECONDS,
                                                 catalog.TRAIN_DATA_WAIT_RATIO)}
        out = []
        for rank, samples in sorted(flagged.items()):
            for start, end in spans(samples, lambda v: v >= 1, self.gap):
                rows = [self._row(r, figures, (start + end) / 2) for r in sorted(flagged)]
                row = next(r for r in rows if r.rank == rank)
                cause, why = straggler_cause(row, rows)
                others = statistics.median([r.busy_s or 0.0 for r in rows if r.rank != rank]
                                           or [0.0])
                lost = max(0.0, (row.busy_s or 0.0) - others) / max(row.step_time_s or 1.0,
                                                                    1e-9) * (end - start)
                out.append(self._incident(start, end, cause, rank, [why], lost))
        return out

    def _row(self, rank: int, figures: dict[catalog.Metric, Series], t: float) -> RankRow:
        def at(metric: catalog.Metric) -> float | None:
            return _at(figures[metric].get(rank, []), t)
        return RankRow(rank=rank, busy_s=at(catalog.TRAIN_BUSY_SECONDS),
                       step_time_s=at(catalog.TRAIN_STEP_TIME_SECONDS),
                       data_wait_ratio=at(catalog.TRAIN_DATA_WAIT_RATIO))

    def checkpoints(self) -> list[Incident]:
        ratio = self.h.series(catalog.TRAIN_CHECKPOINT_TIME_RATIO)
        seconds = self.h.series(catalog.TRAIN_CHECKPOINT_SECONDS)
        own = self.h.series(catalog.TRAIN_CHECKPOINT_OWN_SECONDS)
        saves: dict[float, tuple[float, float]] = {}  # save's seconds -> (first seen, ratio)
        for rank, samples in ratio.items():
            for t, v in samples:
                took = _at(seconds.get(rank, []), t)
                if v > CHECKPOINT_SHARE_LIMIT and took is not None:
                    key = round(took, 3)
                    saves.setdefault(key, (t, v))
        out = []
        for took, (t, share) in sorted(saves.items(), key=lambda kv: kv[1][0]):
            culprit = max(own, key=lambda r: _at(own[r], t) or 0.0) if own else None
            evidence = [f"a save took {took:.1f} s, {share:.0%} of the time since the previous "
                        f"(limit {CHECKPOINT_SHARE_LIMIT:.0%})"]
            out.append(self._incident(t - took, t, "checkpoint_slow", culprit, evidence, took))
        return out

    def nonfinite(self) -> list[Incident]:
        firsts = {r: s[0] for r, s in self.h.series(
            catalog.TRAIN_LOSS_FIRST_NONFINITE_STEP).items() if s}
        if not firsts:
            return []
        rank = min(firsts, key=lambda r: (firsts[r][1], r))
        t, step = firsts[rank]
        return [self._incident(t, t, "loss_nonfinite", rank,
                               [f"rank {rank}: first non-finite loss at step {step:.0f}"], 0.0)]

    def incidents(self) -> list[Incident]:
        found = [*self.stalls(), *self.restarts_found(), *self.stragglers(),
                 *self.checkpoints(), *self.nonfinite()]
        return sorted(found, key=lambda i: (i.start, i.cause))


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
