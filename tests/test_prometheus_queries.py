"""The Prometheus source sends the same few requests per refresh whatever the job's size: a
stand-in answers each query and federation request from a synthetic job's series (by metric
name, as the selectors the source sends select them), for 4 ranks and for 64 (the benchmark:
2048)."""

from __future__ import annotations

import re

import pytest
from synthetic_job import job_expositions

from fsdpmon.scrape.expfmt import Parser, Sample
from fsdpmon.scrape.sources.prometheus import PrometheusSource


class _Stand_in(PrometheusSource):
    def __init__(self, nodes: int, gpus: int) -> None:
        super().__init__("http://127.0.0.1:9", job_name="llama")
        self.series: dict[str, list[dict]] = {}  # by metric name
        for path, body in job_expositions("llama", nodes, gpus).items():
            scrape = {"job": path.strip("/").split("/")[0], "instance": f"10.0.0.1:{path}"}
            for s in [*Parser().parse(body), ("up", {}, 1.0)]:
                self.series.setdefault(s[0], []).append(
                    {"metric": {**s[1], **scrape, "__name__": s[0]}, "value": [0, repr(s[2])]})

    def query(self, promql: str) -> list[dict]:
        self.queries += 1
        return self._matching(promql)

    def federated(self, selection: str, selected: list[str]) -> list[Sample]:
        self.queries += 1
        return [Sample(r["metric"]["__name__"],
                       {k: v for k, v in r["metric"].items() if k != "__name__"},
                       float(r["value"][1]))
                for selector in selected for r in self._matching(selector)]

    def _matching(self, promql: str) -> list[dict]:
        match = re.search(r'__name__=~"([^"]*)"', promql)
        pattern = match.group(1) if match else re.match(r"(?:\w+\()?(\w+)", promql).group(1)
        wanted = re.compile(pattern)
        return [s for name, rows in self.series.items() if wanted.fullmatch(name) for s in rows]


@pytest.mark.parametrize(("nodes", "gpus"), [(2, 2), (16, 4)])
def test_queries_per_refresh_do_not_grow_with_the_job(nodes, gpus):
    source = _Stand_in(nodes, gpus)
    snap = source.fetch()
    assert len(snap.ranks) == nodes * gpus, f"{len(snap.ranks)} ranks of {nodes * gpus}"
    assert source.queries == 5, f"{source.queries} queries for {nodes * gpus} ranks"
