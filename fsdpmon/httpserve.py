"""Serving for both endpoints (exporter, training): wsgiref's server, a bounded pool, auth, TLS.

prometheus_client's ``start_http_server`` supports TLS but not basic auth or extra paths, and it
starts a thread per connection. We assemble the same parts it uses (wsgiref's ``WSGIServer``,
prometheus_client's WSGI app and encoders) with what an endpoint exposed to a network needs:

- a fixed pool of worker threads; while all are busy no connection is accepted, so extra
  clients wait in the kernel's listen backlog (``BACKLOG``, not Python's 5) at no cost to us;
- optionally a pace (at most N requests per second, workers sleep in between): the training
  endpoint's bound on what scrapers can take from training, whatever they do;
- basic auth whose bcrypt work is bounded (``BasicAuth``), TLS from the web-config file;
- failures of untrusted clients (TLS handshakes, resets, garbage) logged as one line at most
  every ``ERROR_LOG_SECONDS``, with a count, never a traceback.

``/healthz`` stays outside basic auth so kubelet probes work without credentials; it reveals
nothing but liveness.
"""

from __future__ import annotations

import errno
import logging
import queue
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from fsdpmon.basicauth import BasicAuth, Verdict
from fsdpmon.errors import ConfigError
from fsdpmon.webconfig import WebConfig

log = logging.getLogger(__name__)

Health = Callable[[], tuple[bool, str]]
StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

BACKLOG = 256  # Python's default of 5 overflowed with 32 clients (p99 ~1 s of SYN retries)
CLIENT_TIMEOUT_SECONDS = 10.0  # a client that connects and stalls (TLS included) is dropped
ERROR_LOG_SECONDS = 60.0


class _QuietHandler(WSGIRequestHandler):
    timeout = CLIENT_TIMEOUT_SECONDS

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds would flood the log; errors still surface as metrics."""


class ErrorLog:
    """One log line per period for failures caused by clients, with how many there were."""

    def __init__(self, period: float = ERROR_LOG_SECONDS) -> None:
        self.period = period
        self.count = 0
        self._last = -period
        self._suppressed = 0
        self._lock = threading.Lock()

    def note(self, client: Any, exc: BaseException | None) -> None:
        now = time.monotonic()
        with self._lock:
            self.count += 1
            if now - self._last < self.period:
                self._suppressed += 1
                return
            self._last, earlier, self._suppressed = now, self._suppressed, 0
        peer = client[0] if isinstance(client, tuple) and client else client
        kind = "TLS handshake failed" if isinstance(exc, ssl.SSLError) else "request failed"
        more = f" (+{earlier} more since the last such line)" if earlier else ""
        log.warning("fsdpmon: %s for %s: %s%s; further ones within %.0fs are only counted",
                    kind, peer, _one_line(exc), more, self.period)


def _one_line(exc: BaseException | None) -> str:
    text = f"{type(exc).__name__}: {exc}" if exc is not None else "unknown error"
    return " ".join(text.split())[:200]


class Pace:
    """At most ``per_second`` request starts per second over all workers (None: no limit)."""

    def __init__(self, per_second: float | None) -> None:
        self.gap = 1.0 / per_second if per_second else 0.0
        self._next = 0.0
        self._lock = threading.Lock()

    def wait(self) -> None:
        if not self.gap:
            return
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + self.gap
        if start > now:
            time.sleep(start - now)


class PooledWSGIServer(WSGIServer):
    request_queue_size = BACKLOG
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], family: int, workers: int, pace: Pace,
                 errors: ErrorLog) -> None:
        self.address_family = family
        self.pace, self.errors = pace, errors
        self._slots = threading.Semaphore(workers)
        self._work: queue.SimpleQueue[tuple[Any, Any] | None] = queue.SimpleQueue()
        self._closing = False
        self._workers: list[threading.Thread] = []  # server_close runs if the bind fails
        super().__init__(address, _QuietHandler)
        self._workers = [threading.Thread(target=self._worker, name=f"fsdpmon-http-{i}",
                                          daemon=True) for i in range(workers)]
        for thread in self._workers:
            thread.start()

    def process_request(self, request: Any, client_address: Any) -> None:
        # Called by the accept loop: wait for a free worker, so that the next connections stay
        # in the listen backlog (the kernel's, costing nothing) instead of in our threads.
        while not self._slots.acquire(timeout=0.25):
            if self._closing:
                self.shutdown_request(request)
                return
        self._work.put((request, client_address))

    def _worker(self) -> None:
        while (item := self._work.get()) is not None:
            request, client_address = item
            try:
                self.pace.wait()
                self.finish_request(request, client_address)
            except Exception:
                self.handle_error(request, client_address)
            finally:
                self.shutdown_request(request)
                self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        self.errors.note(client_address, sys.exc_info()[1])

    def shutdown(self) -> None:
        self._closing = True
        super().shutdown()

    def server_close(self) -> None:
        self._closing = True
        super().server_close()
        for _ in self._workers:
            self._work.put(None)


def build_app(routes: Mapping[str, WsgiApp], default: WsgiApp, health: Health,
              auth: BasicAuth | None) -> WsgiApp:
    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO")
        if path == "/healthz":
            ok, reason = health()
            start_response("200 OK" if ok else "503 Service Unavailable",
                           [("Content-Type", "text/plain; charset=utf-8")])
            return [(reason + "\n").encode()]
        if auth is not None:
            verdict = auth.check(environ.get("HTTP_AUTHORIZATION"))
            if verdict is Verdict.BUSY:
                start_response("429 Too Many Requests", [("Retry-After", "1"),
                               ("Content-Type", "text/plain; charset=utf-8")])
                return [b"Too many password checks at once; retry\n"]
            if verdict is not Verdict.OK:
                start_response("401 Unauthorized", [
                    ("WWW-Authenticate", 'Basic realm="fsdpmon"'),
                    ("Content-Type", "text/plain; charset=utf-8")])
                return [b"Unauthorized\n"]
        return routes.get(path or "", default)(environ, start_response)

    return app


@dataclass
class Server:
    httpd: PooledWSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def failed_connections(self) -> int:
        return self.httpd.errors.count

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


def bind(app: WsgiApp, address: str, port: int, web: WebConfig, *, workers: int = 16,
         max_per_second: float | None = None) -> Server:
    """Listen and serve ``app`` in daemon threads; OSError when the address or port is unusable."""
    context = web.tls.ssl_context() if web.tls is not None else None
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    httpd = PooledWSGIServer((address, port), family, workers, Pace(max_per_second), ErrorLog())
    httpd.set_app(app)
    if context is not None:
        # Handshake in a worker (on first read), not in the accept loop, so a client that
        # stalls mid-handshake cannot hold up everyone else's scrape.
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True,
                                           do_handshake_on_connect=False)
    thread = threading.Thread(target=httpd.serve_forever, name="fsdpmon-http", daemon=True)
    thread.start()
    return Server(httpd, thread)


def _bind_error(address: str, port: int, exc: OSError) -> ConfigError:
    if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
        return ConfigError("--listen-address", f"cannot listen on {address!r}: {exc.strerror}")
    return ConfigError("--port", f"cannot listen on {address}:{port}: {exc.strerror or exc}")


def serve(metrics: WsgiApp, address: str, port: int, web: WebConfig, health: Health,
          routes: Mapping[str, WsgiApp] | None = None, workers: int = 16) -> Server:
    """The exporter's server: ``metrics`` on every path but ``/healthz`` and ``routes``.

    Bad certificates and unusable addresses or ports raise ConfigError naming the field."""
    auth = BasicAuth(dict(web.users)) if web.users else None
    app = build_app(routes or {}, metrics, health, auth)
    try:
        return bind(app, address, port, web, workers=workers)
    except OSError as exc:
        raise _bind_error(address, port, exc) from None
