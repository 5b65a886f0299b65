"""Prometheus history as the judge's evidence: one range query of the job's training series,
cut at each query step into the snapshot `diagnose --prometheus` would have built then (the
same regrouping per target and the same aggregation), so that the replayed judge
(fsdpmon.diagnose.replay) sees what the live one saw.
"""

from __future__ import annotations

import json
from typing import Any

from fsdpmon.job.snapshot import JobSnapshot
from fsdpmon.scrape.aggregate import aggregate
from fsdpmon.scrape.expfmt import Sample
from fsdpmon.scrape.prometheus_api import PrometheusAPI
from fsdpmon.scrape.sources.prometheus import TRAINING_NAMES, select, target_results
from fsdpmon.scrape.wanted import TRAIN_INFO


def snapshots(api: PrometheusAPI, job: str, start: float, end: float,
              step: float) -> list[JobSnapshot]:
    """The job's snapshot at each query step between ``start`` and ``end`` where any of its
    training series had a value, oldest first."""
    where = f",job_name={json.dumps(job)}" if job else ""
    found = api.query_range(select(TRAINING_NAMES, where), start, end, step)
    at: dict[float, list[Sample]] = {}
    known: dict[tuple[str, str], dict[str, str]] = {}
    # series of one target share one label dict, as a scrape's do (the aggregation's memo)
    shared: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
    for s in found:
        metric = dict(s.get("metric") or {})
        name = str(metric.pop("__name__", ""))
        labels = shared.setdefault(tuple(sorted(metric.items())), metric)
        if name == TRAIN_INFO:
            known[(labels.get("job", ""), labels.get("instance", ""))] = labels
        for t, v in s.get("values") or []:
            at.setdefault(float(t), []).append(Sample(name, labels, _number(v)))
    out: list[JobSnapshot] = []
    previous = None
    for t in sorted(at):
        # a target known to the job without a sample now is down, as the live source says
        previous = aggregate(target_results(known, {}, at[t]), now=t, source="prometheus",
                             previous=previous, job_name=job)
        out.append(previous)
    return out


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")
