"""HTTP GETs for scrapes: one blocking ``http_get``, and ``get_all`` for many at once.

Kept instead of a library: urllib3's pool on threads and aiohttp's asyncio client each take
several times as long to fetch a large job's targets, more than 10% of a whole refresh
(benchmarks/bench_top.py prints the three side by side).

``get_all`` drives every plain-HTTP exchange of a refresh from one thread: non-blocking
sockets, one selector, an HTTP/1.0 request, the answer read until the server closes. A scrape
needs no more of HTTP than that, and the generic layers (asyncio's transports, tasks and
futures plus http.client's header parser; urllib3's pool and threads) cost more than the work.
Whatever is not a plain ``200`` is handed to http.client's own parser, so the failure reasons
read exactly as ``http_get``'s.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import http.client
import io
import os
import selectors
import socket
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from urllib.parse import urlsplit

MAX_BODY_BYTES = 64 * 1024 * 1024  # a pod serving more than this is broken or hostile
# Blocking reads take pieces this large so that the deadline is checked between them; an
# exposition (~60 KiB a pod) is one read.
_CHUNK = 1 << 20
_HEAD_ROOM = 64 * 1024  # status line and headers, on top of the body cap
# Exchanges one refresh keeps open at once over plain HTTP (shared by top's processes). A
# socket costs the loop nothing while it waits, and with more requests out the answers wait in
# the kernel's buffers while this thread parses, instead of this thread waiting for them.
IN_FLIGHT = 64


class ScrapeError(Exception):
    """One target failed; the message is what the view shows next to it."""


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, http.client.RemoteDisconnected):
        return "closed the connection without an answer"
    if isinstance(exc, http.client.BadStatusLine):  # str() is the raw line, maybe empty
        return f"not an HTTP answer: {str(exc).strip()[:40]!r}"
    if isinstance(exc, http.client.IncompleteRead):
        return f"answer cut short: {len(exc.partial)} bytes of the body, {exc.expected} missing"
    return str(exc) or type(exc).__name__


def http_get(url: str, timeout_s: float, max_bytes: int = MAX_BODY_BYTES) -> bytes:
    """GET ``url``; raises ScrapeError with a short reason on any failure, an answer other
    than ``200`` included."""
    status, reason, body = http_exchange(url, timeout_s, max_bytes)
    if status != 200:
        raise ScrapeError(f"HTTP {status} {reason}")
    return body


def http_exchange(url: str, timeout_s: float, max_bytes: int = MAX_BODY_BYTES,
                  form: bytes | None = None, error_bytes: int = 0) -> tuple[int, str, bytes]:
    """One request: GET ``url``, or POST ``form`` (URL-encoded) to it; the answer's status,
    reason and body, whatever the status. A body with another status than ``200`` is read up
    to ``error_bytes`` (APIs that explain their errors there, like Prometheus; none by
    default). Raises ScrapeError with a short reason when no whole answer came: refused, timed
    out, cut short, or larger than ``max_bytes``."""
    parts = urlsplit(url)
    https = parts.scheme == "https"
    conn_cls = http.client.HTTPSConnection if https else http.client.HTTPConnection
    deadline = time.monotonic() + timeout_s
    conn = conn_cls(parts.hostname or "", parts.port, timeout=timeout_s)
    try:
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        if form is None:
            conn.request("GET", path or "/", headers={"Accept": "text/plain"})
        else:
            conn.request("POST", path or "/", body=form,
                         headers={"Content-Type": "application/x-www-form-urlencoded"})
        response = conn.getresponse()
        if response.status != 200:
            return response.status, response.reason, response.read(error_bytes)
        if response.length is not None and response.length > max_bytes:
            raise ScrapeError(f"body larger than {max_bytes} bytes")
        chunks, size = [], 0
        while chunk := response.read(_CHUNK):
            size += len(chunk)
            if size > max_bytes:
                raise ScrapeError(f"body larger than {max_bytes} bytes")
            if time.monotonic() > deadline:
                raise ScrapeError(f"timed out after {timeout_s:g}s")
            chunks.append(chunk)
        return 200, response.reason, chunks[0] if len(chunks) == 1 else b"".join(chunks)
    except (TimeoutError, ConnectionError, OSError, http.client.HTTPException) as exc:
        raise ScrapeError(_reason(exc)) from None
    finally:
        conn.close()


# --- many at once ------------------------------------------------------------------------

# (index of the URL, body or None, failure reason or "", seconds the exchange took)
Done = Callable[[int, "bytes | None", str, float], None]
Address = tuple[int, tuple]  # (socket family, socket address)


class _Exchange:
    """One GET in flight: the socket, what is left to send, what has arrived."""

    __slots__ = ("chunks", "deadline", "ends_at", "index", "size", "sock", "start", "unsent")

    def __init__(self, index: int, sock: socket.socket, request: bytes, timeout_s: float) -> None:
        self.index, self.sock, self.unsent = index, sock, request
        self.chunks: list[bytes] = []
        self.size = 0
        self.ends_at = _UNKNOWN  # answer length once the head has told it
        self.start = time.monotonic()
        self.deadline = self.start + timeout_s

    @property
    def complete(self) -> bool:
        """All that the answer's Content-Length announced has arrived."""
        return 0 <= self.ends_at <= self.size


@functools.lru_cache(maxsize=8192)  # the same targets every refresh
def _request(url: str) -> tuple[str, int, bytes]:
    """(host, port, the bytes of an HTTP/1.0 GET) for a plain-HTTP URL."""
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    request = (f"GET {path} HTTP/1.0\r\nHost: {parts.netloc}\r\nAccept: text/plain\r\n"
               "Accept-Encoding: identity\r\nConnection: close\r\n\r\n"
               ).encode("latin-1", "replace")
    return parts.hostname or "", parts.port or 80, request


def _lookup(host: str, port: int, flags: int = 0) -> Address:
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                  flags=flags)[0]
    return family, address


@functools.lru_cache(maxsize=8192)  # an IP literal's address never changes
def _literal(host: str, port: int) -> Address:
    return _lookup(host, port, socket.AI_NUMERICHOST)


def _resolve(hosts: set[tuple[str, int]], timeout_s: float) -> dict[tuple[str, int], Address | str]:
    """Address or failure reason per (host, port). IP literals (pod IPs) resolve at once;
    names are looked up on threads, each bounded by the timeout (getaddrinfo has none)."""
    out: dict[tuple[str, int], Address | str] = {}
    named = []
    for host, port in hosts:
        try:
            out[host, port] = _literal(host, port)
        except (OSError, UnicodeError):
            named.append((host, port))
    if not named:
        return out
    pool = ThreadPoolExecutor(max_workers=min(8, len(named)))
    futures = {pool.submit(_lookup, host, port): (host, port) for host, port in named}
    wait(futures, timeout=timeout_s)
    pool.shutdown(wait=False, cancel_futures=True)
    for future, key in futures.items():
        if not future.done():
            out[key] = "timed out"
        elif future.exception() is not None:
            out[key] = _reason(future.exception())  # type: ignore[arg-type]
        else:
            out[key] = future.result()
    return out


_UNKNOWN, _UNTIL_CLOSE = -1, -2  # answer lengths not known yet / known only at close
_LINGER_S = 0.2  # how long a complete answer waits for the server to close


def _joined(ex: _Exchange) -> bytes:
    raw = ex.chunks[0] if len(ex.chunks) == 1 else b"".join(ex.chunks)
    ex.chunks = []
    return raw


def _answer_length(first: bytes) -> int:
    """Head plus body length, from the first piece of an answer when its head is complete
    there and declares one Content-Length; _UNTIL_CLOSE otherwise (read until the server
    closes, as HTTP/1.0 does)."""
    end = first.find(b"\r\n\r\n", 0, _HEAD_ROOM)
    if end < 0:
        return _UNTIL_CLOSE
    length = _content_length(first[:end].lower())
    return _UNTIL_CLOSE if length is None or length < 0 else end + 4 + length


def _content_length(head: bytes) -> int | None:
    """The one Content-Length of a lower-cased head; None when absent, -1 when odd."""
    at = head.find(b"\r\ncontent-length:")
    if at < 0:
        return None
    if head.find(b"\r\ncontent-length:", at + 1) >= 0:
        return -1
    end = head.find(b"\r\n", at + 2)
    value = head[at + 17:end if end >= 0 else len(head)].strip()
    return int(value) if value.isdigit() else -1


class _Answer:
    """What http.client.HTTPResponse reads a whole answer from (it wants a socket's makefile)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def makefile(self, mode: str) -> io.BytesIO:
        return io.BytesIO(self.data)


def _body_via_http_client(raw: bytes, max_bytes: int) -> bytes:
    try:
        response = http.client.HTTPResponse(_Answer(raw))  # type: ignore[arg-type]
        response.begin()
        if response.status != 200:
            raise ScrapeError(f"HTTP {response.status} {response.reason}")
        body = response.read()
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise ScrapeError(_reason(exc)) from None
    if len(body) > max_bytes:
        raise ScrapeError(f"body larger than {max_bytes} bytes")
    return body


def body_of(raw: bytes, max_bytes: int = MAX_BODY_BYTES) -> bytes:
    """The body of a whole HTTP/1.x answer to a GET, or ScrapeError with the reason.

    A ``200`` framed by connection close or by a matching Content-Length is cut here;
    anything else (an error status, chunked framing, a short body) goes to http.client.
    """
    end = raw.find(b"\r\n\r\n", 0, _HEAD_ROOM)
    head = raw[:end].lower() if end > 0 else b""
    if head.startswith((b"http/1.0 200 ", b"http/1.1 200 ")) and b"transfer-encoding" not in head:
        length = _content_length(head)
        if length is None or length == len(raw) - end - 4:
            if len(raw) - end - 4 > max_bytes:
                raise ScrapeError(f"body larger than {max_bytes} bytes")
            return raw[end + 4:]
    return _body_via_http_client(raw, max_bytes)


class _Loop:
    """The selector loop behind get_all: at most ``limit`` exchanges open at a time."""

    def __init__(self, timeout_s: float, limit: int, max_bytes: int, on_done: Done) -> None:
        self.timeout_s, self.limit, self.max_bytes = timeout_s, limit, max_bytes
        self.on_done = on_done
        self.selector = selectors.DefaultSelector()
        self.open: dict[int, _Exchange] = {}  # by file descriptor

    def run(self, work: deque[tuple[int, Address | str, bytes]]) -> None:
        try:
            while work or self.open:
                while work and len(self.open) < self.limit:
                    self._start(*work.popleft())
                if not self.open:
                    continue
                now = time.monotonic()
                soonest = min(ex.deadline for ex in self.open.values())
                for key, events in self.selector.select(max(0.0, soonest - now)):
                    self._step(key.data, events)
                self._expire(time.monotonic())
        finally:  # a failing on_done ends the refresh; no socket is left behind
            for ex in list(self.open.values()):
                self._close(ex)
            self.selector.close()

    def _start(self, index: int, address: Address | str, request: bytes) -> None:
        if isinstance(address, str):
            self.on_done(index, None, address, 0.0)
            return
        # Non-blocking from the start: one system call fewer than setblocking after it.
        sock = socket.socket(address[0], socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
        ex = _Exchange(index, sock, request, self.timeout_s)
        err = sock.connect_ex(address[1])
        if err not in (0, errno.EINPROGRESS):
            sock.close()
            self.on_done(index, None, _reason(_os_error(err)), time.monotonic() - ex.start)
            return
        self.open[sock.fileno()] = ex
        self.selector.register(sock, selectors.EVENT_WRITE, ex)

    def _step(self, ex: _Exchange, events: int) -> None:
        try:
            if ex.unsent:
                self._send(ex)
                return
            raw = self._receive(ex) if events & selectors.EVENT_READ else None
            if raw is None:
                return
            body, error = body_of(raw, self.max_bytes), ""
        except BlockingIOError:
            return  # woken without data: wait again
        except ScrapeError as exc:
            body, error = None, str(exc)
        except OSError as exc:
            body, error = None, _reason(exc)
        self._finish(ex, body, error)

    def _send(self, ex: _Exchange) -> None:
        err = ex.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            raise _os_error(err)
        ex.unsent = ex.unsent[ex.sock.send(ex.unsent):]
        if not ex.unsent:
            self.selector.modify(ex.sock, selectors.EVENT_READ, ex)

    def _receive(self, ex: _Exchange) -> bytes | None:
        """The whole answer once the server has closed; None while more may come."""
        data = ex.sock.recv(_CHUNK)
        if not data:
            return _joined(ex)
        ex.size += len(data)
        if ex.size > self.max_bytes + _HEAD_ROOM:
            raise ScrapeError(f"body larger than {self.max_bytes} bytes")
        ex.chunks.append(data)
        if ex.ends_at == _UNKNOWN:
            ex.ends_at = _answer_length(ex.chunks[0])
        if ex.complete:
            # All that Content-Length announced is here. Servers close at once after an
            # HTTP/1.0 answer, and letting them close first keeps TIME_WAIT on their side
            # (closing first here cost ~30 ms per 512 scrapes); one that keeps the connection
            # open anyway is given a moment, then read as complete (see _expire).
            ex.deadline = min(ex.deadline, time.monotonic() + _LINGER_S)
        return None

    def _expire(self, now: float) -> None:
        for ex in [ex for ex in self.open.values() if ex.deadline <= now]:
            if ex.complete:  # but the server did not close
                try:
                    body, error = body_of(_joined(ex), self.max_bytes), ""
                except ScrapeError as exc:
                    body, error = None, str(exc)
                self._finish(ex, body, error)
            else:
                self._finish(ex, None, "timed out")

    def _finish(self, ex: _Exchange, body: bytes | None, error: str) -> None:
        self._close(ex)
        self.on_done(ex.index, body, error, time.monotonic() - ex.start)

    def _close(self, ex: _Exchange) -> None:
        self.open.pop(ex.sock.fileno(), None)
        # Not registered yet when an exception (Ctrl-C, the demo's SIGTERM) came between the
        # two lines of _start: the clean-up must not replace that exception with a KeyError.
        with contextlib.suppress(KeyError):
            self.selector.unregister(ex.sock)
        ex.sock.close()


def _os_error(err: int) -> OSError:
    if err == errno.ECONNREFUSED:
        return ConnectionRefusedError(err, os.strerror(err))
    return OSError(err, os.strerror(err))


def get_all(
    urls: Sequence[str], timeout_s: float, limit: int, on_done: Done,
    max_bytes: int = MAX_BODY_BYTES,
) -> None:
    """GETs every plain-HTTP URL, at most ``limit`` at a time, each within ``timeout_s``.

    ``on_done`` is called on this thread for every URL, in the order answers complete,
    with the same failure reasons as ``http_get``; a body failing ``body_of`` counts
    as failed.
    """
    planned = [_request(url) for url in urls]
    addresses = _resolve({(host, port) for host, port, _ in planned}, timeout_s)
    work = deque((i, addresses[host, port], request)
                 for i, (host, port, request) in enumerate(planned))
    _Loop(timeout_s, max(1, limit), max_bytes, on_done).run(work)
