"""HTTP GETs for scrapes: the many-at-once selector loop, its answer framing and its limits."""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections.abc import Iterator

import psutil
import pytest
from payload_server import PayloadServer
from synthetic_job import job_expositions

from fsdpmon.scrape import httpget
from fsdpmon.scrape.httpget import ScrapeError, body_of, get_all, http_get


class RawServer:
    """Answers every connection with fixed bytes after ``delay_s``, counting how many
    connections were open at once (what a bounded pool must keep under its limit)."""

    def __init__(self, answer: bytes, delay_s: float = 0.0, linger_s: float = 0.0) -> None:
        self.answer, self.delay_s, self.linger_s = answer, delay_s, linger_s
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.open = self.most_open = self.served = 0
        self.requests: list[bytes] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with self._lock:
            self.open += 1
            self.most_open = max(self.most_open, self.open)
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                request += chunk
            time.sleep(self.delay_s)
            with self._lock:
                self.requests.append(request)
                self.open -= 1
                self.served += 1
            conn.sendall(self.answer)
            time.sleep(self.linger_s)  # a server that keeps the connection open after answering

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def payloads() -> Iterator[PayloadServer]:
    srv = PayloadServer(job_expositions("llama", 2, 2))
    yield srv
    srv.close()


def _get_all(urls: list[str], timeout_s: float = 2.0, limit: int = 8,
             max_bytes: int = 1 << 20) -> dict[int, str | bytes]:
    got: dict[int, str | bytes] = {}

    def done(index: int, body: bytes | None, error: str, duration_s: float) -> None:
        assert index not in got and duration_s >= 0
        got[index] = body if body is not None else error

    get_all(urls, timeout_s, limit, done, max_bytes=max_bytes)
    return got


def test_every_url_answered_once_with_its_own_body(payloads):
    paths = sorted(payloads.payloads) * 3
    got = _get_all([payloads.url(p) for p in paths], limit=3)
    assert [got[i] for i in range(len(paths))] == [payloads.payloads[p] for p in paths]


def test_request_is_a_plain_http10_get_with_host_and_path():
    srv = RawServer(b"HTTP/1.0 200 OK\r\n\r\nm 1\n")
    try:
        assert _get_all([f"http://127.0.0.1:{srv.port}/x/metrics?a=1"]) == {0: b"m 1\n"}
        head = srv.requests[0].decode()
        assert head.startswith("GET /x/metrics?a=1 HTTP/1.0\r\n")
        assert f"Host: 127.0.0.1:{srv.port}\r\n" in head
    finally:
        srv.close()


def test_an_answer_with_its_length_is_done_without_waiting_for_close():
    srv = RawServer(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nm 1\n", linger_s=5.0)
    try:
        start = time.monotonic()
        assert _get_all([srv.url], timeout_s=3.0) == {0: b"m 1\n"}
        assert time.monotonic() - start < 1.0
        assert b"\r\nConnection: close\r\n" in srv.requests[0]
    finally:
        srv.close()


def test_no_more_than_limit_connections_at_once():
    srv = RawServer(b"HTTP/1.0 200 OK\r\n\r\nm 1\n", delay_s=0.05)
    try:
        got = _get_all([srv.url] * 24, limit=4)
        assert len(got) == 24 and set(got.values()) == {b"m 1\n"}
        assert srv.served == 24 and srv.most_open <= 4
    finally:
        srv.close()


def test_a_hung_target_times_out_while_the_rest_answer(payloads):
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)
    try:
        urls = [f"http://127.0.0.1:{hung.getsockname()[1]}/metrics",
                payloads.url("/train/node-000")]
        start = time.monotonic()
        got = _get_all(urls, timeout_s=0.3)
        assert got[0] == "timed out" and got[1] == payloads.payloads["/train/node-000"]
        assert time.monotonic() - start < 2.0
    finally:
        hung.close()


def test_refused_unresolvable_and_names_that_resolve(payloads):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        refused = s.getsockname()[1]
    urls = [f"http://127.0.0.1:{refused}/metrics", "http://no-such-host.invalid:1/metrics",
            payloads.url("/node/node-000").replace("127.0.0.1", "localhost")]
    got = _get_all(urls)
    assert got[0] == "connection refused"
    assert isinstance(got[1], str) and got[1]  # the resolver's own words
    assert got[2] == payloads.payloads["/node/node-000"]


@pytest.mark.parametrize("answer, expected", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nm 1\n", b"m 1\n"),
    (b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\nm 1\n", b"m 1\n"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nm \r\n2\r\n1\n\r\n0\r\n\r\n",
     b"m 1\n"),
    (b"HTTP/1.0 200\r\n\r\nm 1\n", b"m 1\n"),  # no reason phrase: http.client reads it
    (b"HTTP/1.0 404 Not Found\r\nContent-Length: 2\r\n\r\nno", "HTTP 404 Not Found"),
    (b"HTTP/1.0 200 OK\r\nContent-Length: 10\r\n\r\nm 1\n",
     "answer cut short: 4 bytes of the body, 6 missing"),
    (b"", "closed the connection without an answer"),
    (b"SSH-2.0-OpenSSH\r\n", "not an HTTP answer: 'SSH-2.0-OpenSSH'"),
])
def test_answers_are_framed_like_http_client_does(answer, expected):
    try:
        got: str | bytes = body_of(answer, 100)
    except ScrapeError as exc:
        got = str(exc)
    assert got == expected


def test_body_cap_applies_to_streamed_and_declared_bodies(payloads):
    url = payloads.url("/train/node-000")
    assert _get_all([url], max_bytes=100) == {0: "body larger than 100 bytes"}
    with pytest.raises(ScrapeError, match="larger than 100"):
        body_of(b"HTTP/1.0 200 OK\r\n\r\n" + b"x" * 101, 100)
    with pytest.raises(ScrapeError, match="larger than"):
        http_get(url, 2.0, max_bytes=100)


def test_a_failing_callback_ends_the_loop_without_leaking_sockets(payloads):
    def boom(index: int, body: bytes | None, error: str, duration_s: float) -> None:
        raise RuntimeError("aggregation bug")

    with pytest.raises(RuntimeError, match="aggregation bug"):
        get_all([payloads.url("/train/node-000")] * 16, 2.0, 8, boom)
    ours = [c for c in psutil.Process().net_connections("tcp")
            if c.raddr and c.raddr.port == payloads.port]  # client ends, not the server's
    assert ours == []


def test_an_interrupt_before_a_socket_is_registered_propagates_and_leaks_nothing(
        payloads, monkeypatch):
    """Ctrl-C (or a SIGTERM handler raising) between opening a socket and registering it: the
    interrupt itself leaves get_all, not a KeyError from the clean-up, and no socket stays."""

    class InterruptedOnThirdRegister(selectors.DefaultSelector):
        registered = 0

        def register(self, fileobj, events, data=None):
            self.registered += 1
            if self.registered == 3:
                raise KeyboardInterrupt
            return super().register(fileobj, events, data)

    monkeypatch.setattr(httpget.selectors, "DefaultSelector", InterruptedOnThirdRegister)
    with pytest.raises(KeyboardInterrupt):
        get_all([payloads.url("/train/node-000")] * 8, 2.0, 8, lambda *a: None)
    ours = [c for c in psutil.Process().net_connections("tcp")
            if c.raddr and c.raddr.port == payloads.port]
    assert ours == []
