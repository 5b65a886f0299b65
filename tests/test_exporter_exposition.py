"""The cached exposition: rendered once per sample, identical to the uncached one, fresh staleness,
and read correctly by a real Prometheus server (gzip members back to back included)."""

from __future__ import annotations

import gzip
import json
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text
from prometheus_stack import Prometheus, run_prometheus

from fsdpmon.exporters.exposition import CachedExposition
from fsdpmon.exporters.host import HostReader
from fsdpmon.exporters.procs import ProcessScanner
from fsdpmon.exporters.sampler import Sampler
from fsdpmon.exporters.simulated import SimulatedReader
from fsdpmon.httpserve import serve
from fsdpmon.webconfig import WebConfig

# quiet: its processes mostly wait (8.0 s, 2.6 s alone, /usr/bin/time, 2-core VM)
pytestmark = pytest.mark.quiet

FIXTURE = Path(__file__).parent / "fixtures" / "proc"
OPENMETRICS = "application/openmetrics-text; version=1.0.0"
LIVE = {"fsdpmon_exporter_sample_age_seconds"}


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _sampler(clock: Clock | None = None) -> Sampler:
    gpus = SimulatedReader(4)
    gpus.open()
    return Sampler("node-a", 1.0, gpus, HostReader(str(FIXTURE)), ProcessScanner(str(FIXTURE)),
                   clock=clock or time.time)


def _samples(text: str, parser=parse_text) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in parser(text) if f.name not in LIVE for s in f.samples}


def test_rendered_once_per_sample_and_same_as_uncached() -> None:
    sampler = _sampler()
    sampler.sample_once()
    exposition = CachedExposition(sampler, "0.1.0", simulated=True)
    bodies = [exposition.render(None, None)[1] for _ in range(5)]
    assert exposition.renders == 1
    uncached = generate_latest(exposition.registry).decode()
    assert _samples(bodies[-1].decode()) == _samples(uncached)
    sampler.sample_once()
    exposition.render(None, None)
    assert exposition.renders == 2


def test_staleness_is_computed_at_every_scrape() -> None:
    clock = Clock()
    sampler = _sampler(clock)
    sampler.sample_once()
    exposition = CachedExposition(sampler, "0.1.0", simulated=True)
    assert b'fsdpmon_exporter_sample_stale{node="node-a"} 0.0' in exposition.render(None, None)[1]
    clock.now += 60  # no new sample for a minute: the cached part must not hide it
    body = exposition.render(None, None)[1]
    assert b'fsdpmon_exporter_sample_stale{node="node-a"} 1.0' in body
    assert b'fsdpmon_exporter_sample_age_seconds{node="node-a"} 6' in body
    assert exposition.renders == 1


def test_openmetrics_and_gzip() -> None:
    sampler = _sampler()
    sampler.sample_once()
    exposition = CachedExposition(sampler, "0.1.0", simulated=True)
    content_type, body, zipped = exposition.render(OPENMETRICS, "gzip")
    assert content_type.startswith("application/openmetrics-text") and zipped
    text = gzip.decompress(body).decode()  # two gzip members read as one stream
    assert text.count("# EOF") == 1 and text.endswith("# EOF\n")
    families = {f.name for f in parse_om(text)}
    assert {"fsdpmon_exporter_sample_stale", "fsdpmon_gpu_utilization_ratio"} <= families
    plain = exposition.render(None, "gzip")[1]
    assert _samples(gzip.decompress(plain).decode()) == _samples(text, parse_om)


def _query(prom: Prometheus, promql: str) -> list[dict]:
    url = f"{prom.url}/api/v1/query?query={urllib.request.quote(promql)}"
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)["data"]["result"]


@pytest.mark.slow
def test_a_real_prometheus_scrapes_it(tmp_path: Path) -> None:
    sampler = _sampler()
    sampler.start()
    server = serve(CachedExposition(sampler, "0.1.0", simulated=True), "127.0.0.1", 0,
                   WebConfig(), sampler.health)
    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
              "scrape_configs": [{"job_name": "fsdpmon-node", "static_configs": [
                  {"targets": [f"127.0.0.1:{server.port}"]}]}]}
    try:
        with run_prometheus(tmp_path, config) as prom:
            deadline = time.monotonic() + 60
            gpus: list[dict] = []
            while time.monotonic() < deadline:
                try:
                    gpus = _query(prom, 'fsdpmon_gpu_up{model="SIMULATED"}')
                except OSError:
                    gpus = []
                if len(gpus) == 4:
                    break
                time.sleep(0.5)
            assert len(gpus) == 4
            (up,) = _query(prom, 'up{job="fsdpmon-node"}')
            assert up["value"][1] == "1"
            (stale,) = _query(prom, "fsdpmon_exporter_sample_stale")
            assert stale["value"][1] == "0"
            assert len(_query(prom, "fsdpmon_process_info")) == 3
    finally:
        server.stop()
        sampler.stop()


def _wsgi_get(app, query: str, accept: str = "") -> bytes:
    status: list[str] = []
    body = b"".join(app({"REQUEST_METHOD": "GET", "QUERY_STRING": query, "HTTP_ACCEPT": accept},
                        lambda s, headers: status.append(s)))
    assert status == ["200 OK"], status
    return body


def test_name_filter_answers_as_prometheus_client_does() -> None:
    """`top` asks with Prometheus's ``name[]`` filter: the same samples of those names as the
    whole exposition holds, nothing else, in both formats."""
    sampler = _sampler()
    sampler.sample_once()
    exposition = CachedExposition(sampler, "0.1.0", simulated=True)
    names = {"fsdpmon_gpu_utilization_ratio", "fsdpmon_exporter_info", "fsdpmon_process_info"}
    query = "&".join(f"name%5B%5D={n}" for n in sorted(names))
    full = _samples(_wsgi_get(exposition, "").decode())
    cut = _wsgi_get(exposition, query)
    want = {k: v for k, v in full.items() if k[0] in names}
    assert want and _samples(cut.decode()) == want, f"{len(_samples(cut.decode()))} vs {len(want)}"
    assert len(cut) < len(_wsgi_get(exposition, "")) / 4, len(cut)
    om = _wsgi_get(exposition, query, OPENMETRICS).decode()
    assert om.endswith("# EOF\n") and _samples(om, parse_om) == want
