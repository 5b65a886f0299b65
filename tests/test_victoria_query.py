"""The Prometheus API client against a real VictoriaMetrics at its default flags.

VictoriaMetrics answers an instant query for "now" as of ``-search.latencyOffset`` ago (30 s
by default) unless the query says ``nocache=1``: `top` and `diagnose --prometheus` would see
every rank as it was 30 s before, and a series younger than that not at all. PrometheusAPI
asks with ``nocache=1``; a sample written a second ago must come back, at the query's time.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request

import pytest
from victoria_stack import _started, missing

from fsdpmon.scrape.expfmt import parse
from fsdpmon.scrape.prometheus_api import PrometheusAPI

# quiet: its processes mostly wait (5.3 s, 2.2 s alone, /usr/bin/time, 2-core VM)
pytestmark = [
    pytest.mark.quiet,
    pytest.mark.slow,
    pytest.mark.skipif("victoria-metrics" in missing(),
                       reason="Debian victoria-metrics missing (scripts/setup.sh --test)"),
]


# VictoriaMetrics makes a write searchable within a couple of seconds; a query that comes
# earlier is remembered as empty for about 10 s more, so the samples are written once, first.
SEARCHABLE_AFTER_S = 3.0
LATENCY_OFFSET_S = 30.0  # victoria-metrics' -search.latencyOffset default
SITE = "train.py:3 in <module> (it's)"  # a stack site: VictoriaMetrics' federation escapes < and '


@pytest.fixture(scope="module")
def vm(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vm")
    # its defaults otherwise: -search.latencyOffset=30s, the response cache on
    with _started("victoria-metrics", [f"-storageDataPath={tmp / 'data'}"], tmp) as url:
        written = time.time() - 1
        millis = int(written * 1000)
        put(url, f'fsdpmon_probe_step{{rank="0"}} 42 {millis}\n'
                 f'fsdpmon_probe_fresh{{rank="0"}} 7 {millis}\n'
                 f'fsdpmon_probe_site{{site={json.dumps(SITE)}}} 1 {millis}\n')
        time.sleep(SEARCHABLE_AFTER_S)
        yield url, written


def put(url: str, lines: str) -> None:
    request = urllib.request.Request(f"{url}/api/v1/import/prometheus", data=lines.encode())
    with urllib.request.urlopen(request, timeout=5):
        pass


def newest(url: str, name: str, timeout_s: float = 15.0) -> list[dict]:
    """The instant vector of ``name``, asked until it answers (a slow flush on a loaded
    machine) or ``timeout_s`` passes."""
    api = PrometheusAPI(url)
    deadline = time.monotonic() + timeout_s
    while True:
        found = api.query(name)
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def test_an_instant_query_sees_the_newest_sample_and_now(vm):
    vm, _ = vm
    found = newest(vm, "fsdpmon_probe_step")
    assert [(s["metric"]["rank"], s["value"][1]) for s in found] == [("0", "42")], found
    asked = time.time()
    now = PrometheusAPI(vm).query('vector(time())')
    # the query's time, not 30 s before it (time() is what the stall rules subtract from)
    assert abs(float(now[0]["value"][1]) - asked) < 5, (now, asked)


def test_without_nocache_victoriametrics_hides_the_newest_sample(vm):
    """The other side: the same query without the parameter (what the client sent before)
    misses a sample younger than the latency offset, which the client's query finds."""
    vm, written = vm
    params = urllib.parse.urlencode({"query": "fsdpmon_probe_fresh"})
    with urllib.request.urlopen(f"{vm}/api/v1/query?{params}", timeout=5) as answer:
        hidden = json.loads(answer.read())["data"]["result"]
    assert time.time() - written < LATENCY_OFFSET_S, "too slow to see the offset at work"
    assert hidden == [], hidden
    assert newest(vm, "fsdpmon_probe_fresh"), "the client does not see it either"


def test_federation_sees_the_newest_sample(vm):
    """`top --prometheus` reads its two large selections from /federate: VictoriaMetrics
    serves the series written a second ago there too, in the exposition format."""
    vm, written = vm
    newest(vm, "fsdpmon_probe_fresh")  # searchable by now
    body = PrometheusAPI(vm).federate(['{__name__=~"fsdpmon_probe_fresh|fsdpmon_probe_step"}'])
    assert time.time() - written < LATENCY_OFFSET_S, "too slow to see the offset at work"
    found = sorted((s.name, s.labels, s.value) for s in parse(body))
    assert found == [("fsdpmon_probe_fresh", {"rank": "0"}, 7.0),
                     ("fsdpmon_probe_step", {"rank": "0"}, 42.0)], body[:500]


def test_federated_label_values_come_back_as_written(vm):
    """VictoriaMetrics' /federate writes label values as JSON strings (``<`` as ``\\u003c``,
    ``'`` as ``\\u0027``), which the exposition format does not know; the client reads them
    back as they were written."""
    vm, _ = vm
    newest(vm, "fsdpmon_probe_site")
    found = parse(PrometheusAPI(vm).federate(["fsdpmon_probe_site"]))
    assert [s.labels for s in found] == [{"site": SITE}], found


def test_timestamp_gives_the_samples_own_time(vm):
    """`top --prometheus` reads again only the targets scraped since its last refresh, told by
    ``timestamp(up)``: VictoriaMetrics answers it with the sample's own time, as Prometheus
    does, not the query's (which would have every target read every time)."""
    vm, written = vm
    newest(vm, "fsdpmon_probe_step")
    found = PrometheusAPI(vm).query("timestamp(fsdpmon_probe_step)")
    assert [round(float(s["value"][1]) * 1000) for s in found] == [int(written * 1000)], \
        f"{found} for a sample written at {int(written * 1000)} ms"
