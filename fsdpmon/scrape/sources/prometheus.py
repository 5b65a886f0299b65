"""The Prometheus source (`--prometheus URL`): a handful of requests per refresh (through the
one client of Prometheus' API, fsdpmon.scrape.prometheus_api), for jobs too large to scrape pod
by pod. The results are turned back into per-target samples and go through the same aggregation
as a direct scrape, so the views cannot tell the difference.

Requests per refresh (independent of the job's size): `up` for the job's targets, so a target
that stopped answering is shown as down rather than silently missing, and the time of each
one's last scrape (`timestamp(up)`); then, from /federate, the newest training series and node
series of the targets Prometheus scraped since this source last read them (sources/readcache.py:
as shipped, a 2 s refresh finds a fifth of the training pods and two fifths of the exporters
scraped since the last). Which targets (and nodes) belonged to the job in the last 10 minutes,
and which exporters served those nodes, are two more small queries, asked on the cadence's full
refreshes (every few, and at once after a target was down or lacked its facts) and carried in
between. /federate answers in the exposition format the scrape layer already reads: Prometheus
spends half the CPU on it that an instant query's JSON costs, and it parses in a third of the
time.

Each selection holds only the series top shows: where a target serves one series per ECC type
(or, before the cores had a name of their own, per core), the selector of that name is narrowed
to the one shown (a selector of its own); the process and static ``*_info`` families are asked
for at the cadence a direct scrape uses (sources/cadence.py). Series that share their labels
share one dict (the parser's cache of label blocks), so the aggregation's memo by label set
works as it does for a scrape.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from fsdpmon.errors import ConfigError
from fsdpmon.job.snapshot import JobSnapshot
from fsdpmon.scrape.aggregate import ScrapeResult, Target, aggregate
from fsdpmon.scrape.expfmt import Parser, Sample
from fsdpmon.scrape.prometheus_api import PrometheusAPI
from fsdpmon.scrape.sources.cadence import Cadence
from fsdpmon.scrape.sources.readcache import Key, Plan, ReadCache
from fsdpmon.scrape.sources.targets import normalise_url
from fsdpmon.scrape.wanted import (
    EXPORTER_INFO,
    GPU_ECC,
    HOST_CPU,
    JOB_METRICS,
    RANK_LABELLED,
    RANK_METRICS,
    TRAIN_INFO,
    WANTED,
)

LOOKBACK = "10m"  # a target seen within this window and silent now is reported down
TRAINING_NAMES = sorted({*RANK_METRICS, *JOB_METRICS, TRAIN_INFO, *RANK_LABELLED})
NODE_NAMES = sorted(WANTED - set(TRAINING_NAMES))


class Membership(NamedTuple):
    known: dict[Key, dict[str, str]]  # each target's labels (pod, node, namespace)
    exporters: frozenset[Key]  # those of them that are the job's nodes' exporters


def _names_regex(names: Iterable[str]) -> str:
    return "|".join(re.escape(n) for n in names)


def _quote(value: str) -> str:
    return json.dumps(value)  # PromQL string literals accept JSON escaping


def _alternatives_of(values: Iterable[str]) -> str:
    """A regex matcher's string literal for any of ``values`` (none: matches nothing)."""
    return _quote("|".join(re.escape(v) for v in sorted(set(values))) or "$^")


# Names of which top shows one series of several: the matcher that selects it.
_NARROWED = {
    HOST_CPU: 'cpu="all"',  # the node total (older exporters served the cores here too)
    GPU_ECC: 'type="uncorrected"',
}


def selectors(names: Iterable[str], where: str) -> list[str]:
    """The series selectors of ``names`` matching ``where`` (matchers, each with a leading
    comma): one for the plain names, one for each narrowed name."""
    wanted = sorted(set(names))
    plain = [n for n in wanted if n not in _NARROWED]
    parts = [f"{{__name__=~{_quote(_names_regex(plain))}{where}}}"] if plain else []
    for name in (n for n in wanted if n in _NARROWED):
        inner = ",".join(m for m in (where.lstrip(","), _NARROWED[name]) if m)
        parts.append(f"{name}{{{inner}}}")
    return parts


def _planned(plan: Plan, where: str) -> list[str]:
    """The selectors of a read cache's plan: each set of names for the targets it is planned
    for (by their instance)."""
    targets: dict[frozenset[str], list[str]] = {}
    for key, names in plan.items():
        targets.setdefault(names, []).append(key[1])
    return [selector for names, instances in targets.items()
            for selector in selectors(names, f"{where},instance=~{_alternatives_of(instances)}")]


def select(names: Iterable[str], where: str) -> str:
    """The same selection as one PromQL expression: the selectors as ``or`` branches (their
    label sets differ by name or by the narrowing label, so ``or`` drops none)."""
    return " or ".join(selectors(names, where))


class PrometheusSource:
    """Reads the job from Prometheus; ``fetch()`` → JobSnapshot."""

    def __init__(self, url: str, job_name: str = "", timeout_s: float = 5.0) -> None:
        base = normalise_url(url, field="--prometheus")
        self.base = base[: -len("/metrics")] if base.endswith("/metrics") else base.rstrip("/")
        if not timeout_s > 0:
            raise ConfigError("--timeout", f"must be > 0, got {timeout_s!r}")
        self.job_name, self.timeout_s = job_name, timeout_s
        self.api = PrometheusAPI(self.base, timeout_s)
        self.queries = 0
        self._previous: JobSnapshot | None = None
        self.cadence = Cadence()
        self._membership: Membership | None = None  # asked for on the cadence's full refreshes
        self._held = ReadCache()
        self.targets_read = self.series_read = 0  # at the last refresh
        self._count = threading.Lock()
        # one parser (and its cache of label blocks) per large selection: they parse at once
        self._parsers = {"training": Parser(), "node": Parser()}
        # The two large selections (training series, node series) are read at once: Prometheus
        # answers concurrent requests on its own threads, and the wait is off the GIL.
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="fsdpmon-promql")

    def showing(self, view: str, processes: bool = False) -> None:
        """The view on screen, and whether process figures are on it (``processes``; the
        Processes view always): the process families then come on every refresh."""
        self.cadence.processes_open = processes or view == "processes"

    @property
    def description(self) -> str:
        return f"Prometheus at {self.base}"

    def query(self, promql: str) -> list[dict[str, Any]]:
        """One instant query → its vector result; one clear error line otherwise."""
        with self._count:
            self.queries += 1
        return self.api.query(promql)

    def federated(self, selection: str, selected: list[str]) -> list[Sample]:
        """The newest sample of each series ``selected`` (the ``selection``'s parser reads
        them)."""
        with self._count:
            self.queries += 1
        return self._parsers[selection].parse(self.api.federate(selected))

    def _job_filter(self) -> str:
        return f",job_name={_quote(self.job_name)}" if self.job_name else ""

    def fetch(self) -> JobSnapshot:
        job = self._job_filter()
        names = self.cadence.names()
        if self.cadence.full or self._membership is None:
            self._membership = self._members(job)
        known = self._membership.known
        targets = f"up{{instance=~{_alternatives_of(k[1] for k in known)}}}"
        up = {_key(r["metric"]): _value(r) for r in self.query(targets)}
        scraped = {_key(r["metric"]): _value(r) for r in self.query(f"timestamp({targets})")}
        series = self._newest(names, scraped, job)
        results = [self.cadence.complete(r) for r in target_results(known, up, series)]
        self._previous = aggregate(results, now=time.time(), source="prometheus",
                                   previous=self._previous, job_name=self.job_name,
                                   processes_asked=self.cadence.processes_asked)
        self.cadence.check(self._previous)
        return self._previous

    def _newest(self, names: frozenset[str], scraped: dict[Key, float],
                job: str) -> list[Sample]:
        """The newest samples of ``names`` of every target of the job: those scraped since
        the last read are read (the two selections at once), the rest are as held."""
        known, exporters = self._membership
        self._held.keep(known)
        asked = {key: names.intersection(NODE_NAMES if key in exporters else TRAINING_NAMES)
                 for key in known}
        plans = {"training": self._held.plan(
                     {k: n for k, n in asked.items() if k not in exporters}, scraped),
                 "node": self._held.plan({k: asked[k] for k in exporters}, scraped)}
        where = {"training": job, "node": ""}
        reads = {selection: self._pool.submit(self.federated, selection,
                                              _planned(plan, where[selection]))
                 for selection, plan in plans.items() if plan}
        try:  # a failed read fails the refresh; what was not started is dropped
            read = {selection: future.result() for selection, future in reads.items()}
        finally:
            for future in reads.values():
                future.cancel()
        for selection, samples in read.items():
            self._held.store(plans[selection], samples, scraped)
        self.targets_read = sum(len(plans[selection]) for selection in read)
        self.series_read = sum(map(len, read.values()))
        return [s for key, names in asked.items() for s in self._held.samples(key, names)]

    def _members(self, job: str) -> Membership:
        """The job's targets and its nodes' exporters seen in the last LOOKBACK, with their
        labels."""
        members = self.query(f"last_over_time({TRAIN_INFO}{{{job[1:]}}}[{LOOKBACK}])")
        nodes = {r["metric"].get("node", "") for r in members} - {""}
        node_match = f"node=~{_alternatives_of(nodes)}"
        exporters = self.query(f"last_over_time({EXPORTER_INFO}{{{node_match}}}[{LOOKBACK}])")
        return Membership({_key(r["metric"]): r["metric"] for r in (*members, *exporters)},
                          frozenset(_key(r["metric"]) for r in exporters))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _key(metric: dict[str, str]) -> Key:
    return metric.get("job", ""), metric.get("instance", "")


def _value(result: dict[str, Any]) -> float:
    try:
        return float(result["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return float("nan")


def target_results(known: dict[Key, dict[str, str]], up: dict[Key, float],
                   series: Iterable[Sample]) -> list[ScrapeResult]:
    """Samples regrouped per scrape target (their ``job`` and ``instance`` labels), as if each
    had been scraped directly."""
    samples: dict[Key, list[Sample]] = {}
    for sample in series:
        labels = sample[1]
        key = labels.get("job", ""), labels.get("instance", "")
        found = samples.get(key)
        if found is None:
            found = samples[key] = []
        found.append(sample)
    out = []
    for key in sorted(set(known) | set(samples)):
        meta = known.get(key, {})
        target = Target(url=f"{key[1]} ({key[0]})", pod=meta.get("pod", ""),
                        node=meta.get("node", ""), namespace=meta.get("namespace", ""))
        if up.get(key, 1.0) != 1.0 or (key not in samples and key in known):
            out.append(ScrapeResult(target, None, "down (Prometheus up != 1 or no samples)"))
        else:
            out.append(ScrapeResult(target, samples.get(key, [])))
    return out
