"""The Prometheus source against a real Prometheus scraping catalog-shaped stand-in pods:
the same snapshot as a direct scrape, a fixed handful of queries, and a pod that stops
answering shown as down."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import time

import pytest
import yaml
from payload_server import PayloadServer
from support import rounded
from synthetic_job import (
    GpuSpec,
    RankSpec,
    exporter_exposition,
    job_expositions,
    training_exposition,
)

from fsdpmon.errors import UnreachableError
from fsdpmon.job.snapshot import JobState
from fsdpmon.scrape.sources.prometheus import PrometheusSource

# quiet: its processes mostly wait (8.8 s, 2.4 s alone, /usr/bin/time, 2-core VM)
pytestmark = [pytest.mark.quiet, pytest.mark.slow,
              pytest.mark.skipif(shutil.which("prometheus") is None,
                                 reason="needs the prometheus binary (scripts/setup.sh --test)")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prom")
    pods = PayloadServer(job_expositions("llama", 2, 2))
    # GPU 0 of node-001 throttled: the source's narrowed selectors must keep its active reason
    pods.payloads["/node/node-001"] = exporter_exposition("node-001", [
        GpuSpec(gpu=0, pod="llama-worker-1", pid=1000, rank=2, clock_events=("hw_slowdown",)),
        GpuSpec(gpu=1, pod="llama-worker-1", pid=1001, rank=3)])
    # rank 3 restarted by the agent, its previous life killed: the labelled series comes through
    everyone = [RankSpec(rank=r, local_rank=r % 2, world_size=4, nodes=2,
                         node=f"node-{r // 2:03d}", step_time_s=0.5 + 0.001 * (r % 2))
                for r in range(4)]
    everyone[3] = dataclasses.replace(everyone[3], restarts=1, previous_exit="killed",
                                      previous_exit_step=60, previous_exit_unix=1.7e9)
    pods.payloads["/train/node-001"] = training_exposition("llama", everyone[2:], everyone)
    scrape = [{"job_name": path.strip("/").replace("/", "-"), "honor_labels": True,
               "scrape_interval": "1s", "scrape_timeout": "1s", "metrics_path": path,
               "static_configs": [{"targets": [f"127.0.0.1:{pods.port}"]}]}
              for path in sorted(pods.payloads)]
    (tmp / "prometheus.yml").write_text(yaml.safe_dump({"scrape_configs": scrape}))
    port = _free_port()
    log = open(tmp / "prometheus.log", "w")  # noqa: SIM115 - closed in the finally below
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        source = PrometheusSource(url, job_name="llama")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                snap = source.fetch()
                if len(snap.ranks) == 4 and len(snap.gpus) == 4:
                    break
            except UnreachableError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("Prometheus never had the job's series: " +
                        (tmp / "prometheus.log").read_text()[-2000:])
        yield url, pods
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
        pods.close()


def test_same_snapshot_as_a_direct_scrape_in_a_handful_of_queries(stack):
    url, _ = stack
    source = PrometheusSource(url, job_name="llama")
    snap = source.fetch()
    assert source.queries == 6  # fixed per refresh, whatever the job's size
    assert snap.state is JobState.RUNNING and snap.source == "prometheus"
    assert [r.rank for r in snap.ranks] == [0, 1, 2, 3] and snap.world_size == 4
    assert snap.tokens_per_second == rounded(4 * 8192.0)
    assert len(snap.gpus) == 4 and len(snap.processes) == 4 and len(snap.nodes) == 2
    assert snap.targets_up == 4 and {t.kind for t in snap.targets} == {"train", "exporter"}
    events = {(g.node, g.gpu): g.clock_events for g in snap.gpus}
    assert events == {("node-000", "0"): (), ("node-000", "1"): (),
                      ("node-001", "0"): ("hw_slowdown",), ("node-001", "1"): ()}, events
    assert [g.ecc_uncorrected for g in snap.gpus] == [0.0] * 4  # one ECC series per GPU
    assert snap.nodes[0].cpu_utilization_ratio == rounded(0.35)  # the node total
    exits = {r.rank: (r.previous_exit, r.previous_exit_step, r.previous_exit_unix)
             for r in snap.ranks}
    assert exits == {0: ("", None, None), 1: ("", None, None), 2: ("", None, None),
                     3: ("killed", 60, 1.7e9)}, exits
    assert all(r.node for r in snap.ranks), [r.rank for r in snap.ranks if not r.node]
    light = source.fetch()
    assert not source.cadence.full, "with every rank's node known, the next refresh is light"
    assert source.queries <= 6 + 4, f"{source.queries - 6} requests on a light refresh, not 4"
    assert [r.node for r in light.ranks] == [r.node for r in snap.ranks], "nodes carried"


def test_reading_only_what_was_scraped_since_gives_what_a_whole_read_gives(stack):
    """Against a real Prometheus (each target scraped every second): refreshes back to back
    read again only the targets scraped in between (`timestamp(up)`), and what they hold is
    what a source reading everything afresh finds."""
    url, _ = stack
    source = PrometheusSource(url, job_name="llama")
    whole = source.fetch()
    assert source.targets_read == len(whole.targets) == 4, source.targets_read
    read = []
    for _ in range(5):
        source.fetch()
        read.append(source.targets_read)
    assert min(read) < 4, f"every refresh read every target again: {read}"
    held, afresh = source.fetch(), PrometheusSource(url, job_name="llama").fetch()

    def figures(snap):
        return ([(r.rank, r.node, r.step, r.loss, r.step_time_s, r.down) for r in snap.ranks],
                [(g.node, g.gpu, g.utilization_ratio, g.clock_events) for g in snap.gpus],
                len(snap.processes), [t.up for t in snap.targets])

    assert figures(held) == figures(afresh) == figures(whole)


def test_other_job_names_find_nothing(stack):
    url, _ = stack
    snap = PrometheusSource(url, job_name="not-this-one").fetch()
    assert snap.ranks == () and snap.gpus == ()


def test_a_pod_that_stops_answering_is_down(stack):
    url, pods = stack
    source = PrometheusSource(url, job_name="llama")
    removed = pods.payloads.pop("/train/node-001")
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            snap = source.fetch()
            # `up` and the ranks' series are separate queries: a fresh-clone run under load saw
            # up == 0 with the pod's ranks not yet down in the same fetch
            if snap.targets_up == 3 and any(r.down for r in snap.ranks):
                break
            time.sleep(0.5)
        assert snap.targets_up == 3 and snap.state is JobState.DEGRADED
        assert [r.rank for r in snap.ranks if r.down] == [2, 3]
        assert "train-node-001" in next(t.url for t in snap.targets if not t.up)
    finally:
        pods.payloads["/train/node-001"] = removed


def test_unreachable_prometheus_is_one_line():
    with pytest.raises(UnreachableError, match="connection refused"):
        PrometheusSource(f"http://127.0.0.1:{_free_port()}").fetch()
