"""Scraping plain targets: concurrent, bounded, timed out; a bad target is marked down."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from payload_server import PayloadServer
from synthetic_job import job_expositions

from fsdpmon.errors import ConfigError
from fsdpmon.job.snapshot import JobState
from fsdpmon.scrape.httpget import IN_FLIGHT, ScrapeError, get_all, http_get
from fsdpmon.scrape.sources.targets import TargetsSource, normalise_url


@pytest.fixture
def server():
    srv = PayloadServer(job_expositions("llama", 2, 2))
    srv.payloads["/garbage"] = b"\x00\xff{{{ not an exposition\n" * 1000
    yield srv
    srv.close()


@pytest.fixture
def silent_port():
    """A port that accepts connections and never answers (a hung pod)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield sock.getsockname()[1]
    sock.close()


def _urls(srv: PayloadServer) -> list[str]:
    return [srv.url(p) for p in ("/train/node-000", "/node/node-000", "/train/node-001",
                                 "/node/node-001")]


def test_scrapes_every_target_into_one_snapshot(server):
    source = TargetsSource(_urls(server), timeout_s=2.0)
    try:
        snap = source.fetch()
        assert snap.state is JobState.RUNNING and snap.targets_up == 4
        assert len(snap.ranks) == 4 and len(snap.gpus) == 4 and len(snap.processes) == 4
        assert [t.kind for t in snap.targets] == ["train", "exporter"] * 2
        again = source.fetch()
        assert len(again.history.tokens_per_second) == 2
    finally:
        source.close()


def test_hung_refusing_erroring_and_garbage_targets_are_marked_down(server, silent_port):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        refused = s.getsockname()[1]
    urls = [*_urls(server), f"127.0.0.1:{silent_port}", f"127.0.0.1:{refused}",
            server.url("/missing"), server.url("/garbage")]
    source = TargetsSource(urls, timeout_s=0.5)
    try:
        start = time.monotonic()
        snap = source.fetch()
        elapsed = time.monotonic() - start
    finally:
        source.close()
    assert elapsed < 5.0  # the hung target costs one timeout, in parallel with the rest
    by_url = {t.url: t for t in snap.targets}
    assert by_url[f"http://127.0.0.1:{silent_port}/metrics"].error == "timed out"
    assert by_url[f"http://127.0.0.1:{refused}/metrics"].error == "connection refused"
    assert "HTTP 404" in by_url[server.url("/missing")].error
    garbage = by_url[server.url("/garbage")]
    assert garbage.up and garbage.samples == 0  # unreadable text: no samples, no crash
    assert len(snap.ranks) == 4 and snap.state is JobState.DEGRADED


def test_body_limit(server):
    with pytest.raises(ScrapeError, match="larger than"):
        http_get(server.url("/train/node-000"), 2.0, max_bytes=100)


def test_url_validation():
    assert normalise_url("10.0.0.1:9520") == "http://10.0.0.1:9520/metrics"
    assert normalise_url("https://h:1/x/metrics") == "https://h:1/x/metrics"
    with pytest.raises(ConfigError, match="--targets"):
        normalise_url("ftp://h/x")
    with pytest.raises(ConfigError, match="invalid port"):
        normalise_url("h:99999")
    with pytest.raises(ConfigError):
        TargetsSource([])


def test_selector_fetch_keeps_http_get_reasons(server, silent_port):
    """The many-at-once GET (TargetsSource) reports what http_get reports, body cap included."""

    def get(url: str, max_bytes: int = 1 << 20, timeout_s: float = 2.0) -> str:
        got: list[str] = []

        def done(index: int, body: bytes | None, error: str, duration_s: float) -> None:
            got.append(error or f"{len(body or b'')} bytes")

        get_all([url], timeout_s, 4, done, max_bytes=max_bytes)
        return got[0]

    assert get(server.url("/train/node-000"), 100) == "body larger than 100 bytes"
    assert get(server.url("/missing")) == "HTTP 404 Not Found"
    assert get(f"http://127.0.0.1:{silent_port}/metrics", timeout_s=0.3) == "timed out"
    whole = http_get(server.url("/train/node-000"), 2.0)
    assert get(server.url("/train/node-000")) == f"{len(whole)} bytes"
    assert get(server.url("/garbage")) == f"{len(server.payloads['/garbage'])} bytes"


def test_https_targets_go_through_blocking_gets_beside_the_loop(server):
    """An https URL is fetched by http_get on a thread (TLS, certificate checks) while the
    plain ones share the selector loop; a failed handshake marks only that target down."""
    plain_http = socket.socket()  # answers plain HTTP at once: a TLS client must refuse it
    plain_http.bind(("127.0.0.1", 0))
    plain_http.listen(4)

    def answer() -> None:
        conn, _ = plain_http.accept()
        with conn:
            conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")

    threading.Thread(target=answer, daemon=True).start()
    tls = f"https://127.0.0.1:{plain_http.getsockname()[1]}/metrics"
    source = TargetsSource([*_urls(server)[:1], tls], timeout_s=2.0)
    try:
        snap = source.fetch()
    finally:
        source.close()
        plain_http.close()
    plain, secure = snap.targets
    assert plain.up and plain.kind == "train"
    assert not secure.up and "SSL" in secure.error


def test_a_refresh_keeps_at_most_in_flight_requests_open_at_once():
    """Plain-HTTP scrapes keep up to IN_FLIGHT connections open at once (so the pods' answers
    wait in the kernel while top parses), never more."""
    from test_httpget import RawServer

    srv = RawServer(b"HTTP/1.0 200 OK\r\n\r\nm 1\n", delay_s=0.2)
    source = TargetsSource([f"{srv.url}?n={i}" for i in range(IN_FLIGHT + 32)], timeout_s=10.0)
    try:
        snap = source.fetch()
        assert snap.targets_up == IN_FLIGHT + 32, [t.error for t in snap.targets if not t.up]
        assert srv.served == IN_FLIGHT + 32, srv.served
        # each answer waits 0.2 s, so every connection allowed is open by then
        assert IN_FLIGHT // 2 < srv.most_open <= IN_FLIGHT, (srv.most_open, IN_FLIGHT)
    finally:
        source.close()
        srv.close()
