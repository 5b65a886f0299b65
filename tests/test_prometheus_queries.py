"""What the Prometheus source asks Prometheus for each refresh: the same few requests whatever
the job's size, and of the large selections only what Prometheus scraped since the source last
read it. A stand-in answers each query and federation request from a synthetic job's series (by
metric name and instance, as the selectors the source sends select them), each target with the
time of its last scrape, for 4 ranks and for 64 (the benchmark: 2048)."""

from __future__ import annotations

import re

import pytest
from synthetic_job import RankSpec, job_expositions, training_exposition

from fsdpmon.scrape.expfmt import Parser, Sample
from fsdpmon.scrape.sources.cadence import SLOW_NAMES
from fsdpmon.scrape.sources.prometheus import PrometheusSource
from fsdpmon.scrape.wanted import WANTED


class _Stand_in(PrometheusSource):
    """A Prometheus that has scraped ``payloads`` (path → body) once, at time 1.0."""

    def __init__(self, payloads: dict[str, bytes]) -> None:
        super().__init__("http://127.0.0.1:9", job_name="llama")
        self.targets: dict[str, tuple[float, list[dict]]] = {}  # instance → (scraped at, series)
        self.up_unseen: set[str] = set()  # instances whose `up` queries do not see
        for path, body in payloads.items():
            self.scrape(path, body, at=1.0)

    def scrape(self, path: str, body: bytes, at: float) -> None:
        """Prometheus scrapes the target at ``path`` at time ``at`` and finds ``body``."""
        scrape = {"job": path.strip("/").split("/")[0], "instance": f"10.0.0.1:{path}"}
        self.targets[scrape["instance"]] = at, [
            {"metric": {**s[1], **scrape, "__name__": s[0]}, "value": [at, repr(s[2])]}
            for s in [*Parser().parse(body), ("up", {}, 1.0)]]

    def forget(self, path: str) -> None:
        """The target is no longer scraped (its pod is gone): no `up`, no series."""
        del self.targets[f"10.0.0.1:{path}"]

    def query(self, promql: str) -> list[dict]:
        self.queries += 1
        if promql.startswith("timestamp("):
            return [{"metric": {k: v for k, v in r["metric"].items() if k != "__name__"},
                     "value": [9.0, repr(r["value"][0])]} for r in self._answer(promql[10:-1])]
        return self._answer(promql)

    def _answer(self, promql: str) -> list[dict]:
        return [r for r in self._matching(promql)
                if not (promql.startswith("up{") and r["metric"]["instance"] in self.up_unseen)]

    def federated(self, selection: str, selected: list[str]) -> list[Sample]:
        self.queries += 1
        return [Sample(r["metric"]["__name__"],
                       {k: v for k, v in r["metric"].items() if k != "__name__"},
                       float(r["value"][1]))
                for selector in selected for r in self._matching(selector)]

    def _matching(self, promql: str) -> list[dict]:
        match = re.search(r'__name__=~"([^"]*)"', promql)
        pattern = match.group(1) if match else re.match(r"(?:\w+\()?(\w+)", promql).group(1)
        names = re.compile(pattern)
        match = re.search(r'instance=~"([^"]*)"', promql)
        instances = re.compile(match.group(1).replace("\\\\", "\\") if match else ".*")
        return [r for instance, (_, rows) in self.targets.items() if instances.fullmatch(instance)
                for r in rows if names.fullmatch(r["metric"]["__name__"])]


def _series(payloads: dict[str, bytes], names: frozenset[str] | None = None) -> int:
    return sum(1 for body in payloads.values() for s in Parser().parse(body)
               if names is None or s.name in names)


@pytest.mark.parametrize(("nodes", "gpus"), [(2, 2), (16, 4)])
def test_requests_per_refresh_do_not_grow_with_the_job(nodes, gpus):
    payloads = job_expositions("llama", nodes, gpus)
    source = _Stand_in(payloads)
    snap = source.fetch()
    assert len(snap.ranks) == nodes * gpus, f"{len(snap.ranks)} ranks of {nodes * gpus}"
    assert source.queries == 6, f"{source.queries} requests for {nodes * gpus} ranks, not 6"
    assert source.series_read > 0
    light = source.fetch()
    assert source.queries == 6 + 2, f"{source.queries - 6} on a light refresh with nothing " \
        "scraped since, not 2 (up and its timestamps)"
    assert source.series_read == 0, f"{source.series_read} series read again, none scraped"
    assert [(r.rank, r.node, r.step) for r in light.ranks] == \
        [(r.rank, r.node, r.step) for r in snap.ranks]
    assert {t.node for t in light.targets} == {f"node-{n:03d}" for n in range(nodes)}, \
        "each target's labels carried from the full refresh"


def test_only_what_prometheus_scraped_since_is_read_again():
    payloads = job_expositions("llama", 2, 2)
    source = _Stand_in(payloads)
    source.fetch()
    everyone = [RankSpec(rank=r, local_rank=r % 2, world_size=4, nodes=2,
                         node=f"node-{r // 2:03d}", step=101, loss=1.5 + r) for r in range(4)]
    newer = {"/train/node-001": training_exposition("llama", everyone[2:], everyone)}
    source.scrape("/train/node-001", newer["/train/node-001"], at=2.0)
    snap = source.fetch()
    assert source.cadence.full is False
    expected = _series(newer, WANTED - SLOW_NAMES)  # one target's, of a light refresh's names
    assert source.series_read == expected, f"{source.series_read} series read, not {expected}"
    assert {r.rank: (r.step, r.loss) for r in snap.ranks} == {
        0: (100, 2.5), 1: (100, 2.5), 2: (101, 3.5), 3: (101, 4.5)}, "new figures of node-001"


def test_a_full_refresh_reads_only_the_slow_names_of_targets_not_scraped_since():
    payloads = job_expositions("llama", 2, 2)
    source = _Stand_in(payloads)
    source.cadence.names()  # the first refresh is light: every name but the slow ones read
    source.fetch()
    assert source.cadence.full is False
    full = source.fetch()
    assert source.cadence.full is True, "a target lacking its static facts: a full refresh"
    expected = _series(payloads, SLOW_NAMES)
    assert source.series_read == expected, f"{source.series_read} series read, not {expected}"
    assert all(r.node for r in full.ranks) and len(full.processes) == 4


def test_a_series_gone_since_the_last_read_is_gone_from_the_snapshot():
    payloads = job_expositions("llama", 1, 2)
    source = _Stand_in(payloads)
    assert [r.loss for r in source.fetch().ranks] == [2.5, 2.5]
    path = "/train/node-000"
    body = b"".join(line + b"\n" for line in payloads[path].splitlines()
                    if not line.startswith(b"fsdpmon_train_loss{"))
    source.scrape(path, body, at=2.0)
    assert [r.loss for r in source.fetch().ranks] == [None, None]


def test_a_target_no_longer_scraped_is_down_and_forgotten():
    payloads = job_expositions("llama", 2, 2)
    source = _Stand_in(payloads)
    source.fetch()
    source.forget("/train/node-001")
    snap = source.fetch()
    assert [r.rank for r in snap.ranks if r.down] == [2, 3]
    assert [t.up for t in snap.targets].count(False) == 1
    assert source.cadence.lacking, "a target gone (a pod restarted elsewhere?): ask who belongs"
    source.scrape("/train/node-001", payloads["/train/node-001"], at=1.0)  # same time, back
    back = source.fetch()
    assert not any(r.down for r in back.ranks), "read again though its scrape time is as before"


def test_a_target_whose_up_is_not_seen_is_read_every_refresh_and_shown_as_it_is():
    """VictoriaMetrics answered `up` and `timestamp(up)` without a target at times while its
    series were there: without a scrape time, its series are read every refresh."""
    payloads = job_expositions("llama", 2, 2)
    source = _Stand_in(payloads)
    source.up_unseen.add("10.0.0.1:/train/node-001")
    for _ in range(3):
        snap = source.fetch()
        assert not any(r.down for r in snap.ranks), [r.rank for r in snap.ranks if r.down]
    assert source.targets_read == 1, f"{source.targets_read} targets read, not node-001's"
    source.forget("/train/node-001")
    assert [r.rank for r in source.fetch().ranks if r.down] == [2, 3]


def test_a_target_that_joins_between_full_refreshes_is_asked_about_at_once():
    """A target the carried membership does not know (a node added, a pod restarted with a new
    address) shows at the next refresh, which asks who belongs again."""
    payloads = job_expositions("llama", 2, 2)
    source = _Stand_in({p: b for p, b in payloads.items() if p.endswith("node-000")})
    assert [r.rank for r in source.fetch().ranks] == [0, 1]
    source.fetch()
    assert source.cadence.full is False
    for path in (p for p in payloads if p.endswith("node-001")):
        source.scrape(path, payloads[path], at=1.0)
    for _ in range(5):  # at the latest, the cadence's next full refresh
        known = source.fetch()
        if source.cadence.full:
            break
    assert {r.rank: r.node for r in known.ranks} == {0: "node-000", 1: "node-000",
                                                     2: "node-001", 3: "node-001"}

